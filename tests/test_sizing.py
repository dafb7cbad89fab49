"""--preset auto (chargpt/training/sizing.py): the rule is pure and behaves as its reasons say; the trainer applies it,
says what it chose, lets explicit settings win and keeps a resumed run's model."""

import json
import re

import pytest

from chargpt.config import AUTO_BUDGET_S, PRESETS, UNLIMITED, TrainConfig
from chargpt.config.settings import Settings, new_run_settings
from chargpt.runs.checkpoint import read_meta
from chargpt.training import sizing
from chargpt.training.sizing import RUNGS, choose
from chargpt.training.trainer import train

ENGLISH = "".join(f"line {i}: the quick brown fox jumps over the lazy dog, and then it rests.\n" for i in range(400))


def flops_speed(seconds_per_gflop=0.01, overhead=0.005):
    """A fake machine: a step costs a fixed overhead plus time in proportion to its work, 1.5x with dropout."""
    return lambda rung, dropout=0.0: (overhead + seconds_per_gflop * rung.flops() / 1e9) * (1.5 if dropout else 1)


def test_a_longer_budget_never_picks_a_smaller_model():
    picked = [choose(budget, flops_speed(), 10_000_000).rung.params for budget in (30, 60, 120, 300, 600, 1800, 7200,
                                                                                    36000)]
    assert picked == sorted(picked) and picked[0] < picked[-1]


def test_a_faster_machine_never_picks_a_smaller_model():
    picked = [choose(600, flops_speed(s), 10_000_000).rung.params for s in (0.1, 0.03, 0.01, 0.003, 0.001)]
    assert picked == sorted(picked) and picked[0] < picked[-1]


def test_less_text_means_a_smaller_model_or_more_dropout():
    plans = [choose(600, flops_speed(), chars) for chars in (10_000_000, 1_000_000, 200_000, 40_000, 5_000)]
    sizes = [p.rung.params for p in plans]
    dropouts = [p.settings["dropout"] for p in plans]
    assert sizes == sorted(sizes, reverse=True) and dropouts == sorted(dropouts)
    assert sizes[-1] < sizes[0] and dropouts[-1] > dropouts[0]


def test_a_corpus_read_too_often_ends_the_run_early_and_says_so():
    plan = choose(600, flops_speed(), 2_000)
    cap = plan.settings["max_iters"]
    assert cap * plan.rung.chars_per_step == pytest.approx(sizing.MAX_EPOCHS * 2_000, rel=0.01)
    assert plan.epochs == sizing.MAX_EPOCHS and cap == plan.steps < plan.budget_steps
    assert "by heart" in plan.warning and "--patience" in plan.warning and f"{cap:,}" in plan.warning
    warned = choose(120, flops_speed(), 40_000)  # read often, not too often: dropout, the whole budget, a warning
    assert "max_iters" not in warned.settings and warned.settings["dropout"] > 0 and "by heart" in warned.warning
    large = choose(600, flops_speed(), 50_000_000)
    assert "max_iters" not in large.settings and large.warning is None and large.settings["dropout"] == 0


def test_measuring_stops_where_a_rung_could_not_pay():
    measured = []

    def slow(rung, dropout=0.0):
        measured.append(rung)
        return 5.0  # seconds a step, whatever the rung: a very slow machine
    plan = choose(60, slow, 10_000_000)
    assert plan.rung == RUNGS[0] and measured == [RUNGS[0]]  # the next rung's probe alone would cost too much


def test_a_step_budget_keeps_the_cpu_preset_model_and_measures_nothing():
    cfg = TrainConfig(max_iters=200, max_time=None)
    plan = sizing.plan_run(cfg, {"max_iters": 200}, 1_000_000, probe=lambda rung: pytest.fail("measured"))
    assert plan.rung == sizing.STEP_BUDGET_RUNG and plan.warning is None
    assert "memorise" in sizing.plan_run(TrainConfig(max_iters=100_000, max_time=None), {}, 1_000, None).warning


def test_explicit_settings_win_each_alone():
    plan = choose(600, flops_speed(), 1_000_000)
    model_kw, train_kw, kept = sizing.apply(plan, {"n_layer": 5, "n_embd": 200, "n_head": 4}, {"batch_size": 7},
                                            {"n_layer": 5, "n_embd": 200, "batch_size": 7})
    assert model_kw["n_layer"] == 5 and model_kw["n_embd"] == 200 and 200 % model_kw["n_head"] == 0
    assert train_kw["batch_size"] == 7  # the user's, not the rung's
    assert model_kw["block_size"] == plan.settings["block_size"] and model_kw["dropout"] == plan.settings["dropout"]
    assert kept == [("n_layer", 5), ("n_embd", 200), ("batch_size", 7)]


