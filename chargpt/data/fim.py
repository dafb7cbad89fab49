"""Fill in the middle: --fim RATE teaches a text run to write what goes between a given before and after.

    python train.py --data data/tang_poems.txt --fim 0.5
    python sample.py --prompt "床前明月光，" --suffix "举头望明月，低头思故乡。" --form "_____，"

With probability RATE a training window is cut into prefix, middle and suffix and laid out PRE SUF suffix MID prefix
middle END: the suffix-prefix-middle order (SPM) of Bavarian et al. 2022, "Efficient Training of Language Models to
Fill in the Middle". SPM rather than PSM because there the middle goes on straight from the prefix, as text does:
everything the model learns left to right carries over to writing the middle, and only where to stop (END, where the
text reaches the suffix) needs the suffix. With PSM a small character model must first learn to find where the prefix
ended from across the suffix; in a measured tiny run it had not (it wrote the line from its start again), where SPM
filled the gaps. Laid out this way, where the prefix ends and the middle begins is invisible in training, so the two
cut points drawn are where the middle ends and where the suffix ends: the text after the suffix follows END as plain
text, so that END is not always the window's last character (a model would learn to close the middle by its
position, not by reaching the suffix). The window keeps its length: the layout takes its first block_size + 1 - 4
characters.

The four markers are private to the model, as labels' are (chargpt/data/labels.py): characters of Unicode's plane-16
private-use area, added to the vocabulary, recorded in the checkpoint's metadata (META_KEY), never written by a sample
(END aside, which ends an infill and is not written) and refused in a prompt. A corpus that holds one of them as text
keeps it as text: the markers are the next free characters instead, said at start. The markers are never targets
(IGNORE_INDEX), END aside: what precedes MID is where the window was cut, which is chance, not text. The other windows,
and every validation window, are plain left-to-right text, so a FIM run's validation loss compares with any other
run's.
"""

from dataclasses import dataclass

import numpy as np
import torch

from chargpt.config.flags import param
from chargpt.errors import ChargptError, ConfigError, DataError
from chargpt.model.loss import IGNORE_INDEX

META_KEY = "fim"  # the checkpoint metadata: {"pre": char, "suf": char, "mid": char, "end": char}
ROLES = ("pre", "suf", "mid", "end")
FIRST = 0x100000  # plane 16's private-use area: labels use plane 15's (chargpt/data/labels.py)
LAST = 0x10FFFD


@dataclass(frozen=True)
class FimMarkers:
    """The four characters a FIM run lays its examples out with: PRE SUF suffix MID prefix middle END."""
    pre: str
    suf: str
    mid: str
    end: str

    @classmethod
    def choose(cls, taken, previous=None):
        """The markers of a run: the previous run's (--resume, --init-from a FIM run), else the first four plane-16
        private-use characters not in `taken` (the corpus's and the base's characters) -> (markers, a note or "")."""
        if previous is not None:
            return previous, ""
        taken = set(taken)
        free, point = [], FIRST
        while len(free) < len(ROLES):
            if point > LAST:
                raise DataError("the text holds every private-use character of plane 16; there is none left to mark "
                                "fill-in-the-middle examples with")
            if chr(point) not in taken:
                free.append(chr(point))
            point += 1
        markers = cls(*free)
        skipped = sorted(c for c in taken if FIRST <= ord(c) < ord(free[-1]))
        note = "" if not skipped else (
            f"note: the text holds U+{ord(skipped[0]):04X}, a private-use character fill-in-the-middle marks with by "
            f"default; its markers are U+{ord(markers.pre):04X}, U+{ord(markers.suf):04X}, U+{ord(markers.mid):04X} "
            f"and U+{ord(markers.end):04X} instead")
        return markers, note

    @classmethod
    def from_meta(cls, meta):
        """A checkpoint's markers, or None for a run without FIM (checked: the metadata is untrusted)."""
        value = (meta or {}).get(META_KEY)
        if value is None:
            return None
        try:
            chars = [value[r] for r in ROLES]
            vocab = meta.get("vocab")
            if not all(isinstance(c, str) and len(c) == 1 and FIRST <= ord(c) <= LAST for c in chars) or \
                    len(set(chars)) != len(chars) or (vocab is not None and not all(c in vocab.stoi for c in chars)):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ChargptError("the checkpoint's fill-in-the-middle markers are damaged; re-train or re-copy it") \
                from None
        return cls(*chars)

    def to_meta(self):
        return {r: getattr(self, r) for r in ROLES}

    def chars(self):
        return [self.pre, self.suf, self.mid, self.end]

    def context(self, before, after):
        """The text a FIM model reads before it writes the middle (which goes on from `before`)."""
        return f"{self.pre}{self.suf}{after}{self.mid}{before}"


