"""The index files, cached beside the encoded corpus (chargpt.data.corpus) as numpy .npy files, written atomically
(rundir.write_atomic) and read back memory-mapped (no pickle: allow_pickle=False):

    <key>.sa-train-<n_train>.v1.npy   int32 (int64 past 2**31 characters), one entry per training position
    <key>.sa-val-<n_train>.v1.npy     the same for the validation split (n_train names the split point)
    <key>.lines.v1.npy                where every line ends ("\\n"; for sentence pairs, the end marker), for
                                      line numbers

(Sentence pairs name their split by its validation size, --val-split blocks by its stretches' block length and
validation size: sa-train-s<block>-<n_val>.)

A file is checked before it is used, and one that fails is rebuilt, with a line that says so: its size on disk
(never read past what the corpus implies), its length (the corpus sets it), every value a position of the text,
and its order (check_order: a few thousand sampled neighbours of a suffix array, or the line ends, compared).
A write cut short leaves a hidden `.<name>.tmp<pid>` file: SIGTERM in the middle of one (as Ctrl-C) removes it,
and remove_stale removes those of processes that are gone (kill -9, power loss).
"""

import contextlib
import signal
import threading

import numpy as np

from chargpt.runs.rundir import remove_stale_temps, write_atomic
from chargpt.tools.novelty.score import suffix_keys
from chargpt.training.interrupt import handling

INDEX_VERSION = 1
ORDER_SAMPLES = 4096  # neighbouring pairs of a suffix array compared when it is loaded
ORDER_DEPTH = 64  # characters compared per pair (pairs equal that far are not told apart: a cheap check)
HEADER_BYTES = 1 << 16  # the most an .npy header takes (numpy's own limit for format 1.0 is 65,535 bytes)


def index_path(cache_dir, key, what):
    """The cache file of one index array: `what` is "lines" or "sa-<split>-<tag>"."""
    return cache_dir / f"{key}.{what}.v{INDEX_VERSION}.npy"


def remove_stale(cache_dir, key):
    """The index files' temporary files (`.<key>.sa-...npy.tmp<pid>`) left by processes that are gone."""
    remove_stale_temps(cache_dir, (f".{key}.sa-*.npy.tmp*", f".{key}.lines.*.npy.tmp*"))


class NotIndexed(LookupError):
    """An index file that is not there (or not sound) where the caller asked for no building (cached, build None):
    speculative decoding's auto drafts from the training text only once its index is built."""


def cached(path, build, log, what, size, bound, check=None):
    """The array in `path` (memory-mapped) if it is there and sound (`size` long, every value from 0 to below
    `bound`, and check(array) -> None rather than what is wrong with it), else build(), saved there atomically
    and mapped back. A file that is there but unsound is named in one line of `log` before it is rebuilt.
    build None: NotIndexed rather than a build."""
    arr, damage = load(path, size, bound, check)
    if arr is not None:
        return arr
    if build is None:
        raise NotIndexed(str(path))
    if damage:
        log(f"the cached novelty {what} {path} is damaged ({damage}); rebuilding it")
    arr = build()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)

        def save(tmp):
            with open(tmp, "wb") as f:
                np.save(f, arr, allow_pickle=False)
        with terminate_as_interrupt():
            write_atomic(path, save)
    except OSError as e:
        log(f"warning: cannot cache the novelty {what} in {path.parent} ({e.strerror}); it is rebuilt next time")
        return arr
    return load(path, None, None)[0]


def load(path, size, bound, check=None, chunk=1 << 24):
    """-> (the cached index array, memory-mapped, None) when it is sound, else (None, what is wrong with it; ""
    when it is missing). Nothing past the header is read from a file longer than `size` entries imply."""
    try:
        on_disk = path.stat().st_size
    except OSError:
        return None, ""
    if size is not None and on_disk > HEADER_BYTES + 8 * size:
        return None, f"{on_disk:,} bytes for {size:,} entries"
    try:
        arr = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        return None, f"not a numpy array file: {e}"
    if arr.ndim != 1 or arr.dtype not in (np.int32, np.int64):
        return None, f"a {arr.dtype} array of shape {arr.shape}, not a list of positions"
    if size is not None and len(arr) != size:
        return None, f"{len(arr):,} entries where the corpus has {size:,}"
    if arr.offset + arr.nbytes != on_disk:
        return None, f"{on_disk:,} bytes where its header says {arr.offset + arr.nbytes:,}"
    if bound is not None and len(arr):
        for i in range(0, len(arr), chunk):
            piece = arr[i:i + chunk]
            if int(piece.min()) < 0 or int(piece.max()) >= bound:
                return None, "a position outside the text"
    damage = check(arr) if check is not None and len(arr) else None
    return (None, damage) if damage else (arr, None)


def check_order(text, sa, stop, inside=None, samples=ORDER_SAMPLES, depth=ORDER_DEPTH):
    """None if `sa` looks sorted, else what is wrong: `samples` random neighbouring pairs (all of them in a short
    array) must be distinct positions in order, compared over `depth` characters as the searches compare them
    (stop: positions -> their stretch's end, score.stops_of); inside(positions) -> bool, if given, must hold for the
    sampled positions (a blocks split's positions lie in its stretches). A shuffled or overwritten array fails at
    once; damage to a few entries may pass (the length and range checks still hold it to the text)."""
    n = len(sa)
    if n < 2:
        return None
    i = np.arange(n - 1) if n - 1 <= samples else np.random.default_rng().integers(0, n - 1, samples)
    a, b = np.asarray(sa[i], dtype=np.int64), np.asarray(sa[i + 1], dtype=np.int64)
    if inside is not None and not (inside(a).all() and inside(b).all()):
        return "a position outside its split"
    if (a == b).any():
        return "a position listed twice"
    ka, kb = suffix_keys(text, a, stop(a), depth), suffix_keys(text, b, stop(b), depth)
    differ = ka != kb
    rows = np.flatnonzero(differ.any(axis=1))
    first = differ[rows].argmax(axis=1)
    return "its suffixes out of order" if (ka[rows, first] > kb[rows, first]).any() else None


def check_line_ends(ids, value, samples=ORDER_SAMPLES):
    """-> check(line_ends): None if they look right (increasing, each at a `value` of ids; sampled), else what is
    wrong."""
    def check(ends):
        n = len(ends)
        i = np.arange(n) if n <= samples else np.random.default_rng().integers(0, n, samples)
        at = np.asarray(ends[i], dtype=np.int64)
        if (np.asarray(ids[at]) != value).any():
            return "a line end that is not one"
        j = i[i < n - 1]
        if (np.asarray(ends[j + 1], dtype=np.int64) <= np.asarray(ends[j], dtype=np.int64)).any():
            return "line ends out of order"
        return None
    return check


@contextlib.contextmanager
def terminate_as_interrupt():
    """SIGTERM (what `kill` and job schedulers send) raises KeyboardInterrupt inside this block, as Ctrl-C does,
    so that write_atomic removes its temporary file before the process ends; only where SIGTERM would otherwise
    kill at once (the main thread, no handler of the command's own: training's SignalFlag keeps its)."""
    sigterm = getattr(signal, "SIGTERM", None)
    if sigterm is None or threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(sigterm) is not signal.SIG_DFL:
        yield
        return

    def interrupt(signum, frame):
        raise KeyboardInterrupt
    with handling((sigterm,), interrupt):
        yield
