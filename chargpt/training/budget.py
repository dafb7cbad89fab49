"""How a time budget (--max-time) is spent: on training, at the speed the run was sized for, with a warm-up and a
decay that fit it, and with evaluation kept to its share.

    budget = fit(cfg, state, step_s, period, chars_per_batch, log, fit_warmup, fit_iters)   # start-up: the two below
    Pace        the speed the run actually trains at, against the probe's (sizing.py): said once if far off
    EvalFit     after the first evaluation: fewer evaluations, or fewer batches each, where evaluating at the
                preset's cadence would cost more than EVAL_SHARE of the budget

Measured on a busy 2-core machine at a 5,378-character alphabet: the probe saw 3,716 ms a step where the run got
320 ms, and 20 evaluations of 20 batches took 62% of a 150 s budget. A model cannot change its shape mid-run, so a
speed far from the probe's is said, with the steps the run now expects; evaluation is the run's own to fit.
Only a time budget is fitted: a run given steps (--max-iters) gets the cadence it was given.
"""

import math
import time
from dataclasses import dataclass, field

from chargpt.config.flags import param
from chargpt.runtime import broadcast_str
from chargpt.training.schedules import WARMUP_SHARE, decay_warning, seconds, warmup_steps
from chargpt.training.validate import EVALS_PER_BUDGET

EVAL_SHARE = 0.10  # evaluation may cost at most this share of a time budget...
MIN_EVALS = 6  # ...but a run evaluates at least this many times over it (a curve, --patience, the best checkpoint)
MIN_EVAL_CHARS = 8192  # ...on at least this many characters a split (all ranks), or the preset's, if fewer
PACE_SHARE = 0.05  # the run's speed is judged once this share of the budget has trained...
PACE_MIN_STEPS = 5  # ...over at least this many steps...
PACE_MIN_S = 1.0  # ...and seconds (a few ms of jitter is not a speed)
PACE_FACTOR = 2.0  # a speed this many times the probe's, or its inverse, is said
# A run sized by --preset auto that trains this many times faster than its probe measured (the machine was busy
# then), within the first RESIZE_SHARE of its budget, starts again with the model sized for that speed, where the
# rule picks a larger one at it (sizing.larger_pays): once, in a new run of its own (trainer.train)
RESIZE_FACTOR = 1.5
RESIZE_SHARE = 0.15
RESIZE_WINDOW_S = 0.5  # the speed it judges by: of the steps since the last look, at least this long
# What the end of a run takes beyond its last evaluation and save (measured at each evaluation), before it is
# measured: the closing sample at DECODE_FLOPS (2 FLOPs a parameter a character: a 4 x 192 model wrote 750-1,200
# characters a second on 2 cores, about 1e10), at least DECODE_MIN_S a character, and the curves (matplotlib's
# import and one figure: about a second)
DECODE_FLOPS = 1e10
DECODE_MIN_S = 5e-4
CURVES_S = 1.0


@dataclass
class Budget:
    """What start-up fitted to the run's budget (Run.budget)."""
    step_s: float | None = None  # seconds a step the probe measured for the model that trains (--preset auto)
    lines: list = field(default_factory=list)  # start-up lines: the warm-up, and a decay it cannot reach
    pace: "Pace | None" = None
    eval_fit: "EvalFit | None" = None


def fit(cfg, s, step_s, eval_period, chars_per_batch, log, fit_warmup=False, fit_iters=False, larger=None):
    """-> the Budget of a run with settings `cfg` and state `s` (training/start.py), evaluated every eval_period
    seconds (None: by steps) on batches of chars_per_batch characters; step_s: the probe's seconds a step, where the
    model that trains is the one it measured (else None). fit_warmup: a new run (or one started --init-from) whose
    warm-up nobody chose, which with a time budget warms up over a share of it (schedules.py: the share is saved
    with the run's state); fit_iters: whether evaluation may also take fewer batches (nobody chose them); larger:
    Pace's (a run --preset auto sized, which may start again sized for the speed it trains at)."""
    timed = bool(cfg.max_time) and cfg.lr_schedule != "inverse-sqrt"
    if timed and fit_warmup:
        s.warmup_s = WARMUP_SHARE * cfg.max_time
    expected = min(cfg.max_iters, cfg.max_time / step_s) if step_s and cfg.max_time else None
    warning = decay_warning(cfg, s, expected)
    budget = Budget(step_s, [f"warning: {warning}"] if warning else [])
    if s.warmup_s is not None and s.budget_lr is None and s.step == 0:
        budget.lines.insert(0, f"warmup: over the first {s.warmup_s:.3g} s of training ({WARMUP_SHARE:.0%} of the "
                               f"budget) or {warmup_steps(cfg, s):,} steps, whichever ends first; "
                               f"{param('warmup_iters')} N for N steps instead")
    warming = timed and s.warmup_s is None and s.budget_lr is None and s.step < warmup_steps(cfg, s)
    if cfg.max_time and (step_s or (warming and not warning)):
        budget.pace = Pace(cfg.max_time, log, step_s, warmup_steps(cfg, s) if warming and not warning else None,
                           larger)
    if eval_period is not None:
        budget.eval_fit = EvalFit(cfg.max_time, chars_per_batch, log, fit_iters=fit_iters)
    return budget


