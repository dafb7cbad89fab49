"""Is it writing or copying? Which spans of a text occur verbatim in a run's training text.

    chargpt novelty --checkpoint checkpoints/tinyshakespeare "ROMEO: What say'st thou?"
    python sample.py --novelty                 # one line per sample: copied: 23% in spans of 20+; longest ...
    python -m chargpt.novelty bench --chars 1000000 --chars 100000000

A character model trained on a small corpus memorises it, and a fluent sample does not say whether it is
invention or recitation. This module answers span by span, for any text, against the training split the run
trained on (and, apart, against its validation split: copying that is no memorisation, but worth knowing).

The index, per split, is a suffix array: the split's positions sorted by the text that starts there. It is
built once per corpus and split, and cached beside the encoded corpus (chargpt.data) as numpy .npy files,
written atomically (rundir.write_atomic) and read back memory-mapped (no pickle: allow_pickle=False):

    <key>.sa-train-<n_train>.v1.npy   int32 (int64 past 2**31 characters), one entry per training position
    <key>.sa-val-<n_train>.v1.npy     the same for the validation split (n_train names the split point)
    <key>.lines.v1.npy                where every line ends ("\\n"; for sentence pairs, the end marker), for
                                      line numbers

A text of m characters is scored by m binary searches (log2 n steps each) that touch O(m log n) pages of those
maps, so a 100M-character corpus costs page cache, not its size in RAM. Building it costs more, once (see
`suffix_array`): up to tens of bytes per character.

Scores ("matching statistics", Chang & Lawler 1994): starting[i] is the length of the longest prefix of
text[i:] that occurs verbatim in the split. The suffix sharing the longest prefix with text[i:] is next to where
text[i:] would be inserted in the sorted suffixes, so one binary search per position finds it; the searches run
for all positions at once, in numpy, comparing a block of characters per step and skipping the prefix both
bounds of the search already share with the text (Manber & Myers 1990). ending[j], the longest copied span that
ends at j, follows from starting (a span that occurs has every sub-span occur). A character counts as copied
when it lies inside a span of at least min_span characters that occurs in the split.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .config import run_val_split
from .errors import ChargptError, DataError
from .rundir import write_atomic

INDEX_VERSION = 1
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
EXCERPT_CHARS = 80  # of a copied span shown from the corpus (with up to CONTEXT_CHARS before it)
CONTEXT_CHARS = 20
MAX_SPANS = 1000  # spans listed per text (its share and longest count them all)
NO_MATCH = -1  # a text position that matches nothing: past its end, or a character the corpus does not have
PAST_END = -2  # past the end of the corpus: below every character, so shorter suffixes sort first

try:  # the optional `novelty` extra
    import pydivsufsort
except ImportError:
    pydivsufsort = None


# --- building a suffix array ------------------------------------------------------------------------------------
def suffix_array(ids, builder="auto"):
    """(n,) character ids -> (n,) int32 (int64 past 2**31) positions, sorted by the text that starts at each.

    builder "auto": with the optional pydivsufsort (pip install -e ".[novelty]") and a vocabulary of at most 256
    characters, libdivsufsort builds it: C, O(n log n), in less memory and time than numpy (on tiny Shakespeare,
    measured once on a busy machine: 9.6 MB against 42 MB besides the 4.3 MB result, about twice as fast).
    libdivsufsort sorts bytes: wider ids go in as big-endian byte pairs and half the positions are thrown away
    after, so for larger vocabularies (Chinese) its edge is gone (on the Tang corpus it was slower than numpy) and
    numpy's prefix doubling (suffix_array_numpy) builds it. Both give the same array (tested); "numpy" and
    "pydivsufsort" force one, for `python -m chargpt.novelty bench --builder`."""
    if builder == "pydivsufsort" and pydivsufsort is None:
        raise ChargptError('the pydivsufsort builder is not installed: pip install -e ".[novelty]"')
    small = len(ids) and int(np.max(ids)) < 256
    if len(ids) and (builder == "pydivsufsort" or builder == "auto" and pydivsufsort is not None and small):
        # byte order is id order is code-point order: the vocabulary is sorted by code point
        sa = pydivsufsort.divsufsort(np.ascontiguousarray(ids))
        return sa.astype(_index_dtype(len(ids)), copy=False)
    return suffix_array_numpy(ids)


def _index_dtype(n):
    return np.int32 if n < 2**31 else np.int64


def suffix_array_numpy(ids):
    """The suffix array by prefix doubling over group-head ranks (Manber & Myers; Larsson & Sadakane's refinement
    of re-sorting only the groups not yet told apart). Round one sorts keys that pack as many characters as fit
    in 62 bits (9 of a 65-character vocabulary); each later round doubles the characters compared, and text that
    repeats little is sorted after a few rounds."""
    n = len(ids)
    dtype = _index_dtype(n)
    if n == 0:
        return np.zeros(0, dtype)
    x = np.asarray(ids).astype(np.int64) + 1  # 0 marks "past the end", below every character
    bits = int(x.max()).bit_length()
    h = max(1, min(n, 62 // bits))  # characters packed into one key
    key = np.zeros(n, np.int64)
    for j in range(h):
        key <<= bits
        key[:n - j] |= x[j:]
    del x
    sa = np.argsort(key).astype(dtype)  # equal keys: equal first h characters, told apart below
    sorted_key = key[sa]
    del key
    start = np.empty(n, bool)  # in SA order: this entry starts a group of suffixes not yet told apart
    start[0] = True
    np.not_equal(sorted_key[1:], sorted_key[:-1], out=start[1:])
    del sorted_key
    rank = np.empty(n, dtype)  # position -> the SA index where its group starts: its rank by the first h chars
    rank[sa] = np.maximum.accumulate(np.where(start, np.arange(n, dtype=dtype), 0))
    active = ~(start & np.append(start[1:], True))  # in SA order: inside a group of two or more
    while active.any():
        slots = np.flatnonzero(active)  # SA indices of unsorted groups (each group contiguous, by rank)
        pos = sa[slots]
        r1 = rank[pos]
        nxt = pos.astype(np.int64) + h
        r2 = np.where(nxt < n, rank[np.minimum(nxt, n - 1)], -1).astype(np.int64)  # rank of the next h chars
        order = np.argsort(r1.astype(np.int64) * (n + 1) + r2 + 1, kind="stable")
        pos, r2 = pos[order], r2[order]  # r1 keeps its order: it is the primary key and was sorted
        sa[slots] = pos
        change = np.empty(len(slots), bool)
        change[0] = True
        change[1:] = (r1[1:] != r1[:-1]) | (r2[1:] != r2[:-1])
        rank[pos] = slots[np.maximum.accumulate(np.where(change, np.arange(len(slots)), 0))]
        active[slots[change & np.append(change[1:], True)]] = False  # groups of one are done
        h *= 2
    return sa


def _builder_note(vocab):
    return "" if pydivsufsort is not None or len(vocab) > 256 else \
        ' (with numpy; pip install -e ".[novelty]" adds pydivsufsort, which builds it faster in less memory)'


# --- the index of one corpus ------------------------------------------------------------------------------------
@dataclass
class SplitIndex:
    """One split's suffix array over a run of corpus ids. `text` holds the split (plain text) or the whole
    corpus (pairs: the split's suffixes are a subset of its positions; a span never crosses an example's end
    marker, which no scored text contains); `offset` is where text[0] is in the corpus."""
    name: str
    text: np.ndarray
    sa: np.ndarray
    offset: int = 0


@dataclass
class Span:
    """A maximal copied span of the scored text: text[start:end] occurs at corpus position `offset`, which is on
    line `line` of the corpus (for sentence pairs: in pair number `line`). `excerpt` is the corpus text there (at
    most EXCERPT_CHARS of it), `context` what comes before it on its line (at most CONTEXT_CHARS): who speaks."""
    start: int
    end: int
    offset: int
    line: int
    excerpt: str
    context: str = ""

    @property
    def length(self):
        return self.end - self.start


@dataclass
class SplitScore:
    """A text against one split: per position, and its summary for min_span."""
    starting: np.ndarray  # (m,) the longest span starting at each position that occurs in the split
    ending: np.ndarray  # (m,) the longest one ending there
    copied: np.ndarray  # (m,) bool: inside a span of min_span or more
    spans: list = field(default_factory=list)  # [Span], maximal spans of min_span or more, in text order
    longest: Span | None = None  # the longest span (shorter than min_span too); None when nothing matches

    @property
    def copied_fraction(self):
        return float(self.copied.mean()) if len(self.copied) else 0.0


@dataclass
class Report:
    text: str
    min_span: int
    unit: str  # "line" or "pair": what `line` numbers count
    train: SplitScore
    val: SplitScore

    def summary(self):
        """The `novelty` object of sample.py --json and samples.jsonl."""
        t, v = self.train, self.val
        return {"copied_fraction": round(t.copied_fraction, 4), "min_span": self.min_span,
                "longest": t.longest.length if t.longest else 0, "longest_line": t.longest.line if t.longest else None,
                "longest_excerpt": t.longest.excerpt if t.longest else "", "unit": self.unit,
                "val_copied_fraction": round(v.copied_fraction, 4), "val_longest": v.longest.length if v.longest else 0}

    def line(self):
        """The one-line summary (format_summary)."""
        return format_summary(self)

    def to_json(self, positions=True):
        """Everything, for `chargpt novelty --json` and the playground: per split its share, longest span and
        spans (with `positions`, also the per-character starting and ending lengths)."""
        out = {"chars": len(self.text), **self.summary()}
        for name, s in (("train", self.train), ("val", self.val)):
            out[name] = {"copied_fraction": round(s.copied_fraction, 4),
                         "longest": _span_json(s.longest) if s.longest else None,
                         "spans": [_span_json(x) for x in s.spans]}
            if positions:
                out[name].update(starting=s.starting.tolist(), ending=s.ending.tolist())
        return out


def segments(spans):
    """Maximal spans (which may overlap) -> the non-overlapping pieces a page shades, each with its span's source:
    [{start, end, line, excerpt, context}], in text order; a character belongs to the first span that holds it."""
    out, reach = [], 0
    for x in spans:
        if x.end > reach:
            out.append({"start": max(x.start, reach), "end": x.end, "line": x.line, "excerpt": x.excerpt,
                        "context": x.context})
            reach = x.end
    return out


def _span_json(s):
    return {"start": s.start, "end": s.end, "length": s.length, "offset": s.offset, "line": s.line,
            "excerpt": s.excerpt, "context": s.context}


class Novelty:
    """A corpus's two split indexes and its line ends: .score(text) -> Report."""

    def __init__(self, vocab, corpus_ids, splits, line_ends, unit="line", ignore=()):
        self.vocab, self.corpus_ids, self.splits, self.line_ends, self.unit = vocab, corpus_ids, splits, line_ends, unit
        self.ignore = set(ignore)  # characters never matched (the pair markers)

    def encode(self, text):
        """text -> (m,) int64 ids; characters outside the vocabulary (or ignored) are NO_MATCH."""
        table = {c: i for c, i in self.vocab.stoi.items() if c not in self.ignore}
        return np.fromiter((table.get(c, NO_MATCH) for c in text), dtype=np.int64, count=len(text))

    def score(self, text, min_span=DEFAULT_MIN_SPAN):
        check_min_span(min_span)
        query = self.encode(text)
        scores = {name: self._score_split(split, query, min_span) for name, split in self.splits.items()}
        return Report(text, min_span, self.unit, scores["train"], scores["val"])

    def _score_split(self, split, query, min_span):
        starting, where = matching_statistics(split.text, split.sa, query)
        where = where + split.offset
        ends = np.arange(len(query)) + starting
        copied = covered(starting, min_span)
        firsts = maximal_starts(starting, min_span)[:MAX_SPANS]
        spans = [self._span(int(i), int(starting[i]), int(where[i])) for i in firsts]
        longest = None
        if len(query) and starting.max() > 0:
            i = int(np.argmax(starting))  # the first of the longest
            longest = self._span(i, int(starting[i]), int(where[i]))
        ending = spans_ending(ends)
        return SplitScore(starting, ending, copied, spans, longest)

    def _span(self, start, length, offset):
        return Span(start, start + length, offset, self.line_of(offset), *self.excerpt(offset, length))

    def line_of(self, offset):
        """1-based line (pair) number of corpus position `offset`."""
        return int(np.searchsorted(self.line_ends, offset, side="left")) + 1

    def excerpt(self, offset, length):
        """-> (the copied span as it stands in the corpus, the text before it on its line), both shortened."""
        line = self.line_of(offset)
        line_start = int(self.line_ends[line - 2]) + 1 if line > 1 else 0
        begin, shown = max(line_start, offset - CONTEXT_CHARS), min(length, EXCERPT_CHARS)
        span, before = self._text(offset, offset + shown), self._text(begin, offset)
        return span + ("…" if shown < length else ""), ("…" if begin > line_start else "") + before

    def _text(self, begin, end):
        text = self.vocab.decode(self.corpus_ids[begin:end])
        for marker in self.ignore:  # a pair's source and target, as the tab between them in the file
            text = text.replace(marker, "\t")
        return text


