"""Samples held to a pattern: a regular expression (--regex), a Lark grammar (--grammar FILE) or a JSON schema
(--json-schema FILE), through llguidance, the engine llama.cpp, vLLM and SGLang use for the same (the optional extra
`pip install -e ".[grammar]"`, imported only here).

    check("regex", "K[a-z]{4,7}")                      # the syntax alone: where SampleSettings are made
    pattern = compile_pattern("regex", "K[a-z]{4,7}", vocab, allowed)   # against a model's vocabulary
    rows = pattern.matchers(4)                         # a batch: rows.mask() before each step, rows.advance(ids) after

llguidance takes a vocabulary as a list of byte strings: token i is character i's UTF-8 bytes, and one more token,
id V (the vocabulary's size), is the end of the sample, which the model never writes and llguidance allows wherever
the text so far is complete (its EOS). At each step every row's matcher gives a bitmask over the V + 1 ids; the
constraints' Steer (chargpt/sampling/constraints.py) applies it to the logits with the other hard constraints, and
the chosen id goes back to the row's matcher. A row ends when it chooses the end, or when its pattern is complete
(nothing may follow: llguidance's is_stopped).

The end's logit, where the text may end, is the log of the probability the model gives to the characters the
pattern does not allow next: the model wanting to write something else is the model ending the match. So
`[A-Z][a-z]{3,7}` ends a name where the model would end the word, and a pattern that allows every character next
(`.*`) ends only at --max-new-tokens.

Checked before any decoding, each a one-line ConfigError: the syntax (check, with llguidance's own message on one
line, which says where), and against a vocabulary (compile_pattern): a pattern that no text of the characters a
sample may write completes, found by a short search (probe) that names the character the pattern needed where it
got stuck, when it needed one.
"""

import functools
import json
import re
from dataclasses import dataclass

import numpy as np
import torch

from chargpt.config.flags import param
from chargpt.errors import ConfigError

KINDS = {"regex": ("regex", "regular expression"), "grammar": ("lark", "grammar"),
         "json_schema": ("json_schema", "JSON schema")}  # SampleSettings' field -> (llguidance's format, in words)
INSTALL = 'pip install -e ".[grammar]"'
MAX_PATTERN_CHARS = 1 << 20  # a pattern, grammar or schema (files are read up to as many bytes): far past any real one
END_TOKEN = b"<|end|>"  # the end's bytes; llguidance marks a special token with a leading 0xFF, never any text's
PROBE_STEPS = 2000  # the most characters the search before decoding tries (a mask each: a few ms in all)
PROBE_DEPTH = 400  # ... and the longest text it tries


def llguidance():
    """The llguidance module, or a one-line ChargptError naming the install."""
    try:
        import llguidance
        import llguidance.numpy  # noqa: F401  (the bitmask helpers)
    except ImportError:
        raise ConfigError(f"a --regex, --grammar or --json-schema constraint needs llguidance, which is not "
                          f"installed; {INSTALL} (or pip install llguidance)") from None
    return llguidance


def given(settings):
    """-> (field name, text) of the pattern SampleSettings ask for, or None."""
    found = [(k, getattr(settings, k)) for k in KINDS if getattr(settings, k) is not None]
    return found[0] if found else None


def _grammar(kind, text):
    """llguidance's grammar for a pattern's text (its syntax unchecked), or a one-line ConfigError."""
    fmt, words = KINDS[kind]
    try:
        return llguidance().grammar_from(fmt, text)
    except ValueError as e:  # a schema that is not JSON
        raise ConfigError(f"{param(kind)}: not a {words}: {one_line(str(e))}") from None


def check(kind, text):
    """The pattern's own syntax, before any model is loaded: a malformed one is a one-line ConfigError with
    llguidance's message (which says where). Run where SampleSettings are made."""
    if not isinstance(text, str) or not text:
        raise ConfigError(f"{param(kind)} is empty; give it a {KINDS[kind][1]}, or leave it out")
    if len(text) > MAX_PATTERN_CHARS:
        raise ConfigError(f"{param(kind)} is {len(text):,} characters; the limit is {MAX_PATTERN_CHARS:,}")
    if kind == "json_schema":
        try:
            schema = json.loads(text)
        except ValueError as e:
            raise ConfigError(f"{param(kind)} is not JSON: {e}") from None
        if not isinstance(schema, (dict, bool)):
            raise ConfigError(f"{param(kind)} must be a JSON object (a JSON schema), got {type(schema).__name__}")
    error = llguidance().LLMatcher.validate_grammar(_grammar(kind, text))
    if error:
        raise ConfigError(f"{param(kind)}: {one_line(error, kind=kind)}")


