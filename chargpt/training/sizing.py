"""--preset auto, the default without a GPU: the model for this corpus, this machine and this time budget.

    plan = choose(budget_s, step_seconds, train_chars)   # the rule: pure (step_seconds a function of a rung)
    step_seconds = Probe(vocab_size, cfg, device, dtype)   # this machine's speed: the fastest of a few timed steps

A fixed model is the wrong model for most runs. Compute-optimal size grows with compute (Kaplan et al. 2020;
Hoffmann et al. 2022: about 20 tokens per parameter), so a longer budget wants a larger model; and a small corpus
read many times over is memorised (nanoGPT's shakespeare_char run is best at step ~2,000 of 5,000), so a small
corpus wants dropout, fewer passes and a model that cannot learn it by heart. The rule below is those two facts
with constants fitted to a grid of rungs on tiny Shakespeare, CPython's standard library (at 120 s and 600 s), and
20,000-100,000 characters of Tang poems, code and English prose (at 120 s) on a 2-core CPU (benchmarks/RESULTS.md,
--preset auto). It is a table and a few numbers,
not a search: each rung's speed is measured here (a few steps, about a second), because machines differ several
times over in speed and in how a step's cost grows with the model.

The rule, in order:
1. Climb RUNGS, from the smallest, while the next rung would still see TOKENS_PER_PARAM characters per block
   parameter in the budget at its measured speed, and holds at most PARAMS_PER_CHAR block parameters per
   training character (a larger one memorises a small corpus before it generalises).
2. Dropout (DROPOUT) when the passes over the corpus the budget buys, times the model's block parameters per
   training character, exceed MEMORISE: a model learns a text by heart the sooner the more it can hold of it.
3. Past WARN_EPOCHS passes the log warns that the model may learn the text by heart (and what to do); past
   MAX_EPOCHS the run ends there (a step budget, reached before the time budget; the schedule decays to it).
Anything the user sets (a flag or a config file) wins over what the rule picks, for that setting alone.
"""

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field, fields

from chargpt.config import PRESETS, SIZED, ModelConfig
from chargpt.training.schedules import seconds

HEAD_SIZE = 32  # channels per attention head in every rung (a given --n-embd gets heads of about this size)

# Fitted (benchmarks/RESULTS.md, --preset auto). Characters seen per block parameter below which a larger rung
# loses to the one below it at the same budget:
TOKENS_PER_PARAM = 3.0
# A rung may hold at most this many block parameters per training character. Refit with dropout's cheap CPU mask
# (chargpt/model/dropout.py) at 120 s: on 36,000 characters of code 2 x 64 (2.7 a character) beat 2 x 96 (6.1) by 0.019
# nats and 2 x 128 (10.9) by 0.058; on 18,000 characters of Tang poems 2 x 64 (5.5) beat 2 x 96 (12.3) by 0.12;
# on 90,000 characters of English prose 2 x 128 (4.4) beat 2 x 96 (2.5) by 0.048, and 3 x 160 (10.2), 0.005 better
# still, was out of the budget's reach anyway (TOKENS_PER_PARAM). All with dropout 0.2 (0.4 lost on both corpora
# tried), each far ahead of the cpu preset's 2 x 128 without it (benchmarks/RESULTS.md):
PARAMS_PER_CHAR = 5.0
# Dropout when passes over the training text x block parameters per training character exceed this: a model
# learns text by heart sooner the more parameters it has per character. Measured: 40,000 characters, 2 x 128 was
# best after ~13 passes (x 11 parameters a character: 143) and then only got worse, and dropout 0.2 fixed it; tiny
# Shakespeare at 600 s, 4 x 256 (10 passes x 3.2 = 33) was the best run without dropout, and 4 x 192 with dropout
# 0.2 lost 0.1 nats to it (with the old dropout, which halved a CPU step; it now costs a third): 60 lies between
MEMORISE = 60.0
DROPOUT = 0.2  # shakespeare-char's; on the 40,000-character corpus it took 2 x 96 from overfit to still improving
WARN_EPOCHS = 100.0  # more passes than this: the log warns that the model may memorise the text
MAX_EPOCHS = 250.0  # more passes than this, even with dropout, only memorise: the run ends there

