"""Trainings started from the playground's New run view: one child process at a time, running the very command a
person types (`python -m chargpt train --data FILE --out-dir RUN --max-time N ...`), watched until it ends.

The child gets its own process group, so a Ctrl-C meant for the server never reaches it, and Stop sends it SIGTERM
(Ctrl-Break on Windows), which saves and ends it as Ctrl-C does. It outlives the server: a server started again on the
same folder reads the record below and watches the training by its pid (and the run directory's lock, so a pid the
system gave to another process is never taken for it).

What the server keeps, in .playground/ under the served checkpoints folder (never listed as a run: it holds no
checkpoint; its name starts with '.', which no run name from the page may):
  uploads/NAME.txt   texts uploaded from the page: strict UTF-8, capped in size, written whole or not at all
  logs/RUN.log       each training's output, stdout and stderr: every line train.log gets (the child runs with
                     --verbose) from the first moment on (train.log waits for the run's first save), the progress
                     bar, and the one error line of a start that failed before any run directory existed
  training.json      the training started last: run, pid, command, budget, and how it ended
Corpora and runs are chosen by name from a fresh listing of a folder the server was given; a name never becomes a
path, and a file whose real path leaves its folder (a symlink out of it) is not listed.
"""

import contextlib
import errno
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import chargpt
from chargpt.config import PRESETS
from chargpt.data.corpus import DEFAULT_CORPUS_NAME
from chargpt.errors import ChargptError
from chargpt.platforms import WINDOWS, pid_alive, portable_name
from chargpt.runs.checkpoint import read_meta, run_settings
from chargpt.runs.rundir import LOSSES, SAMPLES, STATE, STATUS, lock_holder, write_atomic, write_text_atomic
from chargpt.web.body import RequestError
from chargpt.web.corpora import inside, size_of, text_folders, texts
from chargpt.web.limits import (
    MAX_NAME_CHARS,
    MAX_UPLOAD_FOLDER_BYTES,
    TRAIN_LOG_LINES,
    TRAIN_SAMPLES,
)

HOME, UPLOADS, LOGS, RECORD = ".playground", "uploads", "logs", "training.json"
TEXT_PRESETS = tuple(name for name, p in PRESETS.items() if p.get("task", "text") == "text")  # not sentence pairs
TAIL_BYTES = 64 * 1024  # read from the end of a log or a .jsonl file: what the page shows is at its end
HEAD_BYTES = 32 * 1024  # read from the start of a log: the start-up lines
START_GRACE_S = 120  # a child this young may not hold its run's lock yet (it is still importing torch)
STOP_CODES = (130, 143, -signal.SIGINT, -signal.SIGTERM)  # saved and ended by a signal; or killed while starting
# the first line that is no longer the start-up: an evaluation, a sample, the end
AFTER_START = re.compile(r"^(step +\d+:|--- sample|done:|error:|interrupted|stopped |more with:)")
BUSY = "a training is already running ({run}); one at a time, because a training uses all of this machine's cores: " \
       "stop it first, or wait for it to finish"