def test_auto_is_the_cpu_default_with_a_time_budget_and_steps_lift_it():
    _, cfg, settings = new_run_settings({})
    assert cfg.preset == "auto" and cfg.max_time == AUTO_BUDGET_S and cfg.max_iters >= UNLIMITED
    _, cfg, _ = new_run_settings({"max_iters": 50})
    assert cfg.max_iters == 50 and cfg.max_time is None  # a step budget given: no time budget left over
    _, cfg, _ = new_run_settings({"max_time": 30})
    assert cfg.max_time == 30 and cfg.max_iters >= UNLIMITED
    assert new_run_settings({}, "cuda")[1].preset == "shakespeare-char"
    assert "max_iters" not in Settings({"max_time": 30}).given()  # --max-time alone gives no step budget


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text(ENGLISH, encoding="utf-8")
    return str(path)


def run_log(**kw):
    lines = []
    summary = train(log=lines.append, sample_chars=0, curves=False, threads=1, verbose=True, **kw)
    return summary, lines


def test_a_time_budget_sizes_the_run_and_the_log_says_how(corpus, tmp_path):
    out = tmp_path / "run"
    summary, lines = run_log(data=corpus, out_dir=str(out), max_time=1.0)
    auto = [ln for ln in lines if ln.startswith("auto: ")]
    assert len(auto) == 1 and "ms a step measured" in auto[0] and "passes" in auto[0]
    assert any(ln.startswith("auto, why: ") for ln in lines)
    model = read_meta(out / "best.safetensors")[0]["model_config"]
    shape = auto[0].removeprefix("auto: ").split(" (")[0]
    assert shape == f"{model.n_layer} x {model.n_embd}"
    assert f"dropout {model.dropout:g} " in auto[0] and f"context {model.block_size}," in auto[0]
    config = (out / "config.toml").read_text()
    assert 'preset = "auto"' in config and f"n-layer = {model.n_layer}" in config


def test_a_flag_wins_and_a_resume_keeps_the_model(corpus, tmp_path):
    out = tmp_path / "run"
    _, lines = run_log(data=corpus, out_dir=str(out), max_time=1.0, n_layer=1, dropout=0.05)
    assert "auto left to you: n_layer=1, dropout=0.05" in lines
    first = read_meta(out / "state.safetensors")[0]["model_config"]
    assert first.n_layer == 1 and first.dropout == 0.05
    _, lines = run_log(data=corpus, out_dir=str(out), resume=True, max_time=1.0)
    assert not any(ln.startswith("auto") for ln in lines)  # nothing re-sized: the run's own model goes on
    assert read_meta(out / "state.safetensors")[0]["model_config"] == first


def test_sentence_pairs_keep_the_cpu_model(tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"a{i % 7} b{i % 5}\tc{i % 3} d\n" for i in range(300)), encoding="utf-8")
    _, lines = run_log(data=str(pairs), task="pairs", out_dir=str(tmp_path / "p"), max_iters=2, eval_pairs=0)
    assert any("sentence pairs keep the cpu preset's model" in ln for ln in lines)
    assert json.loads(json.dumps(lines))  # plain strings


def test_the_default_budget_is_time_and_the_log_says_so(corpus, tmp_path):
    from chargpt.training.describe import start_lines
    from chargpt.training.trainer import start_run
    lines = []
    trainer = start_run(dict(data=corpus, out_dir=str(tmp_path / "run"), threads=1), log=lines.append)  # set up only
    lines += start_lines(trainer)
    try:
        assert trainer.cfg.max_time == AUTO_BUDGET_S
        if trainer.cfg.max_iters < UNLIMITED:  # this small corpus read over 250 times in the budget: a cap, said
            assert any(ln.startswith("warning: the corpus is small") and f"{trainer.cfg.max_iters:,}" in ln
                       for ln in lines)
        assert any(ln.startswith("budget: ") and f"{AUTO_BUDGET_S:g} s of training" in ln and ln.endswith(
            "(the default of --preset auto; --max-time SECONDS or --max-iters N for another)") for ln in lines)
        assert any(ln.startswith("auto: ") and f"for {AUTO_BUDGET_S:g} s on" in ln for ln in lines)
    finally:
        trainer.release()


def test_a_step_budget_trains_the_documented_cpu_preset_model():
    """docs/runs.md: a step budget (--max-iters alone) keeps the cpu preset's model, 2 x 128 at context 128."""
    plan = sizing.plan_run(TrainConfig(max_iters=200, max_time=None), {"max_iters": 200}, 1_000_000, probe=None)
    cpu = PRESETS["cpu"]
    assert {k: plan.settings[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "batch_size")} == {
        k: cpu[k] for k in ("n_layer", "n_embd", "n_head", "block_size", "batch_size")}


