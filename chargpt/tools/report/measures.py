"""The report's numbers that need no model: what general-purpose compressors make of the same bytes, a standard
error from per-window losses, and what a set of samples says about itself (distinct-n, self-BLEU, repetition), with
the rule that suggests a temperature from them. Pure functions of their inputs; sacrebleu and zstandard are optional.

    compressed_sizes(text.encode())            # -> {"zlib": {"bytes": ..., "setting": "level 9"}, ...}
    distinct_n([["a", "b"], ["a", "c"]], 1)    # -> 0.75: 3 distinct unigrams among 4
"""

import bz2
import lzma
import math
import zlib

# each compressor at its strongest setting; all but zstd are in Python's standard library
COMPRESSORS = {
    "zlib": ("level 9", lambda data: zlib.compress(data, 9)),
    "bz2": ("level 9", lambda data: bz2.compress(data, 9)),
    "xz": ("preset 9e (lzma)", lambda data: lzma.compress(data, format=lzma.FORMAT_XZ,
                                                            preset=9 | lzma.PRESET_EXTREME)),
}
ZSTD_LEVEL = 22  # zstd's strongest ("ultra") level
NGRAM_ORDERS = (1, 2, 3, 4)
REPETITION_N = 4  # seq-rep-4, as Welleck et al. (2019, "Neural text generation with unlikelihood training") report
WORD_SPACE_SHARE = 0.05  # a text with at least this share of spaces is counted in words, else in characters

# The suggested temperature: the lowest tried (the most likely text) whose samples stay under both limits below;
# lower temperatures recite and loop, higher ones drift into text the model itself finds unlikely.
MAX_COPIED = 0.2  # at most this share of characters inside spans copied from the training text
MAX_REPETITION = 0.2  # at most this share of a sample's 4-grams repeating one earlier in it
SUGGESTION_RULE = (f"the lowest temperature tried whose samples copy at most {MAX_COPIED:.0%} of their characters "
                   f"from the training text and repeat at most {MAX_REPETITION:.0%} of their {REPETITION_N}-grams; "
                   f"if none does, the one with the least copying and repetition together")


def zstd_compressor():
    """-> zstd's compress function at ZSTD_LEVEL, or None where the zstandard module is not installed."""
    try:
        import zstandard
    except ImportError:
        return None
    return zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress


def compressed_sizes(data):
    """UTF-8 bytes -> {compressor: {"bytes": compressed size, "setting": its setting}}, each at its strongest, zstd
    where installed. The sizes include each format's header and checksums, as its files would."""
    out = {name: {"bytes": len(compress(data)), "setting": setting}
           for name, (setting, compress) in COMPRESSORS.items()}
    zstd = zstd_compressor()
    if zstd is not None:
        out["zstd"] = {"bytes": len(zstd(data)), "setting": f"level {ZSTD_LEVEL}"}
    return out


def ratio_se(windows):
    """Per-window (sum, count) pairs -> (sum of sums / sum of counts, its standard error): the ratio estimator's
    standard error, treating windows as independent draws (neighbouring windows of one text are not quite, so it is
    a lower bound). None for the error with fewer than two windows."""
    k = len(windows)
    total = sum(s for s, _ in windows)
    count = sum(n for _, n in windows)
    mean = total / count
    if k < 2:
        return mean, None
    spread = sum((s - mean * n) ** 2 for s, n in windows) * k / (k - 1)
    return mean, math.sqrt(spread) / count


def token_unit(text):
    """'word' for a text with spaces between words (at least WORD_SPACE_SHARE of it), else 'character' (Chinese,
    Japanese): what distinct-n, repetition and self-BLEU count."""
    return "word" if text and text.count(" ") / len(text) >= WORD_SPACE_SHARE else "character"


def tokens(text, unit):
    """A text -> its words (split at whitespace) or its characters other than whitespace."""
    return text.split() if unit == "word" else [c for c in text if not c.isspace()]


def ngrams(toks, n):
    return [tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)]


def distinct_n(samples, n):
    """Distinct n-grams over all n-grams of all samples (token lists) together (Li et al. 2016); None without any."""
    grams = [g for toks in samples for g in ngrams(toks, n)]
    return len(set(grams)) / len(grams) if grams else None


def repetition(samples, n=REPETITION_N):
    """seq-rep-n: per sample, the share of its n-grams that repeat one earlier in it (1 - distinct/all), averaged over
    the samples that have n-grams; None if none has."""
    shares = [1 - len(set(g)) / len(g) for g in (ngrams(toks, n) for toks in samples) if g]
    return sum(shares) / len(shares) if shares else None


def self_bleu(texts, unit):
    """Self-BLEU (Zhu et al. 2018, Texygen): each sample scored by sacrebleu's sentence BLEU (exp smoothing) against
    all the other samples as its references, averaged; 0-100, higher is more alike. Words are tokenised by sacrebleu's
    13a, characters by its 'char'. A sample is never among its own references (Texygen's bug #27 scored it against
    a set that held it). -> the score, or None with fewer than two samples. Raises ImportError without sacrebleu."""
    from sacrebleu.metrics import BLEU
    if len(texts) < 2:
        return None
    bleu = BLEU(tokenize="13a" if unit == "word" else "char", effective_order=True)
    scores = [bleu.sentence_score(t, texts[:i] + texts[i + 1:]).score for i, t in enumerate(texts)]
    return sum(scores) / len(scores)


def sacrebleu_note():
    """The one line said where self-BLEU is not measured, or None when sacrebleu is installed."""
    try:
        import sacrebleu  # noqa: F401
    except ImportError:
        return 'self-BLEU not measured: sacrebleu is not installed (pip install -e ".[report]")'
    return None


def suggest_temperature(rows):
    """rows: [{"temperature", "copied_fraction" (None: not measured), "repetition"}] -> (temperature, the reason in
    words) by SUGGESTION_RULE; (None, why) without rows."""
    if not rows:
        return None, "no samples were written"

    def copied(r):
        return r["copied_fraction"] or 0.0

    def rep(r):
        return r["repetition"] or 0.0
    for r in sorted(rows, key=lambda r: r["temperature"]):
        if copied(r) <= MAX_COPIED and rep(r) <= MAX_REPETITION:
            return r["temperature"], (f"the lowest tried whose samples copy {copied(r):.0%} of their characters "
                                      f"(at most {MAX_COPIED:.0%}) and repeat {rep(r):.0%} of their "
                                      f"{REPETITION_N}-grams (at most {MAX_REPETITION:.0%})")
    best = min(rows, key=lambda r: (copied(r) + rep(r), r["temperature"]))
    return best["temperature"], (f"no temperature tried stays under both limits; this one copies and repeats least "
                                 f"({copied(best):.0%} copied, {rep(best):.0%} repeated {REPETITION_N}-grams)")