class Trainings:
    """The trainings started from the page: at most one running, the last one's record, the texts to train on."""

    def __init__(self, checkpoints, data_dir=None, device="auto", enabled=True, train_args=(), off_because=None):
        self.root = Path(checkpoints).resolve()
        self.train_args = tuple(train_args)  # the server's own flags for every training (e.g. --threads)
        self.home = self.root / HOME
        self.data_dir = Path(data_dir).resolve() if data_dir is not None else None
        self.device, self.enabled = device, enabled
        self.off_because = off_because  # why the page may not train, when that is not --no-training
        self.lock = threading.Lock()
        self.proc = None  # the Popen of a training this server started (None for one found on start-up)
        self.record = self._read_record() if enabled else None

    # --- folders and names ------------------------------------------------------------------------------------
    def _folder(self, name):
        """.playground/name, made if needed; refused if either is (or leads through) a link out of the folder."""
        folder = self.home / name
        for p in (self.home, folder):  # checked before anything is made: mkdir would follow a link
            if p.is_symlink() or (p.exists() and not inside(p, self.root)):
                raise RequestError(500, f"{p} is a link; remove it, so that the server keeps its files in its own "
                                        f"folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RequestError(500, f"cannot make {folder} ({e.strerror}); make the checkpoints folder writable") \
                from None
        return folder

    def texts(self, folder):
        return texts(folder)

    def corpora(self):
        """What a training can read: the built-in corpus, the data folder's texts and folders of texts (with their
        labels choices), the uploaded ones."""
        data, uploads = self.texts(self.data_dir), self.texts(self.home / UPLOADS)
        return {"builtin": DEFAULT_CORPUS_NAME, "data_dir": self.data_dir.name if self.data_dir else None,
                "data": [{"name": n, "kind": "file", "bytes": size_of(p)} for n, p in data.items()]
                + [f.summary() for f in text_folders(self.data_dir).values()],
                "uploads": [{"name": n, "kind": "file", "bytes": size_of(p)} for n, p in uploads.items()]}

    def corpus_path(self, source, name, labels=None):
        """A corpus chosen by name, and a labels choice -> (its path (None: the built-in one), chargpt train's
        --labels value or None); a 404 saying where the names are, or a 400 for labels the corpus cannot have."""
        if source == "builtin":
            return None, no_labels(labels, "the built-in corpus is one text")
        if source == "data" and self.data_dir is None:
            raise RequestError(404, "this server has no data folder; start it with chargpt serve --data-dir DIR, or "
                                    "upload the text")
        folder = self.data_dir if source == "data" else self.home / UPLOADS
        path = self.texts(folder).get(name) if isinstance(name, str) else None
        if path is not None:
            return path, no_labels(labels, f"{name} is one text")
        found = text_folders(self.data_dir).get(name) if source == "data" and isinstance(name, str) else None
        if found is None:
            raise RequestError(404, f"no text named {str(name)[:80]!r} in the {source} folder; GET /api/corpora "
                                    f"lists them")
        return found.path, found.labels_flag(labels)

    def _new_run_dir(self, name):
        """A run directory that does not exist yet: NAME, else NAME-2, NAME-3 ... (a new run never joins an old
        one; --resume continues one)."""
        for candidate in [name] + [f"{name}-{i}" for i in range(2, 1000)]:
            path = self.root / candidate
            if not path.exists() and not path.is_symlink():
                return path
        raise RequestError(409, f"runs {name} to {name}-999 all exist; choose another run name")

    # --- uploads ----------------------------------------------------------------------------------------------
    def upload(self, filename, data):
        """Keep an uploaded text (bytes, already capped) as uploads/NAME.txt -> its name. Checked whole before
        anything is written; the same text uploaded again is the same file."""
        if not data:
            raise RequestError(400, "the file is empty; choose a text file with something in it")
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RequestError(400, f"the file is not UTF-8 text (byte {e.start:,} is not UTF-8); save it as UTF-8 "
                                    f"(most editors offer it under Save as) and upload it again") from None
        if b"\0" in data:  # training refuses a text with one (a binary file, or UTF-16): said now, not at its start
            raise RequestError(400, f"the file holds a NUL byte (at byte {data.index(0):,}), which no text has and "
                                    f"training refuses; it is likely not a text file, or saved as UTF-16: save it "
                                    f"as UTF-8 text and upload it again")
        stem = text_name(filename)
        with self.lock:
            folder = self._folder(UPLOADS)
            kept = self.texts(folder)
            if sum(size_of(p) for p in kept.values()) + len(data) > MAX_UPLOAD_FOLDER_BYTES:
                raise RequestError(507, f"the uploads folder {folder} is full ({MAX_UPLOAD_FOLDER_BYTES:,} bytes at "
                                        f"most); delete texts you no longer need from it")
            for name in [f"{stem}.txt"] + [f"{stem}-{i}.txt" for i in range(2, 1000)]:
                path = folder / name
                if name in kept and path.read_bytes() == data:
                    return name
                if not path.exists() and not path.is_symlink():
                    try:  # whole or not at all: a write cut short (a full disk) leaves nothing
                        write_atomic(path, lambda tmp: tmp.write_bytes(data))
                    except OSError as e:
                        raise RequestError(disk_status(e), f"cannot keep the upload as {name} ({e.strerror}); "
                                                           f"free disk space on the server and upload it again") \
                            from None
                    return name
        raise RequestError(409, f"{stem}.txt to {stem}-999.txt all exist; rename the file")

    # --- starting, stopping, resuming -------------------------------------------------------------------------
    def start(self, source, corpus, name, max_time, options, labels=None):
        """A new run on a corpus chosen by name, for max_time seconds; options: more train flags (preset, size);
        labels: a folder corpus's labels choice (none, folders, files or one of its manifests)."""
        with self.lock:
            self._refuse_if_running()
            data, labels = self.corpus_path(source, corpus, labels)
            out_dir = self._new_run_dir(run_name(name or (Path(corpus).stem if data else DEFAULT_CORPUS_NAME)))
            args = [*(["--data", str(data)] if data else []), "--out-dir", str(out_dir), "--max-time", str(max_time),
                    *as_flags({**options, "labels": labels})]
            self._launch(out_dir, args, budget=max_time, budget_start=0.0)
        return self.status()

    def resume(self, run, max_time=None):
        """Continue run (a directory from the runs listing) with --resume: the rest of its budget, or max_time
        seconds more."""
        with self.lock:
            self._refuse_if_running()
            if not (run / STATE).is_file():
                raise RequestError(409, f"the run {run.name!r} has no saved training state ({STATE}) to resume from")
            holder = lock_holder(run)
            if holder is not None:
                raise RequestError(409, f"the run {run.name!r} is training now ({holder}); wait for it to end")
            budget, start = saved_budget(run, max_time)
            args = ["--resume", "--out-dir", str(run), *(["--max-time", str(max_time)] if max_time else [])]
            self._launch(run, args, budget=budget, budget_start=start)
        return self.status()

    def stop(self):
        """SIGTERM to the training's process group (Ctrl-Break on Windows): it saves and ends, as Ctrl-C does. One
        per training: a second signal would only repeat the first, and a third abandons the save, so a second Stop
        (a double click, another tab) sends none and says the training is already stopping."""
        with self.lock:
            rec = self._refresh()
            if rec is None or rec["state"] not in ("running", "stopping"):
                raise RequestError(409, "no training is running; start one, or resume a run")
            if rec["stop_requested"]:
                return {**self._status_of(dict(rec)), "message": f"{rec['run']} is already stopping: it is saving, "
                                                                 f"and ends when the save is written"}
            with contextlib.suppress(ProcessLookupError):  # it ended just now: the next status says how
                stop_group(rec["pid"])
            rec.update(stop_requested=True, state="stopping")
            self._save_record()
        return self.status()

    def _refuse_if_running(self):
        rec = self._refresh()
        if rec is not None and rec["state"] in ("running", "stopping"):
            raise RequestError(409, BUSY.format(run=rec["run"]))

    def _launch(self, out_dir, args, budget, budget_start):
        """Start the training and record it (training.json). A child the record cannot be written for (a full disk)
        is ended at once: a restarted server finds a training only by its record, so none may run without one."""
        output = self._folder(LOGS) / f"{out_dir.name}.log"
        argv = [sys.executable, "-m", "chargpt", "train", *args, "--device", self.device, *self.train_args, "--verbose"]
        try:
            f = open(output, "wb")
        except OSError as e:
            raise RequestError(disk_status(e), f"cannot start the training: cannot write its log {LOGS}/{output.name} "
                                               f"({e.strerror}); free disk space on the server and start it again") \
                from None
        try:
            with f:
                proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT,
                                        cwd=self.home, env=child_env(), **NEW_GROUP)
        except OSError as e:
            raise RequestError(500, f"cannot start {Path(argv[0]).name} ({e.strerror})") from None
        before, self.proc = self.record, proc
        self.record = {"run": out_dir.name, "pid": proc.pid, "out_dir": str(out_dir), "output": str(output),
                       "command": argv[1:], "started": time.time(), "ended": None, "state": "running",
                       "exit_code": None, "stop_requested": False, "budget": budget, "budget_start": budget_start}
        try:
            self._save_record()
        except OSError as e:
            proc.kill()  # still importing: nothing of the run is written yet
            proc.wait()
            self.record, self.proc = before, None
            with contextlib.suppress(OSError):
                output.unlink()
            raise RequestError(disk_status(e), f"cannot start the training: cannot record it in {RECORD} "
                                               f"({e.strerror}); free disk space on the server and start it again") \
                from None

    # --- watching ---------------------------------------------------------------------------------------------
    def _refresh(self):
        """The record, its state brought up to date: a child that ended is reaped and how it ended recorded."""
        rec = self.record
        if rec is None or rec["state"] not in ("running", "stopping"):
            return rec
        if self.proc is not None and self.proc.pid == rec["pid"]:
            code = self.proc.poll()
            if code is None:
                return rec
            self.proc = None
        elif self._alive(rec):
            return rec
        else:
            code = None  # a training found on start-up has ended: its output says how
        said = run_status(rec["out_dir"])
        if said is not None and said["updated"] < rec["started"]:  # an earlier session's: says nothing of this one
            said = None
        rec.update(exit_code=code, ended=time.time(), state=how_it_ended(code, rec["stop_requested"], said))
        self._save_record()
        return rec

    def _alive(self, rec):
        """Whether the recorded pid is still this training: alive, and the run's lock holder; or, while no one
        holds the lock, young enough to be still starting, or writing its output still (its closing sample comes
        after it gives the lock up). A pid the system has given to another process does neither."""
        if not pid_alive(rec["pid"]):
            return False
        holder = lock_holder(rec["out_dir"])
        if holder == f"pid {rec['pid']}":
            return True
        now = time.time()
        return holder in (None, "a process that is still starting") and (
            now - rec["started"] < START_GRACE_S or now - modified(rec["output"]) < START_GRACE_S / 4)

    def status(self):
        """The training running or last finished, for the page: its state, start-up lines, last lines, samples,
        speed and time left."""
        with self.lock:
            rec = self._refresh()
            rec = dict(rec) if rec is not None else None
        return self._status_of(rec)

    def _status_of(self, rec):
        if rec is None:
            return {"training": None}
        out_dir, output = Path(rec["out_dir"]), Path(rec["output"])
        lines, status = log_lines(output), run_status(out_dir)
        running = rec["state"] in ("running", "stopping")
        shown = {k: rec[k] for k in ("run", "pid", "state", "exit_code", "started", "ended", "stop_requested",
                                     "budget")}
        return {"training": {
            **shown, "startup": startup_lines(output), "log": lines[-TRAIN_LOG_LINES:],
            "error": for_the_page(crash_line(status, lines)) if rec["state"] == "crashed" else None,
            "samples": read_tail_rows(out_dir / SAMPLES)[-TRAIN_SAMPLES:],
            "progress": progress(read_tail_rows(out_dir / LOSSES), status, rec["budget"], rec["budget_start"]),
            "resumable": not running and (out_dir / STATE).is_file()}}

    # --- the record -------------------------------------------------------------------------------------------
    def _save_record(self):
        write_text_atomic(self._folder("") / RECORD, json.dumps(self.record))

    def _read_record(self):
        """training.json, if it is one this server could have written (its paths inside its folders)."""
        try:
            with open(self.home / RECORD, "rb") as f:
                rec = json.loads(f.read(TAIL_BYTES).decode("utf-8"))
            ok = RECORD_KEYS <= rec.keys() and isinstance(rec["pid"], int) and rec["state"] in STATES \
                and isinstance(rec["started"], (int, float)) and Path(rec["out_dir"]).parent == self.root \
                and Path(rec["output"]).parent == self.home / LOGS
        except (OSError, ValueError, KeyError, TypeError, AttributeError):  # not one: no training to show
            return None
        return rec if ok else None


