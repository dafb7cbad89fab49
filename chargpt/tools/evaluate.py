"""Score a checkpoint on any text: mean loss per character (nats), bits per character and bits per byte.

    chargpt eval --checkpoint checkpoints/shakespeare --data new_play.txt     # or, from Python:
    evaluate("checkpoints/shakespeare", "new_play.txt")                        # -> {"loss": 1.52, "bpc": 2.19, ...}

Bits per character compare models of one alphabet only; bits per byte (the total in bits over the UTF-8 bytes of
the characters scored, as nanochat reports it) compare any: an English letter is one byte, a Chinese character
three, so a model of either is charged per byte of the text it predicts.

Every character but the first is scored exactly once, as a target inside a window of at most block_size
characters (sliding windows, as in Hugging Face's perplexity guide). Windows start every `stride` characters;
the first one scores all its positions, each later one only its last `stride` (the ones the window before did
not reach), and a last window aligned to the end of the text scores what is left. So every character after the
first block_size is predicted from at least block_size - stride characters of context. The default stride is
half the window; stride 1 gives every character a full window (block_size times the work of stride
block_size, which is the plain loss over consecutive chunks).

Characters outside the model's vocabulary are counted and reported, never scored as targets, and replaced in
the context by the vocabulary's stand-in (U+FFFD, '?' or a space, the first it has; Vocab.replacement).

With no text given, the run's own validation split is scored: the exact number the training loop estimates
from a few random batches. `python -m chargpt.bench quality` reports it with stride = block_size.

A run trained on sentence pairs is scored pair by pair instead: the loss of each target and its end marker
given the source, exactly as training counts it, over a pairs file (--data source<TAB>target lines, or --data
plus --target-data) or the run's own validation pairs. Pairs longer than the context are counted and skipped;
characters the model never saw stand in as above and are not scored.
"""

import dataclasses
import math
import sys
from collections import Counter

import numpy as np
import torch
from torch.nn import functional as F
from tqdm import tqdm

from chargpt.data.corpus import corpus_sources, encode_corpus, iter_text, split_of
from chargpt.data.fim import FimMarkers
from chargpt.data.pairs import END, SEP, context_needed, encode_pairs, pair_stream, split_pairs
from chargpt.data.tokenizer import Vocab, codepoints
from chargpt.errors import ConfigError, DataError
from chargpt.model.quantize import check_precision, inference_model
from chargpt.runs.checkpoint import load_model, run_settings
from chargpt.runs.rundir import resolve
from chargpt.runtime import autocast, pick_device, pick_dtype
from chargpt.training.init_from import in_vocab, run_vocab

LOGITS_BUDGET = 1 << 24  # logits per forward pass (64 MB in float32): bounds memory for 10,000-character alphabets
MAX_BATCH = 64  # windows per forward pass
PROGRESS_MIN_CHARS = 200_000  # a progress bar only where scoring takes noticeable time


BYTES_CHUNK = 1 << 24  # ids per step when adding up UTF-8 bytes (a memory-mapped corpus is read in pieces)


def utf8_lengths(vocab):
    """-> (V,) int64: the UTF-8 length of each character of the vocabulary, by id (1 to 4)."""
    return np.array([len(c.encode("utf-8", "surrogatepass")) for c in vocab.chars], dtype=np.int64)


def utf8_bytes(ids, lengths, known=None):
    """Total UTF-8 bytes of the characters `ids` (1-D, memory-mapped is fine) where `known` (None: all) is True."""
    if len(lengths) and (lengths == lengths[0]).all():  # a one-byte alphabet (ASCII): no pass over the text
        return int(lengths[0]) * (len(ids) if known is None else int(np.count_nonzero(known)))
    total = 0
    for k in range(0, len(ids), BYTES_CHUNK):
        b = lengths[np.asarray(ids[k:k + BYTES_CHUNK])]
        total += int((b if known is None else b[np.asarray(known[k:k + BYTES_CHUNK])]).sum())
    return total


def bits_per_byte(nats, n_bytes):
    """Total loss in nats over `n_bytes` UTF-8 bytes -> bits per byte (None without bytes)."""
    return nats / math.log(2) / n_bytes if n_bytes else None


