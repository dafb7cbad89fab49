"""The learning-rate schedules and the budget: pure functions of the step, the training clock and the settings,
as nanoGPT's get_lr.

    lr = lr_at(step, elapsed, cfg, state)      # what the loop sets before each optimizer step
    finished(cfg, state)                       # 'max_iters', 'max_time', 'patience' or None

`state` is the run's RunState (chargpt/components/state.py): its step and clock, and where the current budget began
(budget_step, budget_elapsed, budget_lr). A --resume that changes the budget starts a new one there: --max-time
counts from then, and the learning rate decays afresh from the rate it had reached (budget_lr).
"""

import math

from .config import UNLIMITED, TrainConfig


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


def run_fraction(it, elapsed, cfg: TrainConfig, s):
    """How much of the decay is done: by steps (from the end of warmup, or from where a resumed budget began
    decaying), or by training time with --max-time, whichever is further."""
    begin = cfg.warmup_iters if s.budget_lr is None else s.budget_step
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    frac = (it - begin) / max(1, decay_end - begin)
    if cfg.max_time:
        frac = max(frac, (elapsed - s.budget_elapsed) / cfg.max_time)
    return min(max(frac, 0.0), 1.0)


def lr_at(step, elapsed, cfg: TrainConfig, s):
    """The learning rate of step `step`, `elapsed` training seconds in, by --lr-schedule, in the budget state `s`."""
    if cfg.lr_schedule == "inverse-sqrt":  # a function of the step alone: no budget, no end
        return inverse_sqrt_lr(step, cfg)
    return SCHEDULES[cfg.lr_schedule](step, run_fraction(step, elapsed, cfg, s), cfg, s.budget_lr)


# --- the budget --------------------------------------------------------------------------------------------------
def finished(cfg: TrainConfig, s):
    """Why the run stops now ('max_iters', 'max_time' or 'patience'), or None while it goes on."""
    if s.step >= cfg.max_iters:
        return "max_iters"
    if cfg.max_time and s.elapsed - s.budget_elapsed >= cfg.max_time:
        return "max_time"
    if cfg.patience and s.since_best >= cfg.patience:
        return "patience"
    return None


def schedule_changed(old: TrainConfig, new: TrainConfig, flags):
    """Whether a resumed run's budget differs from the saved one: a new --max-time always does (it counts from
    now), as does another decay end (--lr-decay-iters, else --max-iters) or a lifted time budget."""
    return ("max_time" in flags or old.max_time != new.max_time
            or (old.lr_decay_iters or old.max_iters) != (new.lr_decay_iters or new.max_iters))


def describe_budget(cfg: TrainConfig, s, left=True):
    """'until step 3,000 or 120 s of training (80 s left), whichever comes first'."""
    parts = [f"until step {cfg.max_iters:,}"] if cfg.max_iters < UNLIMITED else []
    if cfg.max_time:
        spent = s.elapsed - s.budget_elapsed
        parts.append(f"{seconds(cfg.max_time)} of training"
                     + (f" ({max(0.0, cfg.max_time - spent):.0f} s left)" if spent and left else ""))
    return " or ".join(parts) + (", whichever comes first" if len(parts) > 1 else "")


def seconds(s):
    """A time budget in words: '150 s' (as given, up to a million seconds), then days, then 'more than a year'."""
    if s < 1e6:
        return f"{s:g} s"
    return f"{s / 86400:,.0f} days" if s < 365 * 86400 else "more than a year"
