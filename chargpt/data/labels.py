"""Several texts, one model: --labels names the text each part of a folder is (an author, a genre), and the model
learns to write in the style of the label it is given.

    python train.py --data data/authors/ --labels folders      # each subfolder is a label
    python train.py --data data/authors/ --labels files        # each file (its name without extension)
    python train.py --data data/authors/ --labels labels.tsv   # file<TAB>label lines, paths relative to it
    python sample.py --label austen --prompt "It was"

Each label is one entry of the vocabulary: a character of Unicode's supplementary private-use plane (U+F0001 on;
real text never holds one, and a corpus that does is refused), and U+F0000 is the NULL label, "no label". A
training window is [label] + block_size - 1 characters of that label's text, so the model reads the label first in
every window; --label-dropout of the windows get NULL instead, so that the model also writes unconditioned, which
classifier-free guidance (--guidance F: logits = uncond + F * (cond - uncond)) mixes with the conditioned logits.
Sampling keeps the label at position 0 when the window slides (chargpt.sampling.decode.decode's `pin`).

Being a vocabulary entry, a label survives the Hugging Face export as it is: there its token is the added token
"⟨name⟩" (NULL: "⟨⟩"), so tokenizer("⟨austen⟩It was") with stock transformers writes in that style.

Validation: each label's text is split on its own (--val-split, as a corpus), so every label validates, and each
evaluation records the validation loss of each label (val_loss_by_label in metrics.jsonl). Batches draw their
labels by --label-sampling: proportional (to the label's characters) or balanced (each label equally often).
"""

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from chargpt.config.flags import param
from chargpt.data.corpus import Source, Split, corpus_sources, iter_text, looks_binary, make_split
from chargpt.data.tokenizer import codepoints
from chargpt.errors import ChargptError, ConfigError, DataError
from chargpt.runtime import autocast

NULL = "\U000f0000"
FIRST_LABEL = 0xF0001
LAST_LABEL = 0xFFFFD
META_KEY = "labels"  # the checkpoint metadata: {"null": char, "names": {name: char}}
LABEL_SOURCES = ("folders", "files")
MAX_LABELS = 10_000
MAX_NAME = 100
MAX_MANIFEST_BYTES = 1 << 20
SHOWN = 12  # labels listed by name in a start-up line


class UnknownLabel(ChargptError):
    pass


def usable(name):
    return isinstance(name, str) and 0 < len(name) <= MAX_NAME and not any(
        c.isspace() or not c.isprintable() or c in "⟨⟩" for c in name)


def check_name(name, where):
    if not usable(name):
        raise DataError(f"{where}: {name!r} is not a usable label; a label is 1 to {MAX_NAME} printable characters, "
                        f"no spaces, tabs or ⟨⟩")
    return name


def token_strings(vocab, labels):
    """Each id's string outside chargpt: its character, or ⟨name⟩ for a label's (⟨⟩ for NULL)."""
    if labels is None:
        return list(vocab.chars)
    names = {c: rendered(labels.name_of(c)) for c in labels.chars()}
    return [names.get(c, c) for c in vocab.chars]


def rendered(name):
    """How a label's token is written outside chargpt (the Hugging Face tokenizer): ⟨name⟩; NULL (None): ⟨⟩."""
    return f"⟨{name or ''}⟩"


