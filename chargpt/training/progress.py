"""Progress of one training session: its clocks, its speed, the running training loss and the progress bar.

Speeds measure training alone: the time spent evaluating, saving and sampling is paused out (pause()), so chars/s
and the time left do not drop each time the run looks at itself. The bar shows only numbers computed here (tqdm
draws it; its own clock and rate, which would count the pauses, are not shown).

The running training loss is the mean of the losses of the last LOG_EVERY steps, summed on the device (no host
sync) and read once per LOG_EVERY steps; each read is a record for the run's sinks (train_loss.jsonl, loggers), with
the model FLOPs utilisation of the speed since the last one (mfu: training/mfu.py), also on the bar.
"""

import math
import sys
import time

from tqdm import tqdm

from chargpt.config import UNLIMITED
from chargpt.training.mfu import Utilisation

LOG_EVERY = 10  # steps between progress updates (each reads the loss: a host sync on a GPU)
KNOWN_TOTAL = "{l_bar}{bar}| {n_fmt}/{total_fmt} steps{postfix}"
UNKNOWN_TOTAL = "step {n_fmt}{postfix}"  # a time budget: the number of steps is not known


class RunningLoss:
    """Sum of step losses on the device since the last read; read() -> their mean (a host sync), or None if it
    is not a finite number (a skipped step)."""

    def __init__(self):
        self.total, self.count = None, 0

    def add(self, loss):
        loss = loss.detach().float()
        self.total = loss if self.total is None else self.total + loss
        self.count += 1

    def read(self):
        if not self.count:
            return None
        value = self.total.item() / self.count  # note: the host sync, once per LOG_EVERY steps
        self.total, self.count = None, 0
        return value if math.isfinite(value) else None


def time_left(seconds):
    """'83s' for the bar; days past a day or so, and 'years' for a budget nobody will see the end of."""
    seconds = max(0.0, seconds)
    if seconds < 100_000:
        return f"{seconds:.0f}s"
    return f"{seconds / 86400:,.0f}d" if seconds < 1e9 else "years"


def percent(share):
    """0.4213 -> '42.1%'; a small share keeps two significant digits (0.00031 -> '0.031%'), never '0.0%'."""
    return f"{share:.1%}" if share >= 0.01 else f"{share * 100:.2g}%"


class Progress:
    """The clocks of a session that starts at `step` with `elapsed` training seconds behind it (a resumed run),
    and its progress bar (shown where `show`). chars_per_step converts steps to characters."""

    def __init__(self, step, elapsed, max_iters, chars_per_step, show=True, pace=None, mfu=None):
        known = max_iters < UNLIMITED
        self.bar = tqdm(total=max_iters if known else None, initial=step, disable=not show, dynamic_ncols=True,
                        leave=False, bar_format=KNOWN_TOTAL if known else UNKNOWN_TOTAL,
                        mininterval=0.1 if sys.stderr.isatty() else 5.0)  # quiet in logs
        self.chars_per_step, self.max_iters = chars_per_step, max_iters
        self.session_start, self.elapsed_before, self.session_step = time.perf_counter(), elapsed, step
        self.pauses = 0.0  # seconds spent evaluating, saving and sampling this session: not training
        self.window = (self.session_start, 0.0, step)  # (time, pauses, step) where the speed window began
        self.running = RunningLoss()
        self.first_step_s = None  # wall time of this session's first step: torch.compile compiles during it
        self.pace = pace  # training/budget.Pace: the speed trained at, against the probe's, said once
        self.mfu = mfu  # training/mfu.Utilisation: characters per second -> model FLOPs utilisation (None: no formula)

    @classmethod
    def of(cls, run):
        """The progress of a session of `run` (training/start.Run)."""
        s = run.state
        return cls(s.step, s.elapsed, run.cfg.max_iters, run.chars_per_step, show=run.dist.is_main,
                   pace=run.budget.pace, mfu=Utilisation.of(run))

    def clock(self):
        """The run's training clock now: seconds over all its sessions (evaluations included)."""
        return self.elapsed_before + time.perf_counter() - self.session_start

    def pause(self, seconds):
        """Leave `seconds` (just spent evaluating, saving or sampling) out of the speeds shown."""
        self.pauses += seconds

    def first_step(self, seconds):
        self.first_step_s = seconds

    def step(self, step, loss, lr, elapsed, last_val, left_s=None):
        """After step `step` (its loss still on the device; `elapsed`: the run's agreed clock): the bar moves on;
        every LOG_EVERY steps -> the record of the running loss (a dict for the sinks), else None. left_s: the time
        budget's seconds left, if any (else, with a step budget, estimated from the speed)."""
        self.running.add(loss)
        if self.pace is not None and self.pace.waiting:  # the steps after the first (with compile, the compiling)
            trained = time.perf_counter() - self.session_start - self.pauses - (self.first_step_s or 0.0)
            self.pace.check(step, step - self.session_step - (self.first_step_s is not None), trained, left_s,
                            self.max_iters)
        record = None
        if (step - 1) % LOG_EVERY == 0:
            value = self.running.read()  # the mean since the last read: the one host sync of progress
            now = time.perf_counter()
            t0, pauses0, step0 = self.window
            seconds = max(now - t0 - (self.pauses - pauses0), 1e-9)
            speed = (step - step0) / seconds  # steps per second of training
            self.window = (now, self.pauses, step)
            if left_s is None and self.max_iters < UNLIMITED and speed > 0:
                left_s = (self.max_iters - step) / speed
            chars_per_s = speed * self.chars_per_step
            mfu = self.mfu(chars_per_s) if self.mfu is not None else None
            shown = {"loss": f"{value:.4f}" if value is not None else "nan",
                     "val": f"{last_val:.4f}" if last_val else "-", "lr": f"{lr:.2e}", "chars/s": f"{chars_per_s:,.0f}",
                     **({"mfu": percent(mfu)} if mfu is not None else {})}
            if left_s is not None:
                shown["left"] = time_left(left_s)
            self.bar.set_postfix(shown, refresh=False)
            if value is not None:
                record = {"step": step, "train_loss": round(value, 6), "lr": lr, "elapsed_s": round(elapsed, 2),
                          "chars_per_s": round(chars_per_s, 1),  # evaluations and saves left out
                          **({"mfu": float(f"{mfu:.4g}")} if mfu is not None else {})}
        self.bar.update(1)
        return record

    def session_speed(self, step):
        """Characters per second of training over this session (its pauses left out)."""
        seconds = time.perf_counter() - self.session_start - self.pauses
        return (step - self.session_step) * self.chars_per_step / max(seconds, 1e-9)

    def session_mfu(self, step):
        """The model FLOPs utilisation of this session's training speed (None: no formula for the model)."""
        return self.mfu(self.session_speed(step)) if self.mfu is not None else None

    def close(self):
        self.bar.close()  # the bar is cleared (leave=False), so an error line after it starts clean
