"""Text -> character ids on disk -> train/validation batches.

A corpus (a file, a directory of files, or the built-in default) is read in chunks, decoded incrementally,
and encoded twice over: pass 1 finds the vocabulary, pass 2 writes the ids to a flat binary file in the
smallest unsigned dtype that holds them. The result is cached under a key made from the corpus bytes, so a
second run skips straight to training, and it is read back through a memory map: memory use does not grow
with the corpus.
"""

import codecs
import contextlib
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from chargpt.config.flags import param
from chargpt.data.tokenizer import MAX_CODEPOINT, Vocab, codepoints
from chargpt.errors import ChargptError, DataError
from chargpt.runs.rundir import remove_stale_temps, temp_suffix, write_text_atomic

# Bounded memory: one chunk of text, its code points and its ids at a time (a few times the chunk size). 1 MB
# chunks encode a 50 MB corpus as fast as 16 MB ones with a tenth of the working memory (30 MB against 520 MB).
CHUNK_BYTES = 1 << 20
CACHE_VERSION = 1
DEFAULT_CORPUS_NAME = "pydoc-topics"
PROGRESS_MIN_BYTES = 32 << 20  # show progress bars only for corpora where encoding takes noticeable time
CHECK_CHUNK = 1 << 24  # ids per step when checking a cached encoding (32-64 MB of the memory map at a time)


def default_cache_dir():
    return Path(os.environ.get("CHARGPT_CACHE_DIR") or Path.home() / ".cache" / "chargpt")


def share_compile_cache():
    """torch.compile's on-disk cache under chargpt's, not the temporary folder a reboot empties: training runs and
    samplings of the same shapes load its compiled code in seconds. A TORCHINDUCTOR_CACHE_DIR of the user's wins.
    Called before anything imports torch._dynamo (torch's optimizers do), since its import sets the variable to
    torch's default when it is unset."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(default_cache_dir() / "torchinductor"))


def default_corpus_text():
    """The built-in corpus: CPython's English help topics (pydoc_data), present in every installation."""
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # some distributions strip it
        raise DataError(f"this Python has no pydoc_data module for the built-in corpus; pass {param('data')} "
                        f"with a text file") from e
    return "\n\n".join(topics[k].strip() for k in sorted(topics)) + "\n"


@dataclass
class Source:
    """One piece of the corpus: a file on disk, or in-memory bytes (the built-in corpus)."""
    name: str
    path: Path | None = None
    data: bytes | None = None

    @property
    def size(self):
        return len(self.data) if self.data is not None else self.path.stat().st_size

    def chunks(self):
        if self.data is not None:
            yield self.data
            return
        with open(self.path, "rb") as f:
            while chunk := f.read(CHUNK_BYTES):
                yield chunk


BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE begins as UTF-16 LE does: it is looked for first


def looks_binary(path, encoding):
    """-> (offset of the first NUL byte, the encoding the file looks written in, or None), or None for text."""
    if encoding.lower().replace("-", "").replace("_", "").startswith(("utf16", "utf32")):
        return None  # NUL bytes are normal there
    with open(path, "rb") as f:
        head = f.read(8192)
    pos = head.find(b"\x00")
    return (pos, _wide_encoding(head)) if pos >= 0 else None


