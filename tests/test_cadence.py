"""How often a run evaluates and logs: a time budget gets evaluations spread over it (a real validation curve
for a short run), the running training loss is logged every few steps (a dense training curve)."""

import itertools
import json
import time

import torch

import chargpt
from chargpt.components.progress import RunningLoss
from chargpt.components.validate import EVALS_PER_BUDGET, eval_period, time_to_evaluate
from chargpt.config import TrainConfig
from chargpt.rundir import LOSSES, METRICS

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", curves=False, verbose=True)


def test_a_time_budget_evaluates_every_twentieth_of_it_unless_an_interval_was_chosen():
    cfg = TrainConfig(max_time=180.0, eval_interval=250)
    assert EVALS_PER_BUDGET == 20
    assert eval_period(cfg, None) == eval_period(cfg, "preset cpu") == 9.0  # the default or a preset's interval
    assert eval_period(cfg, "flags") is None and eval_period(cfg, "run.toml") is None  # chosen: steps alone
    assert eval_period(TrainConfig(max_iters=300), None) is None  # a step budget: its interval
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
