"""`sample.py --interactive`: load the model once, then answer prompt after prompt.

Commands between prompts change the settings: /temp 0.5, /topk 40, /topp 0.9, /len 300, /seed 7, /show,
/help, /quit; and the constraints (chargpt/sampling/constraints.py): /form 五言绝句, /acrostic 春夏秋冬, /ban eE,
/allow CHARS, /regex RE, /minp 0.05, /rep 1.3, /norepeat 4, /bestof 8 (a string command alone clears it). Under a
constraint or best-of, each sample's scores follow it on stderr. An empty line samples from the default start (a
pairs model translates each line: for it, an empty line is an error that says so). Ctrl-C stops the current sample
only (at the input prompt it just clears the line); Ctrl-D (end of input) exits. Text goes to stdout, everything
else (the "> " prompt, messages) to stderr, so the samples can be piped or logged on their own. /suggest TEXT lists
the likeliest next characters after TEXT and the words it likeliest completes (chargpt/sampling/suggest.py), on stderr.
"""

import itertools
import random
import sys
from dataclasses import asdict

from chargpt import textio
from chargpt.cli.writers import score_line
from chargpt.config import check_seed
from chargpt.config.decoding import LabelMix
from chargpt.errors import ChargptError
from chargpt.sampling.constraints import given

HELP = ("commands: /temp T  /topk K (0: off)  /topp P (1: off)  /len N  /seed S  /show  /help  /quit; "
        "constraints: /form PATTERN|NAME  /acrostic CHARS  /ban CHARS  /allow CHARS (alone: off)  /regex RE  "
        "/minp P (0: off)  /rep F (1: off)  /norepeat N (0: off)  /bestof N (1: off)  /beam N (0: off); a run trained "
        "with --labels: /label NAME or a:0.7,b:0.3 (alone: none)  /guidance F (1: off); with --fim: /suffix TEXT (the "
        "text after the gap; alone: none); /suggest TEXT: the next characters and words after TEXT; anything else is "
        "a prompt")
PAIRS_HELP = HELP.replace("anything else is a prompt", "anything else is a sentence to translate (one per line)")
PAIRS_EMPTY = ("this model was trained on sentence pairs: type a source sentence, one per line, and it writes the "
               "translation")
# command -> (setting, type, the value that turns it off)
SETTERS = {"/temp": ("temperature", float, None), "/topk": ("top_k", int, 0), "/topp": ("top_p", float, 1.0),
           "/len": ("max_new_tokens", int, None), "/minp": ("min_p", float, 0.0),
           "/rep": ("repetition_penalty", float, 1.0), "/norepeat": ("no_repeat_ngram", int, 0),
           "/bestof": ("best_of", int, 1), "/form": ("form", str, ""), "/acrostic": ("acrostic", str, ""),
           "/ban": ("ban", textio.unescape, ""), "/allow": ("allow", textio.unescape, ""),
           "/regex": ("regex", str, ""),
           "/label": ("label", str, ""), "/guidance": ("guidance", float, 1.0), "/beam": ("beam", int, 0),
           "/suffix": ("suffix", textio.unescape, "")}
SKIP_BYTES = 64 << 20  # the most skipped of one too-long input line before the input counts as endless
SKIP_CHUNK = 1 << 20  # read at a time while skipping: memory stays bounded


def repl(gen, options, inp=None, out=None, err=None):
    """Read lines from `inp` until end of input; options: the session's SampleOptions (its seed: the session's,
    from which each prompt draws its own), changed by the commands between prompts."""
    inp, out, err = textio.binary(inp or sys.stdin), out or sys.stdout, err or sys.stderr  # bytes: UTF-8 checked
    seed = options.seed
    rng = random.Random(seed)  # one seed per prompt, drawn from the session seed: a session replays exactly
    pairs = gen.task == "pairs"
    usage = PAIRS_HELP if pairs else HELP
    err.write(usage + "\n")
    number = 0
    while True:
        err.write("> ")
        err.flush()
        number += 1
        try:
            line = _read(inp, number)
        except KeyboardInterrupt:
            err.write("\n(Ctrl-D or /quit exits)\n")
            continue
        except textio.TooLarge as e:  # this line only: the rest of it is skipped, unless it never ends
            _skip_rest(inp, e)
            err.write(f"error: {e}\n")
            continue
        except ChargptError as e:  # not UTF-8: this line only
            err.write(f"error: {e}\n")
            continue
        if line is None:  # Ctrl-D
            err.write("\n")
            return
        word, _, arg = line.strip().partition(" ")
        if word in ("/quit", "/exit"):
            return
        if word == "/help":
            err.write(usage + "\n")
        elif word == "/show":
            err.write(f"{asdict(options.settings)} seed={seed}\n")
        elif word == "/seed":
            try:
                seed = check_seed(int(arg))
                rng = random.Random(seed)
                err.write(f"seed = {seed}\n")
            except (ValueError, ChargptError):
                err.write("usage: /seed N, a whole number from 0 to 2**63 - 1\n")
        elif word == "/suggest":  # the text as typed after the command: its spaces count
            _suggest(gen, line.lstrip()[len("/suggest "):] if arg else None, options, err)
        elif word == "/label" and (bad := _bad_label(gen, arg.strip())):
            err.write(f"error: {bad}\n")
        elif word == "/suffix" and arg and gen.fim is None:
            err.write("error: this run was trained without --fim, so it does not fill in the middle; train one with "
                      "--fim 0.5 (or --init-from this run --fim 0.5)\n")
        elif word == "/suffix":  # the text as typed after the command: its spaces count, as /suggest's
            options, said = _set(options, word, line.lstrip()[len("/suffix "):] if arg else "")
            err.write(said + "\n")
        elif word in SETTERS:
            options, said = _set(options, word, arg.strip())
            err.write(said + "\n")
        elif word.startswith("/"):
            err.write(f"unknown command {word}; {usage}\n")
        elif pairs and not line:  # a translator has no default start: the empty line is not a sentence
            err.write(f"error: {PAIRS_EMPTY}\n")
        else:
            _answer(gen, line, options.replace(seed=rng.randrange(2**31)), out, err)