# --softmax auto: the adaptive output layer for a new text run on a CPU over at least ADAPTIVE_MIN_CHARS characters
# with a budget of at most ADAPTIVE_MAX_S. On the Tang poems (9,728 characters, 2-core CPU) it won at 150 s (best
# validation loss 4.300 against 4.420 with the full layer: its step costs a third less, and auto sizes a larger model
# into the budget) and lost at 600 s (3.991 against 3.960): its narrow clusters cost the rare characters once a
# model has trained longer (docs/training.md)
ADAPTIVE_MIN_CHARS = 2000
ADAPTIVE_MAX_S = 300.0
PROBE_STEPS = 3  # timed steps per rung, after one untimed (the first call allocates and warms caches)
PROBE_SHARE = 0.02  # measuring rungs may cost at most this share of the budget
# A rung's speed is the fastest of its timed steps: other work on the machine only ever slows a step down, so the
# fastest is the one nearest what the run gets once that work ends (one probe measured 3,716 ms a step, the same
# command minutes later 320 ms). Steps that vary by more than BUSY_SPREAD (and by BUSY_MIN_S: a few ms of jitter in
# a 2 ms step is not a busy machine) say the machine was busy: then up to PROBE_MAX_STEPS are timed, within the
# rung's share of the budget, and start-up says so (Probe.busy_note).
PROBE_MAX_STEPS = 8
# A step timed while another process keeps a core busy is no fastest-of-a-few away from the truth: torch's threads
# meet at every operator, and one of them waiting for a shared core slowed every step alike, 8-19x (a 2 x 64 step
# 413 and 1,052 ms against 54 ms quiet, on 2 cores with one busy loop beside it), so no step looks unusual. So before
# measuring, the probe asks the system how busy the machine is, and while other processes use more than the CPUs
# this run leaves free (and QUIET_CPUS more) it waits, up to WAIT_SHARE of the budget and WAIT_MAX_S, for them
# to finish. A load that lasts is what the run will get: then the sizes are measured with it.
QUIET_CPUS = 0.5
WAIT_SHARE = 0.1
WAIT_MAX_S = 30.0
WAIT_STEP_S = 0.5
BUSY_SPREAD = 2.0
BUSY_MIN_S = 0.05
# A rung whose measured speed puts it within NEAR of a threshold of the rule (TOKENS_PER_PARAM, MEMORISE) decides
# on that speed's noise: the same command picked 3 x 128 once and 3 x 160 three times on 400,000 characters of Tang
# poems at 150 s (3 x 160 read 2.6-3.3 characters per parameter there). The fastest of 3 steps of a VM's 2 cores
# varied 90-114 ms between six processes, the fastest of 12 by half as much (83-98 ms), so such a rung is timed
# up to PROBE_NEAR_STEPS (Probe.closer), within its share of the budget, before the rule decides.
NEAR = 0.2
PROBE_NEAR_STEPS = 12


@dataclass(frozen=True)
class Rung:
    """One model shape of the ladder, with the context and batch it trains with."""
    n_layer: int
    n_embd: int
    block_size: int = 128
    batch_size: int = 16

    @property
    def n_head(self):
        return self.n_embd // HEAD_SIZE

    @property
    def params(self):
        """Weights in the blocks (attention 4 d^2, MLP 8 d^2 a layer): what compute buys. The embeddings and the
        head are left out, as in Kaplan et al.: their size follows the vocabulary, not the budget."""
        return 12 * self.n_layer * self.n_embd ** 2

    @property
    def chars_per_step(self):
        return self.block_size * self.batch_size

    def flops(self):
        """Rough work of a step (6 per parameter per character, plus attention): only to guess whether measuring
        the next rung is worth its time."""
        return self.chars_per_step * (6 * self.params + 12 * self.n_layer * self.block_size * self.n_embd)

    def describe(self):
        return f"{self.n_layer} x {self.n_embd}"

    def model_settings(self, dropout=0.0):
        return {"n_layer": self.n_layer, "n_embd": self.n_embd, "n_head": self.n_head, "block_size": self.block_size,
                "dropout": dropout}


