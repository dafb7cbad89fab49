"""Building the index: a suffix array, a run of character ids' positions sorted by the text that starts at each.

libdivsufsort (the optional `novelty` extra, pip install -e ".[novelty]") builds it in C for vocabularies of at
most 256 characters; numpy's prefix doubling builds it otherwise. Both give the same array (tested). A split made
of several stretches (--val-split blocks) gets the suffix array of its stretches, each ending like a text
(stretch_suffix_array).
"""

import numpy as np

from chargpt.errors import ChargptError

try:  # the optional `novelty` extra
    import pydivsufsort
except ImportError:
    pydivsufsort = None


def pick_builder(ids, builder="auto"):
    """The builder suffix_array uses for `ids`: "pydivsufsort" when forced, or for "auto" when it is installed and
    every id fits in a byte; else "numpy"."""
    small = len(ids) and int(np.max(ids)) < 256
    return "pydivsufsort" if builder == "pydivsufsort" or builder == "auto" and pydivsufsort is not None and small \
        else "numpy"


def suffix_array(ids, builder="auto"):
    """(n,) character ids -> (n,) int32 (int64 past 2**31) positions, sorted by the text that starts at each.

    builder "auto": with the optional pydivsufsort (pip install -e ".[novelty]") and a vocabulary of at most 256
    characters, libdivsufsort builds it: C, O(n log n), in less memory and time than numpy (on tiny Shakespeare,
    measured once on a busy machine: 9.6 MB against 42 MB besides the 4.3 MB result, about twice as fast).
    libdivsufsort sorts bytes: wider ids go in as big-endian byte pairs and half the positions are thrown away
    after, so for larger vocabularies (Chinese) its edge is gone (on the Tang corpus it was slower than numpy) and
    numpy's prefix doubling (suffix_array_numpy) builds it. Both give the same array (tested); "numpy" and
    "pydivsufsort" force one, for `python -m chargpt.bench novelty --builder`."""
    if builder == "pydivsufsort" and pydivsufsort is None:
        raise ChargptError('the pydivsufsort builder is not installed: pip install -e ".[novelty]"')
    if len(ids) and pick_builder(ids, builder) == "pydivsufsort":
        # byte order is id order is code-point order: the vocabulary is sorted by code point
        sa = pydivsufsort.divsufsort(np.ascontiguousarray(ids))
        return sa.astype(index_dtype(len(ids)), copy=False)
    return suffix_array_numpy(ids)


def stretch_suffix_array(ids, segs, builder="auto"):
    """The suffix array of the stretches `segs` ((k, 2) [start, end) offsets into ids) as if each ended the text:
    the positions inside them, sorted by their text up to the end of their own stretch (one that reaches it first
    sorts first, as at the end of a text). The --val-split blocks index: a match never runs on from one training
    stretch into the validation text after it (score.matching_statistics, stretches=...).

    Built as the suffix array of the stretches joined, each followed by a separator below every character
    (ids + 1, and 0), whose k separators sort first and are dropped; the rest map back to positions of ids."""
    segs = np.asarray(segs, dtype=np.int64).reshape(-1, 2)
    dtype = index_dtype(len(ids))
    lengths = segs[:, 1] - segs[:, 0]
    k, total = len(segs), int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype)
    top = max(int(np.max(ids[a:b])) for a, b in segs if b > a) + 1
    joined = np.zeros(total + k, np.uint8 if top < 256 else np.uint16 if top < 65536 else np.int64)
    heads = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]])  # where each stretch starts in `joined`
    for (a, b), h in zip(segs, heads):
        joined[h:h + b - a] = np.asarray(ids[a:b]) + 1
    sa = suffix_array(joined, builder)[k:]  # separators (0) sort before any character
    del joined
    shift = segs[:, 0] - heads
    return (sa + shift[np.searchsorted(heads, sa, side="right") - 1]).astype(dtype)


def index_dtype(n):
    return np.int32 if n < 2**31 else np.int64


def suffix_array_numpy(ids):
    """The suffix array by prefix doubling over group-head ranks (Manber & Myers; Larsson & Sadakane's refinement
    of re-sorting only the groups not yet told apart). Round one sorts keys that pack as many characters as fit
    in 62 bits (9 of a 65-character vocabulary); each later round doubles the characters compared, and text that
    repeats little is sorted after a few rounds."""
    n = len(ids)
    dtype = index_dtype(n)
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


def builder_note(vocab):
    """What the "indexing ..." log line adds when numpy builds an index that pydivsufsort would build better."""
    return "" if pydivsufsort is not None or len(vocab) > 256 else \
        ' (with numpy; pip install -e ".[novelty]" adds pydivsufsort, which builds it faster in less memory)'