STATES = ("running", "stopping", "finished", "stopped", "abandoned", "crashed")  # how_it_ended's and the two live
RECORD_KEYS = {"run", "pid", "out_dir", "output", "started", "ended", "state", "exit_code", "stop_requested", "budget",
               "budget_start"}


# --- pure helpers ---------------------------------------------------------------------------------------------
def disk_status(e):
    """The HTTP status of a write that failed: 507 Insufficient Storage for a full disk or quota, else 500."""
    return 507 if e.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)) else 500


def modified(path):
    try:
        return Path(path).stat().st_mtime
    except OSError:
        return 0.0


def no_labels(labels, what):
    """None, or the one-line 400 for labels asked of a corpus that is one text."""
    if labels in (None, "none"):
        return None
    raise RequestError(400, f"labels {labels!r} need a folder of texts, and {what}; choose a folder from the data "
                            f"folder for Text, or set Labels to none")


def run_name(name):
    """A run name from the page -> one folder name every system accepts, never hidden (.playground is the
    server's), at most MAX_NAME_CHARS characters."""
    name = "".join(c if c.isprintable() else "_" for c in str(name)[:MAX_NAME_CHARS])  # no escapes, no newlines
    name = portable_name(name).lstrip(" .")
    return portable_name(name or "run", fallback="run")


