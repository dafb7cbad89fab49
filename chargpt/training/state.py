"""What changes as a run trains (RunState), and the state a --resume continues from.

RunState is saved with every checkpoint (state.safetensors' metadata) and read back on --resume. A resume that
gives a new budget starts a new one from where the run stands: --max-time counts from then, and the learning
rate decays afresh from the rate the run had reached (chargpt/training/schedules.py reads budget_*).
"""

from dataclasses import dataclass, replace
from pathlib import Path

from chargpt.config import TrainConfig, typed_fields
from chargpt.config.flags import param
from chargpt.errors import CheckpointError, ConfigError
from chargpt.runs.checkpoint import run_settings
from chargpt.runs.rundir import STATE
from chargpt.training.schedules import describe_budget, final_lr, finished, lr_at, schedule_changed, warmup_lr


@dataclass
class RunState:
    """What changes as training goes; saved in state.safetensors (with the weights and moments)."""
    step: int = 0
    best_val: float = float("inf")
    elapsed: float = 0.0  # training seconds over all sessions of this run
    evaluated: bool = False  # whether the evaluation at `step` is already logged
    skipped: int = 0  # non-finite steps skipped with --skip-nonfinite
    eval_time: float = 0.0  # seconds of `elapsed` spent estimating losses
    # The current budget began here. A --resume that changes the budget starts a new one: --max-time counts
    # from then, and the learning rate decays afresh from the rate it had reached (budget_lr).
    budget_step: int = 0
    budget_elapsed: float = 0.0
    budget_lr: float | None = None  # None: the configured warmup, then decay from --learning-rate
    since_best: int = 0  # evaluations since the best validation loss so far (--patience)
    warmup_s: float | None = None  # a warm-up that is a share of the time budget: its seconds (schedules.py)
    # seconds of the current --max-time budget spent around its training: the start-up of the session it began in
    # (measured) and the end's evaluation, save, sample and curves (estimated, then measured at each evaluation)
    overhead_s: float = 0.0
    eval_iters: int | None = None  # evaluation's batches a split once fitted to a time budget (budget.EvalFit), kept
    # for the rest of the run (a --resume compares its losses on as many batches); None: --eval-iters

    def evaluated_at(self, val_loss):
        """Record an evaluation's validation loss -> whether it is the best so far (--patience counts the rest)."""
        improved = val_loss < self.best_val
        self.best_val = min(self.best_val, val_loss)
        self.since_best = 0 if improved else self.since_best + 1
        self.evaluated = True
        return improved


def resumed_state(meta, cfg: TrainConfig, flags, out_dir):
    """The saved RunState of a run continued with `cfg` -> (RunState, notes for the start-up log). With a new
    budget (given in `flags`), a new decay from the learning rate the run had reached; a run already finished, or
    stopped by --patience, is refused unless the budget or the patience is raised."""
    state_file = Path(out_dir) / STATE
    try:
        s = RunState(**typed_fields(RunState, meta.get("run_state") or {}, "run state"))
    except ConfigError as e:
        raise CheckpointError(f"{state_file} has corrupted metadata ({e}); re-train or re-copy it") from None
    if "eval_iters" in flags:  # chosen now: it replaces what the run's budget fitted
        s = replace(s, eval_iters=None)
    notes = []
    old = run_settings(meta) or cfg
    if schedule_changed(old, cfg, flags):
        lr = lr_at(s.step, s.elapsed, old, s)
        warming = warmup_lr(s.step, s.elapsed, cfg, s) is not None  # finish the warmup first
        s = replace(s, budget_step=s.step, budget_elapsed=s.elapsed, budget_lr=None if warming else lr, overhead_s=0.0)
        if cfg.lr_schedule == "inverse-sqrt":
            how = "follows its inverse-square-root curve on from the step reached"
        else:
            how = ("finishes its warmup, then decays" if warming else f"decays from {lr:.2e} (the rate reached)") \
                + f" to {final_lr(cfg):.2e} over it"
        notes.append(f"new budget: {describe_budget(cfg, s)}; the learning rate {how}")
    if finished(cfg, s) == "patience" and s.evaluated:
        raise ConfigError(f"--resume: the run in {out_dir} stopped early at step {s.step:,} (no new best validation "
                          f"loss in {s.since_best} evaluations); to train on, raise {param('patience')} above "
                          f"{s.since_best}, or pass {param('patience', 0)} to turn it off")
    if finished(cfg, s) and s.evaluated:
        raise ConfigError(f"--resume: the run in {out_dir} is already finished at step {s.step:,} (its budget: "
                          f"{describe_budget(cfg, s, left=False)}); to train on, give a new budget: --max-iters N "
                          f"(more than {s.step:,}) or --max-time SECONDS (counted from now)")
    return s, notes