def _read(inp, number):
    """The next line without its line end, or None at the end of input. A line that is not UTF-8, or longer than
    textio.MAX_LINE_BYTES, is an error naming it."""
    what = f"input line {number}"
    line = textio.read_line(inp, textio.MAX_LINE_BYTES, what)
    if not line:
        return None
    text = textio.decode_utf8(line, what) if isinstance(line, bytes) else line
    return text.rstrip("\r\n")


def _skip_rest(inp, error):
    """Read and drop the rest of a too-long line (its `error` said so), a chunk at a time, up to its line end or the
    end of input. A line still going after SKIP_BYTES more is not someone typing (/dev/zero): the session ends."""
    skipped = 0
    while skipped < SKIP_BYTES:
        piece = inp.readline(SKIP_CHUNK)
        if not piece or piece.endswith(b"\n" if isinstance(piece, bytes) else "\n"):
            return
        skipped += len(piece)
    raise textio.TooLarge(f"{error}; it has no end after {SKIP_BYTES >> 20} MiB more (is stdin the right file? "
                          f"/dev/zero never ends), so the session ends")


def _bad_label(gen, spec):
    """Why /label NAME (or a mix, a:0.7,b:0.3) cannot be (a run without labels, a name it does not have, a malformed
    mix), or ""."""
    if not spec:
        return ""
    if gen.labels is None:
        return "this run was trained without --labels, so it has no labels"
    try:
        for name in LabelMix.parse(spec).names:
            gen.labels.token(name)
    except ChargptError as e:
        return str(e)
    return ""


def _set(options, word, arg):
    """Apply one setter command -> (the options it makes, checked as they are made; the message to show). A bad
    value leaves the options as they were."""
    key, cast, off = SETTERS[word]
    try:
        value = cast(arg)
    except ValueError:
        return options, f"usage: {word} {cast.__name__.upper()}"
    if off is not None and value == off:
        value = None
    try:
        return options.replace(**{key: value}), f"{key} = {value}"
    except ChargptError as e:
        return options, f"invalid value for {word}: {e}"


def _suggest(gen, text, options, err):
    """/suggest TEXT: the next characters with their probabilities, and the word completions, on one line each (on
    stderr, with the other messages: the samples alone go to stdout). TEXT as typed, \\n a newline."""
    if text is None:
        err.write("usage: /suggest TEXT (\\n for a newline): the likeliest next characters and words after TEXT\n")
        return
    try:
        found = gen.suggest(textio.unescape(text), label=options.settings.label, unknown=options.unknown)
    except ChargptError as e:
        err.write(f"error: {e}\n")
        return
    err.write("next: " + "  ".join(f"{c!r} {p:.1%}" for c, p in found.chars) + "\n")
    if found.words:
        err.write("words: " + "  ".join(f"{w.word} {w.p:.1%}" for w in found.words) + "\n")


def _answer(gen, line, options, out, err):
    """Write the prompt and its continuation (options: this prompt's, with its own seed); a bad prompt (found before
    or while decoding) or Ctrl-C ends only this sample."""
    scored, unknown = given(options.settings) or options.settings.beam is not None, options.unknown
    try:
        prompt = gen.prompt_text(line, unknown)
        if scored:  # its scores are written after it
            pieces = gen.decoding(prompt, options)
        else:
            pieces = gen.stream(prompt, options)
        first = next(pieces, None)  # a pairs model checks its source here: nothing is written for a bad one
    except ChargptError as e:
        err.write(f"error: {e}\n")
        return
    except KeyboardInterrupt:
        err.write("[stopped]\n")
        return
    warning = gen.unknown_warning(line, unknown)
    if warning:
        err.write(f"warning: {warning}\n")
    if gen.task != "pairs":  # a pairs model's answer is the translation alone
        out.write(prompt)
    try:
        for _, piece in itertools.chain([first] if first else [], pieces):
            out.write(piece)
            out.flush()
    except KeyboardInterrupt:
        err.write("\n[stopped]")
    except ChargptError as e:
        err.write(f"\nerror: {e}")
    out.write((options.settings.suffix or "") + "\n")  # an infill: the text after the gap it filled
    out.flush()
    if scored and pieces.samples:
        err.write(score_line(pieces.samples[0], 0, 1, options.settings.best_of) + "\n")