def text_name(filename):
    """An uploaded file's name -> the stem its .txt is kept under."""
    stem = Path(str(filename or "").replace("\\", "/")).name
    return run_name(stem.rsplit(".", 1)[0] if "." in stem.lstrip(".") else stem) if stem else "upload"


def as_flags(options):
    """{'n_layer': 2, 'preset': 'tiny'} -> ['--n-layer', '2', '--preset', 'tiny'] (None: not given)."""
    return [part for k, v in options.items() if v is not None for part in ("--" + k.replace("_", "-"), str(v))]


def how_it_ended(code, stop_requested, status):
    """finished, stopped (saved by a signal), abandoned (stopped without its save: the run keeps its last complete
    one) or crashed, from the exit code and what the run said of its session's end (status.json: run_status); without
    a code (the training ended while no server watched it), from that alone. A run that still says it is training
    was killed before it could save: abandoned if a stop was asked for (or a signal ended it), else crashed; one that
    never trained a step and was stopped lost nothing."""
    said = (status or {}).get("state")
    if code is not None and code not in STOP_CODES:
        return "finished" if code == 0 else "crashed"
    if said == "stopped" and status.get("saved") is False:  # a third signal abandoned the save
        return "abandoned"
    if said == "training" and (code is not None or stop_requested):
        return "abandoned"
    if code is not None:
        return "stopped"
    if said in ("finished", "stopped"):
        return said
    return "stopped" if stop_requested and said is None else "crashed"


