"""A time budget is spent training, and the same command picks the same model: the sizing probe takes the fastest
of its steps (a busy moment does not decide the size, and start-up says the machine looked busy), the speed the
run actually gets is checked against the probe's, evaluation is fitted to at most a tenth of the budget, the
warm-up is a share of it, a decay the budget cannot reach is warned of, and overfitting is said once.

Every clock here is a fake one (a machine whose steps take what the test says): no measurement depends on how
busy this machine is."""

import itertools
import json
import re
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
import torch
from helpers import TINY_RUN_KW

import chargpt
from chargpt import runtime
from chargpt.config import UNLIMITED, TrainConfig
from chargpt.config.flags import param
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir
from chargpt.training import sizing
from chargpt.training.budget import EVAL_SHARE, MIN_EVALS, EvalFit, Pace, fit_evaluations, pace_lines
from chargpt.training.describe import brief_lines, start_lines
from chargpt.training.overfit import RISEN_EVALS, OverfitWatch, overfitting
from chargpt.training.progress import Progress
from chargpt.training.schedules import WARMUP_SHARE, decay_warning, finished, lr_at, warmup_steps
from chargpt.training.start import start_run
from chargpt.training.state import RunState
from chargpt.training.trainer import Trainer
from chargpt.training.validate import EVALS_PER_BUDGET, Validator

TINY = {k: v for k, v in TINY_RUN_KW.items() if k != "warmup_iters"}  # the warm-up: each test's own


def quiet(message):
    pass


# --- the probe -----------------------------------------------------------------------------------------------------
class FakeMachine:
    """Steps that take (5 ms + 10 ms a GFLOP) x 1.5 with dropout, on a clock that only they move; `slow`: which
    calls of each rung's step (0 is the untimed first) take `factor` times longer, as when other work runs."""

    def __init__(self, slow=(), factor=12.0):
        self.now, self.slow, self.factor = 0.0, set(slow), factor

    def clock(self):
        return self.now

    def make_step(self, rung, dropout):
        calls = itertools.count()
        seconds = (0.005 + 0.01 * rung.flops() / 1e9) * (1.5 if dropout else 1)

        def step():
            self.now += seconds * (self.factor if next(calls) in self.slow else 1)
        return step


def probe_on(machine, max_time=600.0):
    return sizing.Probe(65, TrainConfig(max_time=max_time), torch.device("cpu"), torch.float32, clock=machine.clock,
                        make_step=machine.make_step, others_use=lambda seconds: 0.0)


@pytest.mark.parametrize("slow", [{1}, {1, 2}])  # the first timed step busy; or most of the three
def test_a_busy_moment_does_not_decide_the_size_and_start_up_says_so(slow):
    quiet_probe, busy_probe = probe_on(FakeMachine()), probe_on(FakeMachine(slow))
    calm, busy = sizing.choose(600, quiet_probe, 10_000_000), sizing.choose(600, busy_probe, 10_000_000)
    assert (busy.rung, busy.settings) == (calm.rung, calm.settings)  # the same model
    assert busy.step_s == pytest.approx(calm.step_s)  # at the same speed
    assert len(calm.reasons) and quiet_probe.busy_note() is None
    assert all(len(t) == sizing.PROBE_STEPS for t in quiet_probe.samples.values())
    timed = busy_probe.samples[calm.rung, 0.0]
    assert sizing.PROBE_STEPS < len(timed) <= sizing.PROBE_MAX_STEPS  # busy: measured again, within bounds
    note = busy_probe.busy_note()
    assert note.startswith("the machine looks busy: the probe's steps of ") and "sized for the fastest" in note
    fastest, slowest = (float(x.replace(",", "")) for x in re.search(r"from ([\d,]+) to ([\d,]+) ms", note).groups())
    assert slowest / fastest > sizing.BUSY_SPREAD


def test_the_probe_times_a_rung_near_a_threshold_longer_and_only_that_one():
    rung = sizing.RUNGS[4]
    machine = FakeMachine()
    built = []
    make_step = machine.make_step
    machine.make_step = lambda r, d: built.append(r) or make_step(r, d)
    step_s = 0.005 + 0.01 * rung.flops() / 1e9
    budget = 3.1 * rung.params * step_s / rung.chars_per_step  # 3 x 160 reads 3.1 characters per parameter
    probe = probe_on(machine, max_time=budget)
    plan = sizing.plan_run(TrainConfig(max_time=budget), {}, 100_000_000, probe)
    assert plan.rung == rung and plan.step_s == pytest.approx(step_s)
    assert {r: len(t) for (r, _), t in probe.samples.items()} == {
        r: sizing.PROBE_NEAR_STEPS if r == rung else sizing.PROBE_STEPS for r in sizing.RUNGS[:6]}
    assert built == list(sizing.RUNGS[:6])  # timed on, not built again
    assert probe.busy_note() is None


