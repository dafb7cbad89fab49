"""Run directories: what they hold, where they go, who owns one, and how files in them are written.

A run directory (checkpoints/<corpus name> by default) holds:
  best.safetensors     the model at its best validation loss: what sampling loads by default
  latest.safetensors   the model at the last save
  state.safetensors    everything --resume needs: weights, AdamW moments, step, random states
  metrics.jsonl        one JSON line per evaluation
  config.toml          the run's resolved settings: chargpt train --config DIR/config.toml repeats it
  samples.jsonl        with --sample-every: one JSON line per sample shown while training (step, prompt, text)
  curves.png           loss curves, drawn when training ends (if matplotlib is installed)
  .lock, .owner        while a training owns the directory: its lock, and that process's id and host

Every file is written to a temporary name, flushed to disk and renamed over the old one (write_atomic), so a
crash or a full disk during a save leaves the previous file intact. One training at a time owns a directory
(RunDir.claim). The lock is filelock's: the kernel's on every system (flock on Linux and macOS, msvcrt's on Windows),
so it dies with its process, even under kill -9; on a filesystem without OS locks (some network mounts), a marker
file naming its process, which a later claim on the same machine takes over once that process is gone.
"""

import contextlib
import json
import math
import os
import re
import socket
import time
import warnings
from pathlib import Path

from chargpt.errors import CheckpointError
from chargpt.platforms import pid_alive, portable_name, replace

with warnings.catch_warnings():  # where fcntl is missing, filelock warns once that it falls back to its marker lock
    warnings.simplefilter("ignore")
    import filelock

LATEST, BEST, STATE, METRICS, LOCK = ("latest.safetensors", "best.safetensors", "state.safetensors",
                                      "metrics.jsonl", ".lock")
OWNER = ".owner"  # beside the lock, not in it: on Windows a locked file cannot be read, and a marker lock is filelock's
CLAIM_WAIT = 0.3  # seconds a claim retries a held lock: rides over lock_holder()'s brief probes
CONFIG, SAMPLES = "config.toml", "samples.jsonl"
LOSSES = "train_loss.jsonl"  # the running training loss, every few steps: the dense curve between evaluations
LOG = "train.log"  # every line a run said, its start-up in full, over all its sessions
STATUS = "status.json"  # how the run's training is going, and how its last session ended (training/sinks.py)
RUN_FILES = (STATE, LATEST, BEST)
DEFAULT_ROOT = Path("checkpoints")


# --- where runs are ---------------------------------------------------------------------------------------
def holds_run(directory):
    return any((Path(directory) / name).exists() for name in RUN_FILES)


def default_out_dir(name, resume, root=DEFAULT_ROOT):
    """checkpoints/<name>, or <name>-2, -3 ... so that a new run never overwrites an old one nor joins a
    training that is still starting there; with --resume, the one whose state was saved last. The corpus's name is
    made one folder name every system accepts (platforms.portable_name)."""
    root, name = Path(root), portable_name(name)
    candidates = [root / name] + [root / f"{name}-{i}" for i in range(2, 1000)]
    if resume:
        saved = [d for d in candidates if (d / STATE).is_file()]
        return max(saved, key=lambda d: (d / STATE).stat().st_mtime) if saved else root / name
    return next(d for d in candidates if not holds_run(d) and lock_holder(d) is None)


def latest_run(root=DEFAULT_ROOT, pass_run="pass --checkpoint PATH"):
    """The most recently written run directory under root, or an error saying how to make one, or (`pass_run`, in
    the command's own words) how to name one."""
    root = Path(root)
    runs = [d for d in root.iterdir() if d.is_dir() and ((d / BEST).exists() or (d / LATEST).exists())] \
        if root.is_dir() else []
    if not runs:
        raise CheckpointError(f"no trained run under {root}/; train one with python train.py, or {pass_run}")
    return max(runs, key=lambda d: max((d / n).stat().st_mtime for n in (BEST, LATEST) if (d / n).exists()))


