"""Faults during training: Ctrl-C / SIGTERM, kill -9 at any moment (including mid-save), non-finite losses, and
exact resumption (N steps + resume + N steps == 2N steps, bit for bit)."""

import json
import math
import random
import re
import signal
import time
from dataclasses import replace

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_FLAGS, TINY_RUN_KW, start_training, wait_for_training
from safetensors.torch import load_file

import chargpt
from chargpt.cli import train_cli
from chargpt.errors import ChargptError
from chargpt.model.transformer import CharGPT
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir


def quiet_train(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_RUN_KW, **kw})


def mtime(path):
    return path.stat().st_mtime_ns if path.exists() else 0


def saved_since(run, before):
    """-> a condition: state.safetensors was rewritten after mtime `before`, and latest.safetensors exists."""
    return lambda: mtime(run / rundir.STATE) > before and (run / rundir.LATEST).exists()


def terminal_lines(text):
    """Lines a terminal would show: progress-bar updates overwritten with \\r removed."""
    return [line for line in re.sub(r"[^\n]*\r", "", text).splitlines() if line.strip()]


def metric_lines(run):
    return [json.loads(line) for line in (run / rundir.METRICS).read_text().splitlines()]


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_signal_saves_and_exits_with_conventional_status(tmp_path, corpus, sig, status):
    run = tmp_path / "run"
    proc = start_training(tmp_path, "--eval-interval", "5")
    wait_for_training(lambda: (run / rundir.METRICS).exists() and (run / rundir.METRICS).read_text().count("\n") >= 2,
                      proc, tmp_path)  # evaluated at steps 0 and 5
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == status
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "Traceback" not in stderr
    message = terminal_lines(stderr)[-1]
    match = re.fullmatch(r"interrupted at step (\d+); saved the run to run\. Resume with: python train\.py "
                         r"--out-dir run --resume", message)
    assert match, message
    step = int(match.group(1))
    assert step >= 5 and ckpt.read_meta(run / rundir.STATE)[0]["step"] == step
    assert ckpt.load_model(run / rundir.LATEST)[2]["step"] == step
    summary = quiet_train(out_dir="run", resume=True, max_iters=step + 2)
    assert summary["step"] == step + 2


def test_kill_9_at_random_moments_never_loses_the_run(tmp_path, corpus):
    """Kill a real training process (saving at every step) at random moments and while a file is being written;
    each time the latest checkpoint loads and --resume carries on."""
    run, rng = tmp_path / "run", random.Random(4)
    moments = ["mid-save", rng.uniform(0.0, 0.4), "mid-save", rng.uniform(0.0, 0.4)]
    steps = []
    for i, moment in enumerate(moments):
        state_before = mtime(run / rundir.STATE)
        proc = start_training(tmp_path, "--eval-interval", "1", *(["--resume"] if i else []))
        # it (re)started and saved; the first run also wrote its first latest.safetensors
        wait_for_training(saved_since(run, state_before), proc, tmp_path)
        if moment == "mid-save":  # the moment a temporary checkpoint file appears: the write is under way
            wait_for_training(lambda: any(".tmp" in p.name for p in run.iterdir()), proc, tmp_path, poll=0)
        else:
            time.sleep(moment)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        model, vocab, meta = ckpt.load_model(run / rundir.LATEST)
        state_meta, _ = ckpt.read_meta(run / rundir.STATE)
        # state is written first, then latest: latest is never ahead, and each kill between the two writes can
        # leave it one save behind (a resumed run saves latest again only at its next evaluation)
        assert len(vocab) == model.config.vocab_size and 0 <= state_meta["step"] - meta["step"] <= i + 1
        steps.append(state_meta["step"])
    assert steps == sorted(steps) and steps[-1] > 0

    final = steps[-1] + 3
    summary = quiet_train(out_dir="run", resume=True, max_iters=final)
    assert summary["step"] == final
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]  # what the kills left behind is cleaned up
    logged = [m["step"] for m in metric_lines(run)]
    assert logged == list(range(final + 1))  # every step evaluated once: nothing lost, nothing doubled


def test_nonfinite_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(tmp_path, corpus):
    result = CliRunner().invoke(train_cli, ["--data", "corpus.txt", "--out-dir", "run", *TINY_FLAGS, "--max-iters",
                                            "200", "--eval-interval", "2", "--learning-rate", "1e6", "--warmup-iters",
                                            "0"])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    message = terminal_lines(result.stderr)[-1]
    match = re.search(r"^error: (?:evaluation )?loss became (nan|inf) at step (\d+) \(learning rate 1\.00e\+06\): "
                      r"training diverged, most likely because the learning rate is too high; lower "
                      r"--learning-rate.*last good checkpoint in run is kept", message)
    assert match, message
    model, _, meta = ckpt.load_model("run")
    assert meta["step"] <= int(match.group(2)) and meta["val_loss"] is not None
    assert all(torch.isfinite(p).all() for p in model.parameters())
    state = load_file("run/" + rundir.STATE)
    assert all(torch.isfinite(t).all() for k, t in state.items() if k.startswith(("model.", "optim.")))