class OtherProcesses:
    """Other processes' load as the system reports it: `busy_for` seconds of `cpus` CPUs' work, then none."""

    def __init__(self, busy_for, cpus=1.0):
        self.busy_for, self.cpus, self.now = busy_for, cpus, 0.0

    def __call__(self, seconds):
        self.now += seconds
        return self.cpus if self.now <= self.busy_for else 0.0


def test_a_load_that_passes_is_waited_out_before_the_sizes_are_measured():
    """A busy loop beside a 2-core run slowed every probe step alike (8-19x), so the fastest step did not help: the
    probe waits for the load to pass, then measures the machine quiet, and start-up says so."""
    others = OtherProcesses(busy_for=6.0)
    note = sizing.wait_for_quiet_cpus(150.0, threads=2, others_use=others, cpus=2)
    assert 6.0 <= others.now <= 7.0  # waited for it, and not much longer
    assert note == "other processes were keeping the CPUs busy: waited 6 s for them before measuring the sizes"
    assert sizing.wait_for_quiet_cpus(150.0, threads=2, others_use=lambda s: 0.1, cpus=2) is None  # quiet: no line


def test_a_load_that_lasts_is_measured_with_and_the_wait_is_bounded():
    for budget, limit in ((150.0, 15.0), (1e9, sizing.WAIT_MAX_S)):
        others = OtherProcesses(busy_for=1e12)
        note = sizing.wait_for_quiet_cpus(budget, threads=2, others_use=others, cpus=2)
        assert limit <= others.now <= limit + 1.0
        assert note.startswith("other processes use 1.0 of this machine's 2 CPUs, and still did after ")


def test_others_using_cpus_this_run_leaves_free_are_not_waited_for():
    others = OtherProcesses(busy_for=1e12, cpus=1.0)  # one CPU's work, beside a one-thread run on two
    assert sizing.wait_for_quiet_cpus(150.0, threads=1, others_use=others, cpus=2) is None and others.now < 1.0
    assert sizing.wait_until_quiet(lambda s: None, 100.0, 0.5) == (0.0, None)  # a system that does not say


def test_the_system_reports_a_busy_process_beside_this_one():
    """runtime.others_cpu_use on this machine: a process spinning beside the test is seen (Linux only)."""
    if runtime.others_cpu_use(0.01) is None:
        pytest.skip("the system does not report CPU time (/proc/stat)")
    spinner = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 5: pass"])
    try:
        time.sleep(0.3)  # it has started
        assert runtime.others_cpu_use(0.5) >= 0.5
    finally:
        spinner.kill()
        spinner.wait()


def test_measuring_again_stays_within_the_rungs_share_of_the_budget():
    clock = [0.0]

    def step_of(durations):
        it = iter(durations)

        def step():
            clock[0] += next(it)
        return step
    busy = [9.0, 0.1, 1.0, 1.0] + [0.1] * 10  # untimed, then timed: varies, so more are timed while they fit
    timed = sizing.time_steps(step_of(busy), lambda: clock[0], limit_s=2.25)
    assert len(timed) == 4 and sum(timed) <= 2.25  # 2.1 s, then one more of 0.1 s fits, and no other
    assert len(sizing.time_steps(step_of(busy), lambda: clock[0], limit_s=100)) == sizing.PROBE_MAX_STEPS
    assert len(sizing.time_steps(step_of([1.0] * 10), lambda: clock[0], limit_s=100)) == sizing.PROBE_STEPS  # calm


