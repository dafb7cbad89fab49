"""Start a new run from a trained one (--init-from RUN): its weights, in a vocabulary that grew with the new text.

    python train.py --data my_plays.txt --init-from checkpoints/shakespeare      # RUN's best.safetensors
    python train.py --data my_plays.txt --init-from checkpoints/shakespeare/latest.safetensors

The new run keeps the base's architecture (chargpt/config/settings.py: init_settings reconciles the flags), and its
vocabulary is the base's characters followed by the new text's characters the base never saw (Vocab.extended):
every old id keeps its character, so old rows of the token embedding (and of an untied head) are copied as they
are, and the new rows are those of a freshly initialised model of the same config and seed. Learned positions may
be cut to a shorter --block-size (the first rows); every other tensor is copied exactly. The optimizer and the
schedule start afresh. The corpus cache holds ids in the corpus's own (sorted) vocabulary: in_vocab writes, once,
a remapped copy beside it in the run's vocabulary, and checks it against the cache at every later use (a damaged
copy is reported and written again).

The checkpoint records where it started (lineage: the base's path, step, corpus and val loss), which `chargpt info`
and the playground's Runs view show, and which --resume of the new run uses to rebuild its vocabulary.
"""

import dataclasses
import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from chargpt.config.flags import param
from chargpt.data.tokenizer import Vocab
from chargpt.errors import CheckpointError, ConfigError, DataError
from chargpt.runs.checkpoint import load_model
from chargpt.runs.rundir import BEST, LATEST, resolve, write_atomic
from chargpt.textio import escape

REMAP_CHUNK = 1 << 22  # ids per chunk when remapping a cached corpus (8-16 MB at a time, whatever its size)
LINEAGE = "init_from"  # the metadata key


@dataclass
class Base:
    """The run a new one starts from: its checkpoint file, metadata and weights (CPU, float as saved)."""
    path: Path
    meta: dict
    weights: dict  # name -> tensor: the state dict of the base model (a tied head under both names)

    @property
    def vocab(self) -> Vocab:
        return self.meta["vocab"]

    @property
    def which(self):
        """How the log names the weights taken: best or latest (of the run), or the file's name."""
        return {BEST: "best", LATEST: "latest"}.get(self.path.name, self.path.name)


def read_base(source):
    """--init-from's value (a run directory: its best, else latest, checkpoint; or a checkpoint file) -> Base. A
    missing path or a file that is not a chargpt checkpoint is a ConfigError naming --init-from."""
    try:
        path = resolve(source)
        model, _, meta = load_model(path)  # its header is checked before any weights are read
    except CheckpointError as e:
        what = str(e).split("; ")[0]  # what is wrong, without the hint for a run's own files
        raise ConfigError(f"{param('init_from')}: {what}; pass a trained run's directory or one of its .safetensors "
                          f"checkpoints") from None
    return Base(path.resolve(), meta, model.state_dict())


# --- the weights ----------------------------------------------------------------------------------------------------
def transplant(base: dict, fresh: dict, n_old: int):
    """The base model's state dict into a fresh model's -> the state dict to load (fresh is not changed).

    base: tensors of the trained model, its vocabulary the first n_old ids of the new one. fresh: tensors of the
    new model as initialised (same architecture, vocabulary >= n_old, context <= the base's when positions are
    learned). Token rows (wte, and lm_head when untied) 0..n_old-1 and every other tensor come from the base;
    rows from n_old on stay fresh; learned positions keep their first block_size rows."""
    out = {}
    for name, new in fresh.items():
        old = base.get(name)
        if old is None:
            raise ConfigError(f"{param('init_from')}: the base model has no tensor {name}; it is not the same "
                              f"architecture")
        if name in ("wte.weight", "lm_head.weight"):  # (V, C): one row per character
            t = new.clone()
            t[:n_old] = old.to(new.dtype)
        elif name == "wpe.weight":  # (T, C): learned positions, the first T kept
            t = old[:new.shape[0]].to(new.dtype).clone()
        else:
            t = old.to(new.dtype).clone()
        if t.shape != new.shape:
            raise ConfigError(f"{param('init_from')}: tensor {name} is {tuple(old.shape)} in the base model, "
                              f"{tuple(new.shape)} in the new one; it is not the same architecture")
        out[name] = t
    return out


def load_base_weights(model, base: Base):
    """Copy the base's weights into a freshly built `model` (in place: a tied head stays tied, as it is one
    parameter under two names). -> number of characters whose rows were initialised afresh."""
    n_old = len(base.vocab)
    fresh = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    model.load_state_dict(transplant(base.weights, fresh, n_old), strict=True)
    return model.config.vocab_size - n_old


# --- lineage --------------------------------------------------------------------------------------------------------
def lineage(base: Base, vocab: Vocab):
    """What a checkpoint records about the run it started from."""
    m = base.meta
    val = m.get("val_loss")
    return {"path": str(base.path), "weights": base.which, "step": m.get("step", 0), "corpus": m.get("corpus"),
            "val_loss": val if isinstance(val, (int, float)) else None, "task": m.get("task", "text"),
            "base_vocab_size": len(base.vocab), "added_chars": len(vocab) - len(base.vocab)}