def check_settings(cfg):
    """--fim is a share of the windows, of a text run."""
    if not 0.0 <= cfg.fim <= 1.0:  # also catches NaN
        raise ConfigError(f"{param('fim')} must be in [0, 1] (the share of training windows laid out for fill in "
                          f"the middle; 0: off), got {cfg.fim}")
    if cfg.fim and cfg.task != "text":
        raise ConfigError(f"{param('fim')} is for text runs; drop it, or drop {param('task', 'pairs')}")


def describe(rate):
    return (f"fill in the middle: {rate:.0%} of training windows laid out prefix-suffix-middle ({param('fim')}); "
            f"validation reads plain text")


def check_room(block_size):
    if block_size < 2 * len(ROLES):
        raise ConfigError(f"{param('fim')} needs a context of at least {2 * len(ROLES)} characters (4 markers and "
                          f"text between them); raise {param('block_size')}")


def layout_index(keep, length, cut, stop):
    """Where each position of a FIM row comes from, for a row of `length` ids whose first `keep` stay in front (a
    label) and whose text is cut at cut <= stop (offsets into the text): an index into the row followed by the four
    markers (length, length+1, ... for PRE, SUF, MID, END). -> (length,) int64: [keep] PRE SUF text[cut:stop] MID
    text[:cut] END text[stop:m], where m = length - keep - 4 (the text that fits beside the markers)."""
    m = length - keep - len(ROLES)
    t = np.arange(keep, keep + m)
    pre, suf, mid, end = length, length + 1, length + 2, length + 3
    return np.concatenate([np.arange(keep), [pre, suf], t[cut:stop], [mid], t[:cut], [end], t[stop:]]).astype(np.int64)


class FimBatches:
    """Training batches of which a share of rows are laid out for fill in the middle (layout_index); everything else
    (validation, the plain view, every attribute) is the wrapped batches'. The cut points and which rows are laid out
    come from the batch generator, so a resumed run draws the same batches."""

    def __init__(self, inner, rate, marker_ids, keep=0):
        self.inner, self.plain, self.rate, self.keep = inner, inner, rate, keep
        self.marker_ids = torch.tensor(marker_ids, dtype=torch.long)  # PRE, SUF, MID, END

    def __getattr__(self, name):  # split, windows, ...: the wrapped batches'
        return getattr(self.inner, name)

    def get(self, split, generator, **kw):
        x, y = self.inner.get(split, generator, **kw)
        if split != "train" or not self.rate:
            return x, y
        B, T = x.shape
        m = T + 1 - self.keep - len(ROLES)  # text a laid-out row holds
        # drawn for every row, laid out or not: the generator moves on by the same amount at every batch
        chosen = torch.rand(B, generator=generator, dtype=torch.float64).numpy() < self.rate
        cuts = np.sort(torch.randint(m + 1, (B, 2), generator=generator).numpy(), axis=1)
        rows = np.flatnonzero(chosen)
        if not len(rows):
            return x, y
        seq = torch.cat([x[:, :1], y], dim=1)  # (B, T+1): the window, its label first where it has one
        index = torch.from_numpy(np.stack([layout_index(self.keep, T + 1, *map(int, cuts[r])) for r in rows]))
        ext = torch.cat([seq[rows], self.marker_ids.to(seq.device).expand(len(rows), -1)], dim=1)
        laid = torch.gather(ext, 1, index.to(seq.device))  # (rows, T+1)
        seq = seq.clone()
        seq[rows] = laid
        x, y = seq[:, :-1].contiguous(), seq[:, 1:].clone()
        pre, suf, mid = (int(v) for v in self.marker_ids[:3])
        y[torch.from_numpy(rows).to(y.device)] = unlearned(y[rows], pre, suf, mid)
        return x, y


def unlearned(targets, pre, suf, mid):
    """A laid-out row's targets with PRE, SUF and MID ignored: where the window was cut is chance, not text (and SUF
    always follows PRE)."""
    hide = (targets == pre) | (targets == suf) | (targets == mid)
    return targets.masked_fill(hide, IGNORE_INDEX)