def test_start_up_says_the_machine_looked_busy_and_keeps_the_probes_speed(tmp_path, corpus, monkeypatch):
    machine, probe = FakeMachine(slow={1}), sizing.Probe
    monkeypatch.setattr(sizing, "Probe", lambda *a, **kw: probe(*a, **kw, clock=machine.clock,
                                                                make_step=machine.make_step,
                                                                others_use=lambda seconds: 0.0))
    run = start_run(dict(data=str(corpus), out_dir="run", max_time=150, threads=1, dtype="float32"), log=quiet)
    try:
        lines = start_lines(run)
        busy = [ln for ln in lines if ln.startswith("note: the machine looks busy")]
        assert len(busy) == 1 and busy[0] in brief_lines(run, lines)  # shown without --verbose too
        auto = next(ln for ln in lines if ln.startswith("auto: "))
        assert f"{run.budget.step_s * 1e3:.0f} ms a step measured" in auto  # the fastest step, not the busy one
        assert run.budget.pace is not None and run.budget.pace.step_s == run.budget.step_s
    finally:
        run.release()


def test_the_next_run_of_the_same_command_is_given_the_last_ones_choice(tmp_path, corpus, monkeypatch):
    machine, probe, plan_run, seen = FakeMachine(), sizing.Probe, sizing.plan_run, []
    monkeypatch.setattr(sizing, "Probe", lambda *a, **kw: probe(*a, **kw, clock=machine.clock,
                                                                make_step=machine.make_step,
                                                                others_use=lambda seconds: 0.0))
    monkeypatch.setattr(sizing, "plan_run", lambda *a: seen.append(a[-1]) or plan_run(*a))
    picked = []
    for out, budget in (("a", 150), ("b", 150.0), ("c", 300)):  # 150 and 150.0: the same command
        run = start_run(dict(data=str(corpus), out_dir=str(tmp_path / out), max_time=budget, threads=1,
                             dtype="float32"), log=quiet)
        run.release()
        picked.append((sizing.Rung(run.mcfg.n_layer, run.mcfg.n_embd), run.mcfg.dropout))
    first = picked[0]
    assert seen == [None, first, None]  # the same command is given the last choice; another budget is not


# --- the speed the run gets ------------------------------------------------------------------------------------
def test_a_speed_far_from_the_probes_is_said_with_the_steps_now_expected():
    lines = pace_lines(0.96, 0.32, step=20, left_s=130.0, max_iters=UNLIMITED, budget_s=150.0)
    assert len(lines) == 1 and "960 ms a step, 3.0x slower than the 320 ms the probe measured" in lines[0]
    assert f"expect about {20 + 130 / 0.96:,.0f} steps in this budget, not {150 / 0.32:,.0f}" in lines[0]
    assert "faster" in pace_lines(0.1, 0.32, 20, 130.0, UNLIMITED, 150.0)[0]
    assert pace_lines(0.5, 0.32, 20, 130.0, UNLIMITED, 150.0) == []  # within a factor of 2: as planned
    late = pace_lines(1.0, None, 20, 50.0, UNLIMITED, 150.0, warmup=100)  # no probe; a warm-up of 100 steps
    assert len(late) == 1 and late[0].startswith("warning: at this speed the run takes about 70 steps")


def test_the_speed_is_judged_once_after_a_share_of_the_budget(monkeypatch):
    now, said = [0.0], []
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    pace = Pace(100.0, said.append, step_s=0.1)
    p = Progress(step=0, elapsed=0.0, max_iters=UNLIMITED, chars_per_step=1, show=False, pace=pace)
    p.first_step(0.3)
    for step in range(1, 40):
        now[0] += 0.3  # 0.3 s a step: 3x the probe's
        p.step(step, torch.tensor(1.0), 1e-3, now[0], None, left_s=100.0 - now[0])
        if step <= 17:  # 5 s (5% of the budget) after the first step needs 17 steps of 0.3 s
            assert said == []
    assert len(said) == 1 and "300 ms a step, 3.0x slower than the 100 ms" in said[0]


# --- evaluation's share --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("budget_s", [30.0, 150.0, 600.0])
@pytest.mark.parametrize("first_s", [0.01, 0.5, 4.5, 20.0])
@pytest.mark.parametrize("iters,min_iters", [(20, 4), (50, 4), (10, 128)])
def test_evaluation_is_fitted_to_a_tenth_of_the_budget(budget_s, first_s, iters, min_iters):
    evals, n = fit_evaluations(budget_s, first_s, iters, min_iters)
    floor = min(min_iters, iters)
    assert 1 <= evals <= EVALS_PER_BUDGET and 1 <= n <= iters
    projected = first_s + evals * n * first_s / iters
    share = EVAL_SHARE * budget_s
    # within the share; or, where the first alone passed it, one more on one batch (the last evaluation)
    assert projected <= share + 1e-9 or (first_s > share and (evals, n) == (1, 1))
    if first_s + MIN_EVALS * floor * first_s / iters <= share:  # the floors fit: they hold
        assert evals >= MIN_EVALS and n >= floor
    if first_s * (1 + EVALS_PER_BUDGET) <= share:
        assert (evals, n) == (EVALS_PER_BUDGET, iters)  # cheap enough: the preset's cadence, untouched
    kept = fit_evaluations(budget_s, first_s, iters, min_iters, fit_iters=False)
    assert kept[1] == iters and kept[0] >= 1  # batches chosen by the user: only fewer evaluations


