"""Is it writing or copying? Which spans of a text occur verbatim in a run's training text.

    chargpt novelty --checkpoint checkpoints/tinyshakespeare "ROMEO: What say'st thou?"
    python sample.py --novelty                 # one line per sample: copied: 23% in spans of 20+; longest ...
    python -m chargpt.bench novelty --chars 1000000 --chars 100000000   # its benchmark (chargpt/bench/novelty.py)

A character model trained on a small corpus memorises it, and a fluent sample does not say whether it is
invention or recitation. This package answers span by span, for any text, against the training split the run
trained on (and, apart, against its validation split: copying that is no memorisation, but worth knowing).

The index, per split, is a suffix array: the split's positions sorted by the text that starts there. It is
built once per corpus and split, and cached beside the encoded corpus (chargpt.data.corpus) as numpy .npy files,
written atomically, checked and read back memory-mapped (cache.py). A text of m characters is scored by m binary
searches (log2 n steps each) that touch O(m log n) pages of those maps, so a 100M-character corpus costs page
cache, not its size in RAM; a character the corpus lacks costs no search, nor does a position inside a copied
stretch already followed past the search cap. Building it costs more, once: up to tens of bytes per character.

Scores ("matching statistics", Chang & Lawler 1994): starting[i] is the length of the longest prefix of
text[i:] that occurs verbatim in the split; ending[j] is the longest copied span that ends at j. A character
counts as copied when it lies inside a span of at least min_span characters that occurs in the split.

The modules, each importable on its own:
    suffixarray.py  building a suffix array (numpy's prefix doubling, or libdivsufsort when installed)
    score.py        matching statistics for every position of a text, and the spans that follow from them
    report.py       what a score says: copied spans with their source lines, the summary, the text output
    index.py        the index of one corpus (Novelty: its two splits and line ends; .score(text) -> Report)
    cache.py        the index files beside the corpus cache: written atomically, read memory-mapped, checked
    runs.py         a run's own corpus, found by the cache key it recorded (for_run, for_meta)
    samples.py      what the commands ask of it: a scorer for sampled text, its lines, the text to score
"""

from chargpt.tools.novelty.cache import INDEX_VERSION, NotIndexed
from chargpt.tools.novelty.index import CONTEXT_CHARS, EXCERPT_CHARS, MAX_SPANS, Novelty, SplitIndex, index_corpus
from chargpt.tools.novelty.report import Report, Span, SplitScore, format_report, format_summary, segments
from chargpt.tools.novelty.runs import CorpusMissing, corpus_identity, for_meta, for_run, index_run, run_corpus
from chargpt.tools.novelty.samples import (
                    MAX_INPUT_BYTES,
                    check_options,
                    read_input,
                    sample_records,
                    sample_scorer,
                    scored_line,
)
from chargpt.tools.novelty.score import (
                    BLOCK,
                    DEFAULT_MIN_SPAN,
                    NO_MATCH,
                    PAST_END,
                    ROWS,
                    SEARCH_CAP,
                    check_min_span,
                    covered,
                    default_min_span,
                    extend_capped,
                    matching_statistics,
                    maximal_starts,
                    spans_ending,
)
from chargpt.tools.novelty.suffixarray import stretch_suffix_array, suffix_array, suffix_array_numpy

__all__ = ["BLOCK", "CONTEXT_CHARS", "CorpusMissing", "DEFAULT_MIN_SPAN", "EXCERPT_CHARS", "INDEX_VERSION",
           "MAX_INPUT_BYTES", "MAX_SPANS", "NO_MATCH", "NotIndexed", "PAST_END", "ROWS", "SEARCH_CAP", "Novelty",
           "Report", "Span", "SplitIndex", "SplitScore", "check_min_span", "check_options", "corpus_identity",
           "covered", "default_min_span", "extend_capped", "for_meta", "for_run", "format_report", "format_summary",
           "index_corpus", "index_run", "matching_statistics", "maximal_starts", "read_input", "run_corpus",
           "sample_records", "sample_scorer", "scored_line", "segments", "spans_ending", "stretch_suffix_array",
           "suffix_array", "suffix_array_numpy"]