def end_seconds(cfg, params):
    """Seconds the end of a run takes after its last evaluation and save, estimated: the closing sample and the
    curves (--max-time is the command's wall time: schedules.training_seconds)."""
    import importlib.util
    sample = cfg.sample_chars * max(DECODE_MIN_S, 2 * params / DECODE_FLOPS)
    return sample + (CURVES_S if cfg.curves and importlib.util.find_spec("matplotlib") else 0.0)


class Overhead:
    """--max-time is the command's wall time: a session that begins its budget gives what it spent before training
    (start-up: the corpus, the probe, the model) and what its end will take (the last evaluation and save as the
    latest took, the closing sample and the curves: end_seconds) to RunState.overhead_s, which training's share
    of the budget leaves out (schedules.training_seconds). A session that continues a budget adds nothing. Rank
    0's clock decides, so every rank stops at the same step."""

    def __init__(self, state, started, end_s, dist):
        begins = started is not None and state.elapsed == state.budget_elapsed
        self.state, self.dist, self.end_s = state, dist, end_s
        self.startup_s = float(broadcast_str(repr(time.perf_counter() - started), dist)) if begins else None
        self.update(0.0)

    def update(self, evaluation_s):
        """After an evaluation and save of evaluation_s seconds (0.0: none yet)."""
        if self.startup_s is not None:
            evaluation_s = float(broadcast_str(repr(evaluation_s), self.dist))
            self.state.overhead_s = self.startup_s + evaluation_s + self.end_s


# --- the speed ---------------------------------------------------------------------------------------------------
def pace_lines(step_s, probe_s, step, left_s, max_iters, budget_s, warmup=None):
    """What to say of a run training at step_s seconds a step (at step `step`, left_s seconds of its budget left)
    that the probe measured at probe_s (or None: not measured), with a warm-up of `warmup` steps by the steps alone
    (or None) -> lines (none when all is as planned)."""
    expect = min(max_iters, step + left_s / step_s) if left_s is not None else max_iters
    lines = []
    if probe_s and not 1 / PACE_FACTOR <= step_s / probe_s <= PACE_FACTOR:
        slower = step_s > probe_s
        planned = min(max_iters, budget_s / probe_s)
        lines.append(f"note: training takes {step_s * 1e3:,.0f} ms a step, "
                     f"{max(step_s / probe_s, probe_s / step_s):.1f}x {'slower' if slower else 'faster'} than the "
                     f"{probe_s * 1e3:,.0f} ms the probe measured at start-up (the machine "
                     f"{'is busier now' if slower else 'was busy then'}): expect about {expect:,.0f} steps in this "
                     f"budget, not {planned:,.0f}; the model keeps the size chosen for that speed")
    if warmup is not None and expect <= warmup:
        lines.append(f"warning: at this speed the run takes about {expect:,.0f} steps, no more than its warmup "
                     f"({param('warmup_iters', warmup)}): the learning rate only rises and never decays; give a "
                     f"smaller {param('warmup_iters')} (or leave it out: a time budget then warms up over "
                     f"{WARMUP_SHARE:.0%} of itself) or a longer {param('max_time')}")
    return lines


class Resize(Exception):
    """The run trains so much faster than its probe measured that a larger model pays: start again (Pace)."""


class Pace:
    """Once the run has trained a while (PACE_*), its speed against the probe's and its warm-up: said once, by
    `say`. Progress calls check() with its own clock's numbers (pauses and the session's first step left out).
    larger(step_s, left_s) -> whether the rule would pick a larger model at step_s seconds a step for left_s
    seconds (None: the run cannot start again): then, within RESIZE_SHARE of the budget, it raises Resize."""

    def __init__(self, budget_s, say, step_s=None, warmup=None, larger=None):
        self.budget_s, self.say, self.step_s, self.warmup, self.waiting = budget_s, say, step_s, warmup, True
        self.larger, self.said, self.mark = larger, False, None

    def check(self, step, steps, trained_s, left_s, max_iters):
        """After step `step`: `steps` steps took `trained_s` seconds of training; left_s: the budget's time left."""
        if steps < PACE_MIN_STEPS or trained_s < max(PACE_SHARE * self.budget_s, PACE_MIN_S):
            return
        if not self.said:
            self.said = True
            for line in pace_lines(trained_s / steps, self.step_s, step, left_s, max_iters, self.budget_s,
                                   self.warmup):
                self.say(line)
        if self.larger is None or not self.step_s or trained_s > RESIZE_SHARE * self.budget_s:
            self.waiting = False
            return
        # the speed since the last look, not since the start: a busy spell that ended shows at once
        mark, self.mark = self.mark, (steps, trained_s) if self.mark is None or (
            steps - self.mark[0] >= PACE_MIN_STEPS and trained_s - self.mark[1] >= RESIZE_WINDOW_S) else self.mark
        if mark is None or self.mark is mark:
            return
        step_s = (trained_s - mark[1]) / (steps - mark[0])
        if step_s * RESIZE_FACTOR <= self.step_s and self.larger(step_s, left_s):
            raise Resize(f"note: training takes {step_s * 1e3:,.0f} ms a step, {self.step_s / step_s:.1f}x faster "
                         f"than the {self.step_s * 1e3:,.0f} ms the probe measured at start-up (the machine was busy "
                         f"then), and a larger model pays at this speed: starting again, sized for it")


