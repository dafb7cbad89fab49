"""Sentence pairs -> ids and a loss mask on disk -> batches for either architecture.

Input: `source<TAB>target` lines (further columns are ignored, so Tatoeba/Anki downloads work as they are), or
two aligned files, line N of one translating line N of the other. Files are read like plain-text corpora
(chargpt.data.corpus: chunked incremental decoding, --encoding, exact offsets of undecodable bytes); a line ends at
"\\n", "\\r\\n" (CRLF) or a lone "\\r", a byte-order mark opening a file is dropped, and blank lines
are skipped (in aligned files: blank on both sides).

Each pair becomes one example, `source SEP target END`, with SEP and END two private-use characters that
real text does not contain (input that does is rejected) added to the vocabulary. On disk, under the same
cache directory and content-hash key as plain corpora, with every example back to back:

    <key>.ids.bin     ids of the examples (uint16, or uint32 for > 65,535 characters)
    <key>.mask.bin    uint8, 1 on the characters the loss counts: the target and END (not the source, not SEP)
    <key>.index.bin   int64 (pairs, 3): where each example starts, its source length, its target length

all memory-mapped, so a million pairs train with bounded memory. The layouts read from it:
- decoder (CharGPT): x = `source SEP target`, y = x shifted by one (`...target END`), scored where the mask is 1;
- encoder-decoder: src = `source`; tgt_in = `SEP target` (SEP starts every target); tgt_out = `target END`.

Examples longer than the context are skipped, and counted in a log line: truncating would teach the model
targets that stop mid-sentence. The validation split is made of whole pairs, chosen pseudo-randomly with a fixed
seed (not --seed), so every run on the same file validates on the same pairs, and a file sorted by length (as
Anki's are) puts every length in both splits.
"""

import contextlib
import hashlib
import json
import os
import re
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

import numpy as np
import torch

from chargpt.config.flags import param
from chargpt.data.corpus import (
    corpus_key,
    corpus_sources,
    default_cache_dir,
    iter_text,
    remove_dead_temps,
    split_whole,
    write_json_atomic,
)
from chargpt.data.tokenizer import MAX_CODEPOINT, Vocab, codepoints
from chargpt.errors import DataError
from chargpt.runs.rundir import temp_suffix

SEP = "\ue000"  # between source and target; also the first decoder input of the encoder-decoder
END = "\ue001"  # after the target: generation stops here
PAIRS_VERSION = 2  # 2: a lone "\r" ends a line
GROUP_CHARS = 1 << 20  # pairs are encoded in groups of about this many characters (bounded memory)
BOM = "\ufeff"
LINE_END = re.compile("\r\n|\r|\n")



class NoTab(DataError):
    """A line of a one-file pairs corpus without the tab between source and target."""

    def __init__(self, where, line, why="each line must be source<TAB>target (or give the targets as a second, aligned "
                                        "file)"):
        super().__init__(f"{where} has no tab: {line[:40]!r}; {why}")
        self.where, self.line = where, line

def iter_lines(source, encoding="utf-8", errors="strict"):
    """Yield (line number, line) of one Source, without its line end or opening BOM. A line ends at "\\n", "\\r\\n" or
    a lone "\\r" (old Mac files, some exports), as Python's universal newlines read text."""
    n, held = 0, []
    for i, text in enumerate(iter_text([source], encoding, errors)):
        if i == 0:
            text = text.removeprefix(BOM)
        if "\n" not in text and "\r" not in text[:-1]:  # a line longer than a chunk: keep the pieces, join once
            held.append(text)
            continue
        text = "".join(held) + text
        cut = len(text) - 1 if text.endswith("\r") else len(text)  # a "\r" at the end may open a "\r\n"
        lines = LINE_END.split(text[:cut])
        held = [lines.pop() + text[cut:]]
        for line in lines:
            n += 1
            yield n, line
    rest = "".join(held).removesuffix("\r")
    if rest:
        yield n + 1, rest


def _check_side(side, what, where):
    if not side:
        raise DataError(f"{where}: the {what} is empty; every pair needs a source and a target (delete the line)")
    if SEP in side or END in side:
        raise DataError(f"{where}: the {what} contains U+{ord(SEP if SEP in side else END):04X}, a private-use "
                        f"character chargpt reserves as a pair marker; remove it from the data")


