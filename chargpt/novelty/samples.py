"""What the commands ask of novelty: a scorer for the samples sample.py writes (--novelty), each sample's line or
JSON record, and the text `chargpt novelty` scores (an argument, a file or stdin, read no further than a bound)."""

from .. import textio
from ..errors import ChargptError
from .runs import for_meta
from .score import DEFAULT_MIN_SPAN, check_min_span

MAX_INPUT_BYTES = 1 << 24  # text scored by `chargpt novelty` (16 MiB; its JSON lists two numbers per character)


def check_options(wanted, min_span, data, interactive):
    """sample.py's --novelty (`wanted`), --min-span and --data: the last two go with the first, which scores printed
    samples, not --interactive ones."""
    if not wanted:
        if min_span is not None or data is not None:
            raise ChargptError("--min-span and --data go with --novelty; add --novelty, or drop them")
        return
    if interactive:
        raise ChargptError("--novelty scores printed samples, not --interactive ones; drop one of them")


def sample_scorer(meta, run, min_span=None, data=None, log=print):
    """A function text -> Report against the training text of the run with metadata `meta` (named `run` in
    errors). Its index is built or loaded now, so that a missing corpus fails before any sampling."""
    min_span = DEFAULT_MIN_SPAN if min_span is None else min_span
    check_min_span(min_span)
    index = for_meta(meta, run, data, log=log)
    return lambda text: index.score(text, min_span)


def scored_line(report, i, n):
    """Sample i of n's line: copied: 23% in spans of 20+; longest 57 chars, from line 2,317 (after "sample 2: "
    when there are several)."""
    return ("" if n == 1 else f"sample {i + 1}: ") + report.line()


def sample_records(scorer, n, as_json, say):
    """For textio.all_samples: (sample index, text) -> {"novelty": its summary}, added to its JSON record; as
    printed, its line goes to say() instead. None without a scorer."""
    if scorer is None:
        return None

    def record(i, text):
        report = scorer(text)
        if as_json:
            return {"novelty": report.summary()}
        say(scored_line(report, i, n))
        return {}
    return record


def read_input(text, input_path):
    """The text to score: `text`, or the file `input_path` ('-': stdin), read no further than MAX_INPUT_BYTES;
    exactly one of them."""
    if (text is None) == (input_path is None):
        raise ChargptError("give the text to score as an argument or with --input FILE ('-': stdin), one of them")
    if text is not None:
        return text
    data = textio.read_stdin(MAX_INPUT_BYTES, "stdin (--input -)") if input_path == "-" else \
        textio.read_file(input_path, "--input", MAX_INPUT_BYTES)
    return textio.decode_utf8(data, "stdin (--input -)" if input_path == "-" else f"--input {input_path}")
