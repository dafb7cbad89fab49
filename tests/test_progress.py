"""Progress: the speed and time left it shows leave out evaluations, saves and samples; the running loss is
recorded every LOG_EVERY steps, and never as a number when it was not one."""

import time

import torch

from chargpt.training import progress
from chargpt.training.progress import LOG_EVERY, Progress


def test_speed_and_time_left_leave_out_the_pauses(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    p = Progress(step=0, elapsed=0.0, max_iters=101, chars_per_step=100, show=False)
    assert p.step(1, torch.tensor(2.0), 1e-3, 0.0, None) is not None  # the first step starts the window
    for step in range(2, LOG_EVERY + 2):
        now[0] += 0.1  # 0.1 s a step
        if step == 5:
            now[0] += 50.0
            p.pause(50.0)  # an evaluation of 50 s
        record = p.step(step, torch.tensor(1.0), 1e-3, now[0], 1.5)
    assert record == {"step": 11, "train_loss": 1.0, "lr": 1e-3, "elapsed_s": round(now[0], 2),
                      "chars_per_s": 1000.0}  # for the sinks (trackers): the 50 s evaluation left out
    shown = p.bar.postfix
    assert "chars/s=1,000" in shown  # 10 steps of 100 characters in 1 s of training
    assert "left=9s" in shown  # 90 steps at 10 a second
    assert abs(p.session_speed(11) - 11 * 100 / (now[0] - 50.0)) < 1e-6
    assert p.clock() == now[0]  # the run's clock counts everything


def test_a_non_finite_running_loss_is_not_recorded(monkeypatch):
    p = Progress(step=0, elapsed=0.0, max_iters=10**12, chars_per_step=1, show=False)
    assert p.step(1, torch.tensor(float("nan")), 1e-3, 0.0, None) is None
    assert progress.RunningLoss().read() is None