def default_stride(block_size):
    return max(1, block_size // 2)


def window_plan(n_targets, block_size, stride):
    """-> (starts, fresh, L): the start of every window of L characters, and how many of each window's last
    positions are scored there. The fresh counts add up to n_targets: each target is scored exactly once."""
    if not 1 <= stride <= block_size:  # a larger stride would skip characters between windows
        raise ValueError(f"stride must be in 1 .. block_size ({block_size}), got {stride}")
    L = min(block_size, n_targets)
    last = n_targets - L  # the final window ends exactly at the last target
    starts = np.arange(0, last + 1, stride)
    if starts[-1] != last:
        starts = np.append(starts, last)
    fresh = np.diff(starts, prepend=starts[0] - L)  # the first window: all L positions
    return starts, fresh, L


@torch.no_grad()
def score_ids(model, ids, known=None, stride=None, batch_size=None, dtype=torch.float32, progress=False,
              windows=None):
    """Sum of -log p(character | window before it) over every target of `ids` (1-D ids, memory-mapped is fine;
    `known`: a boolean mask, False where a character is not scored) -> (total nats, characters scored). `windows`, a
    list, gets each window's (nats, characters scored) appended: the pieces a standard error is taken over (they
    score disjoint targets; asking for them costs a host sync per batch)."""
    model.eval()
    T, V = model.config.block_size, model.config.vocab_size
    stride = stride or default_stride(T)
    device = next(model.parameters()).device
    starts, fresh, L = window_plan(len(ids) - 1, T, stride)
    batch_size = batch_size or max(1, min(MAX_BATCH, LOGITS_BUDGET // (L * V)))
    offsets, positions = np.arange(L + 1), np.arange(L)
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    with tqdm(total=len(ids) - 1, desc="scoring", unit="char", unit_scale=True, leave=False, dynamic_ncols=True,
              disable=not progress or len(ids) < PROGRESS_MIN_CHARS) as bar:
        for i in range(0, len(starts), batch_size):
            s, new = starts[i:i + batch_size], fresh[i:i + batch_size]
            window = torch.from_numpy(np.asarray(ids[s[:, None] + offsets], dtype=np.int64)).to(device)  # (B, L+1)
            scored = positions[None, :] >= (L - new)[:, None]  # (B, L): the last `new` positions of each window
            if known is not None:
                scored &= known[s[:, None] + 1 + positions]
            with autocast(device, dtype):
                logits, _ = model(window[:, :-1])  # (B, L, V)
            # rows of V contiguous: the (B, V, L) layout cross_entropy also takes measured 2.5x slower at V 10,000
            nll = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten(), reduction="none")
            nll = nll.view(window.size(0), -1)  # (B, L)
            # where, not nll[mask]: boolean indexing makes a tensor of data-dependent size, which waits for the GPU
            per_window = torch.where(torch.from_numpy(scored).to(device), nll.double(), 0.0).sum(1)  # (B,)
            total += per_window.sum()
            if windows is not None:
                windows.extend(zip(per_window.tolist(), scored.sum(1).tolist()))
            count += int(scored.sum())
            bar.update(int(new.sum()))
    return total.item(), count  # note: the only host sync


def encode_text(vocab, data, encoding="utf-8", errors="strict"):
    """A text file or folder, read like a corpus (chargpt.data.corpus) -> (ids, known mask, Counter of unknown
    characters). Unknown characters become the vocabulary's stand-in, marked False in the mask."""
    _, sources = corpus_sources(data, encoding)
    stand_in = vocab.stoi[vocab.replacement()]
    ids, known, unknown = [], [], Counter()
    for text in iter_text(sources, encoding, errors):
        pts = codepoints(text)
        pos, ok = vocab.lookup(pts)
        ids.append(np.where(ok, pos, stand_in).astype(vocab.id_dtype))
        known.append(ok)
        if not ok.all():
            chars, counts = np.unique(pts[~ok], return_counts=True)
            unknown.update({chr(int(c)): int(n) for c, n in zip(chars, counts)})
    if not ids:
        return np.zeros(0, dtype=vocab.id_dtype), np.zeros(0, dtype=bool), unknown
    return np.concatenate(ids), np.concatenate(known), unknown


def validation_split(meta, vocab, block_size):
    """The id arrays of a run's own validation split (one per stretch: --val-split blocks has many, tail one),
    re-read from its corpus (through the encoded-corpus cache), split as the run was. -> (pieces, label)"""
    ids, split, label = run_split(meta, vocab, block_size)
    return split.pieces(ids, "val"), label


def run_split(meta, vocab, block_size):
    """A run's corpus, re-read (through the encoded-corpus cache) in the run's vocabulary, and its split as the run
    made it. -> (the corpus's ids, chargpt.data.corpus.Split, what the validation split is, in words)"""
    cfg = run_settings(meta)
    if not cfg:
        raise DataError("this checkpoint records no training run, so it has no validation split; pass --data FILE")
    corpus = encode_corpus(cfg.data, cfg.encoding, cfg.encoding_errors, cfg.cache_dir,
                           log=lambda m: print(m, file=sys.stderr))  # stdout may be --json
    if (fim := FimMarkers.from_meta(meta)) is not None:  # --fim: its markers follow the text's characters (same ids)
        corpus = dataclasses.replace(corpus, vocab=Vocab(corpus.vocab.chars + fim.chars()))
    if run_vocab(meta, corpus.vocab) == vocab:  # a run started with --init-from: its ids in the run's vocabulary
        corpus = in_vocab(corpus, vocab)
    if corpus.vocab != vocab:
        raise DataError(f"the run's corpus {cfg.data or corpus.name} has changed since training (its "
                        f"characters differ); pass --data FILE to score a text")
    how, fraction = cfg.val_split, cfg.val_fraction
    split = split_of(corpus.ids(), vocab, fraction, block_size, how)
    return corpus.ids(), split, f"validation split of {corpus.name} ({fraction:g}, {how})"


def evaluate(checkpoint, data=None, *, encoding="utf-8", encoding_errors="strict", stride=None, batch_size=None,
             device="auto", progress=True, target_data=None, dtype=None, quantize=None):
    """Loss of a checkpoint (run directory or file) on a text file or folder; data=None scores the run's own
    validation split. dtype and quantize score the model as sample.py would decode with them (chargpt.model.quantize:
    e.g. quantize='int8' gives what int8 weights cost); dtype=None is float32 on a CPU (exact and reproducible)
    and the GPU's autocast dtype on a GPU. -> dict: loss (nats per character), bpc, characters, scored, ...
    A pairs run scores pairs instead (see evaluate_pairs); target_data is for it alone."""
    path = resolve(checkpoint)
    device = pick_device(device)
    if dtype is None:  # on CPU float32 keeps the number exact and reproducible; on a GPU bf16 where it is native
        dtype = "float32" if device.type == "cpu" else "auto"
    check_precision(device, dtype, quantize, auto=False)
    model, vocab, meta = load_model(path, device)
    if meta["task"] == "pairs":
        if stride is not None:
            raise ConfigError("--stride is for runs trained on text; a pairs run is scored pair by pair: drop it")
        if quantize is not None or dtype not in (None, "float32", "auto"):
            raise ConfigError("dtype and quantize are for runs trained on text; score a pairs run as it is")
        return evaluate_pairs(path, model, vocab, meta, data, target_data, encoding, encoding_errors, batch_size,
                              device)
    if target_data is not None:
        raise ConfigError("--target-data is for runs trained on sentence pairs; this one was trained on text")
    model, torch_dtype, _ = inference_model(model, device, dtype, quantize)
    T = model.config.block_size
    stride = default_stride(T) if stride is None else stride
    if not 1 <= stride <= T:
        raise ConfigError(f"--stride must be between 1 and the model's context length {T} (got {stride})")
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1 (got {batch_size})")
    unknown = Counter()
    if data is None:  # each stretch of the split scored by itself: no window reaches across two of them
        pieces, label = validation_split(meta, vocab, T)
        known = [None] * len(pieces)
    else:
        ids, mask, unknown = encode_text(vocab, data, encoding, encoding_errors)
        pieces, known, label = [ids], [mask], str(data)
    if sum(map(len, pieces)) < 2:
        raise DataError(f"{label} has {sum(map(len, pieces))} character(s); scoring needs at least 2 (each character "
                        f"is predicted from the ones before it)")
    total, scored, n_bytes = score_pieces(model, vocab, pieces, known, stride, batch_size, torch_dtype, progress)
    if scored == 0:
        raise DataError(f"none of the characters of {label} are in the model's vocabulary ({len(vocab)} "
                        f"characters), so nothing can be scored; evaluate a text in the corpus's alphabet")
    loss = total / scored
    return {"checkpoint": str(path), "data": label, "step": meta.get("step"), "characters": sum(map(len, pieces)),
            "scored": scored, "unknown": sum(unknown.values()), "unknown_chars": dict(unknown.most_common(10)),
            "stand_in": vocab.replacement(), "loss": loss, "bpc": loss / math.log(2),
            "bpb": bits_per_byte(total, n_bytes), "bytes": n_bytes, "stride": stride, "block_size": T,
            "device": str(device), "precision": _precision(torch_dtype, quantize)}


def score_pieces(model, vocab, pieces, known=None, stride=None, batch_size=None, dtype=torch.float32, progress=False,
                 windows=None):
    """score_ids over each stretch of text by itself (no window reaches across two; `known`: a mask per piece, or
    None) -> (total nats, characters scored, their UTF-8 bytes). `windows`: as score_ids'."""
    total = scored = n_bytes = 0
    lengths = utf8_lengths(vocab)
    for ids, mask in zip(pieces, known or [None] * len(pieces)):
        if len(ids) >= 2:
            nats, n = score_ids(model, ids, mask, stride, batch_size, dtype, progress, windows)
            total, scored = total + nats, scored + n
            n_bytes += utf8_bytes(ids[1:], lengths, None if mask is None else mask[1:])  # the targets scored
    return total, scored, n_bytes


def _precision(dtype, quantize):
    return "int8" if quantize == "int8" else str(dtype).removeprefix("torch.")


# --- pairs --------------------------------------------------------------------------------------------------
def run_validation_pairs(meta, vocab):
    """A pairs run's own validation pairs, (source, target) texts, re-read from its data (through the cache)."""
    cfg = run_settings(meta)
    if not cfg:
        raise DataError("this checkpoint records no training run, so it has no validation pairs; pass --data PAIRS")
    pairs = encode_pairs(cfg.data, cfg.target_data, cfg.encoding, cfg.encoding_errors, cfg.cache_dir,
                         log=lambda m: print(m, file=sys.stderr))
    if pairs.vocab != vocab and run_vocab(meta, pairs.vocab) != vocab:  # texts: decoded in the pairs' own
        raise DataError(f"the run's pairs {cfg.data} have changed since training (their characters differ); "
                        f"pass --data PAIRS to score a pairs file")
    _, val = split_pairs(pairs.n_pairs, cfg.val_fraction)
    return (pairs.pair(int(i)) for i in val), f"validation pairs of {pairs.name} ({cfg.val_fraction:g})"


def pair_tensors(vocab, arch, group):
    """(source, target) texts -> the model's keyword arguments for them (as chargpt.data.pairs.PairBatches lays them
    out), with loss_mask off on characters outside the vocabulary (they stand in as vocab.replacement())."""
    stand_in, sep, end = vocab.stoi[vocab.replacement()], vocab.stoi[SEP], vocab.stoi[END]

    def ids(text):
        return [vocab.stoi.get(c, stand_in) for c in text], [c in vocab.stoi for c in text]

    def padded(rows):
        width = max(map(len, rows))
        return torch.tensor([r + [0] * (width - len(r)) for r in rows])  # (B, width); padding is id 0 / False

    src, tgt = zip(*(ids(s) for s, _ in group)), zip(*(ids(t) for _, t in group))
    (src_ids, _), (tgt_ids, tgt_known) = (list(map(list, z)) for z in (src, tgt))
    if arch == "encoder-decoder":
        return dict(src=padded(src_ids), src_mask=padded([[1] * len(s) for s in src_ids]).bool(),
                    tgt=padded([[sep] + t for t in tgt_ids]), targets=padded([t + [end] for t in tgt_ids]),
                    loss_mask=padded([k + [True] for k in tgt_known]).bool())  # the target's known characters, END
    seqs = [s + [sep] + t + [end] for s, t in zip(src_ids, tgt_ids)]
    mask = [[False] * len(s) + k + [True] for s, k in zip(src_ids, tgt_known)]  # scored targets of seq[1:]
    return dict(idx=padded([q[:-1] for q in seqs]), targets=padded([q[1:] for q in seqs]),
                loss_mask=padded(mask).bool())


def _groups(pairs, arch, block, batch_size, skipped):
    """(source, target) pairs -> lists of up to batch_size that fit the context; skipped[0] counts the others."""
    group = []
    for src, tgt in pairs:
        if context_needed(np.array([[0, len(src), len(tgt)]]), arch)[0] > block:
            skipped[0] += 1
            continue
        group.append((src, tgt))
        if len(group) == batch_size:
            yield group
            group = []
    if group:
        yield group


@torch.no_grad()
def score_pairs(model, vocab, pairs, batch_size=64, dtype=torch.float32):
    """Sum of -log p(target characters and END | source) over an iterable of (source, target) texts
    -> (total nats, characters scored, pairs scored, pairs skipped as longer than the context, Counter of unknown
    characters)."""
    model.eval()
    device, arch = next(model.parameters()).device, model.config.arch
    total, count, done, skipped, unknown = 0.0, 0, 0, [0], Counter()
    for group in _groups(pairs, arch, model.config.block_size, batch_size, skipped):
        unknown.update(c for src, tgt in group for c in src + tgt if c not in vocab.stoi)
        batch = {k: v.to(device) for k, v in pair_tensors(vocab, arch, group).items()}
        n = int(batch["loss_mask"].sum())
        with autocast(device, dtype):
            _, loss = model(**batch)  # the mean over the n scored characters
        total, count, done = total + loss.item() * n, count + n, done + len(group)
    return total, count, done, skipped[0], unknown


def evaluate_pairs(path, model, vocab, meta, data, target_data, encoding, encoding_errors, batch_size, device):
    """Loss of a pairs checkpoint on pairs: a file (TSV, or aligned with target_data) or, with data None, the run's
    validation pairs. -> dict as evaluate()'s, per scored target character."""
    if batch_size is not None and batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1 (got {batch_size})")
    if data is None:
        pairs, label = run_validation_pairs(meta, vocab)
    else:
        pairs, label = pair_stream(data, target_data, encoding, encoding_errors)[2](), str(data)
    dtype = torch.float32 if device.type != "cuda" else pick_dtype("auto", device)[0]
    total, scored, done, skipped, unknown = score_pairs(model, vocab, pairs, batch_size or MAX_BATCH, dtype)
    if scored == 0:
        raise DataError(f"no pair of {label} could be scored ({skipped:,} longer than the model's context of "
                        f"{model.config.block_size} characters)" if skipped else f"{label} has no pairs to score")
    loss = total / scored
    return {"checkpoint": str(path), "data": label, "step": meta.get("step"), "task": "pairs", "pairs": done,
            "skipped": skipped, "scored": scored, "unknown": sum(unknown.values()),
            "unknown_chars": dict(unknown.most_common(10)), "stand_in": vocab.replacement(), "loss": loss,
            "bpc": loss / math.log(2), "block_size": model.config.block_size, "device": str(device)}


def format_result(r):
    """The dict of evaluate() -> a few lines for people."""
    if r.get("task") == "pairs":
        return _format_pairs(r)
    lines = [f"{r['checkpoint']} (step {r['step']}) on {r['data']}:",
             f"  loss {r['loss']:.4f} nats/char, {r['bpc']:.4f} bits/char over {r['scored']:,} characters; "
             f"{r['bpb']:.4f} bits/byte over their {r['bytes']:,} UTF-8 bytes (bits/byte compare across alphabets)",
             f"  windows of {r['block_size']} characters every {r['stride']} (--stride {r['stride']}): each character "
             f"after the first {r['block_size']} saw at least {r['block_size'] - r['stride']} characters of context"]
    if r["unknown"]:
        shown = ", ".join(f"{c!r} x{n}" for c, n in r["unknown_chars"].items())
        lines.append(f"  {r['unknown']:,} character(s) outside the model's vocabulary ({shown}): not scored, and "
                     f"replaced by {r['stand_in']!r} where they are context")
    return "\n".join(lines)


def _format_pairs(r):
    lines = [f"{r['checkpoint']} (step {r['step']}) on {r['data']}:",
             f"  loss {r['loss']:.4f} nats/char, {r['bpc']:.4f} bits/char over {r['scored']:,} target characters "
             f"(each target and its end marker, given its source) of {r['pairs']:,} pairs"]
    if r["skipped"]:
        lines.append(f"  {r['skipped']:,} pair(s) longer than the context ({r['block_size']} characters) skipped")
    if r["unknown"]:
        shown = ", ".join(f"{c!r} x{n}" for c, n in r["unknown_chars"].items())
        lines.append(f"  {r['unknown']:,} character(s) outside the model's vocabulary ({shown}): not scored, and "
                     f"replaced by {r['stand_in']!r} where they are context")
    return "\n".join(lines)

