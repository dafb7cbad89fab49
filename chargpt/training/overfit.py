"""Overfitting, seen: a warning, once, when validation loss has risen for a while as training loss fell.

    warning = overfitting([(step, train_loss, val_loss), ...], patience)   # the rule: pure
    OverfitWatch(say, patience, history)                                  # a sink of the run's "eval" records

The rule: the last RISEN_EVALS evaluations all lie above the best validation loss by more than RISE of it (so the
best is at least that many evaluations old), and training loss is lower now than at the best. One evaluation
above the best is noise; several in a row while training still improves is the model learning its training text
by heart. The run goes on (--patience is what stops it); the best checkpoint stays the one sample.py reads.
"""

from chargpt.config.flags import param
from chargpt.runs.rundir import METRICS, read_step_rows

RISEN_EVALS = 3
RISE = 0.01  # of the best validation loss: smaller rises are within an evaluation's noise


def overfitting(history, patience=0):
    """history: [(step, train_loss, val_loss)] of a run's evaluations, in order -> the warning (without its
    'warning: ') when they show overfitting, else None."""
    if len(history) <= RISEN_EVALS:
        return None
    best = min(range(len(history)), key=lambda i: history[i][2])
    best_step, best_train, best_val = history[best]
    last_step, last_train, last_val = history[-1]
    if not all(val > best_val + RISE * abs(best_val) for _, _, val in history[-RISEN_EVALS:]) \
            or last_train >= best_train:
        return None
    stop = (f"{param('patience', patience)} stops this run after {patience} evaluations without a new best" if patience
            else f"{param('patience')} N stops such runs early")
    return (f"validation loss has risen from {best_val:.3f} at step {best_step:,} to {last_val:.3f} at step "
            f"{last_step:,} while training loss fell ({best_train:.3f} to {last_train:.3f}): the model is "
            f"overfitting; the best checkpoint (step {best_step:,}) is what sample.py uses; {stop}")


def history_of(out_dir, step):
    """A resumed run's evaluations up to `step`, from its metrics.jsonl: [(step, train_loss, val_loss)]."""
    rows = read_step_rows(out_dir / METRICS)
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in rows if r["step"] <= step
            and all(isinstance(r.get(k), (int, float)) for k in ("train_loss", "val_loss"))]


class OverfitWatch:
    """A sink (training/sinks.py) of the run's "eval" records that says the overfitting warning once a run, by
    `say`. history: the evaluations before this session's (a resumed run's)."""

    def __init__(self, say, patience=0, history=()):
        self.say, self.patience, self.history = say, patience, list(history)
        self.warned = overfitting(self.history, patience) is not None  # an earlier session said it already

    def write(self, kind, record):
        if kind != "eval" or self.warned:
            return
        self.history.append((record["step"], record["train_loss"], record["val_loss"]))
        warning = overfitting(self.history, self.patience)
        if warning:
            self.warned = True
            self.say(f"warning: {warning}")

    def close(self):
        pass
