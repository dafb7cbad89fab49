"""What the commands ask of novelty: a scorer for the samples sample.py writes (--novelty), each sample's line or
JSON record, and the text `chargpt novelty` scores (an argument, a file or stdin, read no further than a bound)."""

from chargpt import textio
from chargpt.errors import ChargptError
from chargpt.tools.novelty.runs import index_run, run_corpus
from chargpt.tools.novelty.score import check_min_span

# Text scored by `chargpt novelty` at once: 1 MiB. Scoring costs a binary search per character, more for copied
# text (up to SEARCH_CAP characters compared); measured on a 2-core CPU against a 1M-character corpus, a MiB of new
# text took about 9 s, a MiB of 1,500-character copied passages with new text between them about 17 s (the worst
# case found), and a 16 MiB input minutes.
MAX_INPUT_BYTES = 1 << 20


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
    errors). The corpus is found now, so that a missing one fails before any sampling; its index is built or
    loaded when the first sample is scored, so that whatever refuses the prompt or a setting (a pairs run without
    a prompt) does so before any index work. min_span None: the default for the run's alphabet."""
    if min_span is not None:
        check_min_span(min_span)
    corpus = run_corpus(meta, data, run=run, log=log)
    index = []

    def score(text):
        if not index:
            index.append(index_run(meta, corpus, log))
        return index[0].score(text, min_span)
    return score


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
    what = "the text" if text is not None else "stdin (--input -)" if input_path == "-" else f"--input {input_path}"
    if text is not None:
        if len(text) > MAX_INPUT_BYTES or len(text.encode("utf-8", "surrogatepass")) > MAX_INPUT_BYTES:
            raise _too_large(what)
        return text
    try:
        data = textio.read_stdin(MAX_INPUT_BYTES, what) if input_path == "-" else \
            textio.read_file(input_path, "--input", MAX_INPUT_BYTES)
    except textio.TooLarge:
        raise _too_large(what) from None
    return textio.decode_utf8(data, what)


def _too_large(what):
    return ChargptError(f"{what} is larger than {MAX_INPUT_BYTES >> 20} MiB, the most chargpt novelty scores at once "
                        f"(a MiB takes up to about half a minute on a 2-core CPU); score it in parts of 1 MiB or less")