def read_lineage(meta):
    """The lineage a checkpoint records, or None (a run trained from scratch, or a damaged entry)."""
    value = meta.get(LINEAGE)
    if not isinstance(value, dict) or not isinstance(value.get("base_vocab_size"), int):
        return None
    return value


def describe_lineage(line):
    """One line for the log and `chargpt info`: where a run started. Its strings come from a checkpoint's metadata,
    which may be hostile: they are escaped (no terminal escape or line break is printed as it is)."""
    val, step = line.get("val_loss"), line.get("step", 0)
    step = f"{step:,}" if isinstance(step, int) and not isinstance(step, bool) else "?"
    return (f"{escape(line.get('path'), backslashes=False)} ({escape(line.get('weights', '?'), backslashes=False)} "
            f"weights, step {step} on {escape(line.get('corpus') or '?', backslashes=False)}"
            + (f", val loss {val:.4f}" if isinstance(val, (int, float)) else "") + ")")


def describe_added(vocab: Vocab, n_old):
    new = vocab.chars[n_old:]
    shown = "".join(new[:40])  # repr below makes a newline or tab visible
    return f"{len(new)} characters the base never saw" + (f" added to its vocabulary: {shown!r}"
                                                             + (" ..." if len(new) > 40 else "") if new else "")


def run_vocab(meta, corpus_vocab: Vocab):
    """For a run started with --init-from (its --resume, or scoring its validation split): the vocabulary it
    trains in (the checkpoint's), if its corpus is the one it started on (that corpus's characters appended to the
    base's are exactly the checkpoint's); else None, and the usual vocabulary check refuses the corpus."""
    line = read_lineage(meta)
    if line is None:
        return None
    n_old, saved = line["base_vocab_size"], meta["vocab"]
    if not 0 < n_old <= len(saved) or Vocab(saved.chars[:n_old]).extended(corpus_vocab) != saved:
        return None
    return saved


# --- the corpus in the run's vocabulary -----------------------------------------------------------------------------
def remap_table(old: Vocab, new: Vocab):
    """-> array t with t[old id] = new id of the same character (every character of old must be in new)."""
    missing = [c for c in old.chars if c not in new.stoi]
    if missing:
        raise ConfigError(f"{len(missing)} characters of the corpus are not in the run's vocabulary")
    return np.array([new.stoi[c] for c in old.chars], dtype=new.id_dtype)


def in_vocab(corpus, vocab: Vocab, log=None):
    """An encoded corpus (text: EncodedCorpus; pairs: EncodedPairs) -> the same corpus with ids in `vocab`,
    written once next to the cached ids (chunk by chunk, atomically) and memory-mapped like them.

    A copy already there is used only if it is exactly the cached ids remapped (checked chunk by chunk, one pass
    as the main cache's range check makes): a damaged one, in range or not, is reported on `log` (default:
    stderr) and written again."""
    if corpus.vocab == vocab:
        return corpus
    paths = getattr(corpus, "paths", None)
    src = paths["ids"] if paths is not None else corpus.ids_path
    tag = hashlib.sha256("".join(vocab.chars).encode("utf-8", "surrogatepass")).hexdigest()[:12]
    dst = src.with_name(f"{src.stem}.in-{tag}.bin")
    table, ids = remap_table(corpus.vocab, vocab), corpus.ids()
    damage = _remap_damage(dst, table, ids, corpus.length)
    if damage is not None:
        if damage:
            (log or _to_stderr)(f"the remapped corpus {dst} is damaged ({damage}); rebuilding it")
        _write_remapped(dst, table, ids, corpus.length)
    if paths is not None:
        return dataclasses.replace(corpus, vocab=vocab, paths={**paths, "ids": dst})
    return dataclasses.replace(corpus, vocab=vocab, ids_path=dst)


def _to_stderr(message):
    print(message, file=sys.stderr)


def _remap_damage(dst, table, ids, length):
    """None when dst holds exactly table[ids]; "" when it is missing; else what is wrong with it."""
    if not dst.is_file():
        return ""
    size, want = dst.stat().st_size, length * table.itemsize
    if size != want:
        return f"{size:,} bytes, not {want:,}"
    got = np.memmap(dst, dtype=table.dtype, mode="r", shape=(length,)) if length else table[:0]
    for i in range(0, length, REMAP_CHUNK):
        differ = np.flatnonzero(got[i:i + REMAP_CHUNK] != table[ids[i:i + REMAP_CHUNK]])
        if len(differ):
            return f"it differs from the cached corpus from character {i + int(differ[0]):,} on"
    return None


def _write_remapped(dst, table, ids, length):
    def write(tmp):
        with open(tmp, "wb") as f:
            for i in range(0, length, REMAP_CHUNK):
                table[ids[i:i + REMAP_CHUNK]].tofile(f)

    try:
        write_atomic(dst, write)
    except OSError as e:
        raise DataError(f"cannot write the remapped corpus {dst}: {e.strerror}; pass {param('cache_dir')} with a "
                        f"writable directory that has space") from None
