"""Learning-rate schedules and budgets (chargpt/training/schedules.py): warmup, cosine, warmup-stable-decay and
inverse-sqrt, by steps and by training time, and when a run is finished."""

import math
from dataclasses import replace

import pytest

from chargpt.config import UNLIMITED, TrainConfig
from chargpt.training.schedules import describe_budget, final_lr, finished, lr_at, schedule_changed
from chargpt.training.state import RunState


def lrs(cfg, steps, state=None, elapsed=0.0):
    state = state or RunState()
    return [lr_at(step, elapsed, cfg, state) for step in steps]


# --- warmup ----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_warmup_rises_linearly_to_the_peak(schedule):
    cfg = TrainConfig(learning_rate=1e-2, warmup_iters=9, max_iters=100, lr_schedule=schedule)
    assert lrs(cfg, range(9)) == pytest.approx([1e-2 * (i + 1) / 10 for i in range(9)])
    assert lr_at(9, 0.0, cfg, RunState()) == pytest.approx(1e-2)  # the peak when the warmup ends


# --- cosine ----------------------------------------------------------------------------------------------------
def test_cosine_decays_from_the_peak_to_min_lr_over_the_budget_and_stays_there():
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=10, max_iters=110)
    got = lrs(cfg, range(10, 131))
    assert got[0] == pytest.approx(1e-2)
    assert got[50] == pytest.approx((1e-2 + 1e-3) / 2)  # halfway through the decay: the mean
    assert all(a > b for a, b in zip(got[:100], got[1:101]))
    assert got[100:] == pytest.approx([1e-3] * 21)


def test_min_lr_defaults_to_a_tenth_of_the_peak():
    assert final_lr(TrainConfig(learning_rate=6e-4)) == pytest.approx(6e-5)
    assert final_lr(TrainConfig(learning_rate=6e-4, min_lr=0.0)) == 0.0


def test_lr_decay_iters_ends_the_decay_before_max_iters():
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=0, max_iters=1000, lr_decay_iters=100)
    assert lr_at(100, 0.0, cfg, RunState()) == pytest.approx(1e-3)
    assert lr_at(500, 0.0, cfg, RunState()) == pytest.approx(1e-3)


def test_cosine_is_fitted_to_a_time_budget():
    """With --max-time the decay follows training time (or steps, whichever is further along)."""
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=0, max_iters=UNLIMITED, max_time=100.0)
    assert lr_at(5, 0.0, cfg, RunState()) == pytest.approx(1e-2, rel=1e-6)
    assert lr_at(5, 50.0, cfg, RunState()) == pytest.approx((1e-2 + 1e-3) / 2)
    assert lr_at(5, 100.0, cfg, RunState()) == pytest.approx(1e-3)


# --- warmup-stable-decay ---------------------------------------------------------------------------------------
def test_wsd_warms_up_stays_flat_then_decays_linearly_over_the_last_fraction():
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=10, max_iters=110, lr_schedule="wsd",
                      decay_fraction=0.4)
    got = lrs(cfg, range(121))
    assert got[0] < got[5] < got[9] < 1e-2  # warmup
    assert all(lr == pytest.approx(1e-2) for lr in got[10:71])  # flat for the first 60% after warmup
    assert got[90] == pytest.approx(1e-2 - 0.5 * 9e-3)  # halfway through the decay
    assert all(a > b for a, b in zip(got[70:110], got[71:111]))  # decreasing
    assert all(lr == pytest.approx(1e-3) for lr in got[110:])  # at min_lr from the end of the budget on


def test_wsd_is_fitted_to_a_time_budget():
    """With --max-time the fraction done is by time, as for cosine: flat until 60% of the time, then decaying."""
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=0, max_iters=UNLIMITED, max_time=100.0,
                      lr_schedule="wsd")
    assert lr_at(5, 59.0, cfg, RunState()) == pytest.approx(1e-2)
    assert lr_at(5, 80.0, cfg, RunState()) == pytest.approx(1e-2 - 0.5 * 9e-3)
    assert lr_at(5, 100.0, cfg, RunState()) == pytest.approx(1e-3)


# --- inverse square root ---------------------------------------------------------------------------------------
def test_inverse_sqrt_peaks_at_the_end_of_warmup_then_falls_as_one_over_root_step():
    cfg = TrainConfig(learning_rate=1e-3, warmup_iters=100, max_iters=50, lr_schedule="inverse-sqrt")
    got = lrs(cfg, range(400))
    assert max(got) == pytest.approx(1e-3) and got.index(max(got)) == 99  # step 100, counted from 1
    assert got[399] == pytest.approx(1e-3 * math.sqrt(100 / 400))
    assert got[50:60] == pytest.approx([1e-3 * (i + 1) / 100 for i in range(50, 60)])  # max_iters is no end


