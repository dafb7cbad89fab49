"""Text in and out of the commands: prompts and sentences read as UTF-8 (from an argument, a file or stdin),
the lines around printed samples, output files written atomically, and a stdout that never crashes on a character
it cannot show. The click commands (chargpt/cli/) only wire flags to these; what sample.py prints is
chargpt/cli/writers.py.
"""

import codecs
import io
import itertools
import json
import re
import sys

from chargpt.errors import ChargptError
from chargpt.runs.rundir import write_atomic

TRANSLATE_CHUNK = 1024  # lines translated (and written to stdout) at a time: output flows, memory stays bounded
# The most that is read of each kind of input: a file, a pipe or a device that never ends (/dev/zero, `yes`) is
# refused at this size, naming the input, instead of being read until memory runs out.
MAX_CONFIG_BYTES = 1 << 20  # a --config file: settings are a few hundred bytes
MAX_PROMPT_BYTES = 4 << 20  # a prompt (--prompt-file, --prompt -): far more than any context holds
MAX_LINE_BYTES = 1 << 20  # one line of translation input, or of interactive input
NAMED_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\"}


def escape(text, backslashes=True):
    """Whitespace and invisible characters made visible: newline as \\n, others as \\uXXXX; a plain space stays.
    What a checkpoint's metadata says (a corpus name, a path) goes through here before it is printed: a hostile
    file's terminal escapes (ESC, the C1 controls) and forged lines (\\n, \\r) are shown, never acted on.
    backslashes=False leaves a backslash as it is (a Windows path reads as typed)."""
    return "".join(_visible(c, backslashes) for c in str(text))


def _visible(c, backslashes=True):
    if c in NAMED_ESCAPES and (backslashes or c != "\\"):
        return NAMED_ESCAPES[c]
    if c == " " or (c.isprintable() and not c.isspace()):
        return c
    return f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}"


def visible_json(obj):
    """json.dumps(obj) with non-ASCII text kept, but every character a terminal could act on (the C1 controls,
    DEL, line and bidi controls; JSON itself escapes only C0) written as a \\u escape: the same JSON value."""
    return "".join(c if c.isprintable() else json.dumps(c)[1:-1] for c in json.dumps(obj, ensure_ascii=False))