@dataclass
class LabelSet:
    """The labels of a run: name -> its vocabulary character, and the NULL character."""
    names: dict
    null: str = NULL

    @classmethod
    def assign(cls, names, previous=None):
        """Characters for `names`: a name the previous run (--resume, --init-from) had keeps its character, a new
        one gets the next free one."""
        known = dict(previous.names) if previous else {}
        taken = {ord(c) for c in known.values()}
        nxt = max(taken, default=FIRST_LABEL - 1) + 1
        for name in names:
            if name not in known:
                if nxt > LAST_LABEL:
                    raise DataError(f"too many labels (at most {LAST_LABEL - FIRST_LABEL + 1:,})")
                known[name] = chr(nxt)
                nxt += 1
        return cls(known, previous.null if previous else NULL)  # the previous run's labels stay writable

    @classmethod
    def from_meta(cls, meta):
        """A checkpoint's labels, or None for a run without (checked: the metadata is untrusted)."""
        value = (meta or {}).get(META_KEY)
        if value is None:
            return None
        try:
            names, null, vocab = value["names"], value["null"], meta.get("vocab")
            ok = isinstance(names, dict) and len(names) <= MAX_LABELS and isinstance(null, str) and all(
                usable(k) and isinstance(c, str) and len(c) == 1 for k, c in names.items())
            if not ok or (vocab is not None and not all(c in vocab.stoi for c in [null, *names.values()])):
                raise ValueError
        except (KeyError, TypeError, ValueError):
            raise ChargptError("the checkpoint's labels are damaged; re-train or re-copy it") from None
        return cls(dict(names), null)

    def to_meta(self):
        return {"null": self.null, "names": dict(self.names)}

    def chars(self):
        return [self.null, *self.names.values()]

    def token(self, name):
        """A label's character (None or "": NULL); an unknown name is the one-line error listing the labels."""
        if not name:
            return self.null
        if name not in self.names:
            listed = ", ".join(list(self.names)[:50]) + (" ..." if len(self.names) > 50 else "")
            raise UnknownLabel(f"unknown label {name!r}; this run's labels: {listed}")
        return self.names[name]

    def name_of(self, char):
        """The name of a label character ("" for NULL), or None for a character of the text."""
        if char == self.null:
            return ""
        return next((n for n, c in self.names.items() if c == char), None)


def check_settings(cfg):
    """--labels, --items and --label-dropout make sense together (before any work)."""
    if not 0.0 <= cfg.label_dropout < 1.0:
        raise ConfigError(f"{param('label_dropout')} must be in [0, 1) (got {cfg.label_dropout})")
    if (cfg.items or cfg.labels) and (cfg.task != "text" or cfg.items and cfg.labels):
        raise ConfigError(f"{param('items')} and {param('labels')} are for text, one at a time; drop one")


# --- which file is which label -------------------------------------------------------------------------------------
def label_sources(data, how, encoding="utf-8"):
    """--data FOLDER and --labels folders|files|MANIFEST.tsv -> (corpus name, [Source] grouped by label in label
    order, [label of each source])."""
    if how in LABEL_SOURCES:
        if data is None or not Path(data).expanduser().is_dir():
            raise ConfigError(f"{param('labels', how)} reads the labels from a folder; pass {param('data')} with a "
                              f"folder of text files")
        name, sources = corpus_sources(data, encoding)
        if how == "folders":
            flat = [s.name for s in sources if len(Path(s.name).parts) < 2]
            if flat:
                raise DataError(f"{param('labels', 'folders')}: {flat[0]} is not in a subfolder of {data} (each "
                                f"subfolder is a label); move it into one, or use {param('labels', 'files')}")
            labels = [Path(s.name).parts[0] for s in sources]
        else:
            labels = [Path(s.name).stem or Path(s.name).name for s in sources]
        _check_dropped(data, how, set(labels), encoding)
    else:
        name, sources, labels = _manifest(data, how)
    for label in set(labels):
        check_name(label, f"{param('labels')} {how}")
    order = sorted(set(labels))
    if len(order) > MAX_LABELS:
        raise DataError(f"{param('labels')}: {len(order):,} labels, more than {MAX_LABELS:,}")
    rank = {label: i for i, label in enumerate(order)}
    pairs = sorted(zip(sources, labels), key=lambda p: rank[p[1]])  # stable: the files of a label keep their order
    return name, [s for s, _ in pairs], [label for _, label in pairs]


def _label_of(rel, how):
    """A file's label under --labels folders (its top folder; None for a file beside them) or files (its name)."""
    if how == "folders":
        return rel.parts[0] if len(rel.parts) > 1 else None
    return rel.stem or rel.name