def test_the_auto_line_describes_the_model_that_trains_when_a_size_is_given():
    plan = choose(120, flops_speed(), 1_000_000)
    _, _, kept = sizing.apply(plan, {}, {}, {"n_embd": 16})
    line = sizing.describe(plan, 120, 900_000, kept)[0]
    assert line.startswith(f"auto: {plan.rung.n_layer} x 16 ") and f"auto chose {plan.rung.describe()}" in line
    assert "steps" not in line  # the rung's measured speed says nothing of a 16-wide model's


def test_a_head_count_given_gets_a_width_it_divides():
    plan = choose(120, flops_speed(), 1_000_000)
    model_kw, _, _ = sizing.apply(plan, {"n_head": 3}, {}, {"n_head": 3})
    assert model_kw["n_head"] == 3 and model_kw["n_embd"] % 3 == 0
    assert abs(model_kw["n_embd"] - plan.settings["n_embd"]) < 3  # the rung's width, nearest multiple of 3


def test_a_head_count_alone_trains_under_auto(corpus, tmp_path):
    summary = train(data=corpus, out_dir="run", n_head=3, max_time=2, threads=1, sample_chars=0, curves=False,
                    log=lambda m: None)
    assert summary["step"] > 0 and read_meta(tmp_path / "run" / "best.safetensors")[0]["model_config"].n_embd % 3 == 0


def test_an_astronomical_budget_is_said_in_words_not_in_300_digits():
    def speed(rung, dropout=0.0):
        return 0.01
    plan = choose(1e300, speed, 2_700)
    lines = sizing.describe(plan, 1e300, 2_700)
    assert all(len(line) < 700 for line in lines) and not any(re.search(r"\d{16}", line) for line in lines)
    assert "more than a year" in lines[0] and "max_iters" in plan.settings  # capped by the passes it may read


# seconds a step measured on a 2-core Xeon with native bf16 (the 120 s runs of benchmarks/RESULTS.md, dropout 0.2;
# without dropout a third less)
MEASURED = {(2, 64): 0.032, (2, 96): 0.040, (2, 128): 0.048, (3, 128): 0.070, (3, 160): 0.083, (4, 192): 0.129,
            (4, 256): 0.200, (5, 320): 0.350, (6, 384): 2.0}


def measured_speed(rung, dropout=0.0):
    return MEASURED[rung.n_layer, rung.n_embd] / (1.0 if dropout else 1.3)


@pytest.mark.parametrize("train_chars,want", [(18_000, (2, 64)), (36_000, (2, 64)), (90_000, (2, 128))])
def test_small_texts_get_the_size_that_won_at_two_minutes_with_dropout(train_chars, want):
    """The refit: on the corpora of 20,000-100,000 characters the best model at 120 s held at most 5 block
    parameters per training character, with dropout 0.2."""
    plan = choose(120, measured_speed, train_chars)
    assert (plan.rung.n_layer, plan.rung.n_embd) == want
    assert plan.settings["dropout"] == sizing.DROPOUT
    assert plan.rung.params <= max(sizing.PARAMS_PER_CHAR * train_chars, RUNGS[0].params)


def test_a_probe_that_misreads_one_rung_by_a_few_percent_picks_the_same_model():
    for train_chars in (18_000, 90_000, 1_000_000):
        for budget in (120, 600):
            want = choose(budget, measured_speed, train_chars).rung
            for noise in (0.95, 1.05):
                assert choose(budget, lambda r, d=0.0, k=noise: measured_speed(r, d) * k, train_chars).rung == want


def test_a_rung_near_a_threshold_is_measured_closer_and_that_speed_decides():
    """The fastest of a few steps still varies by ~10% between runs, which flips a rung that lies near a threshold
    (the same command picked 3 x 128 once and 3 x 160 three times): the rule asks such a rung's speed again, measured
    more closely, and decides on that."""
    rung = next(r for r in RUNGS if (r.n_layer, r.n_embd) == (3, 160))
    # a budget where 3 x 160 at its true speed reads 5% more characters per parameter than the threshold
    budget = sizing.TOKENS_PER_PARAM * rung.params * measured_speed(rung) / rung.chars_per_step * 1.05
    want = choose(budget, measured_speed, 100_000_000).rung
    asked = []

    def misread(r, d=0.0):  # a probe whose few steps all ran 12% slow
        return measured_speed(r, d) * 1.12

    def closer(r, d=0.0):
        asked.append(r)
        return measured_speed(r, d)
    assert want == rung and choose(budget, misread, 100_000_000).rung != want  # the misreading alone flips it
    assert choose(budget, misread, 100_000_000, closer=closer).rung == want
    assert asked == [rung]  # only the rung near a threshold is measured again