def tsv_pairs(sources, encoding, errors):
    """Yield (source, target) from `source<TAB>target[<TAB>ignored...]` lines."""
    for src in sources:
        for n, line in iter_lines(src, encoding, errors):
            if not line:
                continue
            parts = line.split("\t", 2)
            where = f"{src.name}:{n}"
            if len(parts) < 2:
                raise NoTab(where, line)
            _check_side(parts[0], "source", where)
            _check_side(parts[1], "target", where)
            yield parts[0], parts[1]


def _all_lines(sources, encoding, errors):
    for src in sources:
        for n, line in iter_lines(src, encoding, errors):
            yield f"{src.name}:{n}", line


def aligned_pairs(src_sources, tgt_sources, encoding, errors):
    """Yield (source, target) from two files read line for line; lines blank in both are skipped."""
    lines = zip_longest(_all_lines(src_sources, encoding, errors), _all_lines(tgt_sources, encoding, errors))
    for left, right in lines:
        if left is None or right is None:  # one file has ended: only blank lines may follow in the other
            where, line = left or right
            if line:
                raise DataError(f"the files are not aligned: {where} has no partner line (the "
                                f"{'target' if right is None else 'source'} file ends first); give one sentence "
                                f"per line, line N of one file translating line N of the other")
            continue
        if not left[1] and not right[1]:
            continue
        _check_side(left[1], "source", f"{left[0]} (target {right[0]})")
        _check_side(right[1], "target", f"{right[0]} (source {left[0]})")
        yield left[1], right[1]


def _groups(pairs):
    """Batch pairs into groups of about GROUP_CHARS characters, so encoding is vectorised per group."""
    group, size = [], 0
    for s, t in pairs:
        group.append((s, t))
        size += len(s) + len(t) + 2
        if size >= GROUP_CHARS:
            yield group
            group, size = [], 0
    if group:
        yield group


def _encode_group(group):
    """-> (code points of `source SEP target END`..., mask (uint8), source lengths, target lengths)."""
    pts = codepoints("".join(s + SEP + t + END for s, t in group))
    src_len = np.fromiter((len(s) for s, _ in group), dtype=np.int64, count=len(group))
    tgt_len = np.fromiter((len(t) for _, t in group), dtype=np.int64, count=len(group))
    runs = np.stack([src_len + 1, tgt_len + 1], axis=1).ravel()  # (source SEP), (target END), ...
    mask = np.repeat(np.tile(np.array([0, 1], dtype=np.uint8), len(group)), runs)
    return pts, mask, src_len, tgt_len


@dataclass
class EncodedPairs:
    """Sentence pairs encoded on disk (see the module docstring for the layout)."""
    name: str
    vocab: Vocab
    paths: dict  # "ids" | "mask" | "index" -> Path
    length: int  # characters in all examples, markers included
    n_pairs: int

    @property
    def key(self):
        """The cache key (as EncodedCorpus.key)."""
        return self.paths["ids"].name.split(".")[0]

    @property
    def cache_dir(self):
        return self.paths["ids"].parent

    def ids(self):
        return np.memmap(self.paths["ids"], dtype=self.vocab.id_dtype, mode="r", shape=(self.length,))

    def mask(self):
        return np.memmap(self.paths["mask"], dtype=np.uint8, mode="r", shape=(self.length,))

    def index(self):
        return np.memmap(self.paths["index"], dtype=np.int64, mode="r", shape=(self.n_pairs, 3))

    def pair(self, i):
        """The text of pair i: (source, target)."""
        start, s, t = (int(v) for v in self.index()[i])
        ids = self.ids()
        return self.vocab.decode(ids[start:start + s]), self.vocab.decode(ids[start + s + 1:start + s + 1 + t])


