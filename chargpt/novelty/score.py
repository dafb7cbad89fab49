"""Scoring a text against one split's suffix array: the longest copied span at every position.

Matching statistics (Chang & Lawler 1994): starting[i] is the length of the longest prefix of text[i:] that
occurs verbatim in the split. The suffix sharing the longest prefix with text[i:] is next to where text[i:] would
be inserted in the sorted suffixes, so one binary search per position finds it; the searches run for all
positions at once, in numpy, comparing a block of characters per step and skipping the prefix both bounds of the
search already share with the text (Manber & Myers 1990). ending[j], the longest copied span that ends at j,
follows from starting (a span that occurs has every sub-span occur). A character counts as copied when it lies
inside a span of at least min_span characters that occurs in the split.
"""

import numpy as np

from ..errors import ChargptError

# Spans shorter than this are counted as chance, not copying. A span of L characters turns up by chance in n
# characters of training text when 2**(H*L) ~ n, H being the text's entropy in bits per character (1.5 to 2 for
# English): common words and phrases (" and the ", "I will not ") match everywhere. Measured on tiny Shakespeare,
# text the model never trains on (its validation split, against its training split) has 43% of its characters
# in common spans of 12+, 9.5% in 16+, 1.5% in 20+ and 0.3% in 24+: at 20, new text scores about 0 and a copied
# line of verse (30-40 characters) scores in full (docs/novelty.md).
DEFAULT_MIN_SPAN = 20
BLOCK = 32  # characters compared per step of the vectorised searches
ROWS = 1 << 16  # text positions searched together (their working arrays: ~BLOCK x 24 bytes each)
# The binary searches compare at most this many characters. A text copied at length L would otherwise cost every
# one of its L positions O(L) compares per step, O(L^2) in all; past the cap, a copied stretch is followed once,
# linearly, from where it was found (extend_capped): the text a position shares with the corpus at p, its next
# position shares at p + 1.
SEARCH_CAP = 1024
NO_MATCH = -1  # a text position that matches nothing: past its end, or a character the corpus does not have
PAST_END = -2  # past the end of the corpus: below every character, so shorter suffixes sort first


def check_min_span(min_span):
    if isinstance(min_span, bool) or not isinstance(min_span, int) or min_span < 1:
        raise ChargptError(f"--min-span must be a whole number of characters, 1 or more (got {min_span!r})")


def matching_statistics(text, sa, query, block=BLOCK, cap=SEARCH_CAP):
    """-> (starting, where), (m,) int64 each: for every position i of `query` (ids; NO_MATCH matches nothing),
    the length of the longest prefix of query[i:] that occurs in `text` at one of the positions `sa` lists (in
    sorted order), and one position of `text` where it does.

    All m binary searches run together: lo/hi bound where query[i:] goes among the sorted suffixes (-1 and n are
    virtual ends), llo/lhi are its common prefix with them, and each comparison starts past min(llo, lhi) and stops
    at `cap` characters (longer matches: extend_capped). A match found past the cap is the one at the position the
    search stopped at, so its length is exact there and a lower bound for the text at large."""
    n, m = len(sa), len(query)
    starting, where = np.zeros(m, np.int64), np.zeros(m, np.int64)
    if n == 0 or m == 0:
        return starting, where
    q = np.asarray(query, dtype=np.int64)
    for first in range(0, m, ROWS):  # positions are independent: a long text goes in groups, in bounded memory
        rows = np.arange(first, min(m, first + ROWS))
        starting[rows], where[rows] = _search(text, sa, q, rows, block, cap)
    extend_capped(text, q, starting, where, cap, block)
    return starting, where


