"""The learning-rate schedules and the budget: pure functions of the step, the training clock and the settings,
as nanoGPT's get_lr.

    lr = lr_at(step, elapsed, cfg, state)      # what the loop sets before each optimizer step
    finished(cfg, state)                       # 'max_iters', 'max_time', 'patience' or None

`state` is the run's RunState (chargpt/training/state.py): its step and clock, and where the current budget began
(budget_step, budget_elapsed, budget_lr). A --resume that changes the budget starts a new one there: --max-time
counts from then, and the learning rate decays afresh from the rate it had reached (budget_lr).

The warm-up is --warmup-iters steps. A run with a time budget whose warm-up nobody chose (no --warmup-iters from a
flag or a config file) warms up over a share of its budget instead (state.warmup_s, set at start and saved with the
run): WARMUP_SHARE of its time or, where a step cap bounds it, of its steps, whichever ends first, and never longer
than --warmup-iters. A fixed 100 steps is 1% of a fast machine's budget and all of a slow one's: a run on a busy
2-core machine ended still warming up, at 1.23e-03 of a 4e-3 peak, and never decayed.
"""

import math

from chargpt.config import UNLIMITED, TrainConfig
from chargpt.config.flags import param

WARMUP_SHARE = 0.05  # of a time budget, when the warm-up is the budget's to choose (see above)
# --max-time is the command's wall time: training gets what start-up and the end (the last evaluation and save, the
# closing sample, the curves) leave of it (RunState.overhead_s), and never less than this share
MIN_TRAINING_SHARE = 0.5


def final_lr(cfg: TrainConfig):
    return cfg.min_lr if cfg.min_lr is not None else cfg.learning_rate / 10


def cosine_lr(it, frac, cfg: TrainConfig, start_lr=None):
    """Learning rate at step `it`, with `frac` in [0, 1] the fraction of the budget done (by steps or by time):
    1) linear warmup over warmup_iters steps, 2) cosine decay from learning_rate (or, in a budget begun on
    --resume, from start_lr, the rate reached then) to min_lr, 3) min_lr after."""
    min_lr = final_lr(cfg)
    if start_lr is None and it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if frac >= 1:
        return min_lr
    peak = cfg.learning_rate if start_lr is None else start_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * frac))  # 1 -> 0
    return min_lr + coeff * (peak - min_lr)


def inverse_sqrt_lr(it, cfg: TrainConfig):
    """--lr-schedule inverse-sqrt, Vaswani et al. 2017 (section 5.3) with its peak as --learning-rate: a linear rise
    over warmup_iters steps, then decay with the inverse square root of the step, lr x sqrt(warmup / step). With
    learning_rate = d_model**-0.5 x warmup**-0.5 this is the paper's d_model**-0.5 x min(step**-0.5,
    step x warmup**-1.5), step counted from 1. It depends on the step alone: no budget, no end."""
    step, warmup = it + 1, max(1, cfg.warmup_iters)
    return cfg.learning_rate * min(step / warmup, math.sqrt(warmup / step))


def wsd_lr(it, frac, cfg: TrainConfig, start_lr=None):
    """Warmup-stable-decay (as in MiniCPM and modded-nanoGPT), same arguments as cosine_lr: 1) linear warmup over
    warmup_iters steps, 2) flat at learning_rate (or start_lr) until 1 - decay_fraction of the budget is done,
    3) linear decay to min_lr over the rest, 4) min_lr after. Fitted to --max-time through `frac`, like cosine."""
    min_lr = final_lr(cfg)
    if start_lr is None and it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    peak = cfg.learning_rate if start_lr is None else start_lr
    decayed = (frac - (1.0 - cfg.decay_fraction)) / cfg.decay_fraction  # < 0 while flat, 1 at the end
    return peak - min(max(decayed, 0.0), 1.0) * (peak - min_lr)


SCHEDULES = {"cosine": cosine_lr, "wsd": wsd_lr}  # --lr-schedule


def warmup_steps(cfg: TrainConfig, s):
    """Steps of warm-up: --warmup-iters; with a warm-up that is a share of the budget (s.warmup_s), at most
    WARMUP_SHARE of the steps to the decay's end where a step cap (--max-iters, --lr-decay-iters) sets one."""
    end = cfg.lr_decay_iters or cfg.max_iters
    if s.warmup_s is None or end >= UNLIMITED:
        return cfg.warmup_iters
    return min(cfg.warmup_iters, max(1, math.ceil(WARMUP_SHARE * end)))


def warmup_lr(it, elapsed, cfg: TrainConfig, s):
    """The learning rate at step `it`, `elapsed` training seconds in, while the warm-up lasts, else None: a linear
    rise, (it + 1) / (warmup + 1) of the peak by steps; with a warm-up that is a share of the budget, by time too
    (elapsed / s.warmup_s of it), whichever is further. None in a budget begun on --resume after the warm-up."""
    warm = warmup_steps(cfg, s)
    if s.budget_lr is not None or it >= warm:
        return None
    if s.warmup_s and elapsed * (warm + 1) > (it + 1) * s.warmup_s:  # the clock is further along than the steps
        return None if elapsed >= s.warmup_s else cfg.learning_rate * elapsed / s.warmup_s
    return cfg.learning_rate * (it + 1) / (warm + 1)