def run_status(out_dir):
    """The run's status.json (training/sinks.RunStatus: how its training goes and how its session ended), if it
    is one; else None (no step trained yet, or not a file chargpt wrote)."""
    try:
        with open(Path(out_dir) / STATUS, "rb") as f:
            rec = json.loads(f.read(TAIL_BYTES).decode("utf-8"))
    except (OSError, ValueError):
        return None
    numbers = ("elapsed_s", "chars_per_step", "budget_elapsed_s", "updated")
    ok = isinstance(rec, dict) and rec.get("state") in ("training", "finished", "stopped", "failed") \
        and isinstance(rec.get("step"), int) and not isinstance(rec["step"], bool) \
        and all(isinstance(rec.get(k), (int, float)) and not isinstance(rec[k], bool) for k in numbers) \
        and isinstance(rec.get("error"), (str, type(None)))
    return rec if ok else None


def crash_line(status, lines):
    """The one line a crashed training ended with: the run's own (status.json), or, for a training that failed
    before it trained a step (its settings, its corpus), the error line it printed."""
    if status is not None and status["error"]:
        return f"error: {status['error']}"
    return next((ln for ln in reversed(lines) if ln.startswith("error:")), None)


# chargpt train's flags that the New run view sets, by the names of its fields (chargpt/web/index.html)
PAGE_FIELDS = {"--data": "Text", "--max-time": "Time budget", "--preset": "Preset", "--n-layer": "Layers",
               "--n-embd": "Width", "--sample-every": "Sample every", "--out-dir": "Run name", "--labels": "Labels"}
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def for_the_page(line):
    """A training's error line as the page should say it: a flag the New run view sets by its field's name, in
    quotes; one it does not, named as a setting of chargpt train in a terminal (the page cannot set it)."""
    if line is None:
        return None
    others = []

    def field(m):
        if m[0] in PAGE_FIELDS:
            return f'"{PAGE_FIELDS[m[0]]}"'
        others.append(m[0])
        return m[0]
    said = FLAG.sub(field, line)
    if others:
        named = ", ".join(dict.fromkeys(others))
        said += f" ({named}: not a setting of this page; train in a terminal with chargpt train to set " \
                f"{'it' if len(set(others)) == 1 else 'them'})"
    return said