def extend_capped(text, q, starting, where, cap, block):
    """Positions whose search stopped at `cap` get their match followed to its end, in place: the first of a run
    of such positions is compared on from where it was found, and each next one inherits that match, one shorter
    (query[i + k:] occurs at where[i] + k). Each copied stretch is read once: linear in its length."""
    n, m = len(text), len(q)
    chain_end = chain_at = -1  # the current stretch: query[i:chain_end] occurs at chain_at + (i - chain_start)
    chain_start = 0
    for i in np.flatnonzero(starting >= cap):
        if i < chain_end - cap:  # inside a stretch already followed: at least the rest of it
            starting[i], where[i] = chain_end - i, chain_at + (i - chain_start)
            continue
        length, p = int(starting[i]), int(where[i])
        while i + length < m and p + length < n:  # compare on, a block at a time
            k = min(block * 64, m - i - length, n - p - length)
            differ = np.flatnonzero(np.asarray(text[p + length:p + length + k], dtype=np.int64)
                                    != q[i + length:i + length + k])
            if len(differ):
                length += int(differ[0])
                break
            length += k
        starting[i], chain_start, chain_at, chain_end = length, i, p, i + length


def _search(text, sa, q, rows, block, cap):
    """matching_statistics for the positions `rows` of q."""
    n, r = len(sa), len(rows)
    lo, hi = np.full(r, -1, np.int64), np.full(r, n, np.int64)
    llo, lhi = np.zeros(r, np.int64), np.zeros(r, np.int64)
    where = np.zeros(r, np.int64)
    index = np.arange(r)
    while True:
        act = index[hi - lo > 1]
        if not len(act):
            break
        mid = (lo[act] + hi[act]) // 2
        start = np.asarray(sa[mid], dtype=np.int64)
        common, less = _compare(text, start, q, rows[act], np.minimum(llo[act], lhi[act]), block, cap)
        down, up = act[less], act[~less]
        hi[down], lhi[down] = mid[less], common[less]
        lo[up], llo[up] = mid[~less], common[~less]
    use_hi = lhi > llo
    starting = np.maximum(llo, lhi)
    best = np.where(use_hi, hi, lo)
    ok = (best >= 0) & (best < n) & (starting > 0)
    where[ok] = np.asarray(sa[best[ok]], dtype=np.int64)
    return starting, where


def _compare(text, start, q, qstart, depth, block, cap):
    """Compare query[qstart:] with text[start:] from `depth` on (both agree before it) -> (common prefix length,
    whether the query sorts first), a block of characters per step for every row still equal. A row equal for
    `cap` characters stops there (as if the query sorted after)."""
    n, m = len(text), len(q)
    common, less = depth.copy(), np.zeros(len(start), bool)
    todo, span = np.arange(len(start)), np.arange(block)
    while len(todo):
        tp = start[todo, None] + common[todo, None] + span  # (rows, block)
        qp = qstart[todo, None] + common[todo, None] + span
        tv = np.where(tp < n, np.asarray(text[np.minimum(tp, n - 1)], dtype=np.int64), PAST_END)
        qv = np.where(qp < m, q[np.minimum(qp, m - 1)], NO_MATCH)
        differ = tv != qv
        found = differ.any(axis=1)
        first = differ.argmax(axis=1)
        done, k = todo[found], first[found]
        common[done] += k
        less[done] = qv[found, k] < tv[found, k]
        common[todo[~found]] += block
        todo = todo[~found]  # a query ends (NO_MATCH) before any corpus character: every row finishes
        reached = common[todo] >= cap
        common[todo[reached]] = cap
        todo = todo[~reached]
    return common, less


def spans_ending(ends):
    """(m,) end of the longest span starting at each position (nondecreasing) -> (m,) the longest span ending at
    each position: j - i0 + 1 for the first i0 whose span reaches past j (every later start up to j does too)."""
    j = np.arange(len(ends))
    return np.maximum(0, j - np.searchsorted(ends, j, side="right") + 1)


def covered(starting, min_span):
    """(m,) bool: inside a span of at least min_span characters that occurs."""
    m = len(starting)
    long = np.flatnonzero(starting >= min_span)
    depth = np.zeros(m + 1, np.int64)
    np.add.at(depth, long, 1)
    np.add.at(depth, long + starting[long], -1)
    return np.cumsum(depth[:m]) > 0


def maximal_starts(starting, min_span):
    """Positions where a span of min_span or more starts that no span starting earlier contains (its end is
    further than the previous position's)."""
    ends = np.arange(len(starting)) + starting
    grows = np.ones(len(starting), bool)
    grows[1:] = ends[1:] > ends[:-1]
    return np.flatnonzero(grows & (starting >= min_span))