# --- evaluation's share ------------------------------------------------------------------------------------------
def fit_evaluations(budget_s, first_s, iters, min_iters, evals=EVALS_PER_BUDGET, fit_iters=True, ran=None):
    """The evaluations left over a budget of budget_s seconds, and the batches a split each, such that with the
    first (first_s seconds at `ran` batches, by default `iters`) evaluation costs at most EVAL_SHARE of it: ->
    (evaluations, batches). Both shrink together (by the square root of what must go) down to their floors,
    MIN_EVALS and min_iters, and past those, where the share still cannot hold (a large model on a short budget),
    the batches go down to one a split and then the evaluations to one (the last); only the evaluations with
    fit_iters False (the batches were chosen)."""
    per_batch = first_s / (ran or iters)
    allowed = max(EVAL_SHARE * budget_s - first_s, 0.0)
    if evals * iters * per_batch <= allowed:
        return evals, iters
    if fit_iters:
        scale = math.sqrt(allowed / (evals * iters * per_batch))
        n = max(MIN_EVALS, math.floor(evals * scale))
        iters = max(min(min_iters, iters), min(iters, math.floor(allowed / (n * per_batch))))
        if MIN_EVALS * iters * per_batch > allowed:  # past both floors: one batch a split before fewer evaluations
            iters = max(1, min(iters, math.floor(allowed / (MIN_EVALS * per_batch))))
    return max(1, min(evals, math.floor(allowed / (iters * per_batch)))), iters


class EvalFit:
    """Fits a time-budgeted run's evaluations to EVAL_SHARE of its budget, once, from its first evaluation's cost
    (Validator.evaluate calls refit). The batches a split are the run's from then on (RunState.eval_iters, saved
    with it: a --resume compares its losses on the same batches); the evaluations, the period between them."""

    def __init__(self, budget_s, chars_per_batch, say, fit_iters=True, clock=None):
        self.budget_s, self.chars_per_batch, self.say, self.fit_iters = budget_s, chars_per_batch, say, fit_iters
        self.clock = clock or time.perf_counter  # what times the first evaluation (tests give their own)

    def first_iters(self, validator, measure):
        """The batches a split of the first evaluation: the run's, or fewer where they would cost more than one
        evaluation's part of EVAL_SHARE (at the floor of MIN_EVALS more): a 20 s budget's first evaluation at a
        3,345-character alphabet took 27 s. measure(iters) -> seconds it took to evaluate on `iters` batches a
        split; one batch a split is timed first."""
        had = validator.iters
        if not self.fit_iters or had <= 1:
            return had
        one = float(broadcast_str(repr(measure(1)), validator.dist))  # rank 0's measure decides
        allowed = EVAL_SHARE * self.budget_s / (1 + MIN_EVALS)
        return max(1, min(had, math.floor(allowed / max(one, 1e-9))))

    def refit(self, first_s, validator, ran=None):
        """The first evaluation took first_s seconds on `ran` batches a split (default: the validator's): the
        validator's period (and steps), and its batches a split (kept in the run's state), fitted. Rank 0's measure
        decides, so all ranks evaluate together."""
        had, ran = validator.iters, ran or validator.iters
        first_s = float(broadcast_str(repr(first_s), validator.dist))
        min_iters = math.ceil(MIN_EVAL_CHARS / max(self.chars_per_batch, 1))
        evals, iters = fit_evaluations(self.budget_s, first_s, had, min_iters, fit_iters=self.fit_iters, ran=ran)
        # evaluations by the passes over a small text come no closer than keeps them within EVAL_SHARE
        validator.min_gap = first_s * iters / ran * (1 - EVAL_SHARE) / EVAL_SHARE
        if (evals, iters) == (EVALS_PER_BUDGET, had):
            return
        before = first_s * (1 + EVALS_PER_BUDGET * had / ran) / self.budget_s
        after = first_s * (1 + evals * iters / ran) / self.budget_s
        validator.period = self.budget_s / evals
        if validator.steps is not None:
            validator.steps = math.ceil(validator.steps * EVALS_PER_BUDGET / evals)
        self.say(f"evaluation: the first took {first_s:.1f} s on {ran} batch{'es' if ran > 1 else ''} a split; "
                 f"{EVALS_PER_BUDGET} more would be {before:.0%} of the budget, so {evals} more, every "
                 f"{seconds(round(validator.period, 1))} of training"
                 + (f", on {iters} batches a split" if iters != had else "")
                 + f" (about {after:.0%}; at most {EVAL_SHARE:.0%} where the floors allow); {param('eval_interval')} "
                 f"N or {param('eval_iters')} N to choose")
        validator.state.eval_iters = iters
