"""Scoring a text against one split's suffix array: the longest copied span at every position.

Matching statistics (Chang & Lawler 1994): starting[i] is the length of the longest prefix of text[i:] that
occurs verbatim in the split. The suffix sharing the longest prefix with text[i:] is next to where text[i:] would
be inserted in the sorted suffixes, so one binary search per position finds it; the searches run for a group of
positions at once, in numpy, comparing a few characters per step (more while they stay equal) and skipping the
prefix both bounds of the search already share with the text (Manber & Myers 1990). A position whose character
the corpus lacks needs no search, nor does one inside a copied stretch already followed (extend_capped).
ending[j], the longest copied span that ends at j, follows from starting (a span that occurs has every sub-span
occur). A character counts as copied when it lies inside a span of at least min_span characters that occurs in
the split.
"""

import numpy as np

from chargpt.errors import ChargptError

# Spans shorter than this are counted as chance, not copying. A span of L characters turns up by chance in n
# characters of training text when 2**(H*L) ~ n, H being the text's entropy in bits per character (1.5 to 2 for
# English): common words and phrases (" and the ", "I will not ") match everywhere. Measured on tiny Shakespeare,
# text the model never trains on (its validation split, against its training split) has 43% of its characters
# in common spans of 12+, 9.5% in 16+, 1.5% in 20+ and 0.3% in 24+: at 20, new text scores about 0 and a copied
# line of verse (30-40 characters) scores in full (docs/novelty.md).
DEFAULT_MIN_SPAN = 20
# A character of a large alphabet (Chinese, Japanese, Korean syllables) carries about a word: Tang poems are 6.5 bits
# per character against 1.5-2 for English, so chance matches are a third as long, and a recited Tang couplet (12
# characters with its punctuation) would pass for new at 20. From LARGE_ALPHABET distinct characters up, a run's
# default is LARGE_ALPHABET_MIN_SPAN (docs/novelty.md: 8 to 10 there); alphabetic scripts stay well below it.
LARGE_ALPHABET = 1000
LARGE_ALPHABET_MIN_SPAN = 10
BLOCK = 32  # characters compared per step of the vectorised searches, at most (FIRST_WIDTH, then doubling)
FIRST_WIDTH = 4  # most comparisons differ within a few characters: the first step compares this many
ROWS = 1 << 16  # text positions searched together, at most (their working arrays: ~BLOCK x 24 bytes each)
FIRST_ROWS = 1 << 10  # ... at first, and again after a copied stretch (matching_statistics)
# The binary searches compare at most this many characters. A text copied at length L would otherwise cost every
# one of its L positions O(L) compares per step, O(L^2) in all; past the cap, a copied stretch is followed once,
# linearly, from where it was found (extend_capped): the text a position shares with the corpus at p, its next
# position shares at p + 1.
SEARCH_CAP = 1024
NO_MATCH = -1  # a text position that matches nothing: past its end, or a character the corpus does not have
PAST_END = -2  # past the end of the corpus: below every character, so shorter suffixes sort first


def default_min_span(alphabet):
    """The min_span a run's text is scored with when none is given: from the size of its alphabet (its vocabulary's
    characters), DEFAULT_MIN_SPAN, or LARGE_ALPHABET_MIN_SPAN for CJK-sized ones."""
    return LARGE_ALPHABET_MIN_SPAN if alphabet >= LARGE_ALPHABET else DEFAULT_MIN_SPAN


def check_min_span(min_span):
    if isinstance(min_span, bool) or not isinstance(min_span, int) or min_span < 1:
        raise ChargptError(f"--min-span must be a whole number of characters, 1 or more (got {min_span!r})")


def matching_statistics(text, sa, query, block=BLOCK, cap=SEARCH_CAP, stretches=None):
    """-> (starting, where), (m,) int64 each: for every position i of `query` (ids; NO_MATCH matches nothing),
    the length of the longest prefix of query[i:] that occurs in `text` at one of the positions `sa` lists (in
    sorted order), and one position of `text` where it does. `stretches`: (starts, ends) of the pieces of `text`
    the split holds (--val-split blocks); a match stops where its piece ends, as at the end of the text, and `sa`
    is sorted so (suffixarray.stretch_suffix_array). None: the whole text is one piece.

    All m binary searches run together: lo/hi bound where query[i:] goes among the sorted suffixes (-1 and n are
    virtual ends), llo/lhi are its common prefix with them, and each comparison starts past min(llo, lhi) and stops
    at `cap` characters (longer matches: extend_capped). A match found past the cap is the one at the position the
    search stopped at, so its length is exact there and a lower bound for the text at large. Positions whose
    character the text lacks (NO_MATCH) are 0 without a search, and so are positions inside a copied stretch
    already followed past the cap (extend_capped gives them their length): a long copied text costs its length,
    not a search per character."""
    n, m = len(sa), len(query)
    starting, where = np.zeros(m, np.int64), np.zeros(m, np.int64)
    if n == 0 or m == 0:
        return starting, where
    q = np.asarray(query, dtype=np.int64)
    text, sa, padded = np.asarray(text), np.asarray(sa), _padded(q, block)  # a memmap as a plain view: faster
    stop = stops_of(len(text), stretches)
    chain = Chain()
    first, size = 0, min(ROWS, FIRST_ROWS)
    while first < m:  # positions are independent: a long text goes in groups, in bounded memory
        skip = min(m, max(first, chain.end - cap))  # inside the stretch followed last: no search needed
        chain.inherit(starting, where, first, skip)
        last = min(m, skip + size)
        rows = np.arange(skip, last)
        rows = rows[q[rows] >= 0]  # a character the text lacks matches nothing: 0, free
        if len(rows):
            starting[rows], where[rows] = _search(text, sa, padded, rows, block, cap, stop)
        extend_capped(text, q, starting, where, cap, block, stop, chain, skip, last)
        # groups grow while nothing is copied at length; after a copied stretch, small again: the next one may
        # start soon (the next training stretch), and a group searches all its positions, even those inside it
        size = min(ROWS, FIRST_ROWS) if chain.start >= skip else min(ROWS, 2 * size)
        first = last
    return starting, where