def test_inverse_sqrt_ignores_the_budget_and_min_lr():
    """It is a function of the step alone: no time budget, no decay end, no floor."""
    base = TrainConfig(learning_rate=1e-3, warmup_iters=10, lr_schedule="inverse-sqrt")
    other = TrainConfig(learning_rate=1e-3, warmup_iters=10, lr_schedule="inverse-sqrt", min_lr=9e-4,
                        max_time=1.0, lr_decay_iters=20)
    assert lrs(base, [5, 50, 5000], elapsed=99.0) == pytest.approx(lrs(other, [5, 50, 5000], elapsed=99.0))
    assert lr_at(10**6, 0.0, other, RunState()) < 9e-4 / 10


# --- a budget begun on --resume --------------------------------------------------------------------------------
@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_new_budget_decays_from_the_rate_reached_without_a_second_warmup(schedule):
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=50, max_iters=110, lr_schedule=schedule,
                      decay_fraction=0.4)
    resumed = RunState(step=10, budget_step=10, budget_lr=5e-3)  # the budget began at step 10, at 5e-3
    assert lr_at(10, 0.0, cfg, resumed) == pytest.approx(5e-3)  # no warmup: the rate reached, at once
    assert lr_at(110, 0.0, cfg, resumed) == pytest.approx(1e-3)
    if schedule == "wsd":  # 90% of the new budget done: three quarters of its decay
        assert lr_at(100, 0.0, cfg, resumed) == pytest.approx(5e-3 - 0.75 * 4e-3)


def test_a_time_budget_counts_from_where_it_began():
    cfg = TrainConfig(learning_rate=1e-2, min_lr=1e-3, warmup_iters=0, max_iters=UNLIMITED, max_time=100.0)
    resumed = RunState(step=500, elapsed=300.0, budget_step=500, budget_elapsed=300.0, budget_lr=1e-2)
    assert lr_at(500, 350.0, cfg, resumed) == pytest.approx((1e-2 + 1e-3) / 2)
    assert finished(cfg, replace(resumed, elapsed=399.0)) is None
    assert finished(cfg, replace(resumed, elapsed=400.0)) == "max_time"


# --- when a run is finished ------------------------------------------------------------------------------------
def test_finished_says_which_budget_ran_out():
    cfg = TrainConfig(max_iters=100, max_time=60.0, patience=3)
    assert finished(cfg, RunState(step=99, elapsed=59.0, since_best=2)) is None
    assert finished(cfg, RunState(step=100)) == "max_iters"
    assert finished(cfg, RunState(step=5, elapsed=60.0)) == "max_time"
    assert finished(cfg, RunState(step=5, since_best=3)) == "patience"
    assert finished(TrainConfig(max_iters=100), RunState(step=5, since_best=50)) is None  # patience 0: never


def test_describe_budget_names_both_limits_and_the_time_left():
    cfg = TrainConfig(max_iters=3000, max_time=120.0)
    assert describe_budget(cfg, RunState(elapsed=40.0)) == \
        "until step 3,000 or 120 s of training (80 s left), whichever comes first"
    assert describe_budget(cfg, RunState(elapsed=40.0), left=False) == \
        "until step 3,000 or 120 s of training, whichever comes first"
    assert describe_budget(TrainConfig(max_iters=UNLIMITED, max_time=120.0), RunState()) == "120 s of training"
    assert describe_budget(TrainConfig(max_iters=500), RunState()) == "until step 500"


def test_a_resume_changes_the_budget_when_its_end_or_time_changes():
    old = TrainConfig(max_iters=1000)
    assert not schedule_changed(old, TrainConfig(max_iters=1000, learning_rate=5e-4), {})
    assert schedule_changed(old, TrainConfig(max_iters=2000), {"max_iters": 2000})
    assert schedule_changed(old, TrainConfig(max_iters=1000, lr_decay_iters=500), {})
    timed = TrainConfig(max_iters=UNLIMITED, max_time=60.0)
    assert schedule_changed(timed, timed, {"max_time": 60.0})  # a --max-time given counts from now
    assert schedule_changed(timed, TrainConfig(max_iters=UNLIMITED), {})  # the time budget lifted