# Small to large, each about 1.5-2x the work of the one below. Context 128 and batch 16 won the 2-minute search
# on this CPU (RESULTS.md); the last rung is shakespeare-char's model, batch and context, the GPU default.
RUNGS = (
    Rung(2, 64),
    Rung(2, 96),
    Rung(2, 128),  # the cpu preset's model
    Rung(3, 128),
    Rung(3, 160),
    Rung(4, 192),
    Rung(4, 256),
    Rung(5, 320),
    Rung(6, 384, block_size=256, batch_size=64),
)
# a run given steps, not time (--max-iters alone), keeps the cpu preset's model (docs/runs.md says so)
STEP_BUDGET_RUNG = Rung(*(PRESETS["cpu"][k] for k in ("n_layer", "n_embd", "block_size", "batch_size")))


@dataclass
class Plan:
    """What auto chose, and why: settings for the run, the estimates behind them, and the lines for the log."""
    rung: Rung
    settings: dict  # {field: value}: the model's shape, context, batch, dropout, and max_iters when capped
    step_s: float | None = None  # measured seconds per step of the rung
    steps: float | None = None  # steps the run takes: what the budget buys at that speed, or the cap
    epochs: float | None = None  # passes over the training text in the run
    reasons: list = field(default_factory=list)
    warning: str | None = None
    budget_steps: float | None = None  # steps the time budget buys at the measured speed


def dropout_for(epochs, params_per_char):
    """Dropout for a model of `params_per_char` block parameters per training character that would read the
    training text `epochs` times without it."""
    return DROPOUT if epochs * params_per_char > MEMORISE else 0.0


def near(value, threshold):
    """Whether a measured value is within NEAR of a threshold of the rule (either side)."""
    return threshold / (1 + NEAR) < value < threshold * (1 + NEAR)


def choose(budget_s, step_seconds, train_chars, world_size=1, grad_accum=1, closer=None, previous=None):
    """The rule (module docstring). budget_s: seconds of training; step_seconds(rung, dropout) -> measured seconds
    per optimizer step (called for each rung considered, smallest first); train_chars: characters of training
    text; closer(rung, dropout) -> the same, measured more closely (more steps), asked where a rung lies near a
    threshold (None: step_seconds is exact); previous: (rung, dropout) the last run of the same command picked
    (recall), whose decision stands where a rung lies near a threshold. -> Plan."""
    scale = world_size * grad_accum  # characters per step of one micro-batch on one process -> per optimizer step
    closer = closer or step_seconds
    last = RUNGS.index(previous[0]) if previous is not None and previous[0] in RUNGS else None
    picked, why_not, held = None, None, []
    for i, rung in enumerate(RUNGS):
        if picked is not None:
            if rung.params > PARAMS_PER_CHAR * train_chars:
                why_not = (f"{rung.describe()} has {rung.params / max(train_chars, 1):.1f} block parameters per "
                           f"training character (at most {PARAMS_PER_CHAR:g}: it would memorise this corpus)")
                break
            guess = picked[1] * rung.flops() / RUNGS[i - 1].flops()  # its step, guessed from the last one measured
            if guess * (PROBE_STEPS + 1) > PROBE_SHARE * budget_s:
                why_not = f"{rung.describe()} is too slow for {seconds(budget_s)} (about {guess:.2g} s a step)"
                break
        step_s = step_seconds(rung, 0.0)
        passes = budget_s / step_s * rung.chars_per_step * scale / max(train_chars, 1)
        if near(passes * rung.params / max(train_chars, 1), MEMORISE):
            step_s = closer(rung, 0.0)
            passes = budget_s / step_s * rung.chars_per_step * scale / max(train_chars, 1)
        dropout = dropout_for(passes, rung.params / max(train_chars, 1))
        if last == i and near(passes * rung.params / max(train_chars, 1), MEMORISE) and dropout != previous[1]:
            dropout = previous[1]
            held.append(f"dropout {dropout:g} for {rung.describe()}")
        if dropout:  # dropout's masks cost time too (on a CPU about as much as the rest of a small step)
            step_s = step_seconds(rung, dropout)
        chars = budget_s / step_s * rung.chars_per_step * scale
        pays = chars >= TOKENS_PER_PARAM * rung.params
        if picked is not None and near(chars, TOKENS_PER_PARAM * rung.params):
            step_s = closer(rung, dropout)
            chars = budget_s / step_s * rung.chars_per_step * scale
            pays = chars >= TOKENS_PER_PARAM * rung.params
            if last is not None and pays != (last >= i):
                pays = last >= i
                kept, other = (rung, picked[0]) if pays else (picked[0], rung)
                held.append(f"{kept.describe()} (not {other.describe()})")
        if picked is not None and not pays:
            why_not = (f"{rung.describe()} would see {chars / rung.params:.1f} characters per block parameter (at "
                       f"least {TOKENS_PER_PARAM:g} pay)")
            break
        picked = (rung, step_s, chars, dropout)
    rung, step_s, chars, dropout = picked
    steps = budget_s / step_s
    epochs = chars / max(train_chars, 1)
    settings = {**rung.model_settings(dropout), "batch_size": rung.batch_size}
    plan = Plan(rung, settings, step_s, steps, epochs, budget_steps=steps)
    plan.reasons.append(f"{count(chars / rung.params)} characters per block parameter in the budget")
    if dropout:
        plan.reasons.append(f"dropout {dropout:g}: the budget reads the training text {count(epochs)} times with "
                            f"{rung.params / train_chars:.1f} block parameters per character")
    if why_not:
        plan.reasons.append(f"not larger: {why_not}")
    if held:
        plan.reasons.append(f"kept {' and '.join(held)} as the last run of this command did: the speed measured now "
                            f"lies within {NEAR:.0%} of a threshold of the rule, where the choice would follow noise")
    if epochs > MAX_EPOCHS:
        cap = max(1, int(MAX_EPOCHS * train_chars / (rung.chars_per_step * scale)))
        settings["max_iters"] = cap
        plan.epochs, plan.steps = MAX_EPOCHS, cap
    if plan.epochs > WARN_EPOCHS:
        stop = (f"the run stops at step {plan.steps:,.0f} ({MAX_EPOCHS:g} passes, about {plan.steps * step_s:.0f} s "
                f"of the budget); --max-iters N trains longer anyway" if "max_iters" in settings else
                f"dropout {dropout:g} holds it off for a while")
        plan.warning = (f"the corpus is small for this budget: its {train_chars:,} training characters are read "
                        f"{plan.epochs:.0f} times, and a model learns text read that often by heart; {stop}. More "
                        f"text helps most; a shorter --max-time, or --patience N (stop when validation stops "
                        f"improving), also keeps the model from memorising")
    return plan