def _wide_encoding(head):
    """'utf-16' or 'utf-32' for bytes that open with that byte-order mark, or that look like ASCII text written in
    it (every other byte NUL, or three in four); else None."""
    for bom, name in BOMS:
        if head.startswith(bom):
            return name
    even = head[:len(head) // 4 * 4]
    if even and (even[1::2].count(0) == len(even) // 2 or even[0::2].count(0) == len(even) // 2):
        return "utf-16"
    if even and all(even[i::4].count(0) == len(even) // 4 for i in (1, 2)):
        return "utf-32"
    return None


def corpus_sources(data, encoding="utf-8", name="data", dirs=True):
    """--data value -> (corpus name, [Source]). None means the built-in corpus. `name` is the setting that gave the
    path (--data, --target-data), named in the messages; dirs=False refuses a directory."""
    if data is None:
        return DEFAULT_CORPUS_NAME, [Source(DEFAULT_CORPUS_NAME, data=default_corpus_text().encode("utf-8"))]
    flag = param(name)
    if os.fspath(data) == "":  # Path("") is the current folder, which would be read as a corpus
        raise DataError(f"{flag} is an empty path; pass a text file or directory, or leave it out for "
                        f"the built-in corpus")
    path = Path(data).expanduser()
    kinds = "text file or directory" if dirs else "text file"
    if not path.exists():
        raise DataError(f"{'corpus' if name == 'data' else 'file'} not found: {data}; pass {flag} with an existing "
                        f"{kinds}")
    if path.is_file():
        _check_readable(path)
        found = looks_binary(path, encoding)
        if found is not None:
            pos, wide = found
            fix = f"it looks like {wide.upper()} text: pass {param('encoding', wide)}" if wide else \
                f"point {flag} at a UTF-8 text file (or pass {param('encoding')} with its encoding)"
            raise DataError(f"{data} looks like a binary file (NUL byte at offset {pos}), not UTF-8 text; {fix}")
        return path.stem or path.name, [Source(path.name, path=path)]
    if path.is_dir() and not dirs:
        raise DataError(f"{flag} {data} is a directory; pass {flag} with one text file, line N translating line N "
                        f"of {param('data')}")
    if not path.is_dir():
        raise DataError(f"{data} is neither a file nor a directory (a device or a pipe, which may never end); pass "
                        f"{flag} with a {kinds}")
    files = sorted(p for p in path.rglob("*") if p.is_file() and not any(
        part.startswith(".") for part in p.relative_to(path).parts))
    texts = [p for p in files if os.access(p, os.R_OK) and looks_binary(p, encoding) is None]
    if not texts:
        raise DataError(f"directory {data} has no readable text files ({len(files)} files, none text); "
                        f"put .txt files in it or pass {flag} with a file")
    return path.resolve().name, [Source(str(p.relative_to(path)), path=p) for p in texts]


def _check_readable(path):
    if not os.access(path, os.R_OK):
        raise DataError(f"cannot read {path}: permission denied; fix its permissions or copy it somewhere readable")


def check_text_encoding(encoding):
    """`encoding` must be a codec that decodes bytes to text: rot13, zlib, hex or base64 are Python codecs too,
    but they turn bytes into bytes (or str into str) and would fail deep inside the decoder."""
    try:
        info = codecs.lookup(encoding)
    except LookupError:
        raise DataError(f"unknown encoding {encoding!r}; pass {param('encoding')} with a Python codec name such as "
                        f"utf-8, latin-1, gbk") from None
    if not info._is_text_encoding:  # False for exactly the bytes-to-bytes and str-to-str codecs
        raise DataError(f"{encoding!r} is not a text encoding (it does not turn bytes into text); pass "
                        f"{param('encoding')} with the corpus's character encoding, such as utf-8, latin-1, gbk")


def iter_text(sources, encoding="utf-8", errors="strict"):
    """Yield decoded text chunks of all sources in order, a newline between files that lack one.

    Decoding is incremental, so a multi-byte character split across chunks is decoded correctly, and an
    undecodable byte is reported with its exact offset in its file.
    """
    check_text_encoding(encoding)
    last = ""
    for src in sources:
        if last and last != "\n":
            yield "\n"
        decoder = codecs.getincrementaldecoder(encoding)(errors)
        offset = 0
        chunks = src.chunks()
        while True:
            chunk = next(chunks, b"")
            try:
                pending = len(decoder.getstate()[0])
            except (TypeError, IndexError):
                pending = 0
            try:
                text = decoder.decode(chunk, final=not chunk)
            except ValueError as e:  # UnicodeDecodeError, or a codec's own UnicodeError ("no BOM", "\\x escape")
                raise _decode_error(src.name, encoding, e, offset - pending) from None
            offset += len(chunk)
            if text:
                last = text[-1]
                yield text
            if not chunk:
                break


def _decode_error(name, encoding, e, chunk_start):
    """The one message for every decode failure: where (byte offset, when the codec says), what, and the fixes."""
    if isinstance(e, UnicodeDecodeError):
        bad = (e.object[e.start:e.start + 1] or b"?").hex()
        what = f"undecodable byte 0x{bad} at byte offset {chunk_start + e.start}"
    else:
        what = f"{e} (in the bytes from offset {max(0, chunk_start)})"
    return DataError(f"{name} is not valid {encoding}: {what}; pass {param('encoding')} with the file's real "
                     f"encoding (e.g. latin-1, gbk, utf-16-le), or {param('encoding_errors', 'replace')} to "
                     f"substitute U+FFFD")


@dataclass
class EncodedCorpus:
    """A corpus encoded on disk: its vocabulary and the path of the flat id file."""
    name: str
    vocab: Vocab
    ids_path: Path
    length: int

    @property
    def key(self):
        """The cache key (a hash of the corpus bytes): runs record it, to find their text again
        (chargpt.tools.novelty)."""
        return self.ids_path.name.split(".")[0]  # <key>.bin, or <key>.in-<vocab>.bin remapped for --init-from

    @property
    def cache_dir(self):
        return self.ids_path.parent

    def ids(self):
        """The ids as a read-only memory map (nothing is loaded into RAM up front)."""
        if self.length == 0:
            return np.zeros(0, dtype=self.vocab.id_dtype)
        return np.memmap(self.ids_path, dtype=self.vocab.id_dtype, mode="r", shape=(self.length,))


def corpus_key(sources, encoding, errors):
    """Cache key: a hash of the corpus bytes and of how they are decoded."""
    h = hashlib.sha256(f"chargpt-cache-v{CACHE_VERSION}|{encoding}|{errors}".encode())
    for src in sources:
        h.update(f"|{src.size}|".encode())
        for chunk in src.chunks():
            h.update(chunk)
    return h.hexdigest()[:32]


def _progress(total, desc):
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, leave=False,
                disable=total < PROGRESS_MIN_BYTES, dynamic_ncols=True)


def encode_corpus(data=None, encoding="utf-8", errors="strict", cache_dir=None, log=print, check_length=None,
                  sources=None):
    """--data -> EncodedCorpus, using the on-disk cache when the same bytes were encoded before.

    `check_length(n_characters)` may raise to reject the corpus (e.g. too short for the block size) after the
    first pass and before anything is written to the cache. `sources`: (name, [Source]) read instead of --data's
    files in sorted order (--labels groups them by label: chargpt.data.labels).
    """
    name, sources = sources or corpus_sources(data, encoding)
    cache_dir = Path(cache_dir) if cache_dir else default_cache_dir()
    key = corpus_key(sources, encoding, errors)
    meta_path, ids_path = cache_dir / f"{key}.json", cache_dir / f"{key}.bin"
    cached = _read_cache(meta_path, ids_path)
    if cached is not None:
        vocab, length = cached
        corpus = EncodedCorpus(name, vocab, ids_path, length)
        if _ids_in_range(corpus):
            if check_length:
                check_length(length)
            return corpus
        log(f"the cached encoding {ids_path} is damaged (ids outside its {len(vocab):,}-character vocabulary); "
            f"rebuilding it")

    total = sum(s.size for s in sources)
    # pass 1: the vocabulary, as a set of code points marked in a 1.1 MB table (linear time)
    seen = np.zeros(MAX_CODEPOINT + 1, dtype=bool)
    length = 0
    with _progress(total, "scanning corpus") as bar:
        for text in iter_text(sources, encoding, errors):
            pts = codepoints(text)
            length += len(pts)
            seen[pts] = True
            bar.update(len(text))  # approximate for multi-byte text; it is only a progress bar
    if length == 0:
        raise DataError(f"corpus {data} is empty; give it some text")
    if check_length:
        check_length(length)
    try:
        vocab = Vocab.from_codepoints(np.flatnonzero(seen))
    except ChargptError as e:  # lone surrogates, which only the *_escape codecs produce
        raise DataError(f"corpus {data or name} decoded as {encoding}: {e}; pass {param('encoding')} with the "
                        f"file's real encoding") from None

    # pass 2: the ids, written to a temporary file and renamed into place only when complete. Under torchrun each
    # machine's first process encodes, maybe into one shared cache folder: the name carries this machine's name
    # beside the pid, so that no machine's sweep of dead writers' files removes another's file being written
    tmp = ids_path.with_name(ids_path.name + temp_suffix())
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_temps(cache_dir, key)
        written = 0
        with open(tmp, "wb") as f, _progress(total, "encoding corpus") as bar:
            for text in iter_text(sources, encoding, errors):
                pts = codepoints(text)
                try:
                    ids = vocab.ids_from_codepoints(pts)
                except ChargptError:  # a character pass 1 did not see
                    written = -1
                    break
                if written + len(ids) > length:
                    break
                ids.tofile(f)
                written += len(ids)
                bar.update(len(text))
        if written != length:
            raise DataError(f"corpus {data} changed while it was being encoded; run again once it is complete")
        os.replace(tmp, ids_path)
        write_json_atomic(meta_path, {"version": CACHE_VERSION, "chars": "".join(vocab.chars), "length": length})
    except OSError as e:
        raise DataError(f"cannot write the encoded corpus to {cache_dir}: {e.strerror}; "
                        f"pass {param('cache_dir')} with a writable directory that has space") from None
    finally:  # anything but success (including Ctrl-C): no partial file left behind
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    if total >= PROGRESS_MIN_BYTES:
        log(f"encoded {length:,} characters ({len(vocab):,} distinct) into {ids_path}")
    return EncodedCorpus(name, vocab, ids_path, length)


def remove_dead_temps(cache_dir, key):
    """An encoding killed half-way leaves a partial id file (as large as the corpus): delete it."""
    remove_stale_temps(cache_dir, (f"{key}.*.tmp*", f".{key}.*.tmp*"))


def _ids_in_range(corpus):
    """Every cached id indexes the vocabulary (a damaged .bin of the right size would crash training with an
    IndexError). One pass over the memory map, in chunks; it costs less than hashing the corpus for its key."""
    ids, limit = corpus.ids(), len(corpus.vocab)
    return all(int(ids[i:i + CHECK_CHUNK].max()) < limit for i in range(0, corpus.length, CHECK_CHUNK))


def cached_corpus(cache_dir, key, name="corpus"):
    """The corpus encoded under `key` in cache_dir, without its source files (a run that recorded its key finds
    its text again: chargpt.tools.novelty), or None when that entry is missing or damaged."""
    cache_dir = Path(cache_dir)
    found = _read_cache(cache_dir / f"{key}.json", cache_dir / f"{key}.bin")
    if found is None:
        return None
    corpus = EncodedCorpus(name, found[0], cache_dir / f"{key}.bin", found[1])
    return corpus if _ids_in_range(corpus) else None


def _read_cache(meta_path, ids_path):
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        vocab = Vocab(meta["chars"])
        length = int(meta["length"])
        if meta.get("version") != CACHE_VERSION or ids_path.stat().st_size != length * vocab.id_dtype().itemsize:
            return None
        return vocab, length
    except Exception:
        return None  # a missing or damaged cache entry is simply rebuilt


def write_json_atomic(path, obj):
    write_text_atomic(path, json.dumps(obj, ensure_ascii=False))


def split_sizes(length, val_fraction, block_size):
    """(n_train, n_val) of the tail split: the last val_fraction of the characters validate. Both must hold one
    full window."""
    n_val = int(length * val_fraction)
    n_train = length - n_val
    need = block_size + 1
    if n_val and n_train >= need and n_val >= need:
        return n_train, n_val
    fits = min(n_train, n_val) - 1
    hints = [f"use {param('block_size', fits)} or less"] if fits >= 1 else []
    if fits < 1 and length >= 2 * need:  # only then does some fraction leave both parts a window
        hints.append(f"use a larger {param('val_fraction')}")
    hints.append(f"give at least {math.ceil(need / min(val_fraction, 1 - val_fraction)):,} characters")
    if n_val == 0:
        raise DataError(f"the validation split is empty: {length:,} characters x {param('val_fraction', val_fraction)} "
                        f"rounds to 0; {_either(hints)}")
    raise DataError(f"corpus of {length:,} characters is too short for {param('block_size', block_size)} with "
                    f"{param('val_fraction', val_fraction)} (train {n_train:,}, validation {n_val:,}; each needs "
                    f"{need:,}): {_either(hints)}")


# --- the train/validation split ----------------------------------------------------------------------------------
# --val-split blocks (the default): the corpus is cut into blocks of SPLIT_CHARS characters and a val_fraction of
# them, evenly spaced (every 10th for 0.1), validate; each cut between a training and a validation stretch moves
# forward to just after the next line end (at most half a block), so no line is split between the two. A file
# is rarely uniform (a licence, then code; folk songs first, named poets last), so the last 10% is rarely like
# the rest: validation from all through the file measures what the model learned of the whole, not how unlike its
# end is. --val-split tail: the last val_fraction, as tiny Shakespeare's published numbers (nanoGPT's) use.
SPLIT_CHARS = 4096
MIN_SPLIT_BLOCKS = 100  # a smaller corpus gets smaller blocks (at least two windows each), so it still has some
PARTS = 10**6  # val_fraction in millionths: which blocks validate is exact integer arithmetic, on any machine


def split_whole(n, val_fraction, empty):
    """-> (train indices, validation indices), each sorted: a fixed pseudo-random choice of whole units (sentence
    pairs, list items), seed 0 and not --seed, so every run on the same data validates on the same units.
    empty("validation" or "training") -> the DataError for a split that would hold none."""
    n_val = int(n * val_fraction)
    if n_val == 0 or n_val == n:
        raise empty("validation" if n_val == 0 else "training")
    order = np.random.default_rng(0).permutation(n)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


@dataclass(frozen=True)
class Split:
    """Which stretches of the corpus train and which validate: (n, 2) arrays of [start, end) character offsets."""
    how: str  # "blocks" or "tail"
    train: np.ndarray
    val: np.ndarray
    block_chars: int = 0  # the nominal block length of the blocks split

    def size(self, split):
        segs = getattr(self, split)
        return int((segs[:, 1] - segs[:, 0]).sum())

    def pieces(self, ids, split):
        """The id arrays of a split's stretches (views of `ids`, in corpus order)."""
        return [ids[a:b] for a, b in getattr(self, split)]

    def describe(self, length):
        n_val = self.size("val")
        if self.how == "tail":
            return (f"validation: the last {n_val:,} characters ({n_val / length:.1%}, --val-split tail, as published "
                    f"tiny-Shakespeare numbers use)")
        return (f"validation: {n_val:,} characters ({n_val / length:.1%}) in {len(self.val):,} stretches spread "
                f"through the corpus (blocks of about {self.block_chars:,} characters cut at line ends, "
                f"--val-split blocks; --val-split tail: the last part instead)")


def make_split(ids, val_fraction, block_size, how="blocks", newline=None):
    """The split of the corpus `ids` (memory-mapped is fine). `newline`: the id of "\\n", to cut at line ends
    (None: cut anywhere). Deterministic: the same corpus and settings give the same split on any machine."""
    length = len(ids)
    if how == "tail":
        n_train, _ = split_sizes(length, val_fraction, block_size)
        return Split("tail", np.array([[0, n_train]]), np.array([[n_train, length]]))
    if how != "blocks":
        raise DataError(f"{param('val_split')} must be blocks or tail (got {how!r})")
    chars = check_blocks_length(length, val_fraction, block_size)
    n_blocks = math.ceil(length / chars)
    i = np.arange(n_blocks, dtype=np.int64)
    parts = round(val_fraction * PARTS)
    is_val = ((i + 1) * parts) // PARTS > (i * parts) // PARTS  # evenly spaced: blocks 9, 19, 29... for 0.1
    firsts = np.concatenate([[0], np.flatnonzero(is_val[1:] != is_val[:-1]) + 1])  # the first block of each run
    cuts = [0] + [min(length, _after_line_end(ids, int(b) * chars, newline, chars // 2)) for b in firsts[1:]]
    bounds = np.array(cuts + [length], dtype=np.int64)
    runs = np.stack([bounds[:-1], bounds[1:]], axis=1)
    runs, labels = runs[runs[:, 1] > runs[:, 0]], is_val[firsts][runs[:, 1] > runs[:, 0]]
    split = Split("blocks", runs[~labels], runs[labels], chars)
    _check_windows(split, length, val_fraction, block_size)
    return split


def check_blocks_length(length, val_fraction, block_size):
    """A corpus of `length` characters must hold a validation block and a training block, each at least two
    windows long; -> the block length: SPLIT_CHARS, or less where that leaves fewer than MIN_SPLIT_BLOCKS blocks
    (or ten validation blocks). Raises the error that says what to change (before anything is cached)."""
    parts = max(1, round(val_fraction * PARTS))
    first_val = -(-PARTS // parts)  # blocks up to and including the first validation block (10 for 0.1)
    least = 2 * (block_size + 1)
    chars = max(min(SPLIT_CHARS, length // max(MIN_SPLIT_BLOCKS, 10 * first_val)), least)
    blocks = max(first_val, 2)
    if length >= blocks * chars:
        return chars
    fits = length // (2 * blocks) - 1
    hints = [f"use {param('block_size', fits)} or less"] if fits >= 1 else []
    hints.append(f"give at least {blocks * least:,} characters")
    if tail := _tail_hint(length, val_fraction, block_size):
        hints.append(f"use {tail}")
    raise DataError(f"the validation split is empty: a corpus of {length:,} characters is too short for "
                    f"{param('block_size', block_size)} with {param('val_fraction', val_fraction)} and "
                    f"{param('val_split', 'blocks')} (1 block in {first_val:,} validates, each block at least two "
                    f"windows of {block_size + 1:,} characters): {_either(hints)}")


def _tail_hint(length, val_fraction, block_size):
    """How --val-split tail splits this corpus: '--val-split tail (...)' as it is, '--val-split tail with
    --block-size N or less' where only a shorter context fits, or None where it cannot (an error suggests it only
    where it works)."""
    n_val = int(length * val_fraction)
    fits = min(n_val, length - n_val) - 1  # the longest context whose window fits in both parts
    if fits >= block_size:
        return f"{param('val_split', 'tail')} (the last part validates)"
    return f"{param('val_split', 'tail')} with {param('block_size', fits)} or less" if fits >= 1 else None


def _either(hints):
    """['a', 'b', 'c'] -> 'a, b, or c'."""
    return hints[0] if len(hints) == 1 else f"{', '.join(hints[:-1])}, or {hints[-1]}"


def _after_line_end(ids, pos, newline, reach):
    """`pos` moved forward to just after the first line end at or after pos - 1, at most `reach` characters."""
    if newline is None or pos == 0:
        return pos
    hits = np.flatnonzero(np.asarray(ids[pos - 1:pos - 1 + reach]) == newline)
    return pos + int(hits[0]) if len(hits) else pos


def _check_windows(split, length, val_fraction, block_size):
    """Both sides of a blocks split must hold at least one window of block_size + 1 characters."""
    for name in ("val", "train"):
        segs = getattr(split, name)
        if not len(segs) or not ((segs[:, 1] - segs[:, 0]) > block_size).any():
            what = "empty" if not len(segs) else f"in stretches too short for {param('block_size', block_size)}"
            hints = ["a larger corpus", f"a smaller {param('block_size')}"]
            if tail := _tail_hint(length, val_fraction, block_size):
                hints.append(tail)
            raise DataError(f"the {'validation' if name == 'val' else 'training'} split of {length:,} characters is "
                            f"{what} with {param('val_fraction', val_fraction)}; use {_either(hints)}")


def split_of(ids, vocab, val_fraction, block_size, how):
    """make_split for an encoded corpus: cut at its line ends (if it has any)."""
    return make_split(ids, val_fraction, block_size, how, vocab.stoi.get("\n"))


def unseen_in_training(ids, split, vocab_size):
    """Ids that occur in the validation stretches but nowhere in the training ones (one pass over the corpus, in
    chunks) -> sorted array of ids."""
    seen = {}
    for name in ("train", "val"):
        counts = np.zeros(vocab_size, dtype=np.int64)
        for piece in split.pieces(ids, name):
            for k in range(0, len(piece), CHECK_CHUNK):
                counts += np.bincount(np.asarray(piece[k:k + CHECK_CHUNK]), minlength=vocab_size)
        seen[name] = counts > 0
    return np.flatnonzero(seen["val"] & ~seen["train"])


class Batches:
    """Random windows of the encoded corpus. x is a window, y the same window shifted by one character. Each
    window lies inside one stretch of its split: a training window never reaches into validation text."""

    def __init__(self, ids, val_fraction, block_size, batch_size, device, split=None):
        self.ids = ids
        self.split = split or make_split(ids, val_fraction, block_size, "tail")
        self.block_size, self.batch_size, self.device = block_size, batch_size, torch.device(device)
        self.offsets = np.arange(block_size + 1)
        self.starts = {}  # split -> (stretch starts, windows in the stretches before, windows in all)
        for name in ("train", "val"):
            segs = getattr(self.split, name)
            counts = np.maximum(segs[:, 1] - segs[:, 0] - block_size, 0)
            ends = np.cumsum(counts)
            self.starts[name] = (segs[:, 0], ends - counts, ends)

    def get(self, split, generator):
        """-> x, y: (B, T) int64 tensors on the device; `generator` (CPU) decides the windows."""
        first, before, ends = self.starts[split]
        r = torch.randint(int(ends[-1]), (self.batch_size,), generator=generator).numpy()  # the n-th window of all
        j = np.searchsorted(ends, r, side="right")  # its stretch (the tail split has one: the same draws as ever)
        starts = first[j] + r - before[j]
        window = torch.from_numpy(self.ids[starts[:, None] + self.offsets].astype(np.int64))  # (B, T+1)
        if self.device.type == "cuda":
            window = window.pin_memory().to(self.device, non_blocking=True)
        else:
            window = window.to(self.device)
        return window[:, :-1], window[:, 1:]


SNIPPET_CHARS = 40  # the most a closing-sample prompt takes from the validation text


def val_snippet(ids, split, vocab, max_chars=SNIPPET_CHARS):
    """A short real piece of validation text to start a sample from: the start of the first line of the middle
    validation stretch with words on it (not a blank or deeply indented line), cut at its end or a word boundary.
    Deterministic (the same for every run on the corpus); "" when the validation text has no such line."""
    newline = vocab.stoi.get("\n")
    order = sorted(range(len(split.val)), key=lambda k: abs(k - len(split.val) // 2))  # the middle first
    for k in order[:8]:
        a, b = (int(x) for x in split.val[k])
        text = vocab.decode(np.asarray(ids[a:min(b, a + SPLIT_CHARS)]))
        starts = [0] if a == 0 or ids[a - 1] == newline else []  # only whole lines: the stretch may begin mid-line
        starts += [i + 1 for i, c in enumerate(text) if c == "\n"]
        for i in starts:
            line = text[i:].split("\n", 1)[0]
            body = line.lstrip()
            if len(body) >= 3 and any(c.isalnum() for c in body) and len(line) - len(body) < max_chars // 2:
                return _cut(line, max_chars)
    return ""


def _cut(line, max_chars):
    if len(line) <= max_chars:
        return line
    space = line.rfind(" ", max_chars // 3, max_chars + 1)
    return line[:space + 1] if space > 0 else line[:max_chars]