def resolve(path):
    """A run directory or a file -> the checkpoint file (best, else latest, in a directory)."""
    p = Path(path).expanduser()
    if p.is_dir():
        for name in (BEST, LATEST):
            if (p / name).is_file():
                return p / name
        raise CheckpointError(f"no checkpoint in {path} (expected {BEST} or {LATEST}); train first with "
                              f"python train.py --out-dir {path}")
    if not p.exists():
        raise CheckpointError(f"checkpoint not found: {path}; pass a run directory or a .safetensors file")
    if not p.is_file():
        raise CheckpointError(f"{path} is not a checkpoint (not a regular file or a directory); pass a run directory "
                              f"or a .safetensors file")
    return p


# --- who owns a run ---------------------------------------------------------------------------------------
def check_writable(out_dir):
    """Fail, creating nothing, unless out_dir can be made: its nearest existing folder must be a writable
    directory."""
    out_dir = Path(out_dir)
    try:
        existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
        problem = f"{existing} is not a directory" if not existing.is_dir() else \
            None if os.access(existing, os.W_OK | os.X_OK) else f"{existing} is not writable"
    except OSError as e:
        problem = e.strerror
    if problem:
        raise CheckpointError(f"cannot write to --out-dir {out_dir} ({problem}); choose a writable directory")


class RunDir:
    """A run directory owned by this process: created if needed and locked until release(). A start that
    fails before anything was saved leaves no trace: release() removes the folders claim() created, if
    they are still empty."""

    def __init__(self, path):
        self.path = Path(path)
        self.created = []  # folders made by claim(), outermost first
        self._lock = None  # the held lock; releasing it (or dying) gives the directory back

    def claim(self):
        check_writable(self.path)
        for _ in range(3):  # a failed start elsewhere may remove an empty folder between our mkdir and open
            try:
                self._make_dirs()
                return self._take_lock()
            except FileNotFoundError:
                continue
            except OSError as e:
                self.release()
                raise CheckpointError(f"cannot write to --out-dir {self.path} ({e.strerror}); choose a writable "
                                      f"directory") from None
        self.release()
        raise CheckpointError(f"{self.path} keeps disappearing; is another program removing it?")

    def _make_dirs(self):
        for d in reversed([self.path, *self.path.parents]):
            if not d.exists():
                try:
                    d.mkdir()
                    self.created.append(d)
                except FileExistsError:
                    pass
                except FileNotFoundError:
                    if d.parent.is_dir():  # the folder above is there: its filesystem refuses new folders (/proc)
                        self.release()
                        raise CheckpointError(f"cannot write to --out-dir {self.path} ({d.parent} does not allow "
                                              f"creating folders in it); choose a writable directory") from None
                    raise  # the folder above went away: claim() tries again

    def _take_lock(self):
        lock = _acquire(self.path / LOCK, CLAIM_WAIT)
        if lock is None:
            holder, elsewhere = _read_holder(self.path)
            self.release()
            gone = f"; if that training is gone, delete {self.path / LOCK}" if elsewhere else ""
            raise CheckpointError(f"{self.path} is in use by another training ({holder}); wait for it to finish or "
                                  f"stop it (Ctrl-C saves it), or pass another --out-dir{gone}")
        self._lock = lock
        with contextlib.suppress(OSError):  # only the message above reads it
            write_text_atomic(self.path / OWNER, json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        return self

    def release(self):
        """Give the directory up: the owner and lock files go first (while still locked, so no one can lock the
        file we are removing; where an open file cannot be removed, Windows, filelock removes it on release), then
        the lock itself, then any folder claim() created that is still empty."""
        if self._lock is not None:
            for name in (OWNER, LOCK):
                with contextlib.suppress(OSError):
                    os.unlink(self.path / name)
            self._lock.release()
            self._lock = None
        for d in reversed(self.created):
            with contextlib.suppress(OSError):
                d.rmdir()  # only succeeds on an empty folder: a saved run is never touched
        self.created = []


class _Unlocked:
    """What _acquire gives where the filesystem supports no lock at all: training goes on, unlocked."""

    def release(self):
        pass


def _acquire(path, wait):
    """-> the lock at `path`, held, or None while another process holds it. filelock's FileLock takes the kernel's
    lock (flock; msvcrt on Windows; without fcntl, its marker lock); a filesystem that refuses OS locks (ENOLCK on
    some network mounts) gets the marker lock (SoftFileLock), and one that refuses both, none."""
    for kind in (filelock.FileLock, filelock.SoftFileLock):
        lock = kind(str(path))
        try:
            with warnings.catch_warnings():  # "falling back to SoftFileLock": this function says what it does
                warnings.simplefilter("ignore")
                lock.acquire(timeout=wait, poll_interval=0.05)
            return lock
        except filelock.Timeout:
            return None
        except FileNotFoundError:  # the folder went: claim() makes it again
            raise
        except (OSError, NotImplementedError):
            continue
    return _Unlocked()


OWNER_BYTES = 4096  # the .owner file holds {"pid": ..., "host": ...}: anything longer is not one


def _read_holder(directory):
    """-> (how the message names the training that holds directory's lock, whether it runs on another machine)."""
    try:
        with open(Path(directory) / OWNER, "rb") as f:  # a few dozen bytes; never more than OWNER_BYTES read
            info = json.loads(f.read(OWNER_BYTES).decode("utf-8"))
        pid, host = int(info["pid"]), str(info["host"])
    except (OSError, ValueError, KeyError, TypeError):
        return "a process that is still starting", False
    if host != socket.gethostname():
        return f"pid {pid} on {host}", True
    if pid != os.getpid() and not pid_alive(pid):  # a killed holder's file; the new holder has not written its own
        return "a process that is still starting", False
    return f"pid {pid}", False


def lock_holder(directory):
    """'pid N' of the training that owns directory, or None if none does."""
    path = Path(directory) / LOCK
    if not path.is_file():
        return None
    try:
        lock = _acquire(path, 0)
    except OSError:
        return None
    if lock is None:
        return _read_holder(directory)[0]
    lock.release()
    return None


# --- writing files ----------------------------------------------------------------------------------------
# A temporary file's name ends in .tmp<pid>-<host>: the writer's process id and machine. A cache folder or a run
# directory on a shared filesystem is written by several machines (under torchrun each machine's first process
# encodes the corpus), and a pid means something only on the machine it came from; so the sweep of dead writers'
# leftovers (remove_stale_temps) judges only this machine's files by their pid. Another machine's temporary file is
# left alone unless it has not been written to for FOREIGN_TEMP_AGE, far longer than any write takes.
FOREIGN_TEMP_AGE = 24 * 3600  # seconds


def host_tag():
    """This machine's name as it goes into temporary file names: letters, digits and '-' only (no '.', so the
    name's last '.tmp' is always the one before the pid), at most 40 characters."""
    return re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname())[:40] or "host"