def pair_stream(data, target_data=None, encoding="utf-8", errors="strict"):
    """-> (name, cache key, a function that starts a fresh iteration over the (source, target) pairs)."""
    if data is None:
        raise DataError("sentence pairs need --data: a file of source<TAB>target lines, or --data SOURCES "
                        "--target-data TARGETS")
    name, sources = corpus_sources(data, encoding)
    if target_data is None:
        mode, tgt_sources = "tsv", []
    else:
        mode, (_, tgt_sources) = "aligned", corpus_sources(target_data, encoding, name="target_data", dirs=False)
    key = hashlib.sha256(f"chargpt-pairs-v{PAIRS_VERSION}|{mode}|{len(sources)}|".encode()
                         + corpus_key(sources + tgt_sources, encoding, errors).encode()).hexdigest()[:32]
    if mode == "tsv":
        return name, key, lambda: tsv_pairs(sources, encoding, errors)
    return name, key, lambda: aligned_pairs(sources, tgt_sources, encoding, errors)


def encode_pairs(data, target_data=None, encoding="utf-8", errors="strict", cache_dir=None, log=print):
    """--data [--target-data] -> EncodedPairs, from the cache when the same bytes were encoded before.

    Pass 1 reads every pair (every format error is raised here, before anything is written) and finds the
    vocabulary; pass 2 writes ids, mask and index to temporary files renamed into place when complete."""
    name, key, pairs = pair_stream(data, target_data, encoding, errors)
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    meta_path = cache_dir / f"{key}.pairs.json"
    paths = {part: cache_dir / f"{key}.{part}.bin" for part in ("ids", "mask", "index")}
    cached = _read_cache(meta_path, paths)
    if cached is not None:
        return EncodedPairs(name, *cached)

    seen = np.zeros(MAX_CODEPOINT + 1, dtype=bool)  # pass 1: the vocabulary
    length = n_pairs = 0
    for group in _groups(pairs()):
        pts = _encode_group(group)[0]
        seen[pts] = True
        length, n_pairs = length + len(pts), n_pairs + len(group)
    if n_pairs == 0:
        raise DataError(f"{data} has no sentence pairs; give lines of source<TAB>target")
    vocab = Vocab.from_codepoints(np.flatnonzero(seen))

    tmps = {part: p.with_name(p.name + temp_suffix()) for part, p in paths.items()}  # this machine's pid and host
    try:  # pass 2: ids, mask and index
        cache_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_temps(cache_dir, key)
        written = pairs_written = 0
        with contextlib.ExitStack() as stack:
            files = {part: stack.enter_context(open(p, "wb")) for part, p in tmps.items()}
            for group in _groups(pairs()):
                pts, mask, src_len, tgt_len = _encode_group(group)
                starts = written + np.concatenate([[0], np.cumsum(src_len + tgt_len + 2)[:-1]])
                vocab.ids_from_codepoints(pts).tofile(files["ids"])
                mask.tofile(files["mask"])
                np.stack([starts, src_len, tgt_len], axis=1).astype(np.int64).tofile(files["index"])
                written, pairs_written = written + len(pts), pairs_written + len(group)
        if (written, pairs_written) != (length, n_pairs):
            raise DataError(f"{data} changed while it was being encoded; run again once it is complete")
        for part in paths:
            os.replace(tmps[part], paths[part])
        write_json_atomic(meta_path, {"version": PAIRS_VERSION, "chars": "".join(vocab.chars), "length": length,
                                       "pairs": n_pairs})
    except OSError as e:
        raise DataError(f"cannot write the encoded pairs to {cache_dir}: {e.strerror}; "
                        f"pass {param('cache_dir')} with a writable directory that has space") from None
    finally:  # anything but success (including Ctrl-C): no partial file left behind
        for tmp in tmps.values():
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
    return EncodedPairs(name, vocab, paths, length, n_pairs)


def cached_pairs(cache_dir, key, name="pairs"):
    """The pairs encoded under `key` in cache_dir, without their source files (as data.cached_corpus), or None."""
    cache_dir = Path(cache_dir)
    found = _read_cache(cache_dir / f"{key}.pairs.json",
                        {part: cache_dir / f"{key}.{part}.bin" for part in ("ids", "mask", "index")})
    return EncodedPairs(name, *found) if found else None


def _read_cache(meta_path, paths):
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        vocab, length, n_pairs = Vocab(meta["chars"]), int(meta["length"]), int(meta["pairs"])
        sizes = {"ids": length * vocab.id_dtype().itemsize, "mask": length, "index": n_pairs * 24}
        if meta.get("version") != PAIRS_VERSION or any(paths[p].stat().st_size != n for p, n in sizes.items()):
            return None
        return vocab, paths, length, n_pairs
    except Exception:
        return None  # a missing or damaged cache entry is simply rebuilt