def test_the_first_evaluation_is_cut_to_its_part_of_the_share_by_timing_one_batch_first():
    """A 20 s budget at a 3,345-character alphabet: 50 batches a split took 27 s. One batch a split is timed first
    (here 0.27 s), and the first evaluation takes what one of MIN_EVALS + 1 evaluations may: 2 s / 7 (1 batch)."""
    cfg = TrainConfig(max_time=20.0, eval_iters=50)
    validator = Validator(cfg, RunState(), 1.0, None, None, None, "cpu", None, SimpleNamespace(enabled=False))
    fit = EvalFit(20.0, 16 * 128, lambda m: None)
    asked = []
    assert fit.first_iters(validator, lambda iters: asked.append(iters) or 0.27) == 1 and asked == [1]
    assert EvalFit(600.0, 2048, None).first_iters(validator, lambda iters: 0.27) == 31  # 60 s / 7 / 0.27
    assert EvalFit(600.0, 2048, None, fit_iters=False).first_iters(validator, None) == 50  # chosen: as given


def test_the_measured_case_goes_from_most_of_the_budget_to_about_a_tenth():
    """20 batches a split took 4.5 s at a 5,378-character alphabet: 21 of them were 63% of 150 s."""
    said = []
    cfg = TrainConfig(max_time=150.0, eval_iters=20)
    validator = Validator(cfg, RunState(), 7.5, None, None, None, "cpu", None, SimpleNamespace(enabled=False))
    EvalFit(150.0, 16 * 128, said.append).refit(4.5, validator)
    evals, iters = round(150.0 / validator.period), validator.iters
    assert MIN_EVALS <= evals < EVALS_PER_BUDGET and 4 <= iters < 20 and validator.state.eval_iters == iters
    assert cfg.eval_iters == 20  # the setting stays as it was; what the budget fitted is the run's state
    assert 4.5 * (1 + evals * iters / 20) <= EVAL_SHARE * 150.0 + 1e-9
    assert len(said) == 1 and said[0].startswith("evaluation: the first took 4.5 s on 20 batches a split; 20 more "
                                                 "would be 63% of the budget")


def test_a_costly_first_evaluation_makes_a_real_run_evaluate_less(tmp_path, corpus):
    """A fake clock says the first evaluation took half the budget: the run evaluates at its floor from then on,
    and says so; its warm-up is a share of the budget, saved with its state."""
    said = []
    run = start_run(dict(data=str(corpus), out_dir="run", max_time=1.0, **TINY),
                    log=said.append)
    run.budget.eval_fit.clock = iter([0.0, 0.25]).__next__  # --eval-iters given (TINY): timed as it is
    assert run.state.warmup_s == WARMUP_SHARE * 1.0
    assert any(ln.startswith("warmup: over the first 0.05 s of training") for ln in start_lines(run))
    Trainer(run).train()
    assert any(ln.startswith("evaluation: the first took 0.2 s on 2 batches a split") and "so 1 more" in ln
               for ln in said), said
    evals = [json.loads(ln) for ln in (tmp_path / "run" / rundir.METRICS).read_text().splitlines()]
    assert len(evals) <= 3  # the first, one fitted and the last (not 21)
    meta = ckpt.read_meta(tmp_path / "run" / rundir.STATE)[0]
    assert meta["run_state"]["warmup_s"] == WARMUP_SHARE * 1.0  # the schedule reads saved state on --resume


