"""The index of one corpus: its two splits' suffix arrays and its line ends, built and cached the first time
(cache.py), and Novelty.score(text) -> Report against both splits, each span located by line (or pair).

A plain text run's splits are its text's tail (or, with --val-split blocks, stretches of it); a pairs run's are
sets of examples. A tail split's index is the suffix array of its stretch; a blocks split's, of its stretches,
each sorted as if it ended the text (a span stops where its stretch ends: the validation stretch after a training
one is not training text); a pairs split keeps the positions of one suffix array of the whole corpus that fall in
its examples (a span never crosses an example's end marker, which no scored text contains).
"""

from dataclasses import dataclass

import numpy as np

from chargpt.tools.novelty.cache import cached, check_line_ends, check_order, index_path, remove_stale
from chargpt.tools.novelty.report import Report, Span, SplitScore
from chargpt.tools.novelty.score import (
    NO_MATCH,
    check_min_span,
    covered,
    default_min_span,
    matching_statistics,
    maximal_starts,
    spans_ending,
    stops_of,
)
from chargpt.tools.novelty.suffixarray import builder_note, index_dtype, stretch_suffix_array, suffix_array

EXCERPT_CHARS = 80  # of a copied span shown from the corpus (with up to CONTEXT_CHARS before it)
CONTEXT_CHARS = 20
MAX_SPANS = 1000  # spans listed per text (its share and longest count them all)


@dataclass
class SplitIndex:
    """One split's suffix array over a run of corpus ids. `text` holds the split (plain text) or the whole
    corpus (pairs: the split's suffixes are a subset of its positions; a span never crosses an example's end
    marker, which no scored text contains; --val-split blocks: `stretches`, the (starts, ends) of the split's
    pieces of the corpus, where a span stops); `offset` is where text[0] is in the corpus."""
    name: str
    text: np.ndarray
    sa: np.ndarray
    offset: int = 0
    stretches: tuple | None = None


class Novelty:
    """A corpus's two split indexes and its line ends: .score(text) -> Report."""

    def __init__(self, vocab, corpus_ids, splits, line_ends, unit="line", ignore=()):
        self.vocab, self.corpus_ids, self.splits, self.line_ends, self.unit = vocab, corpus_ids, splits, line_ends, unit
        self.ignore = set(ignore)  # characters never matched (the pair markers)

    def encode(self, text):
        """text -> (m,) int64 ids; characters outside the vocabulary (or ignored) are NO_MATCH."""
        table = {c: i for c, i in self.vocab.stoi.items() if c not in self.ignore}
        return np.fromiter((table.get(c, NO_MATCH) for c in text), dtype=np.int64, count=len(text))

    @property
    def default_min_span(self):
        """The min_span for this corpus's alphabet (score.default_min_span), used when none is given."""
        return default_min_span(len(self.vocab) - len(self.ignore & set(self.vocab.chars)))

    def score(self, text, min_span=None):
        min_span = self.default_min_span if min_span is None else min_span
        check_min_span(min_span)
        query = self.encode(text)
        scores = {name: self._score_split(split, query, min_span) for name, split in self.splits.items()}
        return Report(text, min_span, self.unit, scores["train"], scores["val"])

    def _score_split(self, split, query, min_span):
        starting, where = matching_statistics(split.text, split.sa, query, stretches=split.stretches)
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


def index_corpus(corpus, val_fraction, log=print, split=None, build=True):
    """An encoded corpus (chargpt.data.corpus.EncodedCorpus or chargpt.data.pairs.EncodedPairs) -> Novelty, building and
    caching the suffix arrays of its two splits the first time (beside the corpus cache). `split`: a text run's
    chargpt.data.corpus.Split (None: the tail split of val_fraction, as runs from before --val-split). build=False:
    only an index already cached (cache.NotIndexed where there is none), nothing built or written."""
    from chargpt.data.pairs import END
    ids = corpus.ids()
    pairs = hasattr(corpus, "n_pairs")
    ends_id = corpus.vocab.stoi.get(END if pairs else "\n")
    remove_stale(corpus.cache_dir, corpus.key)
    positions = (lambda: _positions_of(ids, ends_id)) if build else None
    line_ends = cached(index_path(corpus.cache_dir, corpus.key, "lines"), positions, log, "line ends",
                       size=_count_of(ids, ends_id), bound=len(ids), check=check_line_ends(ids, ends_id))
    if pairs:
        return _index_pairs(corpus, ids, val_fraction, line_ends, log, build)
    if split is not None and split.how == "blocks":
        return _index_blocks(corpus, ids, split, line_ends, log, build)
    return _index_tail(corpus, ids, val_fraction, line_ends, log, build)


