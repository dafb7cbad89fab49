"""Lists: a corpus whose lines are items (names, titles, one-line jokes), trained with --items.

Each line that holds more than whitespace is an item. The validation split holds out whole items: a fixed pseudo-
random choice of --val-fraction of them (seed 0, not --seed, as sentence pairs are split: every run on the same list
validates on the same items, and a sorted list puts every part of it in both splits). Training reads its items, in
list order, as one text, each item after a newline and ending with one ("\\nitem\\nitem\\n..."), and so does
validation: a newline is what the model reads before every item, so an empty context ("\\n") means "the start of an
item", and a sample of an items run starts there and ends at the next newline
(chargpt.sampling.engine.Generator.items).

The text of both splits is built in memory (MAX_ITEMS_CHARS bounds it): a list is small.
"""

from dataclasses import dataclass

import numpy as np

from chargpt.config.flags import param
from chargpt.data.corpus import Split, split_whole
from chargpt.errors import ConfigError, DataError

MAX_ITEMS_CHARS = 200_000_000  # a list larger than this is not a list: train it as plain text
MAX_TRIES = 10  # sampling makes at most this many generations per item asked for (empty items, copies)


def item_bounds(ids, vocab):
    """The items of an encoded corpus: (n, 2) [start, end) of its lines that hold more than whitespace (a blank
    line, spaces alone included, is no item), a line's "\r" (CRLF files) left out. `ids` may be a memory map."""
    if len(ids) > MAX_ITEMS_CHARS:
        raise DataError(f"{param('items')}: the corpus has {len(ids):,} characters, more than the {MAX_ITEMS_CHARS:,} "
                        f"a list may hold; drop {param('items')} to train on it as plain text")
    newline, carriage = vocab.stoi.get("\n"), vocab.stoi.get("\r")
    ids = np.asarray(ids)
    ends_at = np.flatnonzero(ids == newline) if newline is not None else np.zeros(0, dtype=np.int64)
    starts = np.concatenate([[0], ends_at + 1]).astype(np.int64)
    ends = np.concatenate([ends_at, [len(ids)]]).astype(np.int64)
    if carriage is not None:
        cr = (ends > starts) & (ids[np.maximum(ends - 1, 0)] == carriage)
        ends = ends - cr
    blank = np.array([c.isspace() for c in vocab.chars])
    seen = np.concatenate([[0], np.cumsum(~blank[ids])])  # characters other than whitespace up to each position
    keep = seen[ends] > seen[starts]
    return np.stack([starts[keep], ends[keep]], axis=1)


def split_items(n_items, val_fraction):
    """-> (train item indices, validation item indices), each sorted: a fixed pseudo-random choice of whole items."""
    return split_whole(n_items, val_fraction, lambda which: DataError(
        f"{n_items:,} items x {param('val_fraction', val_fraction)} leaves the {which} split without an item; give "
        f"more items (one per line) or change {param('val_fraction')}"))


@dataclass
class ItemsLayout:
    """The text an items run trains and validates on: `ids` holds the training items, then the validation items,
    each part "\\n" + its items each followed by "\\n"; `split` says which is which."""
    ids: np.ndarray
    split: Split
    corpus_split: Split  # the same items where they are in the corpus (for its novelty index)
    n_train: int
    n_val: int
    too_long: int  # items longer than the context (with the newline before them)
    longest: int

    def describe(self, block_size):
        """Start-up lines: the split, and a warning when some items do not fit in the context."""
        lines = [f"items: {self.n_train + self.n_val:,} items (one a line, blank lines dropped); validation: "
                 f"{self.n_val:,} whole items ({self.split.size('val'):,} characters), chosen at random with a fixed "
                 f"seed; samples start at a newline and end at the next"]
        if self.too_long:
            lines.append(f"warning: {self.too_long:,} item(s) are longer than the context ({param('block_size')} "
                         f"{block_size}; the longest has {self.longest:,} characters): the model never reads them "
                         f"whole from their start; a larger {param('block_size')} fits them")
        return lines