# --- warm-up and decay ---------------------------------------------------------------------------------------------
def test_a_time_budgets_warmup_is_a_share_of_it_by_time_or_steps_whichever_ends_first():
    cfg = TrainConfig(learning_rate=4e-3, min_lr=4e-4, warmup_iters=100, max_iters=UNLIMITED, max_time=150.0,
                      lr_schedule="wsd")
    shared = RunState(warmup_s=WARMUP_SHARE * 150.0)  # 7.5 s
    assert lr_at(0, 0.0, cfg, shared) == pytest.approx(4e-3 / 101)  # the first step: by steps, as before
    assert lr_at(3, 3.75, cfg, shared) == pytest.approx(2e-3)  # a slow machine: half the time, half the peak
    assert lr_at(20, 7.5, cfg, shared) == pytest.approx(4e-3)  # warm by 5% of the time, 20 steps in
    assert lr_at(140, 149.0, cfg, shared) < 1e-3  # and decays within the budget
    fixed = RunState()  # --warmup-iters given: by steps alone, however long they take
    assert lr_at(20, 7.5, cfg, fixed) == pytest.approx(4e-3 * 21 / 101)
    capped = TrainConfig(warmup_iters=100, max_iters=200, max_time=150.0)
    assert warmup_steps(capped, shared) == 10 and warmup_steps(capped, fixed) == 100  # 5% of a step cap


def test_only_a_time_budget_whose_warmup_nobody_chose_warms_up_over_a_share(corpus):
    def warmup_of(**kw):
        run = start_run(dict(data=str(corpus), **TINY, **kw), log=quiet)
        run.release()
        return run.state.warmup_s, run.cfg.warmup_iters
    assert warmup_of(out_dir="a", max_time=60) == (WARMUP_SHARE * 60, 100)
    assert warmup_of(out_dir="b", max_time=60, warmup_iters=100) == (None, 100)  # given: kept, by steps
    assert warmup_of(out_dir="c", max_iters=50)[0] is None  # a step budget: --warmup-iters, as before