def read_tail(path, size=TAIL_BYTES):
    """The last `size` bytes of a file as text, starting at a line; '' if there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = max(0, f.tell() - size)
            f.seek(start)
            data = f.read(size)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return text.split("\n", 1)[1] if start and "\n" in text else text


def log_lines(path):
    """A training's output as a terminal shows its finished lines: the text after each line's last carriage return
    (the progress bar is redrawn over with \\r), blank ones left out."""
    shown = (ln.rsplit("\r", 1)[-1].rstrip() for ln in read_tail(path).split("\n")[:-1])
    return [ln for ln in shown if ln.strip()]


def startup_lines(path):
    """What the session said before it began training: the lines up to its first evaluation (or its end)."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return []
    lines = []
    for raw in head.split("\n")[:-1]:
        line = raw.rsplit("\r", 1)[-1].rstrip()
        if AFTER_START.match(line):
            break
        if line.strip():
            lines.append(line)
    return lines[:60]


def read_tail_rows(path):
    """The step-keyed JSON rows at the end of a .jsonl file (its last TAIL_BYTES: the file grows all run long)."""
    rows = []
    for line in read_tail(path).splitlines():
        with contextlib.suppress(ValueError):
            row = json.loads(line)
            if isinstance(row, dict) and isinstance(row.get("step"), int):
                rows.append(row)
    return rows


def progress(rows, status, budget, budget_start):
    """From the running-loss rows (train_loss.jsonl: step, elapsed_s every few steps) and the run's status (its
    step and clock, exact at a session's end; its characters a step): the step, the speed over the last few rows,
    and the seconds of the time budget left (at most the budget)."""
    per_step = status["chars_per_step"] if status else None
    now = max([(r["step"], r.get("elapsed_s")) for r in rows[-1:]] + ([(status["step"], status["elapsed_s"])]
                                                                      if status else []), default=(0, None))
    speed = None
    if len(rows) > 1:
        last, first = rows[-1], rows[max(0, len(rows) - 6)]
        span = last.get("elapsed_s", 0) - first.get("elapsed_s", 0)
        speed = (last["step"] - first["step"]) / span if span > 0 else None
    left = min(budget, max(0.0, budget - ((now[1] or budget_start) - budget_start))) if budget else None
    return {"step": now[0], "elapsed_s": now[1], "steps_per_s": speed,
            "chars_per_s": speed * per_step if speed and per_step else None, "left_s": left}


def saved_budget(run, max_time):
    """(time budget, training clock where it began) of a resumed run: max_time more seconds from where it is,
    or what is left of its own budget."""
    try:
        meta, _ = read_meta(run / STATE)
        clock = meta.get("run_state") or {}
        if max_time:
            return max_time, float(clock.get("elapsed", 0.0))
        return getattr(run_settings(meta), "max_time", None), float(clock.get("budget_elapsed", 0.0))
    except (ChargptError, TypeError, ValueError, AttributeError):
        return max_time, 0.0


def child_env():
    """The server's environment, with this chargpt first on the import path: the child runs the server's code."""
    here = str(Path(chargpt.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (here, os.environ.get("PYTHONPATH"))))}


# The child's own process group: a Ctrl-C at the server's terminal does not reach it, and Stop signals it alone.
# (Process groups and their signals differ by system; platforms.STOP_SIGNALS has SIGBREAK for Windows.)
NEW_GROUP = {"creationflags": subprocess.CREATE_NEW_PROCESS_GROUP} if WINDOWS else {"start_new_session": True}


def stop_group(pid):
    if WINDOWS:
        os.kill(pid, signal.CTRL_BREAK_EVENT)
    else:
        os.killpg(pid, signal.SIGTERM)
