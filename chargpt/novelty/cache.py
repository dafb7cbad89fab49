"""The index files, cached beside the encoded corpus (chargpt.data) as numpy .npy files, written atomically
(rundir.write_atomic) and read back memory-mapped (no pickle: allow_pickle=False):

    <key>.sa-train-<n_train>.v1.npy   int32 (int64 past 2**31 characters), one entry per training position
    <key>.sa-val-<n_train>.v1.npy     the same for the validation split (n_train names the split point)
    <key>.lines.v1.npy                where every line ends ("\\n"; for sentence pairs, the end marker), for
                                      line numbers

(Sentence pairs name their split by its validation size, --val-split blocks by its block length and validation
size.) A file that is damaged (wrong length, a position outside the text) is rebuilt, not trusted.
"""

import numpy as np

from ..rundir import write_atomic

INDEX_VERSION = 1


def index_path(cache_dir, key, what):
    """The cache file of one index array: `what` is "lines" or "sa-<split>-<tag>"."""
    return cache_dir / f"{key}.{what}.v{INDEX_VERSION}.npy"


def cached(path, build, log, what, size=None, bound=None):
    """The array in `path` (memory-mapped) if it is there and sound (`size` long, if given; every value from 0 to
    below `bound`), else build(), saved there atomically and mapped back."""
    arr = load(path, size, bound)
    if arr is not None:
        return arr
    arr = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)

        def save(tmp):
            with open(tmp, "wb") as f:
                np.save(f, arr, allow_pickle=False)
        write_atomic(path, save)
    except OSError as e:
        log(f"warning: cannot cache the novelty {what} in {path.parent} ({e.strerror}); it is rebuilt next time")
        return arr
    return load(path, None, None)


def load(path, size, bound, chunk=1 << 24):
    """A cached index array, memory-mapped, or None when missing or unsound (wrong length or values out of
    range: such a file is rebuilt rather than trusted with a corpus's positions)."""
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError):
        return None
    if arr.ndim != 1 or arr.dtype not in (np.int32, np.int64) or (size is not None and len(arr) != size):
        return None
    if bound is not None and len(arr):
        for i in range(0, len(arr), chunk):
            piece = arr[i:i + chunk]
            if int(piece.min()) < 0 or int(piece.max()) >= bound:
                return None
    return arr