def pick_softmax(vocab_size, budget_s, device_type, reasons_against=()):
    """--softmax auto -> ('adaptive' or 'full', why in words). reasons_against: what rules the adaptive layer out for
    this run (a resumed or extended run, labels, label smoothing, sentence pairs), in words."""
    if reasons_against:
        return "full", reasons_against[0]
    if device_type != "cpu":
        return "full", "its speed is measured on a CPU only; a GPU's fused full layer is fast already"
    if vocab_size < ADAPTIVE_MIN_CHARS:
        return "full", f"{vocab_size:,} characters (adaptive from {ADAPTIVE_MIN_CHARS:,})"
    if not budget_s or budget_s > ADAPTIVE_MAX_S:
        return "full", f"a budget over {ADAPTIVE_MAX_S:g} s (adaptive lost at 600 s on the Tang poems)"
    return "adaptive", (f"{vocab_size:,} characters in a {budget_s:g} s budget: a third cheaper a step, and a larger "
                        f"model fits (it won by 0.12 nats at 150 s on the Tang poems)")


def larger_pays(rung, step_s, budget_s, train_chars, world_size=1, grad_accum=1):
    """Whether the rule would pick the rung above `rung` where `rung` trains at step_s seconds a step for budget_s
    seconds (the larger one's step guessed from the FLOPs of the two, as choose() guesses): a run that trains much
    faster than its probe measured starts again sized for that speed (budget.Pace) only where it would pay."""
    i = RUNGS.index(rung) if rung in RUNGS else len(RUNGS)
    if i + 1 >= len(RUNGS):
        return False
    above = RUNGS[i + 1]
    if above.params > PARAMS_PER_CHAR * train_chars:
        return False
    guess = step_s * above.flops() / rung.flops()
    return budget_s / guess * above.chars_per_step * world_size * grad_accum >= TOKENS_PER_PARAM * above.params