def _index_tail(corpus, ids, val_fraction, line_ends, log, build=True):
    """A text run's tail split: each split's own suffix array, over its stretch of the corpus."""
    from chargpt.data.corpus import split_sizes
    n_train, _ = split_sizes(len(ids), val_fraction, 0)
    splits = {}
    for name, lo, hi in (("train", 0, n_train), ("val", n_train, len(ids))):
        text = ids[lo:hi]

        def make(text=text, name=name):
            log(f"indexing the {len(text):,} {name} characters of {corpus.name} for novelty (once per corpus)"
                + builder_note(corpus.vocab))
            return suffix_array(text)
        stop = stops_of(len(text), None)
        sa = cached(index_path(corpus.cache_dir, corpus.key, f"sa-{name}-{n_train}"), make if build else None, log,
                    f"{name} index", size=len(text), bound=len(text),
                    check=lambda sa, text=text, stop=stop: check_order(text, sa, stop))
        splits[name] = SplitIndex(name, text, sa, offset=lo)
    return Novelty(corpus.vocab, ids, splits, line_ends)


def _index_pairs(corpus, ids, val_fraction, line_ends, log, build=True):
    """A pairs run's splits, sets of examples: one suffix array of the whole corpus, kept per split to the positions
    of its examples (a span never crosses an example's end marker, which no scored text contains)."""
    from chargpt.data.pairs import END, SEP, split_pairs
    train_rows, val_rows = split_pairs(corpus.n_pairs, val_fraction)
    tag = f"{len(val_rows)}"
    whole = _whole_index(corpus, ids, log)

    def part(rows):
        full = whole()
        in_split = np.zeros(corpus.n_pairs, bool)
        in_split[rows] = True
        example = np.searchsorted(line_ends, full, side="left")  # pair i holds positions up to its END
        return full[in_split[np.minimum(example, corpus.n_pairs - 1)]]
    splits, stop = {}, stops_of(len(ids), None)
    for name, rows in (("train", train_rows), ("val", val_rows)):
        count = int(corpus.index()[rows, 1:].sum() + 2 * len(rows))  # positions of the split's examples
        make = (lambda rows=rows: part(rows)) if build else None
        sa = cached(index_path(corpus.cache_dir, corpus.key, f"sa-{name}-{tag}"), make, log, f"{name} index",
                    size=count, bound=len(ids),
                    check=lambda sa: check_order(ids, sa, stop))
        splits[name] = SplitIndex(name, ids, sa)
    return Novelty(corpus.vocab, ids, splits, line_ends, unit="pair", ignore=(SEP, END))


def _index_blocks(corpus, ids, split, line_ends, log, build=True):
    """The --val-split blocks indexes: per split, the suffix array of its stretches, each sorted as if it ended the
    text (suffixarray.stretch_suffix_array), so that a span stops where its stretch ends: only training text is
    copied from, never the validation stretch after it."""
    tag = f"s{split.block_chars}-{split.size('val')}"  # names the split: its block length and validation size
    splits = {}
    for name in ("train", "val"):
        segs = getattr(split, name)
        stretches = (segs[:, 0].astype(np.int64), segs[:, 1].astype(np.int64))
        stop = stops_of(len(ids), stretches)

        def make(segs=segs, name=name):
            log(f"indexing the {split.size(name):,} {name} characters of {corpus.name} for novelty (once per corpus)"
                + builder_note(corpus.vocab))
            return stretch_suffix_array(ids, segs)

        def inside(positions, starts=stretches[0], stop=stop):
            return (positions >= starts[0]) & (positions < stop(positions))
        path = index_path(corpus.cache_dir, corpus.key, f"sa-{name}-{tag}")
        _drop(index_path(corpus.cache_dir, corpus.key, f"sa-{name}-b{split.block_chars}-{split.size('val')}"))
        sa = cached(path, make if build else None, log, f"{name} index", size=split.size(name), bound=len(ids),
                    check=lambda sa, stop=stop, inside=inside: check_order(ids, sa, stop, inside))
        splits[name] = SplitIndex(name, ids, sa, stretches=stretches)
    return Novelty(corpus.vocab, ids, splits, line_ends)


def _drop(path):
    """An index file of an older layout (blocks indexes before they stopped at stretch ends): no longer read."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _whole_index(corpus, ids, log):
    """-> a function giving the suffix array of the whole corpus, built on the first call only: the splits that
    keep their positions of it (pairs) share one build, and a split found in the cache needs none."""
    built = []

    def whole():
        if not built:
            log(f"indexing the {len(ids):,} characters of {corpus.name} for novelty (once per corpus)"
                + builder_note(corpus.vocab))
            built.append(suffix_array(ids))
        return built[0]
    return whole


def _count_of(ids, value, chunk=1 << 24):
    """How many times `value` occurs in ids, in chunks (bounded memory): the length of its line-end list."""
    if value is None:
        return 0
    return sum(int(np.count_nonzero(np.asarray(ids[i:i + chunk]) == value)) for i in range(0, len(ids), chunk))


def _positions_of(ids, value, chunk=1 << 24):
    """Positions of `value` in ids, in chunks (bounded memory)."""
    dtype = index_dtype(len(ids))
    if value is None:
        return np.zeros(0, dtype)
    return np.concatenate([np.flatnonzero(ids[i:i + chunk] == value).astype(dtype) + i
                           for i in range(0, len(ids), chunk)] or [np.zeros(0, dtype)])