def one_line(message, limit=300, kind=None):
    """llguidance's message (several lines, for a regex the pattern with a caret under the place) -> one line. A
    regular expression is compiled as the one-line grammar `start: /PATTERN/`: its line and column are that line's,
    so they are left out."""
    lines = [line.strip() for line in message.splitlines() if line.strip() and set(line.strip()) - set("^~")]
    if kind == "regex":
        lines = [re.sub(r"^at \d+\(\d+\): ", "", line) for line in lines if not re.match(r"\d+ \|", line)]
    text = "".join((" " if i and lines[i - 1].endswith(":") else "; " if i else "") + line
                   for i, line in enumerate(lines))
    return text if len(text) <= limit else text[:limit - 3] + "..."


class CharTokens:
    """llguidance's TokenizerWrapper, duck-typed, over a character vocabulary: token i is character i's UTF-8 bytes
    and token V (the vocabulary's size) the end, a special token."""
    is_tokenizer_wrapper = True
    bos_token_id = None

    def __init__(self, chars):
        self.tokens = [c.encode("utf-8") for c in chars] + [END_TOKEN]
        self.eos_token_id = len(chars)
        self.special_token_ids = [len(chars)]
        self.stoi = {c: i for i, c in enumerate(chars)}

    def __call__(self, text):
        """Text -> its ids, one a character (llguidance tokenizes forced text with it; it must never raise: a
        character the vocabulary lacks has no id)."""
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        return [self.stoi[c] for c in text if c in self.stoi]


@functools.lru_cache(maxsize=4)
def tokenizer(chars):
    """A vocabulary's characters (a tuple) -> its llguidance LLTokenizer (its token trie: built once per
    vocabulary)."""
    return llguidance().LLTokenizer(CharTokens(chars))


@dataclass
class Pattern:
    """A pattern compiled for one vocabulary: kind (SampleSettings' field), llguidance's grammar and tokenizer, the
    characters (id V = len(chars) is the end), and a matcher at the start that the others are copies of (a copy
    costs less than compiling the grammar again)."""
    kind: str
    grammar: str
    tokenizer: object
    chars: tuple
    start: object = None
    unproven: str = ""  # a note, where the check before decoding found no complete text but could not rule one out

    @property
    def size(self):
        return len(self.chars)

    @functools.cached_property
    def stoi(self):
        return {c: i for i, c in enumerate(self.chars)}

    def matcher(self):
        if self.start is None:
            self.start = llguidance().LLMatcher(self.tokenizer, self.grammar, log_level=0)
        return self.start.deep_copy()

    def matchers(self, rows):
        return Matchers(self, rows)

    def complete(self, text):
        """Whether text, whole, is one the pattern accepts."""
        if any(c not in self.stoi for c in text):
            return False
        m = self.matcher()
        return m.consume_tokens([self.stoi[c] for c in text]) and m.is_accepting()

    def words(self):
        return KINDS[self.kind][1]


def compile_pattern(kind, text, vocab, allowed):
    """A pattern's text -> Pattern for this vocabulary; allowed (V,) bool: the characters a sample may write (--ban,
    --allow, labels). A pattern that no text of those characters completes is a one-line ConfigError naming the
    character it needed, where the search found one."""
    chars = tuple(vocab.chars)
    grammar = _grammar(kind, text)
    pattern = Pattern(kind, grammar, tokenizer(chars), chars)
    m = pattern.matcher()
    if m.is_error():
        raise ConfigError(f"{param(kind)}: {one_line(m.get_error())}")
    found, needed = probe(m, allowed.cpu().numpy(), chars)
    if found is False:
        why = ""
        if needed:
            c = needed
            what = "a character this model never saw" if c not in vocab.stoi else \
                f"a character {param('ban')}, {param('allow')} or the run's labels leave out"
            why = f" (it needs {c!r} (U+{ord(c):04X}) there, {what})"
        raise ConfigError(f"{param(kind)}: no text this model can write matches the {pattern.words()}{why}; change "
                          f"the {pattern.words()}, or write with a run whose text has the characters it needs")
    if found is None:
        pattern.unproven = (f"note: the check before decoding found no text of up to {PROBE_DEPTH} characters this "
                            f"model can write that completes the {pattern.words()}; if it needs a character the "
                            f"model never saw, its samples end incomplete (their scores say so)")
    return pattern


