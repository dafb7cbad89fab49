"""--resume: which budget applies, what the learning rate does, and what may change (hardware, dropout) and
what may not. Exact continuation itself (bit for bit) is in test_faults.py."""

import json
import math
import re

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_FLAGS

import chargpt
from chargpt.cli import train_cli
from chargpt.runs.checkpoint import read_meta
from chargpt.runs.rundir import METRICS, STATE
from chargpt.runtime import pick_dtype
from chargpt.training.describe import start_lines
from chargpt.training.trainer import Trainer, start_run

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32")
SCHEDULE = dict(learning_rate=1e-2, min_lr=1e-3, warmup_iters=0, eval_interval=2, lr_schedule="cosine")


def train(logs=None, **kw):
    return chargpt.train(log=logs.append if logs is not None else lambda msg: None,
                         **{"data": "corpus.txt", **TINY_KW, **kw})


def lrs(run):
    """step -> learning rate, from the run's metrics (the rate each evaluation's step trains with)."""
    lines = (run / METRICS).read_text(encoding="utf-8").splitlines()
    return {m["step"]: m["lr"] for m in map(json.loads, lines)}


def test_a_time_bounded_run_can_be_extended_by_steps_or_by_time(tmp_path, corpus):
    first = train(out_dir="run", max_time=0.5, eval_interval=5, warmup_iters=0)
    assert first["stopped_by"] == "max_time"
    step = first["step"]

    # --resume alone: the budget is spent; say so, and how to extend it (no silent 0-step "done")
    result = CliRunner().invoke(train_cli, ["--out-dir", "run", "--resume", *TINY_FLAGS])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert re.search(rf"error: --resume: the run in run is already finished at step {step:,} \(its budget: 0\.5 s "
                     rf"of training\); to train on, give a new budget: --max-iters N \(more than {step:,}\) or "
                     rf"--max-time SECONDS \(counted from now\)", result.stderr), result.stderr

    logs = []  # a step budget replaces the time budget
    summary = train(logs, out_dir="run", resume=True, max_iters=step + 3)
    assert summary["step"] == step + 3 and summary["stopped_by"] == "max_iters"
    assert any(line.startswith(f"new budget: until step {step + 3:,};") for line in logs), logs

    logs = []  # a new time budget counts from now, not from the run's start
    summary = train(logs, out_dir="run", resume=True, max_time=0.5)
    assert summary["step"] > step + 3 and summary["stopped_by"] == "max_time"
    assert any(line.startswith("new budget: 0.5 s of training;") for line in logs), logs


def test_learning_rate_continues_exactly_when_the_budget_is_unchanged(tmp_path, corpus):
    train(out_dir="whole", max_iters=8, lr_decay_iters=8, **SCHEDULE)
    train(out_dir="split", max_iters=4, lr_decay_iters=8, **SCHEDULE)
    logs = []
    train(logs, out_dir="split", resume=True, max_iters=8, **SCHEDULE)  # the decay still ends at step 8
    assert lrs(tmp_path / "split") == lrs(tmp_path / "whole")
    assert "budget: until step 8" in logs


def test_a_new_budget_decays_from_the_rate_reached_instead_of_jumping(tmp_path, corpus):
    train(out_dir="run", max_iters=4, lr_decay_iters=8, **SCHEDULE)
    reached = lrs(tmp_path / "run")[4]  # half-way down the first decay
    logs = []
    train(logs, out_dir="run", resume=True, max_iters=12, lr_decay_iters=12, **SCHEDULE)
    got = lrs(tmp_path / "run")
    for step in (6, 8, 10, 12):  # a cosine from `reached` at step 4 down to min_lr at step 12
        want = 1e-3 + 0.5 * (1 + math.cos(math.pi * (step - 4) / 8)) * (reached - 1e-3)
        assert got[step] == pytest.approx(want), step
    assert f"new budget: until step 12; the learning rate decays from {reached:.2e} (the rate reached) to " \
           f"1.00e-03 over it" in logs


@pytest.mark.parametrize("extend", [dict(max_iters=8), dict(max_time=0.3)], ids=["max-iters", "max-time"])
def test_extending_a_finished_run_keeps_the_final_rate(tmp_path, corpus, extend):
    """A finished run ends at min_lr; more steps (or more time) go on from there, never back up the schedule."""
    train(out_dir="run", max_iters=4, **SCHEDULE)
    assert lrs(tmp_path / "run")[4] == pytest.approx(1e-3)
    summary = train(out_dir="run", resume=True, **{**SCHEDULE, **extend})
    after = {step: lr for step, lr in lrs(tmp_path / "run").items() if step > 4}
    assert summary["step"] > 4 and after
    assert all(lr == pytest.approx(1e-3) for lr in after.values()), after


@pytest.mark.dtype  # auto on resume: bf16 or float32 by the CPU's kind
def test_resume_takes_hardware_settings_from_the_command_and_says_what_changed(tmp_path, corpus):
    train(out_dir="run", max_iters=2, eval_interval=2)  # threads 1, float32
    logs = []
    threads = torch.get_num_threads()
    try:
        run = start_run({"out_dir": "run", "resume": True, "max_iters": 4, "threads": 2}, log=logs.append)
        assert (run.cfg.dtype, run.cfg.threads, run.cfg.compile) == ("auto", 2, "auto")  # not the checkpoint's
        logs += start_lines(run)
        Trainer(run).train()
    finally:
        torch.set_num_threads(threads)  # start_run set the run's; chargpt.train puts them back, this test by hand
    auto = str(pick_dtype("auto", torch.device("cpu"))[0]).removeprefix("torch.")
    changed = [line for line in logs if line.startswith("hardware as this command sets it: ")]
    assert len(changed) == 1 and "threads 2 (checkpoint: 1)" in changed[0]
    assert (f"dtype {auto} (checkpoint: float32)" in changed[0]) == (auto != "float32")
    assert read_meta(tmp_path / "run" / STATE)[0]["hardware"]["threads"] == 2


def test_a_run_trains_with_its_threads_and_gives_the_program_its_own_back(tmp_path, corpus):
    """--threads is the run's: chargpt.train in a program's own process (a notebook, a test) leaves torch's thread
    count as it found it, after a finished run and after a failed start alike."""
    torch.set_num_threads(1)
    train(out_dir="run", max_iters=2, eval_interval=2, threads=2)
    assert read_meta(tmp_path / "run" / STATE)[0]["hardware"]["threads"] == 2 and torch.get_num_threads() == 1
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(chargpt.ChargptError):
        train(data="empty.txt", out_dir="other", max_iters=2, threads=2)
    assert torch.get_num_threads() == 1


def test_dropout_may_change_on_resume_and_the_architecture_may_not(tmp_path, corpus):
    train(out_dir="run", max_iters=2, eval_interval=2)
    logs = []
    train(logs, out_dir="run", resume=True, max_iters=4, dropout=0.1)
    assert "dropout 0.1 (checkpoint: 0.0) from here on" in logs
    assert read_meta(tmp_path / "run" / STATE)[0]["model_config"].dropout == 0.1
    with pytest.raises(chargpt.ConfigError, match=r"--n-embd 32 \(checkpoint: 16\)"):
        train(out_dir="run", resume=True, max_iters=6, dropout=0.1, n_embd=32)
