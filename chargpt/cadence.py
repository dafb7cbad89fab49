"""How often a run looks at itself: the evaluation cadence fitted to a time budget, and the running training loss.

A run with a --max-time budget does not know how many steps it will take, so a step interval from a preset
(--eval-interval 250) gives a fast machine many evaluations and a slow one two or three: a three-point validation
curve. Unless --eval-interval is given, such a run evaluates instead whenever 1/EVALS_PER_BUDGET of its time budget
has passed since the last evaluation (and at step 0 and the end), so every budget gets a real curve and no two
evaluations fall a few steps apart. Only the agreed clock decides (RunState
.elapsed, the same on every rank), so all ranks evaluate at the same step. Evaluations use their own random
stream and no dropout: when they happen never changes the training itself.

The running training loss is the mean of the losses of the last LOG_EVERY steps, summed on the device (no host
sync) and read once per LOG_EVERY steps, where the progress bar read it already; it goes to train_loss.jsonl.
"""

import math

from .config import TrainConfig

EVALS_PER_BUDGET = 20  # evaluations over a time budget (with the first and the last: about 21)


def eval_period(cfg: TrainConfig, interval_source):
    """Seconds of training between evaluations for a time budget, or None (evaluate by steps alone): with
    --max-time, unless --eval-interval was chosen (`interval_source`: the settings layer that set it, None for
    the dataclass default, "preset NAME" for a preset)."""
    if not cfg.max_time or (interval_source is not None and not interval_source.startswith("preset ")):
        return None
    return cfg.max_time / EVALS_PER_BUDGET


def time_to_evaluate(elapsed, last_eval_elapsed, period):
    """Whether `period` seconds of training passed since the last evaluation (never with period None)."""
    return period is not None and elapsed - last_eval_elapsed >= period


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