def _check_dropped(data, how, kept, encoding):
    """A folder's corpus leaves out files that are not text (a NUL byte); a label all of whose files were left out
    would vanish from the run unsaid, so it is an error naming the file."""
    root = Path(data).expanduser()
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = file.relative_to(root)
        label = _label_of(rel, how)
        if label is None or label in kept or any(part.startswith(".") for part in rel.parts):
            continue
        found = looks_binary(file, encoding) if os.access(file, os.R_OK) else None
        why = f"has a NUL byte at offset {found[0]}, so it is not text" if found else "is not readable"
        raise DataError(f"{param('labels', how)}: label {label!r} has no text file ({rel} {why}); fix or remove it")


def _manifest(data, path):
    """A manifest of file<TAB>label lines (paths relative to it; blank lines and # comments skipped)."""
    manifest = Path(path).expanduser()
    if not manifest.is_file():
        raise ConfigError(f"{param('labels')} {path}: not folders, files or a manifest file that exists; pass "
                          f"{param('labels', 'folders')}, {param('labels', 'files')} or a TSV of file<TAB>label lines")
    if manifest.stat().st_size > MAX_MANIFEST_BYTES:
        raise DataError(f"{path} is larger than {MAX_MANIFEST_BYTES:,} bytes; a manifest lists files, one a line")
    try:  # utf-8-sig: a byte-order mark some editors write would otherwise be part of the first file's name
        text = manifest.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); save the manifest as UTF-8") from None
    sources, labels = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise DataError(f"{path} line {n}: {line[:40]!r} is not file<TAB>label")
        file = manifest.parent / parts[0]
        if not file.is_file():
            raise DataError(f"{path} line {n}: {parts[0]} not found (paths are relative to the manifest)")
        sources.append(Source(parts[0], path=file))
        labels.append(parts[1].strip())
    if not sources:
        raise DataError(f"{path} lists no files; write file<TAB>label lines")
    name = Path(data).expanduser().resolve().name if data else manifest.stem
    return name, sources, labels


def label_spans(sources, labels, encoding="utf-8", errors="strict"):
    """Where each label's text lies in the corpus the sources make (chargpt.data.corpus.iter_text: a newline between
    files that lack one) -> {label: (start, end)} character offsets, and the corpus length."""
    spans, pos, last = {}, 0, ""
    for src, label in zip(sources, labels):
        if last and last != "\n":
            pos += 1  # the newline iter_text puts between the files
        start = pos
        for text in iter_text([src], encoding, errors):
            pos += len(codepoints(text))
            last = text[-1]
        a, _ = spans.get(label, (start, pos))
        spans[label] = (a, pos)
    return spans, pos