def step_budget_plan(train_chars, max_iters, world_size=1, grad_accum=1):
    """A run given steps, not time: the cpu preset's model (nothing to size by) -> Plan, with the warning if those
    steps read the corpus so often that the model will memorise it."""
    rung = STEP_BUDGET_RUNG
    settings = {**rung.model_settings(), "batch_size": rung.batch_size}
    epochs = max_iters * rung.chars_per_step * world_size * grad_accum / max(train_chars, 1)
    plan = Plan(rung, settings, None, max_iters, epochs,
                ["a step budget (--max-iters) gives nothing to size by; --max-time SECONDS sizes the model"])
    if epochs > WARN_EPOCHS:
        plan.warning = (f"{max_iters:,} steps read the {train_chars:,} training characters {epochs:.0f} times: the "
                        f"model will memorise them; give more text, fewer steps, or --patience N")
    return plan


def heads_for(n_embd):
    """A head count for a given width: heads of about HEAD_SIZE channels that divide it."""
    return min((h for h in range(1, n_embd + 1) if n_embd % h == 0), key=lambda h: abs(n_embd / h - HEAD_SIZE))


def width_for(n_embd, n_head):
    """The width nearest n_embd that n_head heads divide (never below one channel a head)."""
    return max(n_head, round(n_embd / n_head) * n_head)


def plan_run(cfg, given, train_chars, probe, world_size=1, previous=None):
    """The Plan for a run of TrainConfig `cfg` whose settings `given` ({name: value}, from a flag or a config
    file) win: sized by time (--max-time; the probe is measured), or by steps. Nothing is measured when the
    user gave every setting of the model's size."""
    if cfg.max_time is None:
        return step_budget_plan(train_chars, cfg.max_iters, world_size, cfg.grad_accum)
    if all(name in given for name in ("n_layer", "n_embd", "block_size", "batch_size")):
        rung = Rung(given["n_layer"], given["n_embd"], given["block_size"], given["batch_size"])
        return Plan(rung, {}, reasons=["the model's size is given: nothing to choose"])
    return choose(cfg.max_time, probe, train_chars, world_size, cfg.grad_accum, getattr(probe, "closer", None),
                  previous)


def apply(plan, model_kw, train_kw, given):
    """The plan's settings into the run's, but for those in `given` (set by a flag or a config file: they win)
    -> (model_kw, train_kw, [(name, value)] of the user's settings auto left alone)."""
    kept = [(name, given[name]) for name in SIZED if name in given and name in plan.settings]
    chosen = {k: v for k, v in plan.settings.items() if k not in given}
    if "n_embd" in given and "n_head" not in given:  # the rung's head count may not divide the width given
        chosen["n_head"] = heads_for(given["n_embd"])
    if "n_head" in given and "n_embd" not in given and "n_embd" in chosen:  # a width the heads given divide
        chosen["n_embd"] = width_for(chosen["n_embd"], given["n_head"])
    model_names = {f.name for f in fields(ModelConfig)}
    model_kw = {**model_kw, **{k: v for k, v in chosen.items() if k in model_names}}
    train_kw = {**train_kw, **{k: v for k, v in chosen.items() if k not in model_names}}
    return model_kw, train_kw, kept


def describe(plan, budget_s, train_chars, kept=(), spelled=lambda name, value: f"--{name} {value}"):
    """The start-up lines: what auto chose, for what, why; the user's settings it left alone ([(name, value)]). The
    first line describes the model that trains: where a size setting of the user's replaced the rung's, the
    rung's measured speed no longer applies and no step count is promised."""
    s, r = plan.settings, plan.rung
    if not s:
        line = f"auto: the model's size is given ({r.describe()}, context {r.block_size}, batch {r.batch_size})"
    else:
        given = dict(kept)
        shape = Rung(*(given.get(k, getattr(r, k)) for k in ("n_layer", "n_embd", "block_size", "batch_size")))
        line = (f"auto: {shape.describe()} ({shape.params / 1e6:.2f}M block parameters), context {shape.block_size}, "
                f"batch {shape.batch_size}, dropout {given.get('dropout', s['dropout']):g}")
        if shape != r:
            line += f" (auto chose {r.describe()}, context {r.block_size}, batch {r.batch_size}; yours win)"
        elif plan.step_s is None:
            line += f" for {plan.steps:,.0f} steps on {train_chars:,} training characters: ~{plan.epochs:.1f} passes"
        else:
            line += (f" for {seconds(budget_s)} on {train_chars:,} training characters: {plan.step_s * 1e3:.0f} ms a "
                     f"step measured, ~{count(plan.steps)} steps, ~{plan.epochs:,.1f} passes")
    lines = [line, "auto, why: " + "; ".join(plan.reasons)]
    if kept:
        lines.append("auto left to you: " + ", ".join(spelled(k, v) for k, v in kept))
    return lines


