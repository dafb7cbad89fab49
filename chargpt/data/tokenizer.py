"""The character vocabulary: build it from text, encode, decode, and decide what to do with unknown characters.

A vocabulary is the sorted list of distinct characters (Unicode code points) of the corpus; a character's id is
its index in that list. A run started from another (--init-from) keeps the base's ids and appends the new text's
characters after them (Vocab.extended), so its list is sorted only piecewise.
Encoding large text is vectorised: the text becomes an array of code points
(via UTF-32) and a lookup table indexed by code point maps every one to its id at once.
"""

import numpy as np

from chargpt.config.flags import param
from chargpt.errors import ChargptError

UNKNOWN_POLICIES = ("error", "skip", "replace")
# Stand-ins tried in order by the 'replace' policy; the first one in the vocabulary wins, else the first
# vocabulary character.
REPLACEMENT_CANDIDATES = ("\ufffd", "?", " ")
MAX_CODEPOINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)  # halves of UTF-16 pairs: not characters, and no UTF-8 output can write one


def codepoints(text):
    """str -> uint32 array of its code points (no Python loop per character)."""
    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def describe_chars(found):
    """[(position, char)] -> "'é' (U+00E9) at 3, ..." (at most 10 listed)."""
    shown = ", ".join(f"{c!r} (U+{ord(c):04X}) at {i}" for i, c in found[:10])
    return shown + (f" and {len(found) - 10} more" if len(found) > 10 else "")


class Vocab:
    def __init__(self, chars):
        chars = list(chars)
        if not chars:
            raise ChargptError("the vocabulary is empty: the corpus has no characters")
        if any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise ChargptError("vocabulary must be a list of distinct single characters")
        self.chars = chars
        self.points = codepoints("".join(chars))  # in id order: id i is code point points[i]
        lone = self.points[(self.points >= SURROGATES[0]) & (self.points <= SURROGATES[1])]
        if len(lone):
            raise ChargptError(f"the vocabulary holds {len(lone)} lone surrogate(s), U+{int(lone[0]):04X} first: "
                               f"halves of UTF-16 pairs, not characters")
        self.stoi = {c: i for i, c in enumerate(chars)}
        self._table = None  # code point -> id, built on first use

    @classmethod
    def from_text(cls, text):
        return cls.from_codepoints(np.unique(codepoints(text)))

    @classmethod
    def from_codepoints(cls, points):
        return cls(chr(int(p)) for p in np.unique(points))

    def extended(self, other):
        """This vocabulary's characters, then those of `other` it lacks, in other's order: every id of self keeps
        its character, so a model's rows for them stay valid (chargpt/training/init_from.py)."""
        return Vocab(self.chars + [c for c in other.chars if c not in self.stoi])

    def __len__(self):
        return len(self.chars)

    def __eq__(self, other):
        return isinstance(other, Vocab) and self.chars == other.chars

    @property
    def id_dtype(self):
        """The smallest unsigned dtype that holds every id."""
        return np.uint16 if len(self) <= 65535 else np.uint32

    def lookup(self, points):
        """Vectorised code points -> (ids in id_dtype, known mask); an unknown code point's id is meaningless."""
        if self._table is None:  # 1.1M entries (2 or 4 MB); the largest value of the dtype marks "not in it"
            self._table = np.full(MAX_CODEPOINT + 1, np.iinfo(self.id_dtype).max, dtype=self.id_dtype)
            self._table[self.points] = np.arange(len(self), dtype=self.id_dtype)
        ids = self._table[points]
        return ids, ids != np.iinfo(self.id_dtype).max

    def ids_from_codepoints(self, points):
        """Vectorised code points -> ids (in id_dtype); raises if any code point is outside the vocabulary."""
        ids, known = self.lookup(points)
        bad = ~known
        if bad.any():
            raise ChargptError(f"{int(bad.sum())} characters are not in the vocabulary")
        return ids

    def unknown(self, text):
        """[(position, char)] for every character of text outside the vocabulary."""
        return [(i, c) for i, c in enumerate(text) if c not in self.stoi]

    def replacement(self):
        for c in REPLACEMENT_CANDIDATES:
            if c in self.stoi:
                return c
        return self.chars[0]

    def encode(self, text, unknown="error", what="prompt"):
        """str -> list of ids. `unknown` says what to do with characters outside the vocabulary:
        'error' raises naming them (and `what` the text is: the prompt, the suffix), 'skip' drops them, 'replace' maps
        them to `replacement()`."""
        if unknown not in UNKNOWN_POLICIES:
            raise ChargptError(f"{param('unknown')} must be one of {', '.join(UNKNOWN_POLICIES)} (got {unknown!r})")
        missing = self.unknown(text)
        if missing and unknown == "error":
            raise ChargptError(f"{what} has {len(missing)} character(s) the model never saw: "
                               f"{describe_chars(missing)}; "
                               f"remove them, or pass {param('unknown', 'skip')} or {param('unknown', 'replace')}")
        if missing and unknown == "skip":
            text = "".join(c for c in text if c in self.stoi)
        elif missing:
            stand_in = self.replacement()
            text = "".join(c if c in self.stoi else stand_in for c in text)
        return [self.stoi[c] for c in text]

    def decode(self, ids):
        return "".join(self.chars[int(i)] for i in ids)


class Unknowns:
    """Lines passed through as they are read, counting those with characters outside `vocab`; with the 'skip' or
    'replace' policy, warning() then says in one line how many sentences had them (with 'error' the encoder stops
    at the first, naming it)."""

    def __init__(self, vocab, lines, unknown):
        self.vocab, self.lines, self.unknown, self.affected, self.first = vocab, lines, unknown, 0, None

    def __iter__(self):
        for line in self.lines:
            found = self.vocab.unknown(line)
            if found:
                self.affected += 1
                self.first = self.first or found
            yield line

    def warning(self):
        """'N sentence(s) had characters the model never saw, dropped (the first: ...)', or None."""
        if not self.affected or self.unknown == "error":
            return None
        what = "dropped" if self.unknown == "skip" else f"replaced with {self.vocab.replacement()!r}"
        return (f"{self.affected} sentence(s) had characters the model never saw, {what} (the first: "
                f"{describe_chars(self.first)})")