def test_a_decay_the_budget_cannot_reach_is_warned_of_at_start(corpus):
    slow = TrainConfig(warmup_iters=100, max_iters=UNLIMITED, max_time=150.0)
    assert "outlasts the budget: about 40 steps fit in 150 s" in decay_warning(slow, RunState(), expected_steps=40)
    assert decay_warning(slow, RunState(warmup_s=7.5), expected_steps=40) is None  # a share always ends
    assert decay_warning(slow, RunState(), expected_steps=400) is None
    assert "does not end before the budget" in decay_warning(TrainConfig(warmup_iters=100, max_iters=50), RunState())
    assert "never reaches its floor" in decay_warning(TrainConfig(max_iters=500, lr_decay_iters=1000), RunState())
    both = TrainConfig(max_iters=500, lr_decay_iters=1000, max_time=150.0)  # whichever ends first
    assert decay_warning(both, RunState()) is None and decay_warning(both, RunState(), expected_steps=300) is None
    assert "never reaches its floor" in decay_warning(both, RunState(), expected_steps=900)  # the steps end it
    run = start_run(dict(data=str(corpus), out_dir="run", **TINY, warmup_iters=10, max_iters=5),
                    log=quiet)
    run.release()
    warned = [ln for ln in start_lines(run) if "never decays" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: ") and warned[0] in brief_lines(run)


# --- overfitting ---------------------------------------------------------------------------------------------------
RISING = [(0, 5.9, 5.5), (100, 5.1, 5.2), (200, 4.8, 5.017), (300, 4.6, 5.05), (400, 4.4, 5.1), (500, 4.2, 5.15),
          (600, 4.0, 5.201), (700, 3.8, 5.3), (800, 3.6, 5.4)]


def test_overfitting_is_said_once_when_validation_has_risen_for_a_while():
    said = []
    watch = OverfitWatch(said.append, patience=0)
    for step, train, val in RISING:
        watch.write("train", {"step": step, "train_loss": train})  # only evaluations count
        watch.write("eval", {"step": step, "train_loss": train, "val_loss": val})
        if step == 500:
            assert said == []  # 5.05 is within 1% of the best: two evaluations above it are not yet a trend
    assert said == ["warning: validation loss has risen from 5.017 at step 200 to 5.201 at step 600 while training "
                    "loss fell (4.800 to 4.000): the model is overfitting; the best checkpoint (step 200) is what "
                    f"sample.py uses; {param('patience')} N stops such runs early"]
    resumed = []  # a later session of the same run: already said
    OverfitWatch(resumed.append, history=RISING).write("eval", {"step": 900, "train_loss": 3.4, "val_loss": 5.5})
    assert resumed == []


def test_noise_and_divergence_are_not_overfitting():
    spike = RISING[:3] + [(300, 4.6, 5.3), (400, 4.4, 5.0), (500, 4.2, 5.3), (600, 4.0, 5.3)]
    assert overfitting(spike) is None  # a new best between the rises
    diverging = [(s, 4.0 + i * 0.1, v) for i, (s, _, v) in enumerate(RISING)]
    assert overfitting(diverging) is None  # training loss rose too: not overfitting
    assert overfitting(RISING[:2 + RISEN_EVALS]) is None  # too young a best
    assert f"{param('patience', 5)} stops this run after 5 evaluations" in overfitting(RISING, patience=5)


def test_a_tiny_run_that_memorises_its_text_is_told_it_is_overfitting(tmp_path):
    """The training text cycles 'abc'; the validation text (its tail) cycles the other way, 'acb': the surer the
    model gets of the training text, the worse it predicts the other (here from about step 50)."""
    (tmp_path / "abc.txt").write_text("abc" * 600 + "acb" * 66, encoding="utf-8")
    said = []
    chargpt.train(data="abc.txt", out_dir="run", val_split="tail", max_iters=100, eval_interval=10,
                  learning_rate=1e-2, log=said.append, **TINY_RUN_KW)
    warned = [ln for ln in said if "the model is overfitting" in ln]
    assert len(warned) == 1 and warned[0].startswith("warning: validation loss has risen from ")


def test_the_batches_a_budget_fitted_are_the_runs_until_eval_iters_is_chosen(tmp_path):
    """What the first evaluation fitted is kept in the run's state (a --resume compares its losses on as many
    batches), not written over the setting: --eval-iters given on the resume replaces it."""
    from chargpt.training.state import resumed_state
    cfg = TrainConfig(max_iters=100, eval_iters=20)
    meta = {"run_state": {"step": 10, "eval_iters": 7}, "train_config": cfg}
    assert resumed_state(meta, cfg, {}, tmp_path)[0].eval_iters == 7
    assert resumed_state(meta, cfg, {"eval_iters": 20}, tmp_path)[0].eval_iters is None
    validator = Validator(cfg, RunState(eval_iters=7), None, None, None, None, "cpu", None, None)
    assert validator.iters == 7 and Validator(cfg, RunState(), None, None, None, None, "cpu", None, None).iters == 20


# --- --max-time is wall time ---------------------------------------------------------------------------------------
def test_training_gets_what_start_up_and_the_end_leave_of_the_wall_budget_and_at_least_half():
    from chargpt.training.schedules import MIN_TRAINING_SHARE, training_seconds
    cfg = TrainConfig(max_time=100.0)
    assert training_seconds(cfg, RunState(overhead_s=20.0)) == 80.0
    assert training_seconds(cfg, RunState(overhead_s=70.0)) == MIN_TRAINING_SHARE * 100.0
    assert finished(cfg, RunState(elapsed=80.0, overhead_s=20.0)) == "max_time"
    assert finished(cfg, RunState(elapsed=79.0, overhead_s=20.0)) is None


def test_a_session_that_begins_its_budget_counts_its_start_up_and_its_end():
    import time

    from chargpt.training.budget import Overhead
    dist = SimpleNamespace(enabled=False)
    fresh = RunState()
    Overhead(fresh, time.perf_counter() - 3.0, end_s=1.5, dist=dist).update(2.0)  # 3 s of start-up, 2 s a save
    assert 6.5 <= fresh.overhead_s < 6.5 + 1.0
    going_on = RunState(elapsed=50.0, budget_elapsed=10.0, overhead_s=4.0)  # --resume within the same budget
    Overhead(going_on, time.perf_counter() - 3.0, end_s=1.5, dist=dist).update(2.0)
    assert going_on.overhead_s == 4.0  # its first session's, as saved


def test_a_new_budget_on_resume_forgets_the_last_ones_overhead(tmp_path, corpus):
    from chargpt.training.state import resumed_state
    saved = {"run_state": {"step": 10, "elapsed": 40.0, "overhead_s": 9.0}, "train_config": TrainConfig(max_time=50.0)}
    s, notes = resumed_state(saved, TrainConfig(max_time=100.0), {"max_time": 100.0}, tmp_path)
    assert s.overhead_s == 0.0 and notes
