"""Text in and out of the commands: prompts and sentences read as UTF-8 (from an argument, a file or stdin),
samples formatted as printed or as JSON lines, output files written atomically, and a stdout that never crashes
on a character it cannot show. The click commands (chargpt/cli.py) only wire flags to these.
"""

import codecs
import io
import itertools
import json
import sys
from pathlib import Path

from .errors import ChargptError
from .rundir import write_text_atomic

TRANSLATE_CHUNK = 1024  # lines translated (and written to stdout) at a time: output flows, memory stays bounded


# --- reading ---------------------------------------------------------------------------------------------------
def read_stdin():
    """All of stdin as bytes (a text-only stream, as under some test runners, is encoded back to UTF-8)."""
    return sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")


def read_file(path, what):
    """A file's bytes (exactly as written: \\r\\n kept); `what` names it in the one-line errors."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ChargptError(f"cannot read {what} {path}: not found") from None
    except OSError as e:
        raise ChargptError(f"cannot read {what} {path}: {e.strerror}") from None


def read_bounded(path, limit, what):
    """A file's bytes, or stdin's for '-', read no further than `limit`: more is a one-line error, not a read
    that never ends."""
    try:
        if path == "-":
            stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else io.BytesIO(sys.stdin.read().encode())
            data = stream.read(limit + 1)
        else:
            with open(path, "rb") as f:
                data = f.read(limit + 1)
    except OSError as e:
        raise ChargptError(f"cannot read {what} {path}: {e.strerror}") from None
    if len(data) > limit:
        raise ChargptError(f"{what} {path} is over {limit:,} bytes; give a part of it")
    return data


def decode_utf8(data, source):
    """bytes -> text as UTF-8 (an opening BOM is dropped); anything else is one line naming `source`."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"{source} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None


def read_prompt(prompt, prompt_file):
    """--prompt / --prompt-file / --prompt - -> the prompt text. A file is taken exactly as written; from stdin,
    the one newline that `echo` adds at the end is dropped."""
    if prompt is not None and prompt_file is not None:
        raise ChargptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-":
        text, source = decode_utf8(read_stdin(), "stdin (--prompt -)"), "stdin (--prompt -)"
        text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    elif prompt_file is not None:
        source = f"prompt file {prompt_file}"
        text = decode_utf8(read_file(prompt_file, "prompt file"), source)
    else:
        return prompt or ""
    if not text:
        raise ChargptError(f"{source} is empty; give some text, or drop it to start from a new line")
    return text


def source_lines(sources, input_path):
    """-> (lines to translate, how to name line N in messages). Arguments, else --input FILE ('-': stdin), else
    stdin when it is piped. Lines are UTF-8 (an opening BOM is dropped), ending at \\n or \\r\\n."""
    if sources and input_path is not None:
        raise ChargptError("give sentences as arguments or with --input, not both")
    if sources:
        return list(sources), "sentence {}"
    if input_path is None and sys.stdin.isatty():
        raise ChargptError('nothing to translate: give a sentence (chargpt translate "..."), --input FILE, or pipe '
                           "lines into stdin")
    if input_path in (None, "-"):
        data, where = read_stdin(), "stdin"
    else:
        data, where = read_file(input_path, "--input"), input_path
    lines = [line.removesuffix("\r") for line in decode_utf8(data, where).split("\n")]
    if lines and lines[-1] == "":  # the newline that ends the last line starts no new one
        lines.pop()
    return lines, f"line {{}} of {where}"


# --- samples as printed ----------------------------------------------------------------------------------------
def separator(i, n, seed):
    """The line above each sample when there are several (none for one). It is part of the result, on stdout:
    it tells the samples apart and gives the seed that reproduces them."""
    return f"========== sample {i + 1}/{n} (seed {seed}) ==========\n" if n > 1 else ""


def format_sample(i, n, seed, prompt, text):
    return separator(i, n, seed) + prompt + text + "\n"


def shown_prompt(gen, prompt):
    """What is printed before a sample: the prompt it continues; nothing for a pairs model, whose prompt is the
    source and whose sample is its translation."""
    return "" if gen.task == "pairs" else prompt


def stream_samples(gen, prompt, n, seed, settings, unknown, out, use_cache=True):
    """Write samples to `out` as they are decoded: the prompt, then the text (a pairs model's: the translation
    alone). Samples are decoded together in one batch; the first is shown live and the others, buffered, follow
    when decoding ends. -> the texts."""
    prompt = gen.prompt_text(prompt, unknown)  # raises before anything is printed
    texts = [""] * n
    pieces = gen.stream(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings)
    first = next(pieces, None)  # the cache is allocated and the prompt read: running out of memory prints nothing
    prompt = shown_prompt(gen, prompt)
    out.write(separator(0, n, seed) + prompt)
    out.flush()
    for i, piece in itertools.chain([first] if first else [], pieces):
        texts[i] += piece
        if i == 0:
            out.write(piece)
            out.flush()
    out.write("\n")
    for i in range(1, n):
        out.write(format_sample(i, n, seed, prompt, texts[i]))
    out.flush()
    return texts


def all_samples(gen, prompt, n, seed, settings, unknown, as_json, use_cache=True, ascii_json=False, novelty=None):
    """Decode all samples, then -> the text to write: as printed, or one JSON object per line (\\u escapes for
    every non-ASCII character with ascii_json, for an output that cannot hold them: still exact JSON).
    `novelty(i, text)`, if given, is called for every sample in order: its dict joins that sample's record."""
    prompt = gen.prompt_text(prompt, unknown)
    texts = gen.generate(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings)
    extra = [novelty(i, t) if novelty else {} for i, t in enumerate(texts)]
    if not as_json:
        return "".join(format_sample(i, n, seed, shown_prompt(gen, prompt), t) for i, t in enumerate(texts))
    record = {**settings, "num_samples": n, "unknown": unknown}  # with the seed, enough to reproduce the text
    return "".join(json.dumps({"sample": i, "prompt": prompt, "text": t, "seed": seed, "settings": record, **x},
                              ensure_ascii=ascii_json) + "\n" for i, (t, x) in enumerate(zip(texts, extra)))


def translations(gen, lines, name, options):
    """Yield the translation of each line, chunk by chunk; a blank line stays blank (files keep their alignment)."""
    for start in range(0, len(lines), TRANSLATE_CHUNK):
        chunk = lines[start:start + TRANSLATE_CHUNK]
        todo = [i for i, line in enumerate(chunk) if line.strip()]
        where = [name.format(start + i + 1) for i in todo]  # translate numbers its sources from 1
        done = gen.translate([chunk[i] for i in todo], name=lambda k, where=where: where[k - 1], **options)
        out = [""] * len(chunk)
        for i, text in zip(todo, done):
            out[i] = text
        yield from out


# --- writing ---------------------------------------------------------------------------------------------------
def write_output(path, text):
    """Write --output atomically: an interrupted write never leaves a half file over an older one."""
    try:
        write_text_atomic(path, text)
    except OSError as e:
        raise ChargptError(f"cannot write --output {path}: {e.strerror}") from None


def utf_stream(stream):
    """Whether `stream` can write every character (a UTF encoding)."""
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf")
    except LookupError:
        return False


def tolerant_stdout():
    """Where stdout cannot show a character (an ASCII locale, a Windows code page) write an escape such as \\u4e2d
    in its place, instead of crashing half-way through a sample."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")