def unescape(text):
    """'\\n', '\\t', '\\r' and '\\\\' typed on a command line -> the characters (other text is kept as is)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


# --- reading ---------------------------------------------------------------------------------------------------
class TooLarge(ChargptError):
    """An input past its size cap (read_bounded, read_line)."""


def _size(n):
    return f"{n >> 20} MiB" if n >= 1 << 20 and not n % (1 << 20) else f"{n:,} bytes"


def read_bounded(f, limit, what):
    """At most `limit` bytes of the binary stream f, all of it; past that, an error naming `what` (nothing more is
    read: the stream may never end)."""
    data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{what} is larger than {_size(limit)}, the most read of it (is it the right file? "
                       f"/dev/zero and `yes` never end)")
    return data


def read_line(f, limit, what):
    """One line of the stream f (bytes, or str from a text stream), its line end kept; b"" at the end. A line
    longer than `limit` bytes is an error naming `what`."""
    line = f.readline(limit + 1)
    if len(line) > limit and not line.endswith(b"\n" if isinstance(line, bytes) else "\n"):
        raise TooLarge(f"{what} is longer than {_size(limit)}, the most read of one line; break it into lines")
    return line


def binary(stream):
    """The byte stream under a text stream (sys.stdin.buffer), or the stream itself (a test's StringIO)."""
    return getattr(stream, "buffer", stream)


def read_stdin(limit, what):
    """stdin as bytes, at most `limit` of them (a text-only stream, as under some test runners, is encoded back to
    UTF-8)."""
    data = read_bounded(binary(sys.stdin), limit, what)
    return data.encode("utf-8") if isinstance(data, str) else data


def open_input(path, what):
    """A file opened for reading bytes; `what` names it in the one-line errors."""
    try:
        return open(path, "rb")
    except FileNotFoundError:
        raise ChargptError(f"cannot read {what} {path}: not found") from None
    except OSError as e:
        raise ChargptError(f"cannot read {what} {path}: {e.strerror}") from None


def read_file(path, what, limit):
    """A file's bytes (exactly as written: \\r\\n kept), at most `limit`; `what` names it in the one-line errors."""
    with open_input(path, what) as f:
        try:
            return read_bounded(f, limit, f"{what} {path}")
        except OSError as e:  # a directory, or a read error
            raise ChargptError(f"cannot read {what} {path}: {e.strerror}") from None


def decode_utf8(data, source):
    """bytes -> text as UTF-8 (an opening BOM is dropped); anything else is one line naming `source`."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"{source} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None


def read_prompt(prompt, prompt_file):
    """--prompt / --prompt-file / --prompt - -> the prompt text. --prompt's \\n and \\t are a newline and a tab, as
    in --stop and --ban (unescape); a file is taken exactly as written; from stdin too, but for the one newline that
    `echo` adds at the end."""
    if prompt is not None and prompt_file is not None:
        raise ChargptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-":
        source = "stdin (--prompt -)"
        text = decode_utf8(read_stdin(MAX_PROMPT_BYTES, source), source)
        text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    elif prompt_file is not None:
        source = f"prompt file {prompt_file}"
        text = decode_utf8(read_file(prompt_file, "prompt file", MAX_PROMPT_BYTES), source)
    else:
        return unescape(prompt or "")
    if not text:
        raise ChargptError(f"{source} is empty; give some text, or drop it to start from a new line")
    return text


def source_lines(sources, input_path):
    """-> (the lines to translate, as an iterator, how to name line N in messages). Arguments, else --input FILE
    ('-': stdin), else stdin when it is piped. Lines are UTF-8 (an opening BOM is dropped), ending at \\n or \\r\\n;
    a file or pipe is read a line at a time (at most MAX_LINE_BYTES each), so translations flow as lines come."""
    if sources and input_path is not None:
        raise ChargptError("give sentences as arguments or with --input, not both")
    if sources:
        return iter(sources), "sentence {}"
    if input_path is None and sys.stdin.isatty():
        raise ChargptError('nothing to translate: give a sentence (chargpt translate "..."), --input FILE, or pipe '
                           "lines into stdin")
    if input_path in (None, "-"):
        return _lines(binary(sys.stdin), "stdin", close=False), "line {} of stdin"
    return _lines(open_input(input_path, "--input"), input_path), f"line {{}} of {input_path}"


def _lines(f, where, close=True):
    try:
        n = 0
        while line := read_line(f, MAX_LINE_BYTES, f"line {n + 1} of {where}"):
            n += 1
            data = line.encode("utf-8") if isinstance(line, str) else line
            text = decode_utf8(data, f"line {n} of {where}") if n == 1 else _decode_line(data, n, where)
            yield text.removesuffix("\n").removesuffix("\r")
    except OSError as e:  # a directory, or a read error
        raise ChargptError(f"cannot read {where}: {e.strerror}") from None
    finally:
        if close:
            f.close()


def _decode_line(data, n, where):
    try:
        return data.decode("utf-8")  # a BOM opens only the first line
    except UnicodeDecodeError as e:
        raise ChargptError(f"line {n} of {where} is not UTF-8 (byte {e.start + 1} of the line); convert it to "
                           f"UTF-8") from None


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


def translations(gen, lines, name, options):
    """Yield the translation of each line of the iterable `lines`, chunk by chunk as the lines come: chunks of 1, 2,
    4 ... up to TRANSLATE_CHUNK lines, so the first translation shows at once and long files still decode in large
    batches. A blank line stays blank (files keep their alignment)."""
    lines, start, size = iter(lines), 0, 1
    while chunk := list(itertools.islice(lines, size)):
        size = min(2 * size, TRANSLATE_CHUNK)
        todo = [i for i, line in enumerate(chunk) if line.strip()]
        where = [name.format(start + i + 1) for i in todo]  # translate numbers its sources from 1
        done = gen.translate([chunk[i] for i in todo], name=lambda k, where=where: where[k - 1], **options)
        out = [""] * len(chunk)
        for i, text in zip(todo, done):
            out[i] = text
        start += len(chunk)
        yield from out


# --- writing ---------------------------------------------------------------------------------------------------
def write_output(path, text):
    """Write --output atomically: an interrupted write never leaves a half file over an older one."""
    write_output_lines(path, [text], end="")


def write_output_lines(path, lines, end="\n"):
    """Write --output atomically as the lines come (each followed by `end`): memory stays bounded, and an interrupted
    write never leaves a half file over an older one. -> how many lines were written."""
    count = 0

    def write(tmp):
        nonlocal count
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            for line in lines:
                f.write(line + end)
                count += 1
    try:
        write_atomic(path, write)
    except OSError as e:
        raise ChargptError(f"cannot write --output {path}: {e.strerror}") from None
    return count


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