def temp_suffix():
    """'.tmp<pid>-<host>': what a temporary file's name ends in (see above)."""
    return f".tmp{os.getpid()}-{host_tag()}"


def write_atomic(path, write):
    """`write(tmp)` fills a temporary file next to path (named with our pid and host, so a later cleanup can tell
    a dead writer's leftovers from a live one's); then it is flushed to disk and renamed over path, and the
    rename itself is flushed. On any failure, including Ctrl-C, the temporary file is removed and the
    exception goes on; path is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}{temp_suffix()}")
    try:
        write(tmp)
        os.chmod(tmp, _file_mode())  # some writers (safetensors) create files 0600; a run is meant to be shared
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        replace(tmp, path)
        _fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path, text):
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _fsync_dir(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _file_mode():
    """The permissions a plain open() would give a new file (0666 less the umask)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


# The names remove_stale_temps may delete, whole: NAME.tmp<pid>-<host> (temp_suffix; host as host_tag makes it),
# NAME.tmp<pid> (written before hosts were added, and by export and plot), and safetensors' own .tmpXXXXXX. A user's
# file that merely contains ".tmp" (.notes.tmp.txt, .backup.tmpl, .page.html.tmp_draft) is none of them.
OUR_TEMP = re.compile(r".+\.tmp(?P<pid>[0-9]{1,9})(?:-(?P<host>[A-Za-z0-9-]{1,40}))?")
SAFETENSORS_TEMP = re.compile(r"\.tmp[A-Za-z0-9]{6}")