def training_seconds(cfg: TrainConfig, s):
    """The seconds of training a --max-time budget holds: its wall time less what the command spends around the
    training (RunState.overhead_s: start-up, measured, and the end, estimated), at least MIN_TRAINING_SHARE of it."""
    return max(MIN_TRAINING_SHARE * cfg.max_time, cfg.max_time - s.overhead_s)


def run_fraction(it, elapsed, cfg: TrainConfig, s):
    """How much of the decay is done: by steps (from the end of warmup, or from where a resumed budget began
    decaying), or by training time with --max-time, whichever is further."""
    begin = warmup_steps(cfg, s) if s.budget_lr is None else s.budget_step
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    frac = (it - begin) / max(1, decay_end - begin)
    if cfg.max_time:
        frac = max(frac, (elapsed - s.budget_elapsed) / training_seconds(cfg, s))
    return min(max(frac, 0.0), 1.0)


def lr_at(step, elapsed, cfg: TrainConfig, s):
    """The learning rate of step `step`, `elapsed` training seconds in, by --lr-schedule, in the budget state `s`."""
    if cfg.lr_schedule == "inverse-sqrt":  # a function of the step alone: no budget, no end
        return inverse_sqrt_lr(step, cfg)
    warm = warmup_lr(step, elapsed, cfg, s)
    if warm is not None:
        return warm
    peak = cfg.learning_rate if s.budget_lr is None else s.budget_lr  # given: the schedule's own warm-up is over
    return SCHEDULES[cfg.lr_schedule](step, run_fraction(step, elapsed, cfg, s), cfg, peak)


# --- the budget --------------------------------------------------------------------------------------------------
def finished(cfg: TrainConfig, s):
    """Why the run stops now ('max_iters', 'max_time' or 'patience'), or None while it goes on."""
    if s.step >= cfg.max_iters:
        return "max_iters"
    if cfg.max_time and s.elapsed - s.budget_elapsed >= training_seconds(cfg, s):
        return "max_time"
    if cfg.patience and s.since_best >= cfg.patience:
        return "patience"
    return None


def schedule_changed(old: TrainConfig, new: TrainConfig, flags):
    """Whether a resumed run's budget differs from the saved one: a new --max-time always does (it counts from
    now), as does another decay end (--lr-decay-iters, else --max-iters) or a lifted time budget."""
    return ("max_time" in flags or old.max_time != new.max_time
            or (old.lr_decay_iters or old.max_iters) != (new.lr_decay_iters or new.max_iters))


def decay_warning(cfg: TrainConfig, s, expected_steps=None):
    """The start-up warning of a run that cannot reach its decay, or None: its warm-up outlasts its budget (the
    steps given, or `expected_steps`, what a time budget buys at the measured speed), or the decay ends after the
    step budget that ends the run."""
    if cfg.lr_schedule == "inverse-sqrt" or s.budget_lr is not None:
        return None
    warm = warmup_steps(cfg, s)
    never = "the learning rate only rises and never decays"
    if s.step < warm >= cfg.max_iters:
        return (f"the warmup ({param('warmup_iters', cfg.warmup_iters)}) does not end before the budget "
                f"({param('max_iters', cfg.max_iters)}): {never}; give a larger {param('max_iters')} or a smaller "
                f"{param('warmup_iters')}")
    if s.warmup_s is None and cfg.max_time and expected_steps is not None and s.step < warm >= expected_steps:
        return (f"the warmup ({param('warmup_iters', cfg.warmup_iters)}) outlasts the budget: about "
                f"{expected_steps:,.0f} steps fit in {seconds(cfg.max_time)} at the speed measured, so {never}; give "
                f"a smaller {param('warmup_iters')} (or leave it out: a time budget then warms up over "
                f"{WARMUP_SHARE:.0%} of itself) or a longer {param('max_time')}")
    by_steps = not cfg.max_time or (expected_steps is not None and expected_steps >= cfg.max_iters)  # ends first
    if by_steps and cfg.lr_decay_iters and cfg.lr_decay_iters > cfg.max_iters:
        return (f"the decay ends at step {cfg.lr_decay_iters:,} ({param('lr_decay_iters')}), after the budget "
                f"({param('max_iters', cfg.max_iters)}): the learning rate never reaches its floor "
                f"({param('min_lr')}); drop {param('lr_decay_iters')} or give a larger {param('max_iters')}")
    return None


def describe_budget(cfg: TrainConfig, s, left=True):
    """'until step 3,000 or 120 s of training (80 s left), whichever comes first'."""
    parts = [f"until step {cfg.max_iters:,}"] if cfg.max_iters < UNLIMITED else []
    if cfg.max_time:
        spent = s.elapsed - s.budget_elapsed
        parts.append(f"{seconds(cfg.max_time)} of training"
                     + (f" ({max(0.0, training_seconds(cfg, s) - spent):.0f} s left)" if spent and left else ""))
    return " or ".join(parts) + (", whichever comes first" if len(parts) > 1 else "")


def seconds(s):
    """A time budget in words: '150 s' (as given, up to a million seconds), then days, then 'more than a year'."""
    if s < 1e6:
        return f"{s:g} s"
    return f"{s / 86400:,.0f} days" if s < 365 * 86400 else "more than a year"