def split_pairs(n_pairs, val_fraction):
    """-> (train rows, validation rows), sorted pair indices; a fixed pseudo-random choice of whole pairs."""
    return split_whole(n_pairs, val_fraction, lambda which: DataError(
        f"{n_pairs:,} pairs x --val-fraction {val_fraction} leaves an empty {which} split; give more pairs or change "
        f"--val-fraction"))


def context_needed(index, arch):
    """(pairs,) the --block-size each pair needs: decoder, `source SEP target` (the input x); encoder-decoder,
    the longer of the source and `SEP target`."""
    src_len, tgt_len = index[:, 1], index[:, 2]
    return np.maximum(src_len, tgt_len + 1) if arch == "encoder-decoder" else src_len + tgt_len + 1


class PairBatches:
    """Random pairs of a split as padded tensors, each batch a dict of the model's forward arguments:
    decoder: idx, targets, loss_mask (B, T); encoder-decoder: src, src_mask (B, S), tgt, targets, loss_mask
    (B, T). Padding (id 0) is masked out: T and S are the longest example of the batch."""

    def __init__(self, pairs: EncodedPairs, val_fraction, block_size, batch_size, device, arch="decoder",
                 log=print):
        index = np.asarray(pairs.index())
        train, val = split_pairs(len(index), val_fraction)
        need = context_needed(index, arch)
        fits = need <= block_size
        skipped = len(index) - int(fits.sum())
        if skipped:
            log(f"skipped {skipped:,} of {len(index):,} pairs longer than the context (--block-size {block_size}); "
                f"raise --block-size to train on them")
        self.splits = {"train": train[fits[train]], "val": val[fits[val]]}
        for split, rows in self.splits.items():
            if len(rows) == 0:
                shortest = int(need[train if split == "train" else val].min())
                raise DataError(f"no {split} pair fits the context of {block_size} characters; raise --block-size "
                                f"(the shortest {split} pair needs {shortest})")
        self.index, self.ids, self.mask = index, pairs.ids(), pairs.mask()
        self.arch, self.batch_size, self.device = arch, batch_size, torch.device(device)

    def get(self, split, generator):
        """-> dict of (B, ...) tensors on the device; `generator` (CPU) decides the pairs."""
        rows = self.splits[split]
        pick = rows[torch.randint(len(rows), (self.batch_size,), generator=generator).numpy()]
        start, src_len, tgt_len = self.index[pick].T  # (B,) each
        if self.arch == "encoder-decoder":
            src, src_mask = self._gather(start, src_len)  # (B, S)
            tgt, tgt_mask = self._gather(start + src_len, tgt_len + 2)  # SEP target END: (B, T + 1)
            batch = dict(src=src, src_mask=src_mask, tgt=tgt[:, :-1], targets=tgt[:, 1:], loss_mask=tgt_mask[:, 1:])
        else:
            seq, seq_mask = self._gather(start, src_len + tgt_len + 2)  # source SEP target END: (B, T + 1)
            scored = torch.from_numpy(self._read(self.mask, start, src_len + tgt_len + 2)[0].astype(bool))
            batch = dict(idx=seq[:, :-1], targets=seq[:, 1:], loss_mask=(scored & seq_mask)[:, 1:])
        return {k: self._to_device(v) for k, v in batch.items()}

    def _read(self, array, start, length):
        """array[start : start + length] per row, right-padded with 0 -> (numpy (B, max length), valid)."""
        span = np.arange(int(length.max()))  # (L,)
        valid = span[None, :] < length[:, None]  # (B, L)
        pos = np.where(valid, start[:, None] + span[None, :], start[:, None])  # padding reads a valid position
        return np.where(valid, array[pos], 0), valid

    def _gather(self, start, length):
        out, valid = self._read(self.ids, start, length)
        return torch.from_numpy(out.astype(np.int64)), torch.from_numpy(valid)

    def _to_device(self, t):
        if self.device.type == "cuda":
            return t.pin_memory().to(self.device, non_blocking=True)
        return t.to(self.device)