def test_near_a_threshold_the_last_run_of_the_command_decides_and_far_from_it_the_measurement():
    """The same command picks the same model: where this run's speed puts a rung within NEAR of a threshold, the
    last run's choice stands; a speed clearly past the threshold still decides."""
    small, large = (next(r for r in RUNGS if (r.n_layer, r.n_embd) == shape) for shape in ((3, 128), (3, 160)))
    budget = sizing.TOKENS_PER_PARAM * large.params * measured_speed(large) / large.chars_per_step
    for k in (0.95, 1.05):  # this run's probe: 3 x 160 reads 5% more, or 5% fewer, characters a parameter
        def speed(r, d=0.0, k=k):
            return measured_speed(r, d) / k
        for last in (small, large):
            plan = choose(budget, speed, 100_000_000, previous=(last, 0.0))
            assert plan.rung == last
            said = any("as the last run of this command did" in r for r in plan.reasons)
            assert said == ((last == large) != (k > 1))  # said where it differs from what the speed alone picks
    for k, want in ((0.7, small), (1.4, large)):  # clearly past the threshold: the measurement decides
        for last in (small, large):
            assert choose(budget, lambda r, d=0.0, k=k: measured_speed(r, d) / k, 100_000_000,
                          previous=(last, 0.0)).rung == want


def test_what_auto_picked_is_remembered_per_command_within_bounds(tmp_path):
    path = tmp_path / sizing.MEMORY_FILE
    plan = choose(120, measured_speed, 90_000)
    key = sizing.memory_key(corpus="abc", budget=120.0, threads=2)
    assert sizing.recall(path, key) is None  # nothing yet
    sizing.remember(path, key, plan)
    assert sizing.recall(path, key) == (plan.rung, plan.settings["dropout"])
    assert sizing.recall(path, sizing.memory_key(corpus="abc", budget=600.0, threads=2)) is None  # another command
    for i in range(sizing.MEMORY_MAX + 5):
        sizing.remember(path, sizing.memory_key(corpus=str(i)), plan)
    assert len(json.loads(path.read_text())) == sizing.MEMORY_MAX and sizing.recall(path, key) is None  # forgotten
    path.write_text("{torn")
    assert sizing.recall(path, key) is None  # a torn file is no memory, not an error
    sizing.remember(path, key, plan)
    assert sizing.recall(path, key) == (plan.rung, plan.settings["dropout"])


# --- a busy start-up: the run starts again sized for the speed it trains at ---------------------------------------
def test_a_larger_rung_pays_only_where_the_text_and_the_speed_allow():
    small, above = RUNGS[0], RUNGS[1]
    fast = sizing.larger_pays(small, 0.001, 150.0, 10_000_000)
    assert fast and not sizing.larger_pays(small, 10.0, 150.0, 10_000_000)  # too slow: it would not see enough text
    assert not sizing.larger_pays(small, 0.001, 150.0, int(above.params / sizing.PARAMS_PER_CHAR) - 1)  # too little
    assert not sizing.larger_pays(RUNGS[-1], 0.001, 150.0, 10**9)  # nothing above the top


def test_a_run_sized_while_the_machine_was_busy_starts_again_sized_for_the_speed_it_trains_at(tmp_path, monkeypatch):
    """The probe saw steps 50x slower than training gets (the machine was busy, then not): within the first 15% of
    the budget the run starts again, sized anew, in its own folder emptied."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(ENGLISH, encoding="utf-8")
    busy = sizing.Probe._time

    def slow_probe(self, rung, dropout, step, steps=sizing.PROBE_STEPS, before=None):
        busy(self, rung, dropout, step, steps, before)
        self.times[rung, dropout] *= 50
    monkeypatch.setattr(sizing.Probe, "_time", slow_probe)
    monkeypatch.setattr(sizing, "larger_pays", lambda *a: True)  # the rule's own answer is tested above
    summary, lines = run_log(data=corpus, out_dir=str(tmp_path / "run"), max_time=12.0)
    again = [ln for ln in lines if "starting again, sized for it" in ln]
    assert len(again) == 1 and "faster than the" in again[0]
    assert sum(ln.startswith("auto: ") for ln in lines) == 2  # sized twice, the second time for good
    evals = [json.loads(ln) for ln in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [e["step"] for e in evals][0] == 0 and sorted(e["step"] for e in evals) == [e["step"] for e in evals]
    assert summary["step"] > 0 and len(list((tmp_path / "run").glob("*.safetensors"))) == 3  # one run's files
    assert "starting again, sized for it" in (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
