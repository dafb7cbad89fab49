"""Where a run's records go. The loop makes three kinds of record and hands each to every sink of the run:

    "train"   every LOG_EVERY steps: step, train_loss (the running mean), lr, elapsed_s, chars_per_s (training
              speed since the last record, evaluations and saves left out)
    "eval"    at each evaluation: step, train/val loss in nats, bits per character and bits per byte, lr, elapsed_s
              (and the scores of a pairs run); written before the checkpoint it describes
    "sample"  a sample written while training: step, prompt, text (and its novelty summary)

RunFiles, the sink every run has, appends them to the run directory's train_loss.jsonl, metrics.jsonl and
samples.jsonl, which `chargpt info`, `chargpt plot` and the playground read; RunStatus keeps status.json current (the
step, the clock and, once a session ends, how), which the playground reads to follow a training it started. A
logger for another tool is one more class with the same two methods, passed to chargpt.train(sinks=[...]) or made
at start from a setting (--log-to: TensorBoard, W&B and MLflow, training/trackers.py); the loop does not change.
Sinks are called on rank 0 only, between steps: a slow one slows training, so one that talks to a network should
queue and return.
"""

import json
import sys
import time
from typing import Protocol

from chargpt.errors import Interrupted
from chargpt.runs import rundir
from chargpt.runs.rundir import LOG, LOSSES, METRICS, SAMPLES, STATUS

STATUS_EVERY_S = 1.0  # status.json is rewritten at most this often while training (and always at the end)


class Sink(Protocol):
    def write(self, kind: str, record: dict) -> None:
        """One record of `kind` ("train", "eval" or "sample"); keys as above. It must not change the record."""

    def close(self) -> None:
        """The run ended (or failed): flush what is buffered."""


class RunFiles:
    """The run directory's own .jsonl files. An evaluation's line is flushed to disk before its checkpoint is saved
    (a kill between the two leaves a line that --resume drops, never a saved step without its line); the running
    loss, written often and needed by no saved state, is left to the OS to write."""

    FILES = {"train": (LOSSES, False), "eval": (METRICS, True), "sample": (SAMPLES, True)}  # kind -> (file, fsync)

    def __init__(self, out_dir):
        self.out_dir = out_dir

    def write(self, kind, record):
        name, sync = self.FILES[kind]
        rundir.append_jsonl(self.out_dir / name, record, sync=sync)

    def close(self):
        pass


def ending(before=None):
    """How the run is ending, as a sink's close() is called (in the loop's `finally`, so an exception on its way out
    is sys.exc_info()'s): "finished", "stopped" (a signal; the run was saved) or "failed". `before`: the exception
    being handled when the run started (chargpt.train called in an `except` block), which is not the run's."""
    error = sys.exc_info()[1]
    if error is None or error is before:
        return "finished"
    return "stopped" if isinstance(error, (Interrupted, KeyboardInterrupt)) else "failed"


class RunStatus:
    """RUN/status.json, rewritten atomically: {"state": "training" | "finished" | "stopped" | "failed", "step",
    "elapsed_s" (the run's training clock), "chars_per_step", "max_time", "max_iters", "budget_elapsed_s" (the
    clock where this session's budget began), "error" (a failed session's one line), "saved" (false: a stopped
    session whose save a third signal abandoned, so its last steps are lost), "updated"}. The run says how it
    is going and how it ended, so a watcher (the playground) need not read it from the log's text. `state`: the
    run's RunState, whose step and clock close() reads (the last "train" record may be a few steps behind)."""

    def __init__(self, out_dir, state, chars_per_step, cfg):
        self.path, self.state, self.last = out_dir / STATUS, state, 0.0
        self.fixed = {"chars_per_step": chars_per_step, "max_time": cfg.max_time, "max_iters": cfg.max_iters,
                      "budget_elapsed_s": state.budget_elapsed}
        self.before = sys.exc_info()[1]  # see ending()

    def put(self, how, step, elapsed, error=None, saved=True):
        record = {"state": how, "step": step, "elapsed_s": elapsed, **self.fixed, "error": error, "saved": saved,
                  "updated": time.time()}
        rundir.write_text_atomic(self.path, json.dumps(record))  # the first at the first record: a start that
        self.last = time.perf_counter()                           # fails leaves its new run directory empty

    def write(self, kind, record):
        if kind == "train" and time.perf_counter() - self.last >= STATUS_EVERY_S:
            self.put("training", record["step"], record["elapsed_s"])

    def close(self):
        how, error = ending(self.before), sys.exc_info()[1]
        self.put(how, self.state.step, self.state.elapsed, str(error).splitlines()[0][:500] if how == "failed" and
                 str(error) else None, saved=getattr(error, "saved", True))


class Sinks:
    """The run's sinks as one: each record goes to every sink, in order (RunFiles first). Empty on ranks other
    than 0."""

    def __init__(self, sinks=()):
        self.sinks = list(sinks)

    def add(self, sinks):
        """More sinks, after those already there (the trackers, which start once the Run they read is made)."""
        self.sinks.extend(sinks)

    def write(self, kind, record):
        for sink in self.sinks:
            sink.write(kind, record)

    def close(self):
        for sink in self.sinks:
            sink.close()


def make_sinks(out_dir, is_main, extra=(), status=None):
    """The sinks of a run: its own files (and `status`, a RunStatus), then `extra` (objects with write and close), on
    rank 0; none elsewhere."""
    return Sinks([RunFiles(out_dir), *([status] if status else []), *extra] if is_main else [])


class LogFile:
    """The run's own log, train.log in its directory: every line the run says (the start-up in full, whatever the
    terminal showed), appended over all its sessions. Lines wait in memory until the run directory holds a saved
    run, so a start that fails, or a run killed before its first save, leaves no file behind."""

    def __init__(self, out_dir, enabled=True):
        self.out_dir, self.enabled, self.pending, self.ready = out_dir, enabled, [], False

    def line(self, text):
        if not self.enabled:
            return
        self.pending.append(text)
        if not self.ready and (self.out_dir is None or not rundir.holds_run(self.out_dir)):
            return
        self.ready = True
        try:
            with open(self.out_dir / LOG, "a", encoding="utf-8", errors="backslashreplace") as f:
                f.write("".join(line + "\n" for line in self.pending))
        except OSError:  # a log line is not worth stopping a training for; the run's state is saved elsewhere
            self.enabled = False
        self.pending = []