def check_min_span(min_span):
    if isinstance(min_span, bool) or not isinstance(min_span, int) or min_span < 1:
        raise ChargptError(f"--min-span must be a whole number of characters, 1 or more (got {min_span!r})")


# --- scoring ----------------------------------------------------------------------------------------------------
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


# --- building, caching and loading the index ---------------------------------------------------------------------
def index_corpus(corpus, val_fraction, log=print, split=None):
    """An encoded corpus (chargpt.data.EncodedCorpus or chargpt.pairs.EncodedPairs) -> Novelty, building and caching
    the suffix arrays of its two splits the first time (beside the corpus cache). `split`: a text run's
    chargpt.data.Split (None: the tail split of val_fraction, as runs from before --val-split)."""
    from .pairs import END, SEP
    cache, key, ids = corpus.cache_dir, corpus.key, corpus.ids()
    pairs = hasattr(corpus, "n_pairs")
    ends_char = END if pairs else "\n"
    ends_id = corpus.vocab.stoi.get(ends_char)
    line_ends = _cached(cache / f"{key}.lines.v{INDEX_VERSION}.npy", lambda: _positions_of(ids, ends_id), log,
                        "line ends", bound=len(ids))
    if pairs:
        from .pairs import split_pairs
        train_rows, val_rows = split_pairs(corpus.n_pairs, val_fraction)
        tag = f"{len(val_rows)}"
        whole = _whole_index(corpus, ids, log)

        def part(rows):
            full = whole()
            in_split = np.zeros(corpus.n_pairs, bool)
            in_split[rows] = True
            example = np.searchsorted(line_ends, full, side="left")  # pair i holds positions up to its END
            return full[in_split[np.minimum(example, corpus.n_pairs - 1)]]
        splits = {}
        for name, rows in (("train", train_rows), ("val", val_rows)):
            count = int(corpus.index()[rows, 1:].sum() + 2 * len(rows))  # positions of the split's examples
            sa = _cached(cache / f"{key}.sa-{name}-{tag}.v{INDEX_VERSION}.npy", lambda rows=rows: part(rows), log,
                         f"{name} index", size=count, bound=len(ids))
            splits[name] = SplitIndex(name, ids, sa)
        return Novelty(corpus.vocab, ids, splits, line_ends, unit="pair", ignore=(SEP, END))
    if split is not None and split.how == "blocks":
        return _index_blocks(corpus, split, line_ends, log)
    from .data import split_sizes
    n_train, _ = split_sizes(len(ids), val_fraction, 0)
    splits = {}
    for name, lo, hi in (("train", 0, n_train), ("val", n_train, len(ids))):
        text = ids[lo:hi]

        def build(text=text, name=name):
            log(f"indexing the {len(text):,} {name} characters of {corpus.name} for novelty (once per corpus)"
                + _builder_note(corpus.vocab))
            return suffix_array(text)
        sa = _cached(cache / f"{key}.sa-{name}-{n_train}.v{INDEX_VERSION}.npy", build, log, f"{name} index",
                     size=len(text), bound=len(text))
        splits[name] = SplitIndex(name, text, sa, offset=lo)
    return Novelty(corpus.vocab, ids, splits, line_ends)