class Chain:
    """The copied stretch extend_capped followed last: query[start:end] occurs at text position `at`."""

    def __init__(self):
        self.start, self.at, self.end = -1, -1, -1

    def inherit(self, starting, where, lo, hi):
        """Positions lo..hi-1 (inside the stretch) get its rest: query[i + k:] occurs at at + k."""
        i = np.arange(lo, hi)
        starting[lo:hi], where[lo:hi] = self.end - i, self.at + (i - self.start)


def extend_capped(text, q, starting, where, cap, block, stop=None, chain=None, lo=0, hi=None):
    """Positions lo..hi-1 whose search stopped at `cap` get their match followed to its end, in place: the first
    of a run of such positions is compared on from where it was found, and each next one inherits that match, one
    shorter (query[i + k:] occurs at where[i] + k). Each copied stretch is read once: linear in its length. `stop`:
    the stretch ends (stops_of; None: the text's end); `chain`: the stretch followed last (carried between calls)."""
    n, m = len(text), len(q)
    stop = stop or stops_of(n, None)
    chain = chain or Chain()
    hi = m if hi is None else hi
    for i in lo + np.flatnonzero(starting[lo:hi] >= cap):
        if i < chain.end - cap:  # inside a stretch already followed: at least the rest of it
            chain.inherit(starting, where, i, i + 1)
            continue
        length, p = int(starting[i]), int(where[i])
        end = int(stop(np.array([p]))[0])
        while i + length < m and p + length < end:  # compare on, a block at a time
            k = min(block * 64, m - i - length, end - p - length)
            differ = np.flatnonzero(np.asarray(text[p + length:p + length + k], dtype=np.int64)
                                    != q[i + length:i + length + k])
            if len(differ):
                length += int(differ[0])
                break
            length += k
        starting[i], chain.start, chain.at, chain.end = length, i, p, i + length


def stops_of(n, stretches):
    """-> a function: text positions -> the end of the stretch each is in (n for a text that is one)."""
    if stretches is None:
        return lambda positions: np.full(len(positions), n, np.int64)
    starts, ends = (np.asarray(x, dtype=np.int64) for x in stretches)
    return lambda positions: ends[np.maximum(np.searchsorted(starts, positions, side="right") - 1, 0)]


def suffix_keys(text, starts, stops, depth):
    """(r,) suffix starts and their stretch ends -> (r, depth) int64: the first `depth` characters of each suffix,
    PAST_END past its stretch (the values the searches compare)."""
    tp = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(depth)
    inside = tp < np.asarray(stops, dtype=np.int64)[:, None]
    return np.where(inside, np.asarray(text[np.minimum(tp, len(text) - 1)], dtype=np.int64), PAST_END)


def _search(text, sa, q, rows, block, cap, stop):
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
        common, less = _compare(text, start, stop(start), q, rows[act], np.minimum(llo[act], lhi[act]), block, cap)
        down, up = act[less], act[~less]
        hi[down], lhi[down] = mid[less], common[less]
        lo[up], llo[up] = mid[~less], common[~less]
    use_hi = lhi > llo
    starting = np.maximum(llo, lhi)
    best = np.where(use_hi, hi, lo)
    ok = (best >= 0) & (best < n) & (starting > 0)
    where[ok] = np.asarray(sa[best[ok]], dtype=np.int64)
    return starting, where


def _compare(text, start, end, q, qstart, depth, block, cap):
    """Compare query[qstart:] with text[start:end] from `depth` on (both agree before it) -> (common prefix length,
    whether the query sorts first), for every row still equal a few characters per step, then twice as many up
    to `block` (most rows differ within a few). A row equal for `cap` characters stops there (as if the query
    sorted after). `q` is the query padded with NO_MATCH past its end (_padded)."""
    n = len(text)
    common, less = depth.copy(), np.zeros(len(start), bool)
    todo, width = np.arange(len(start)), min(block, FIRST_WIDTH)
    while len(todo):
        span, at = np.arange(width), common[todo]
        tp = (start[todo] + at)[:, None] + span  # (rows, width)
        past = tp >= end[todo, None]
        np.minimum(tp, n - 1, out=tp)
        tv = text[tp].astype(np.int64)
        tv[past] = PAST_END
        qv = q[(qstart[todo] + at)[:, None] + span]
        differ = tv != qv
        found = differ.any(axis=1)
        first = differ.argmax(axis=1)
        done, k = todo[found], first[found]
        common[done] += k
        less[done] = qv[found, k] < tv[found, k]
        common[todo[~found]] += width
        todo = todo[~found]  # a query ends (NO_MATCH) before any corpus character: every row finishes
        reached = common[todo] >= cap
        common[todo[reached]] = cap
        todo = todo[~reached]
        width = min(block, 2 * width)
    return common, less


def _padded(q, block):
    """The query followed by NO_MATCH as far as a comparison reads past its end: a row stops at the first NO_MATCH
    (no text character equals it), so at most a step of `block` characters."""
    return np.concatenate([q, np.full(block + 1, NO_MATCH, np.int64)])


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