def items_layout(ids, vocab, val_fraction, block_size):
    """An encoded corpus read as a list -> ItemsLayout. Raises the one-line error when the list is too small."""
    newline = vocab.stoi.get("\n")
    bounds = item_bounds(ids, vocab)
    if len(bounds) < 2:
        raise DataError(f"{param('items')}: the corpus has {len(bounds)} item(s), and a list needs at least two (one "
                        f"item a line) to hold some out for validation; give a list, or drop {param('items')}")
    if newline is None:
        raise DataError(f"{param('items')}: the corpus has no line ends")  # unreachable: two items need one
    train, val = split_items(len(bounds), val_fraction)
    ids = np.asarray(ids)
    parts = []
    for rows in (train, val):
        pieces = [np.array([newline], dtype=ids.dtype)]
        for a, b in bounds[rows]:
            pieces += [ids[a:b], pieces[0]]
        parts.append(np.concatenate(pieces))
    n_train = len(parts[0])
    text = np.concatenate(parts)
    for name, n in (("training", n_train), ("validation", len(parts[1]))):
        if n <= block_size:
            raise DataError(f"{param('items')}: the {name} items hold {n:,} characters with their newlines, fewer "
                            f"than one window of {param('block_size', block_size)} + 1; use "
                            f"{param('block_size', max(1, n - 1))} or less, or give more items")
    lengths = bounds[:, 1] - bounds[:, 0]
    split = Split("items", np.array([[0, n_train]]), np.array([[n_train, len(text)]]))
    in_corpus = Split("items", bounds[train], bounds[val])
    return ItemsLayout(text, split, in_corpus, len(train), len(val), int((lengths + 1 > block_size).sum()),
                       int(lengths.max()))


def corpus_items(corpus):
    """The set of an encoded corpus's items (its lines with more than whitespace, as strings): what a sample is a
    copy of."""
    vocab = corpus.vocab
    ids = np.asarray(corpus.ids())
    chars = np.array(vocab.chars, dtype=object)
    return {"".join(chars[ids[a:b]]) for a, b in item_bounds(ids, vocab)}


def is_items_run(meta):
    """Whether a checkpoint's metadata is that of a run trained with --items."""
    from chargpt.runs.checkpoint import run_settings  # checkpoints come after the data they hold
    return bool(getattr(run_settings(meta), "items", False))


@dataclass
class ItemSamples:
    """What Generator.items wrote: `items` (at most the number asked), and the count of generations it made."""
    items: list
    tries: int
    empty: int  # generations that ended at once (an empty item), retried
    copies: int  # items that were copies of the list (kept unless new_only)
    dropped: int  # copies left out (new_only)


def check_item_options(settings, prompt):
    """What a list's items cannot be asked for (one-line ConfigErrors, before any work): an item is one line that
    starts with the prompt, so the prompt holds no line break; best-of ranks text samples; an acrostic gives each
    item its first character, so it cannot follow a prompt."""
    if "\n" in prompt or "\r" in prompt:
        raise ConfigError(f"a list's items are one line each and the prompt starts every one, so it may not hold a "
                          f"line break; give {param('prompt')} one line")
    if settings.best_of:
        raise ConfigError(f"{param('best_of')} ranks text samples; a list's items take {param('new_only')} instead")
    if settings.acrostic and prompt:
        raise ConfigError(f"on a list, {param('acrostic')} gives each item its first character, so it cannot follow "
                          f"a {param('prompt')}; drop one of them")


def acrostic_items(sample, n, letters, seed=None):
    """A list under an acrostic: item k starts with letters[k] (the letters cycle when there are more items).
    sample(letter, count, seed) -> ItemSamples of `count` items starting with `letter`; each position of the
    acrostic is sampled as one batch (its own seeds), and the items interleaved back into acrostic order."""
    parts, span = [], MAX_TRIES * n + 1  # seeds a position's rounds may use (sample_items: seed + round)
    for j, letter in enumerate(letters[:n]):
        count = len(range(j, n, len(letters)))
        parts.append(sample(letter, count, None if seed is None else (seed + j * span) % 2**63))
    got = []
    for k in range(n):
        items = parts[k % len(letters)].items  # a position that came short (--new-only's tries ran out) leaves gaps
        if k // len(letters) < len(items):
            got.append(items[k // len(letters)])
    return ItemSamples(got, *(sum(getattr(p, f) for p in parts) for f in ("tries", "empty", "copies", "dropped")))


def sample_items(generate, n, seed=None, known=None, new_only=False, batch=None):
    """Sample n items: generate(count, seed) -> `count` texts, each cut at its first newline. An empty item is
    retried (it is no item); with new_only, copies of `known` (a set of the list's items) are left out and sampling
    goes on. At most MAX_TRIES * n generations in all, so a model that only copies ends: -> ItemSamples (fewer items
    than n when the tries ran out)."""
    got, tries, empty, copies, dropped, round_ = [], 0, 0, 0, 0, 0
    batch = batch or n
    while len(got) < n and tries < MAX_TRIES * n:
        count = min(max(batch, n - len(got)), MAX_TRIES * n - tries)
        texts = generate(count, None if seed is None else seed + round_)
        round_ += 1
        tries += count
        for text in texts:
            text = text.split("\n", 1)[0].removesuffix("\r")
            if not text.strip():  # whitespace alone is no item
                empty += 1
                continue
            copy = known is not None and text in known
            if copy and new_only:
                dropped += 1
                continue
            if len(got) < n:
                got.append(text)
                copies += copy
    return ItemSamples(got, tries, empty, copies, dropped)