def _whole_index(corpus, ids, log):
    """-> a function giving the suffix array of the whole corpus, built on the first call only: the splits that
    keep their positions of it (pairs, blocks) share one build, and a split found in the cache needs none."""
    built = []

    def whole():
        if not built:
            log(f"indexing the {len(ids):,} characters of {corpus.name} for novelty (once per corpus)"
                + _builder_note(corpus.vocab))
            built.append(suffix_array(ids))
        return built[0]
    return whole


def _index_blocks(corpus, split, line_ends, log):
    """The --val-split blocks indexes: one suffix array of the whole corpus, kept per split to the positions in its
    stretches (as for pairs). A span may run on across the line end where a stretch meets the next one (at most
    one per block of SPLIT_CHARS): a rare slight overcount of the longest spans, for one array instead of two."""
    cache, key, ids = corpus.cache_dir, corpus.key, corpus.ids()
    tag = f"b{split.block_chars}-{split.size('val')}"  # names the split: its block length and validation size
    whole = _whole_index(corpus, ids, log)

    def part(segs):
        full = whole()
        inside = np.zeros(len(ids), bool)
        for a, b in segs:
            inside[a:b] = True
        return full[inside[full]]
    splits = {}
    for name in ("train", "val"):
        segs = getattr(split, name)
        sa = _cached(cache / f"{key}.sa-{name}-{tag}.v{INDEX_VERSION}.npy", lambda segs=segs: part(segs), log,
                     f"{name} index", size=split.size(name), bound=len(ids))
        splits[name] = SplitIndex(name, ids, sa)
    return Novelty(corpus.vocab, ids, splits, line_ends)