# --- batches --------------------------------------------------------------------------------------------------------
class LabelBatches:
    """Windows of a labelled corpus: x = [label] + block_size - 1 characters of that label's text, y = those
    characters and the next. Each label's text has its own train/validation split; batches draw each row's label
    by --label-sampling, then a window of it; --label-dropout of the training rows read NULL instead."""

    def __init__(self, ids, spans, token_ids, null_id, cfg, block_size, newline, device):
        self.ids, self.block_size, self.batch_size = ids, block_size, cfg.batch_size
        self.device, self.dropout, self.null_id = torch.device(device), cfg.label_dropout, null_id
        self.names = list(spans)
        self.token_ids = np.array([token_ids[n] for n in self.names], dtype=np.int64)
        self.offsets = np.arange(block_size)  # a window: block_size characters of text
        segs = {"train": [], "val": []}
        owner = {"train": [], "val": []}
        for k, name in enumerate(self.names):
            a, b = spans[name]
            try:
                split = make_split(ids[a:b], cfg.val_fraction, block_size - 1, cfg.val_split, newline)
            except DataError as e:
                raise DataError(f"label {name!r} ({b - a:,} characters): {e}") from None
            for side in segs:
                got = getattr(split, side) + a
                segs[side].append(got)
                owner[side] += [k] * len(got)
        block_chars = split.block_chars
        self.split = Split(cfg.val_split, np.concatenate(segs["train"]), np.concatenate(segs["val"]), block_chars)
        self.windows = {}
        for side in segs:
            s = getattr(self.split, side)
            counts = np.maximum(s[:, 1] - s[:, 0] - block_size + 1, 0)
            ends = np.cumsum(counts)
            per_label = np.bincount(np.array(owner[side]), weights=counts, minlength=len(self.names))
            first = np.concatenate([[0], np.cumsum(per_label)[:-1]]).astype(np.int64)
            weights = per_label if cfg.label_sampling == "proportional" else (per_label > 0).astype(float)
            self.windows[side] = (s[:, 0], ends - counts, ends, first, per_label.astype(np.int64),
                                  np.cumsum(weights / weights.sum()))

    def get(self, split, generator, label=None):
        """-> x, y (B, T) int64 on the device. label: an index into self.names, for that label's windows only (and
        no dropout)."""
        starts, before, ends, first, count, cum = self.windows[split]
        B = self.batch_size
        if label is None:
            u = torch.rand(B, generator=generator, dtype=torch.float64).numpy()
            lab = np.minimum(np.searchsorted(cum, u, side="right"), len(self.names) - 1)
        else:
            lab = np.full(B, label)
        v = torch.rand(B, generator=generator, dtype=torch.float64).numpy()
        r = np.minimum((v * count[lab]).astype(np.int64), count[lab] - 1)
        g = first[lab] + r  # the window's index among all the split's windows
        j = np.searchsorted(ends, g, side="right")
        text = np.asarray(self.ids[(starts[j] + g - before[j])[:, None] + self.offsets]).astype(np.int64)  # (B, T)
        tok = self.token_ids[lab]
        if split == "train" and label is None and self.dropout > 0:
            drop = torch.rand(B, generator=generator).numpy() < self.dropout
            tok = np.where(drop, self.null_id, tok)
        x = torch.from_numpy(np.concatenate([tok[:, None], text[:, :-1]], axis=1))
        y = torch.from_numpy(text)
        return x.to(self.device), y.to(self.device)


@torch.no_grad()
def label_losses(model, batches, iters, dtype, seed=0, check_stop=None):
    """{label: mean validation loss over `iters` batches of its own windows}, the same windows at every call.
    check_stop() is called before each batch (it raises to abandon the evaluation, as estimate_loss's does)."""
    was = model.training
    model.eval()
    device = next(model.parameters()).device
    out = {}
    try:
        for k, name in enumerate(batches.names):
            gen = torch.Generator().manual_seed(seed + k)
            total = 0.0
            for _ in range(iters):
                if check_stop is not None:
                    check_stop()
                x, y = batches.get("val", gen, label=k)
                with autocast(device, dtype):
                    total += float(model(x, targets=y)[1])
            out[name] = round(total / iters, 6)
    finally:
        model.train(was)
    return out


def describe(spans, cfg):
    """The start-up line: the labels and their share of the characters."""
    total = sum(b - a for a, b in spans.values()) or 1
    shares = [f"{name} {(b - a) / total:.1%}" for name, (a, b) in spans.items()]
    shown = ", ".join(shares[:SHOWN]) + (f" and {len(shares) - SHOWN} more" if len(shares) > SHOWN else "")
    return (f"labels: {len(spans)} ({shown} of the characters); batches draw them {cfg.label_sampling}, "
            f"{cfg.label_dropout:.0%} of training windows unlabelled (--label-dropout)")


def check_no_label_chars(vocab, data):
    """A corpus that holds the private-use characters labels use cannot be labelled."""
    clash = [c for c in vocab.chars if ord(c) >= FIRST_LABEL - 1]
    if clash:
        raise DataError(f"{data} holds the private-use character U+{ord(clash[0]):04X}, which labels use; remove it "
                        f"to train with {param('labels')}")
