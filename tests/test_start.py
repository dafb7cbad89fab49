"""Start-up: one call builds what a run is made of (a Run whose fields name it all), says it in lines that are a
function of that Run alone, and a start that fails leaves nothing behind."""

import pytest

import chargpt
from chargpt.training.describe import start_lines
from chargpt.training.start import start_run
from chargpt.training.trainer import Trainer

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=1, dropout=0.0,
               threads=1, dtype="float32", curves=False, sample_chars=0)


def quiet(message):
    pass


def test_a_run_is_built_in_one_call_and_its_lines_depend_on_it_alone(tmp_path, corpus):
    run = start_run({**TINY_KW, "data": str(corpus), "out_dir": "run", "max_iters": 4}, log=quiet)
    try:
        assert run.out_dir.name == "run" and run.state.step == 0 and run.origin.meta is None
        assert run.mcfg.vocab_size == len(run.corpus.vocab) == run.distinct
        assert run.chars_per_step == 4 * 16 and run.wrapped.train_model is run.model  # eager, one process
        first, again = start_lines(run), start_lines(run)
        assert first == again  # no line is added by saying them
        assert first[0].startswith("corpus: corpus — ") and any(line.startswith("model: ") for line in first)
        assert any(line.startswith("budget: until step 4") for line in first)
    finally:
        run.release()
    assert not (tmp_path / "run").exists()  # released before anything was saved: no empty folder left


def test_a_resumed_run_starts_from_its_own_state_and_says_what_changed(tmp_path, corpus):
    chargpt.train(data=str(corpus), out_dir="run", max_iters=4, eval_interval=2, log=quiet, **TINY_KW)
    run = start_run({"out_dir": "run", "resume": True, "max_iters": 6, "dropout": 0.1, "threads": 1}, log=quiet)
    try:
        assert run.state.step == 4 and run.origin.meta["step"] == 4
        lines = start_lines(run)
        assert any(line.startswith("resuming run at step 4") for line in lines)
        assert "dropout 0.1 (checkpoint: 0.0) from here on" in lines
        best, run.state.best_val = run.state.best_val, float("inf")  # as a run stopped in its first evaluation
        assert any(line.startswith("resuming run at step 4 (not evaluated yet)") for line in start_lines(run))
        run.state.best_val = best
        summary = Trainer(run).train()
    finally:
        run.release()
    assert summary["step"] == 6


def test_a_run_started_from_another_records_where_it_came_from(tmp_path, corpus):
    chargpt.train(data=str(corpus), out_dir="base", max_iters=2, eval_interval=2, log=quiet, **TINY_KW)
    (tmp_path / "more.txt").write_text("Zebras quietly yawn.\n" * 40, encoding="utf-8")
    run = start_run({**TINY_KW, "data": "more.txt", "out_dir": "run", "init_from": "base", "max_iters": 2},
                    log=quiet)
    try:
        assert run.origin.lineage["base_vocab_size"] < len(run.corpus.vocab)
        assert run.origin.base.weights == {}  # copied into the model, the memory handed back
        lines = start_lines(run)
        assert any(line.startswith("starting from ") for line in lines)
        assert any("characters the base never saw added to its vocabulary" in line for line in lines)
    finally:
        run.release()


def test_a_start_that_fails_after_claiming_leaves_no_lock_and_no_folder(tmp_path, corpus):
    with pytest.raises(chargpt.ConfigError, match="sample_prompt has characters the corpus does not"):
        start_run({**TINY_KW, "data": str(corpus), "out_dir": "new/run", "sample_prompt": "\u00e9"}, log=quiet)
    assert not (tmp_path / "new").exists()


def test_the_start_up_reads_in_a_few_short_lines_and_the_run_keeps_them_all(tmp_path, corpus):
    """By default a person sees the corpus, the model and why, the budget and where the run goes (and any warning);
    every line, the start-up in full included, is in the run's train.log; --verbose shows them all."""
    said = []
    brief = {**{k: v for k, v in TINY_KW.items() if k != "dtype"}, "warmup_iters": 0}  # the device's numerics
    chargpt.train(data=str(corpus), out_dir="run", max_iters=2, eval_interval=2, log=said.append, **brief)
    start = said[:said.index(next(line for line in said if line.startswith("step ")))]
    assert [line.split(":")[0] for line in start] == ["corpus", "model", "budget", "run"]
    assert all(len(line) < 160 for line in start), start
    assert start[3] == "run: run (every start-up line is in run/train.log; --verbose shows them here)"
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8").splitlines()
    assert [line for line in log if line.startswith(("device: ", "numerics: ", "global batch: ", "validation: "))]
    assert any(line.startswith("step      2: ") for line in log) and log[-1].startswith("done: ")
    said.clear()
    chargpt.train(data=str(corpus), out_dir="verbose", max_iters=2, eval_interval=2, log=said.append, verbose=True,
                  **brief)
    assert any(line.startswith("numerics: ") for line in said) and not any(line.startswith("run: ") for line in said)


def test_a_run_s_settings_are_checked_once(tmp_path, corpus, monkeypatch):
    """Each setting is checked where the run's settings are made, once: the model's before the corpus is read (what
    only the vocabulary decides is checked with it), the training's when the layers are merged; sizing and the
    parts after it read typed fields."""
    from chargpt.config import ModelConfig, TrainConfig
    checks = []
    for cls in (ModelConfig, TrainConfig):
        real = cls.validate
        monkeypatch.setattr(cls, "validate", lambda self, real=real: checks.append(type(self).__name__) or real(self))
    run = start_run({**TINY_KW, "data": str(corpus), "out_dir": "run", "max_iters": 4, "dropout": 0.1,
                     "softmax": "adaptive"}, log=quiet)
    run.release()
    assert sorted(checks) == ["ModelConfig", "TrainConfig"] and run.mcfg.dropout == 0.1
    assert run.mcfg.vocab_size == len(run.corpus.vocab) and 0 < run.mcfg.shortlist < run.mcfg.vocab_size