def _positions_of(ids, value, chunk=1 << 24):
    """Positions of `value` in ids, in chunks (bounded memory)."""
    dtype = _index_dtype(len(ids))
    if value is None:
        return np.zeros(0, dtype)
    return np.concatenate([np.flatnonzero(ids[i:i + chunk] == value).astype(dtype) + i
                           for i in range(0, len(ids), chunk)] or [np.zeros(0, dtype)])


def _cached(path, build, log, what, size=None, bound=None):
    """The array in `path` (memory-mapped) if it is there and sound (`size` long, if given; every value from 0 to
    below `bound`), else build(), saved there atomically and mapped back."""
    arr = _load(path, size, bound)
    if arr is not None:
        return arr
    arr = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)

        def save(tmp):
            with open(tmp, "wb") as f:
                np.save(f, arr, allow_pickle=False)
        write_atomic(path, save)
    except OSError as e:
        log(f"warning: cannot cache the novelty {what} in {path.parent} ({e.strerror}); it is rebuilt next time")
        return arr
    return _load(path, None, None)


def _load(path, size, bound, chunk=1 << 24):
    """A cached index array, memory-mapped, or None when missing or unsound (wrong length or values out of
    range: such a file is rebuilt rather than trusted with a corpus's positions)."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if arr.ndim != 1 or arr.dtype not in (np.int32, np.int64) or (size is not None and len(arr) != size):
        return None
    if bound is not None and len(arr):
        for i in range(0, len(arr), chunk):
            piece = arr[i:i + chunk]
            if int(piece.min()) < 0 or int(piece.max()) >= bound:
                return None
    return arr


# --- the corpus of a run ------------------------------------------------------------------------------------------
def run_corpus(meta, data=None, cache_dir=None, run="the run", log=print):
    """A checkpoint's metadata -> its encoded corpus (chargpt.data.EncodedCorpus or EncodedPairs), found by the
    corpus cache key the run recorded, else re-encoded from the path it trained on; `data` replaces that path
    (a corpus moved elsewhere), checked to be the same corpus by its hash."""
    from . import data as corpus_data
    from . import pairs as corpus_pairs
    tc = meta.get("train_config") or {}
    task, encoding, errors = tc.get("task", "text"), tc.get("encoding", "utf-8"), tc.get("encoding_errors", "strict")
    cache = Path(cache_dir or tc.get("cache_dir") or corpus_data.default_cache_dir()).expanduser()
    recorded = meta.get("corpus_key")
    path = data if data is not None else tc.get("data")
    if data is None and recorded:
        name = meta.get("corpus") or "corpus"
        corpus = (corpus_pairs.cached_pairs if task == "pairs" else corpus_data.cached_corpus)(cache, recorded, name)
        if corpus is not None:
            return _same_vocab(corpus, meta, run)
    if data is None and path is not None and not Path(path).expanduser().exists():
        raise DataError(f"the training text of {run} is gone ({path} does not exist and its encoding is not in the "
                        f"cache {cache}); pass --data FILE with the same corpus (checked by its hash)")
    if task == "pairs":
        _, key, _ = corpus_pairs.pair_stream(path, tc.get("target_data"), encoding, errors)
    else:
        key = corpus_data.corpus_key(corpus_data.corpus_sources(path, encoding)[1], encoding, errors)
    if recorded and key != recorded:
        where = path if path is not None else "the built-in corpus of this Python"
        raise DataError(f"{where} is not the corpus {run} was trained on (its hash differs); pass --data FILE with "
                        f"the text it trained on")
    if task == "pairs":
        corpus = corpus_pairs.encode_pairs(path, tc.get("target_data"), encoding, errors, cache, log=log)
    else:
        corpus = corpus_data.encode_corpus(path, encoding, errors, cache, log=log)
    return _same_vocab(corpus, meta, run)


def _same_vocab(corpus, meta, run):
    """The corpus, if its vocabulary is the run's: the guard for runs saved before they recorded their corpus key.
    A run started from another (--init-from) trains in the base's vocabulary extended by its corpus's characters,
    so there the corpus's characters need only be among the run's (the text is scored in the corpus's own ids)."""
    from .init_from import read_lineage
    within = read_lineage(meta) is not None and all(c in meta["vocab"].stoi for c in corpus.vocab.chars)
    if corpus.vocab != meta["vocab"] and not within:
        raise DataError(f"the corpus found for {run} has a different vocabulary ({len(corpus.vocab):,} characters "
                        f"against its {len(meta['vocab']):,}): not the text it trained on; pass --data FILE with it")
    return corpus


def for_run(checkpoint, data=None, cache_dir=None, log=print):
    """A run directory or checkpoint file -> Novelty over the text it trained on."""
    from .checkpoint import read_meta
    from .rundir import resolve
    meta, _ = read_meta(resolve(checkpoint))
    return for_meta(meta, str(checkpoint), data, cache_dir, log)


def for_meta(meta, run="the run", data=None, cache_dir=None, log=print):
    """A checkpoint's metadata (checkpoint.read_meta, Generator.meta) -> Novelty over the text it trained on."""
    corpus = run_corpus(meta, data, cache_dir, run=run, log=log)
    tc = meta.get("train_config") or {}
    fraction, split = tc.get("val_fraction", 0.1), None
    if tc.get("task", "text") == "text":  # the split the run trained with (runs from before --val-split: the tail)
        from .data import split_of
        split = split_of(corpus.ids(), corpus.vocab, fraction, meta["model_config"].block_size, run_val_split(tc))
    return index_corpus(corpus, fraction, log=log, split=split)


# --- words ------------------------------------------------------------------------------------------------------
def format_summary(report):
    """One line: copied: 23% in spans of 20+; longest 57 chars, from line 2,317 (validation text: 2%)."""
    s = report.summary()
    line = f"copied: {s['copied_fraction']:.0%} in spans of {s['min_span']}+; longest {s['longest']} chars"
    if s["longest"]:
        line += f", from {report.unit} {s['longest_line']:,}"
    if s["val_copied_fraction"]:
        line += f" (from the validation text: {s['val_copied_fraction']:.0%})"
    return line


def format_report(report):
    """`chargpt novelty`'s text output: the summary, then each split's copied spans with their sources."""
    out = [format_summary(report)]
    for name, s in (("training", report.train), ("validation", report.val)):
        if not s.spans:
            out.append(f"{name} text: no span of {report.min_span}+ characters")
            continue
        out.append(f"{name} text: {len(s.spans)} span(s) of {report.min_span}+ characters ({s.copied_fraction:.0%} "
                   f"of the text)")
        out += [f"  {x.length:>5} chars at {x.start}-{x.end}, {report.unit} {x.line:,}"
                + (f" after {_shown(x.context)}" if x.context else "") + f": {_shown(x.excerpt)}" for x in s.spans]
    return "\n".join(out)


def _shown(text):
    return json.dumps(text, ensure_ascii=False)


# --- benchmark ------------------------------------------------------------------------------------------------------
def synthetic_ids(n, seed=0, words=5000, chunk=1 << 23):
    """(n,) uint16 ids of English-like filler: random words (2 to 9 letters of 26) from a fixed lexicon, spaces
    between them and a newline every 4 to 12 words; long repeats are as rare as in real text, short ones as
    common. Made a chunk of words at a time (bounded memory: a 100M-character corpus costs its 200 MB)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 10, words)
    lexicon = rng.integers(2, 28, int(lengths.sum())).astype(np.uint16)  # ids 2..27: letters; 0 "\n", 1 " "
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out, filled = np.empty(n, np.uint16), 0
    while filled < n:
        w = rng.integers(0, words, chunk // 6)  # words, each with the separator after it
        size = lengths[w] + 1
        end = np.cumsum(size)
        within = np.arange(int(end[-1])) - np.repeat(end - size, size)  # offset inside word + separator
        piece = np.ones(int(end[-1]), np.uint16)
        letter = within < np.repeat(size - 1, size)
        piece[letter] = lexicon[(np.repeat(first[w], size) + within)[letter]]
        line_ends = np.cumsum(rng.integers(4, 13, len(w)))
        piece[end[line_ends[line_ends <= len(w)] - 1] - 1] = 0
        take = min(n - filled, len(piece))
        out[filled:filled + take] = piece[:take]
        filled += take
    return out


def bench_one(n_chars=None, data=None, sample_chars=1000, seed=0, builder="auto"):
    """Index build time and peak memory (numpy and ctypes allocations, traced), and the time to score a
    `sample_chars` text (half a slice of the corpus, half its characters shuffled), for a synthetic corpus of
    n_chars or the text file `data` (encoded as training encodes it, into a temporary cache) -> dict.
    builder: auto (pydivsufsort when installed), numpy or pydivsufsort."""
    import tempfile
    import tracemalloc

    from .data import encode_corpus
    with tempfile.TemporaryDirectory() as tmp:
        if data is not None:
            ids, name = encode_corpus(data, cache_dir=tmp, log=lambda *a: None).ids(), Path(data).name
        else:
            ids, name = synthetic_ids(n_chars, seed), f"synthetic {n_chars:,}"
        used = "pydivsufsort" if builder == "pydivsufsort" or builder == "auto" and pydivsufsort is not None and \
            int(np.max(ids)) < 256 else "numpy"
        tracemalloc.start()
        t0 = time.perf_counter()
        sa = suffix_array(ids, builder)
        build_s = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - sa.nbytes  # what the build needed besides its result
        tracemalloc.stop()
        rng = np.random.default_rng(seed + 1)
        at = int(rng.integers(0, max(1, len(ids) - sample_chars)))
        query = np.asarray(ids[at:at + sample_chars], dtype=np.int64).copy()
        query[len(query) // 2:] = rng.permutation(query[len(query) // 2:])
        t0 = time.perf_counter()
        starting, _ = matching_statistics(ids, sa, query)
        score_s = time.perf_counter() - t0
        return {"corpus": name, "chars": len(ids), "builder": used, "build_s": round(build_s, 3),
                "build_extra_mb": round(max(0, peak) / 2**20, 1),
                "index_mb": round(sa.nbytes / 2**20, 1), "peak_rss_mb": round(_peak_rss() / 2**20, 1),
                "score_chars": len(query), "score_s": round(score_s, 4), "longest": int(starting.max(initial=0))}


def _peak_rss():
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes). The benchmark's only: the
    resource module is POSIX's, so it is imported here and not where Windows would fail to import chargpt.novelty."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def bench(cases, sample_chars=1000, timeout=3600):
    """Each case (bench_one's keywords: {"n_chars": N} or {"data": PATH}, and "builder") in a fresh Python
    process, so that one's memory does not colour the next; -> list of result dicts."""
    results = []
    for case in cases:
        code = (f"import json; from chargpt.novelty import bench_one; "
                f"print(json.dumps(bench_one(**{case!r}, sample_chars={sample_chars})))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ})
        if done.returncode:
            raise ChargptError(f"novelty benchmark of {case} failed: {done.stderr.strip().splitlines()[-1:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main(argv=None):
    import argparse
    parser = argparse.ArgumentParser(prog="python -m chargpt.novelty", description="novelty index benchmark")
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench", help="index build time and peak memory, and scoring time, per corpus")
    b.add_argument("--chars", type=int, action="append", default=[], help="a synthetic corpus of this many chars")
    b.add_argument("--data", action="append", default=[], help="a UTF-8 text file")
    b.add_argument("--sample-chars", type=int, default=1000, help="length of the scored text")
    b.add_argument("--builder", action="append", choices=("auto", "numpy", "pydivsufsort"), default=[],
                   help="suffix-array builder(s) to measure [default: auto, pydivsufsort when installed]")
    args = parser.parse_args(argv)
    corpora = [{"n_chars": n} for n in args.chars] + [{"data": d} for d in args.data] or [{"n_chars": 1_000_000}]
    cases = [{**c, "builder": b} for c in corpora for b in args.builder or ["auto"]]
    for r in bench(cases, args.sample_chars):
        print(json.dumps(r))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