# --- the same command, the same model ---------------------------------------------------------------------------
# What auto picked for a command is remembered beside the encoded corpus (MEMORY_FILE, the MEMORY_MAX most recent
# commands): where a rung lies near a threshold, the next run of the same command keeps that decision (choose's
# previous) instead of following its own probe's noise, and a measurement clearly past the threshold still decides.
MEMORY_FILE = "sizing.json"
MEMORY_MAX = 64
MEMORY_MAX_BYTES = 1 << 20  # a larger file is not this one's: ignored
# the settings of a command that change what auto picks or how fast the probe's steps run (where the output goes,
# the seed or the log do not: a command with another --out-dir is the same command)
SIZING_SETTINGS = {f.name for f in fields(ModelConfig)} | {"batch_size", "optimizer", "grad_clip", "max_iters"}


def memory_key(**command):
    """A key for a command's sizing: what it was given and where it runs (JSON-able values), and the rule itself
    (a refit rule decides afresh)."""
    rule = (TOKENS_PER_PARAM, PARAMS_PER_CHAR, MEMORISE, DROPOUT, [(r.n_layer, r.n_embd, r.block_size, r.batch_size)
                                                                   for r in RUNGS])
    return hashlib.sha256(json.dumps([command, rule], sort_keys=True, default=str).encode()).hexdigest()[:32]


def command_settings(given):
    """The user's settings that change what auto picks (SIZING_SETTINGS), as one command gives them however they
    were written (150 from a config file and --max-time 150.0 alike) -> a sorted list of (name, value)."""
    def same(v):
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    return sorted((k, same(v)) for k, v in given.items() if k in SIZING_SETTINGS)


def _read_memory(path):
    try:
        if path.stat().st_size > MEMORY_MAX_BYTES:
            return {}
        memory = json.loads(path.read_text(encoding="utf-8"))
        return memory if isinstance(memory, dict) else {}
    except (OSError, ValueError, RecursionError):  # none yet, unreadable, torn, or not this file: start afresh
        return {}


def recall(path, key):
    """(Rung, dropout) the last run of the command `key` picked, from the memory file at `path`, or None."""
    entry = _read_memory(path).get(key)
    try:
        rung, dropout = Rung(*(int(v) for v in entry["rung"])), float(entry["dropout"])
        return (rung, dropout) if rung in RUNGS and dropout in (0.0, DROPOUT) else None  # only what auto picks
    except (TypeError, KeyError, ValueError):
        return None


def remember(path, key, plan):
    """Keep the plan's rung and dropout for the command `key` (the oldest commands forgotten past MEMORY_MAX). A
    memory that cannot be written is only a memory lost: nothing fails."""
    from chargpt.runs.rundir import write_text_atomic
    memory = _read_memory(path)
    memory.pop(key, None)
    r = plan.rung
    memory[key] = {"rung": [r.n_layer, r.n_embd, r.block_size, r.batch_size], "dropout": plan.settings["dropout"]}
    try:
        write_text_atomic(path, json.dumps(dict(list(memory.items())[-MEMORY_MAX:])))
    except OSError:
        pass


def count(x):
    """A count that may be astronomically large (a budget of 1e300 s): digits up to a trillion, then 'more than a
    trillion'."""
    return f"{x:,.0f}" if x < 1e12 else "more than a trillion"


def looks_busy(times):
    """Whether a rung's timed steps (seconds) varied as they do on a machine busy with other work."""
    return max(times) > BUSY_SPREAD * min(times) and max(times) - min(times) > BUSY_MIN_S