def test_skip_nonfinite_skips_bad_steps(tmp_path, corpus, monkeypatch):
    forward, calls = CharGPT.forward, []

    def flaky(self, idx, targets=None, cache=None, **kw):
        logits, loss = forward(self, idx, targets, cache, **kw)
        if self.training:
            calls.append(1)
            if len(calls) == 3:  # the third training step
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(CharGPT, "forward", flaky)
    with pytest.raises(ChargptError, match=r"loss became nan at step 2 .*--skip-nonfinite"):
        quiet_train(out_dir="stop", max_iters=6, eval_interval=2)
    calls.clear()
    logs = []
    summary = chargpt.train(log=logs.append, data="corpus.txt", out_dir="skip", max_iters=6, eval_interval=2,
                            skip_nonfinite=True, **TINY_RUN_KW)
    assert summary["step"] == 6
    assert "step 2: non-finite loss, step skipped (1 so far)" in logs
    meta, _ = ckpt.read_meta("skip/" + rundir.STATE)
    assert meta["run_state"]["skipped"] == 1
    assert all(torch.isfinite(t).all() for t in load_file("skip/" + rundir.STATE).values() if t.is_floating_point())


def test_exact_resume(tmp_path, corpus):
    """N steps, then resume for N more == 2N steps in one go: weights, optimizer moments, random streams and
    every metrics line (but the wall-clock) identical. Dropout and gradient accumulation are on, so the random
    streams and the data order both matter."""
    n = 6
    kw = dict(eval_interval=3, lr_decay_iters=2 * n, warmup_iters=2, dropout=0.1, grad_accum=2)
    quiet_train(out_dir="whole", max_iters=2 * n, **kw)
    quiet_train(out_dir="split", max_iters=n, **kw)
    quiet_train(out_dir="split", resume=True, max_iters=2 * n, **kw)

    whole, split = load_file("whole/" + rundir.STATE), load_file("split/" + rundir.STATE)
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.equal(whole[name], split[name]), name
    latest = rundir.LATEST
    assert torch.equal(load_file("whole/" + latest)["wte.weight"], load_file("split/" + latest)["wte.weight"])

    def lines(run):
        return [{k: v for k, v in m.items() if k != "elapsed_s"} for m in metric_lines(tmp_path / run)]

    assert [m["step"] for m in lines("whole")] == [0, 3, 6, 9, 12]
    assert lines("whole") == lines("split")


def test_weights_that_evaluate_to_nan_are_never_saved(tmp_path, corpus, monkeypatch):
    """If the model breaks between evaluations (finite training loss, non-finite evaluation), the broken weights
    must not overwrite the last good checkpoint."""
    from chargpt.training import validate
    estimate, calls = validate.estimate_loss, []

    def breaks_at_second_eval(*args, **kwargs):
        calls.append(1)
        losses = estimate(*args, **kwargs)
        return {k: float("nan") for k in losses} if len(calls) == 2 else losses

    monkeypatch.setattr(validate, "estimate_loss", breaks_at_second_eval)
    with pytest.raises(ChargptError, match=r"evaluation loss became nan at step 2 .*last good checkpoint in run is "
                                           r"kept"):
        quiet_train(out_dir="run", max_iters=6, eval_interval=2)
    assert ckpt.read_meta("run/" + rundir.STATE)[0]["step"] == ckpt.load_model("run")[2]["step"] == 0
    assert [m["step"] for m in metric_lines(tmp_path / "run")] == [0]


def test_gpu_style_periodic_check_names_the_first_nonfinite_step(tmp_path, corpus, monkeypatch):
    """On a GPU the host reads the stop flags only every 10 steps (each read is a sync). The first non-finite loss
    is remembered on the device in between, so the error still names its step, not the step of the check."""
    from chargpt.training.trainer import Trainer, start_run
    forward, calls = CharGPT.forward, []

    def nan_from_step_3(self, idx, targets=None, cache=None, **kw):
        logits, loss = forward(self, idx, targets, cache, **kw)
        if self.training:
            calls.append(1)
            if len(calls) >= 4:  # the fourth training step (step 3) and after
                loss = loss * float("nan")
        return logits, loss

    monkeypatch.setattr(CharGPT, "forward", nan_from_step_3)
    run = start_run({"data": "corpus.txt", "out_dir": "run", **TINY_RUN_KW, "max_iters": 30,
                     "eval_interval": 100, "learning_rate": 1e-2, "lr_schedule": "cosine"}, log=lambda msg: None)
    run = replace(run, wrapped=replace(run.wrapped, sync_every=10))  # what a GPU does; the CPU default: every step
    trainer = Trainer(run)
    lr_3 = 1e-3 + 0.5 * (1 + math.cos(math.pi * 3 / 30)) * 9e-3  # the rate of step 3 (step 10's is 7.75e-03)
    with pytest.raises(ChargptError, match=rf"^loss became nan at step 3 \(learning rate {lr_3:.2e}\)"):
        trainer.train()
    assert len(calls) == 11  # it ran on to the check after step 10, as a GPU does, and no further
    assert ckpt.read_meta("run/" + rundir.STATE)[0]["step"] == 0  # nothing saved from the broken steps