def _fill(matcher, words, row, stoi):
    """Row `row` of llguidance's bitmask `words`: the ids the matcher allows next; -> the character the pattern
    forces next, or "". Where it forces its next characters, the first of them alone: llguidance's mask there takes
    the forced text as written and allows what may follow it, which lets a sample skip a character its vocabulary
    lacks."""
    forced = matcher.compute_ff_bytes()
    first = forced.decode("utf-8", "ignore")[:1] if forced else ""
    if not first:
        llguidance().numpy.fill_next_token_bitmask(matcher, words, row)
        return ""
    words[row] = 0
    i = stoi.get(first)
    if i is not None:
        words.view(np.uint32)[row, i // 32] = np.uint32(1) << np.uint32(i % 32)
    return first


def _bits(words, size):
    """llguidance's bitmask (rows, W) int32 -> (rows, size + 1) bool: bit j of the little-endian words is id j."""
    return np.unpackbits(words.view(np.uint8), axis=1, bitorder="little")[:, :size + 1].astype(bool)


def probe(matcher, allowed, chars, steps=PROBE_STEPS, depth=PROBE_DEPTH):
    """Whether some text of the `allowed` characters ((V,) bool) is one the pattern accepts: a depth-first search
    from the matcher's state that tries the end first, then each character the fewer times it is already in the text
    (so a free span ends: `"a` tries `"` before another `a`), punctuation before spaces before letters. -> (True,
    None) when it finds one; (False, the character the pattern needed where the search last got stuck, or None)
    when there is none; (None, None) when `steps` ran out first (decoding then goes on: a row that gets stuck ends
    there, said in its score). The matcher is left where it started."""
    size, ext, stoi = len(chars), np.append(allowed, True), {c: i for i, c in enumerate(chars)}
    words = np.zeros((1, (size + 32) // 32), dtype=np.int32)
    order = np.array(_kind_order(chars), dtype=np.int64)
    counts = np.zeros(size, dtype=np.int64)  # how often each id is in the text the search is at
    budget, needed, depth_now = [steps], [None], [0]

    def go():
        forced = _fill(matcher, words, 0, stoi)
        bits = _bits(words, size)[0] & ext
        if bits[size]:
            return True
        ids = order[bits[order]]
        if not len(ids):
            needed[0] = forced or needed[0]
            return False
        if depth_now[0] >= depth:
            return None
        seen = counts[ids]  # the ids not yet in the text first, in the kind order; then the others, fewest first
        ids = np.concatenate([ids[seen == 0], ids[seen > 0][np.argsort(seen[seen > 0], kind="stable")]])
        undecided = False
        for i in ids.tolist():
            if budget[0] <= 0:
                return None
            budget[0] -= 1
            if not matcher.consume_token(i):
                return None
            counts[i] += 1
            depth_now[0] += 1
            result = go()
            counts[i] -= 1
            depth_now[0] -= 1
            matcher.rollback(1)
            if result:
                return True
            undecided |= result is None
        return None if undecided else False

    result = go()
    return result, (needed[0] if result is False else None)


def _kind_order(chars):
    """The ids in the order the search tries them: punctuation and symbols (what closes a span: quotes, brackets,
    commas), then spaces and line breaks, then letters and digits; by id within each."""
    kind = [2 if c.isalnum() else 1 if c.isspace() else 0 for c in chars]
    return sorted(range(len(chars)), key=lambda i: kind[i])


class Matchers:
    """One matcher per row of a batch. mask() -> (fits (B, V) bool: the characters the pattern allows next,
    may_end (B,) bool: whether the text may end here); advance(ids) feeds each live row its chosen id (V: the end).
    A row that ended (chose the end, was completed, or stuck: stop(row)) is left alone: its mask allows every
    character and never the end."""

    def __init__(self, pattern, rows):
        self.size, self.rows, self.stoi = pattern.size, [pattern.matcher() for _ in range(rows)], pattern.stoi
        self.live = np.ones(rows, dtype=bool)
        self.words = np.zeros((rows, (pattern.size + 32) // 32), dtype=np.int32)

    def mask(self):
        for r, m in enumerate(self.rows):
            if self.live[r]:
                _fill(m, self.words, r, self.stoi)
        bits = _bits(self.words, self.size)
        bits[~self.live] = True
        bits[~self.live, self.size] = False
        return torch.from_numpy(np.ascontiguousarray(bits[:, :self.size])), torch.from_numpy(bits[:, self.size].copy())

    def stop(self, row):
        self.live[row] = False

    def advance(self, ids):
        """-> (the rows the pattern is complete in, the rows whose character it refused: their matcher's error)."""
        complete, refused = [], {}
        for r, c in enumerate(ids):
            if not self.live[r]:
                continue
            if c == self.size:  # the end
                self.live[r] = False
            elif not self.rows[r].consume_token(c):  # never where the mask allowed c; said if it does
                self.live[r] = False
                refused[r] = one_line(self.rows[r].get_error(), limit=200)
            elif self.rows[r].is_stopped():
                self.live[r] = False
                complete.append(r)
        return complete, refused
