"""How often a run evaluates and logs: a time budget gets evaluations spread over it (a real validation curve
for a short run), the running training loss is logged every few steps (a dense training curve)."""

import itertools
import json
import time
from types import SimpleNamespace

import torch

import chargpt
from chargpt.config import TrainConfig
from chargpt.runs.rundir import LOSSES, METRICS
from chargpt.training.budget import EVAL_SHARE, EvalFit
from chargpt.training.progress import RunningLoss
from chargpt.training.state import RunState
from chargpt.training.validate import (
    EVALS_PER_BUDGET,
    PASSES_PER_EVAL,
    Validator,
    eval_period,
    pass_steps,
    time_to_evaluate,
)

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", curves=False, verbose=True)


def test_a_time_budget_evaluates_every_twentieth_of_it_unless_an_interval_was_chosen():
    cfg = TrainConfig(max_time=180.0, eval_interval=250)
    assert EVALS_PER_BUDGET == 20
    assert eval_period(cfg) == 9.0  # the default or a preset's interval: by the clock
    assert eval_period(cfg, interval_chosen=True) is None  # chosen (a flag, a config file): steps alone
    assert eval_period(TrainConfig(max_iters=300)) is None  # a step budget: its interval
    assert not time_to_evaluate(8.9, 0.0, 9.0) and time_to_evaluate(9.0, 0.0, 9.0)
    assert not time_to_evaluate(10**6, 0.0, None)


def test_the_running_loss_is_the_mean_since_the_last_read():
    running = RunningLoss()
    for v in (1.0, 2.0, 3.0):
        running.add(torch.tensor(v))
    assert running.read() == 2.0 and running.read() is None
    running.add(torch.tensor(float("nan")))
    assert running.read() is None  # never written as a number


def test_a_short_time_budget_gets_a_validation_curve_and_a_dense_training_curve(tmp_path, corpus, monkeypatch):
    clock = itertools.count()
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock) * 1e-3)  # 1 ms a reading: the same on any CPU
    logs = []
    # the cpu preset's interval (250 steps) alone would give two evaluations: the start and the end
    chargpt.train(data=str(corpus), out_dir="run", max_time=1.5, log=logs.append, **TINY_KW)
    assert any("evaluating every 0.075 s of training (1/20 of --max-time)" in line for line in logs)
    evals = [json.loads(ln) for ln in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert len(evals) >= EVALS_PER_BUDGET - 1 and evals[1]["step"] < 250
    gaps = [b["elapsed_s"] - a["elapsed_s"] for a, b in zip(evals, evals[1:-1])]
    assert min(gaps) >= 0.05 - 1e-9  # spread over the budget (the 250-step interval may fall between two)
    running = [json.loads(ln) for ln in (tmp_path / "run" / LOSSES).read_text().splitlines()]
    steps = [r["step"] for r in running]
    assert steps == list(range(1, evals[-1]["step"] + 1, 10))  # every 10 steps, to the end
    assert all(r["train_loss"] > 0 for r in running)


def test_a_resumed_run_drops_running_losses_past_its_state(tmp_path, corpus):
    chargpt.train(data=str(corpus), out_dir="run", max_iters=30, eval_interval=10, log=lambda m: None, **TINY_KW)
    path = tmp_path / "run" / LOSSES
    with open(path, "a") as f:  # as a run killed after its last save would have left
        f.write(json.dumps({"step": 41, "train_loss": 9.0}) + "\n")
    chargpt.train(data=str(corpus), out_dir="run", resume=True, max_iters=40, log=lambda m: None, **TINY_KW)
    rows = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 11, 21, 31] and rows[-1]["train_loss"] != 9.0


def test_a_time_budget_that_a_step_cap_ends_first_evaluates_and_saves_along_the_steps(tmp_path, corpus):
    """--max-time 1e9 capped at 40 steps (as --preset auto caps a small corpus): evaluations every 2 steps, not
    every 5e7 s, so the run saves, and --patience can act, before the cap."""
    logs = []
    chargpt.train(data=str(corpus), out_dir="run", max_time=1e9, max_iters=40, log=logs.append, **TINY_KW)
    assert any(line.startswith("evaluating every 2 steps or ") for line in logs)
    evals = [json.loads(ln) for ln in (tmp_path / "run" / METRICS).read_text().splitlines()]
    assert [e["step"] for e in evals] == list(range(0, 41, 2))


def test_a_small_text_is_evaluated_every_few_passes_as_often_as_a_tenth_of_the_budget_allows():
    """600 s on 18,000 training characters at 2,048 a step: a twentieth of the budget (30 s) is about 100 passes,
    enough to memorise the text between two evaluations. So also every PASSES_PER_EVAL passes, no closer than
    keeps evaluation within its share."""
    assert PASSES_PER_EVAL == 10
    assert pass_steps(30.0, 18_000, 2048) == 88  # ceil(10 * 18,000 / 2,048)
    assert pass_steps(None, 18_000, 2048) is None  # a step budget: --eval-interval decides
    cfg = TrainConfig(max_time=600.0, eval_iters=20)
    validator = Validator(cfg, RunState(), 30.0, None, None, None, "cpu", None, SimpleNamespace(enabled=False),
                          passes=88)
    EvalFit(600.0, 2048, lambda m: None).refit(0.2, validator)  # cheap: twenty by the clock stay
    assert validator.period == 30.0 and abs(validator.min_gap - 0.2 * (1 - EVAL_SHARE) / EVAL_SHARE) < 1e-9
    assert validator.due(0, 0.0)
    validator.evaluated(0, 0.2)
    assert not validator.due(87, 3.0)  # not yet 10 passes
    assert not validator.due(88, 1.9)  # 10 passes, but sooner than a tenth of the budget allows
    assert validator.due(88, 2.1) and validator.due(50, 30.5)  # the gap allows; or the clock's period passed
    validator.evaluated(88, 2.0)
    assert not validator.due(100, 10.0) and validator.due(100, 32.0)  # the clock still decides as before


def test_the_start_says_a_small_text_is_evaluated_by_its_passes_and_a_large_one_by_the_clock(tmp_path, corpus):
    big = tmp_path / "big.txt"
    big.write_text(corpus.read_text(encoding="utf-8") * 10, encoding="utf-8")  # 53,000: 10 passes > 30 s of steps
    said = {}
    for name, path in (("small", corpus), ("big", big)):
        logs = said[name] = []
        chargpt.train(data=str(path), out_dir=name, max_time=600.0, max_iters=2, log=logs.append, **TINY_KW)
    line = f"after {PASSES_PER_EVAL} passes over the training text"
    assert any(ln.startswith("evaluating every") and line in ln for ln in said["small"])
    assert any(ln.startswith("evaluating every") for ln in said["big"]) and not any(line in ln for ln in said["big"])