def remove_stale_temps(directory, patterns=(".*.tmp*", ".tmp??????")):
    """Delete temporary files left behind by writes whose process was killed (kill -9, power loss), and only those:
    a name of exactly the form ours take (OUR_TEMP: ending in the writer's pid and host) whose writer is gone (this
    machine's files of processes still running are left alone, and other machines' files unless untouched for
    FOREIGN_TEMP_AGE; those named before hosts were added end in the pid alone and are judged as this machine's),
    or a `.tmpXXXXXX` made by safetensors itself, which writes through a temporary file of its own. `patterns`:
    where to look (globs); any other name they match is a file of someone else's, and kept."""
    here = host_tag()
    for p in (p for pattern in patterns for p in Path(directory).glob(pattern)):
        ours = OUR_TEMP.fullmatch(p.name)
        if ours is None and not SAFETENSORS_TEMP.fullmatch(p.name):
            continue  # not a name we write
        if ours is not None and _temp_in_use(p, ours["pid"], ours["host"], here):
            continue
        with contextlib.suppress(OSError):
            p.unlink()


def _temp_in_use(path, pid, host, here):
    """Whether the temporary file `path`, written by process `pid` on machine `host` (None: this one), may still be
    being written."""
    if host and host != here:  # another machine's: its pid says nothing here
        try:
            return time.time() - path.stat().st_mtime < FOREIGN_TEMP_AGE
        except OSError:
            return True
    return int(pid) != os.getpid() and pid_alive(int(pid))


# --- metrics.jsonl ----------------------------------------------------------------------------------------
def append_jsonl(path, record, sync=True):
    """One line, flushed to disk: the line is written before the state it describes (see Trainer). sync=False
    leaves the disk write to the OS: for lines written often that no state depends on (LOSSES)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            if sync:
                os.fsync(f.fileno())
    except OSError as e:
        raise CheckpointError(f"could not append to {path} ({e.strerror}); free disk space or choose a "
                              f"writable --out-dir") from None


def check_metrics(path):
    """Before resuming: metrics.jsonl, if there, must be a readable file (resuming rewrites it)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return
    problem = None if path.is_file() else "it is a directory" if path.is_dir() else "it is not a regular file"
    if problem is None:
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            problem = e.strerror
    if problem:
        raise CheckpointError(f"cannot resume: {path} is unusable ({problem}); move it out of the run "
                              f"directory (a new one is started) and resume again")


def truncate_metrics(path, step):
    """Drop the lines logged after `step`, the step a run resumes from: it logs them again. A line cut short
    by a kill does not parse and is dropped too."""
    path = Path(path)
    if not path.exists():
        return
    try:
        lines = [ln for ln in path.read_text(encoding="utf-8", errors="replace").splitlines() if ln.strip()]
        keep = [ln for ln in lines if _json_step(ln) <= step]
        if len(keep) != len(lines):
            write_text_atomic(path, "".join(ln + "\n" for ln in keep))
    except OSError as e:
        raise CheckpointError(f"cannot rewrite {path} ({e.strerror}); fix its permissions and resume again") \
            from None


def read_step_rows(path):
    """A run's step-keyed JSON lines (metrics.jsonl, train_loss.jsonl, samples.jsonl) -> its rows (dicts with an
    integer step) sorted by step, the last one kept for a repeated step; lines that do not parse (cut short by a
    kill) are skipped. A missing or unreadable file has no rows: [], never an error (plot.require_metrics is the
    reader that insists)."""
    rows = {}
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line, parse_constant=no_constant)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows[row["step"]] = row
    return [rows[s] for s in sorted(rows)]




def no_constant(name):
    """json.loads's parse_constant: NaN and Infinity, which Python writes but JSON has not, refused as invalid."""
    raise ValueError(f"{name} is not a number JSON allows")


def _json_step(line):
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return math.inf