def time_steps(step, clock, limit_s, steps=PROBE_STEPS, before=None):
    """Seconds of `steps` calls of step(), after one untimed; where they vary as on a busy machine, more, up to
    PROBE_MAX_STEPS while their total stays within limit_s. clock() -> seconds (time.perf_counter). before: seconds
    this step() already took (it is warm: no untimed call), counted in; more are timed, up to `steps` in all."""
    if before is None:
        step()  # the first call allocates and warms caches
    times = list(before or ())
    while len(times) < PROBE_STEPS or (len(times) < steps and sum(times) + min(times) <= limit_s) or (
            looks_busy(times) and len(times) < PROBE_MAX_STEPS and sum(times) + min(times) <= limit_s):
        t0 = clock()
        step()
        times.append(clock() - t0)
    return times


def wait_until_quiet(others_use, limit_s, allowed):
    """Before measuring: while other processes use more than `allowed` CPUs, wait (up to limit_s) for them to
    finish. others_use(seconds) -> CPUs other processes used over that long (it takes that long), or None where
    the system does not say. -> (seconds waited, CPUs others used at the end, or None)."""
    waited, use = 0.0, others_use(WAIT_STEP_S / 2)
    while use is not None and use > allowed and waited < limit_s:
        use = others_use(WAIT_STEP_S)
        waited += WAIT_STEP_S
    return waited, use


def quiet_note(waited, use, allowed, cpus):
    """The start-up line about other processes' load before measuring, or None when there was none."""
    if use is None or (waited == 0 and use <= allowed):
        return None
    if use <= allowed:
        return f"other processes were keeping the CPUs busy: waited {waited:.0f} s for them before measuring the sizes"
    return (f"other processes use {use:.1f} of this machine's {cpus} CPUs, and still did after {waited:.0f} s: the "
            f"model is sized for the speed the machine has with them")


def wait_for_quiet_cpus(max_time, threads, others_use=None, cpus=None):
    """wait_until_quiet for a run of `threads` threads on this machine's CPUs, within the budget's share -> the
    start-up note (quiet_note), or None."""
    from chargpt.runtime import others_cpu_use
    cpus = cpus or os.cpu_count() or 1
    allowed = max(0.0, cpus - threads) + QUIET_CPUS  # the CPUs this run leaves to others, and some slack
    waited, use = wait_until_quiet(others_use or others_cpu_use, min(WAIT_SHARE * max_time, WAIT_MAX_S), allowed)
    return quiet_note(waited, use, allowed, cpus)


class Probe:
    """step_seconds for choose(): times training steps (forward, backward, optimizer) of each rung on this machine,
    at the run's vocabulary, dtype and optimizer, on random characters; a rung's speed is its fastest step
    (time_steps). Memoised per rung. clock and make_step(rung, dropout) -> step() stand in for the machine in
    tests."""

    def __init__(self, vocab_size, cfg, device, dtype, clock=None, make_step=None, others_use=None,
                 head=("full", 0, None), threads=None):
        self.vocab_size, self.cfg, self.device, self.dtype, self.times = vocab_size, cfg, device, dtype, {}
        # the run's output layer: (--softmax, --shortlist, the text's character counts for an adaptive one, whose
        # step depends on which characters the batch holds: the probe's batch is then drawn from those counts)
        self.softmax, self.shortlist, self.counts = head
        self.clock, self.make_step = clock or time.perf_counter, make_step or self.training_step
        self.samples = {}  # (rung, dropout) -> every timed step's seconds
        # others_use(seconds) -> other processes' CPUs (None: runtime.others_cpu_use): on a CPU their load is
        # waited out before the first measurement, and start-up says so with quiet_note
        self.others_use, self.quiet_note, self.waited = others_use, None, False
        self.last = None  # ((rung, dropout), step) of the rung timed last
        # the run's threads.ThreadTuner (--threads auto): the first rung's steps find the thread count the run trains
        # at, before any rung is timed (beside a busy process, 2 threads ran a 2 x 64 step 8-19x slower than 1)
        self.threads = threads

    def __call__(self, rung, dropout=0.0):
        if (rung, dropout) not in self.times:
            import torch
            if not self.waited and self.device.type == "cpu":  # a GPU's speed does not depend on them
                self.waited = True
                self.quiet_note = wait_for_quiet_cpus(self.cfg.max_time or 0.0, torch.get_num_threads(),
                                                      self.others_use)
            self.last = None  # the last rung's model freed before the next is built: one model at a time
            self.last = (rung, dropout), self.make_step(rung, dropout)  # kept for closer()
            if self.threads is not None and not self.threads.fixed and not self.threads.measured:
                with torch.random.fork_rng(devices=[]):
                    self.threads.settle(self.last[1])
            self._time(rung, dropout, self.last[1])
        return self.times[rung, dropout]

    def closer(self, rung, dropout=0.0):
        """The rung's seconds a step measured more closely: timed up to PROBE_NEAR_STEPS in all (NEAR)."""
        self(rung, dropout)
        before = self.samples[rung, dropout]
        if len(before) < PROBE_NEAR_STEPS:
            if self.last[0] == (rung, dropout):  # still warm: its times go on
                self._time(rung, dropout, self.last[1], PROBE_NEAR_STEPS, before)
            else:
                self.last = None
                self.last = (rung, dropout), self.make_step(rung, dropout)
                self._time(rung, dropout, self.last[1], PROBE_NEAR_STEPS - len(before))
                self.samples[rung, dropout] = before + self.samples[rung, dropout]
                self.times[rung, dropout] = min(self.samples[rung, dropout])
        return self.times[rung, dropout]

    def _time(self, rung, dropout, step, steps=PROBE_STEPS, before=None):
        import torch
        with torch.random.fork_rng(devices=[]):  # the run's own random streams are untouched (dropout's too)
            times = time_steps(step, self.clock, PROBE_SHARE * (self.cfg.max_time or 0), steps, before)
        self.samples[rung, dropout], self.times[rung, dropout] = times, min(times)

    def busy_note(self):
        """The start-up line where the machine looked busy while it was measured (the rung whose steps varied
        most), or None."""
        busy = [(max(t) / min(t), rung, t) for (rung, _), t in self.samples.items() if looks_busy(t)]
        if not busy:
            return None
        _, rung, times = max(busy, key=lambda b: b[0])
        return (f"the machine looks busy: the probe's steps of {rung.describe()} varied from {min(times) * 1e3:,.0f} "
                f"to {max(times) * 1e3:,.0f} ms; sized for the fastest (the run says so if it trains much slower)")

    def training_step(self, rung, dropout):
        """A training step of the rung, as the run takes it: step() -> None."""
        import torch

        from chargpt.model.transformer import build_model
        from chargpt.runtime import autocast
        from chargpt.training.optim import low_precision_copies, make_optimizer
        g = torch.Generator().manual_seed(0)
        mcfg = ModelConfig(vocab_size=self.vocab_size, n_layer=rung.n_layer, n_embd=rung.n_embd,
                           n_head=rung.n_head, block_size=rung.block_size, dropout=dropout, softmax=self.softmax,
                           shortlist=self.shortlist).validate()
        model = build_model(mcfg)
        shape = (rung.batch_size, rung.block_size + 1)
        if self.counts is not None:
            model.lm_head.set_frequencies(self.counts)
            x = torch.multinomial(self.counts.double(), math.prod(shape), replacement=True, generator=g).view(shape)
        else:
            x = torch.randint(self.vocab_size, shape, generator=g)
        model.to(self.device)
        optimizer = make_optimizer(model, self.cfg, self.device, self.dtype)
        copies = low_precision_copies(model, optimizer, self.device, self.dtype, wrapped=False)  # as training
        x = x.to(self.device)
        batch = dict(idx=x[:, :-1], targets=x[:, 1:])

        def step():
            if copies is not None:
                copies.refresh()
            with autocast(self.device, self.dtype):
                _, loss = model(**batch) if copies is None else copies.forward(model, batch)
            loss.backward()
            if copies is not None:
                copies.grads_to_flat()
            if self.cfg.grad_clip > 0:  # as a training step
                optimizer.clip_grad_norm_(self.cfg.grad_clip)
            for part in optimizer.parts.values():
                part.step()
            optimizer.zero_grad()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
        return step
