"""Where a run's settings come from (chargpt/config/settings.py): defaults <- preset <- config file <- flags, the source
of each, budgets given in one layer lifting another's, a run started from another's settings, and config.toml
read back as the same settings."""

import re
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

from chargpt.cli import train_cli
from chargpt.config import AUTO_BUDGET_S, PRESETS, UNLIMITED, ModelConfig, TrainConfig
from chargpt.config.flags import cli_names, flag_specs
from chargpt.config.settings import (
    FLAGS,
    NOT_WRITTEN,
    Settings,
    config_toml,
    init_settings,
    new_run_settings,
    read_config_file,
)
from chargpt.errors import ConfigError
from chargpt.runs.checkpoint import absolute_paths


def write(path, text):
    Path(path).write_text(text, encoding="utf-8")
    return str(path)


# --- the layers ------------------------------------------------------------------------------------------------
def test_defaults_have_one_home_and_keep_their_values():
    """Dataclass defaults are the GPU's; the CPU preset overrides only what differs; --help shows both."""
    def build_configs(device_type):
        model_kw, train, _ = new_run_settings({}, device_type)
        return ModelConfig(**model_kw, vocab_size=65), train
    cpu_model, cpu_train = build_configs("cpu")
    gpu_model, gpu_train = build_configs("cuda")
    size = lambda m: (m.n_layer, m.n_head, m.n_embd, m.block_size, m.dropout)  # noqa: E731
    run = lambda t: (t.batch_size, t.learning_rate, t.eval_interval, t.eval_iters, t.max_iters, t.warmup_iters)  # noqa
    assert size(cpu_model) == (2, 4, 128, 128, 0.0) and run(cpu_train) == (16, 4e-3, 250, 20, UNLIMITED, 100)
    assert cpu_train.max_time == AUTO_BUDGET_S  # a time budget, the model sized for it at start (test_sizing.py)
    assert (cpu_train.optimizer, cpu_train.muon_lr, cpu_train.lr_schedule) == ("muon", 0.01, "wsd")
    assert (gpu_train.optimizer, gpu_train.muon_lr, gpu_train.lr_schedule) == ("adamw", 0.02, "cosine")
    assert size(gpu_model) == (6, 6, 384, 256, 0.2) and run(gpu_train) == (64, 1e-3, 500, 50, 5000, 100)
    assert PRESETS["shakespeare-char"] == {} and (cpu_train.preset, gpu_train.preset) == ("auto", "shakespeare-char")
    assert all(PRESETS["cpu"][k] != getattr(gpu_model if hasattr(gpu_model, k) else gpu_train, k)
               for k in PRESETS["cpu"])
    shown = " ".join(CliRunner().invoke(train_cli, ["--help"]).output.split())
    assert "[default: sized by --preset auto on CPU, 6 on GPU]" in shown and "[default: 0.1]" in shown
    assert "[default: 0.004 on CPU, 0.001 on GPU]" in shown


def test_each_setting_comes_from_the_highest_layer_that_holds_it(tmp_path):
    write(tmp_path / "run.toml", "n-layer = 4\nbatch-size = 8\n")
    settings = Settings({"config": str(tmp_path / "run.toml"), "n_layer": 3})
    settings.pick_preset("cpu")
    assert settings.preset == "auto" and settings.preset_source is None  # the device's choice
    assert settings.source("n_layer") == FLAGS
    assert settings.source("batch_size") == str(tmp_path / "run.toml")
    assert settings.source("optimizer") == "preset auto" and settings.source("beta1") is None  # a default
    assert settings.merged()["n_layer"] == 3 and settings.merged()["batch_size"] == 8
    assert "optimizer" not in settings.given()  # what a file or the flags set, not the preset


def test_the_start_up_lines_say_what_each_source_changed_in_the_users_words(tmp_path):
    write(tmp_path / "run.toml", "n-layer = 4\nbatch-size = 8\n")
    _, _, settings = new_run_settings({"config": "run.toml", "n_layer": 3, "preset": "tiny"})
    assert settings.describe()[1:] == ["from run.toml: batch_size=8", "from arguments: n_layer=3"]
    with cli_names():
        assert settings.describe()[1:] == ["from run.toml: --batch-size 8", "from the command line: --n-layer 3"]
    assert settings.describe()[0].startswith("preset: tiny (preset) — tests and demos")


def test_a_time_budget_alone_lifts_a_step_limit_and_a_step_budget_lifts_a_time_limit(tmp_path):
    _, timed, _ = new_run_settings({"preset": "tiny", "max_time": 30.0})
    assert (timed.max_time, timed.max_iters) == (30.0, UNLIMITED)  # tiny's 300 steps no longer stop it
    _, stepped, _ = new_run_settings({"max_iters": 500}, "cpu")
    assert (stepped.preset, stepped.max_iters, stepped.max_time) == ("auto", 500, None)  # auto's 150 s lifted
    _, both, _ = new_run_settings({"max_iters": 500, "max_time": 30.0}, "cpu")
    assert (both.max_iters, both.max_time) == (500, 30.0)  # both given: whichever comes first
    write(tmp_path / "run.toml", "max-iters = 40\n")
    _, flagged, _ = new_run_settings({"config": "run.toml", "max_time": 10.0, "preset": "tiny"})
    assert flagged.max_iters == UNLIMITED  # --max-time alone on the command line lifts the file's steps too


def test_a_resume_keeps_from_a_file_only_what_differs_from_the_run(tmp_path):
    write(tmp_path / "run.toml", "n-layer = 4\nlearning-rate = 0.01\n")
    settings = Settings({"config": "run.toml", "max_iters": 99})
    settings.keep_changes({"n_layer": 4, "learning_rate": 0.001, "max_iters": 99})
    assert settings.given() == {"config": "run.toml", "learning_rate": 0.01, "max_iters": 99}  # the flags all count


def test_paths_are_stored_absolute():
    saved = absolute_paths({"data": "corpus.txt", "out_dir": "run", "cache_dir": None, "n_layer": 2})
    assert saved == {"data": str(Path("corpus.txt").resolve()), "out_dir": "run", "cache_dir": None, "n_layer": 2}


# --- a run started from another (--init-from) ------------------------------------------------------------------
BASE = ModelConfig(vocab_size=20, n_layer=2, n_head=2, n_embd=16, block_size=32, dropout=0.1)


def started(flags, base=BASE, task="text", device_type="cpu"):
    meta = {"model_config": base, "train_config": TrainConfig(preset="tiny"), "task": task}
    return init_settings(meta, Settings(flags), device_type, "runs/base")


def test_a_run_started_from_another_keeps_its_architecture_and_its_preset():
    got = started({"dropout": 0.0, "block_size": 16, "max_iters": 7})
    assert {k: got.model_kw[k] for k in ("n_layer", "n_embd", "dropout", "block_size")} == \
        {"n_layer": 2, "n_embd": 16, "dropout": 0.0, "block_size": 16}
    assert got.cfg.preset == "tiny" and got.cfg.max_iters == 7  # the base's preset: not this device's auto
    assert got.cfg.learning_rate == PRESETS["tiny"]["learning_rate"]
    assert got.notes == ["dropout 0.0 (base: 0.1)", "context 16 characters (base: 32)"]
    assert started({"n_layer": 2}).model_kw["n_layer"] == 2  # agreeing is fine


def test_a_run_started_from_another_refuses_another_architecture(tmp_path):
    with pytest.raises(ConfigError, match=r"^init_from: settings disagree with the base model runs/base: --n-layer 3 "
                                          r"\(base: 2\); --n-embd 8 \(base: 16\); drop them"):
        started({"n_layer": 3, "n_embd": 8})
    with pytest.raises(ConfigError, match=r"block_size=64 is longer than the 32 positions the base model runs/base "
                                          r"learned; pass block_size=32 or less"):
        started({"block_size": 64})
    assert started({"block_size": 64}, base=ModelConfig(**{**vars(BASE), "pos_emb": "sinusoidal"})) \
        .model_kw["block_size"] == 64  # no learned positions: any context
    with pytest.raises(ConfigError, match=r"was trained on sentence pairs; it continues only on pairs"):
        started({"task": "text"}, task="pairs")


# --- config files and config.toml ------------------------------------------------------------------------------
def test_a_config_file_takes_dashes_or_underscores_a_bom_and_integers_for_numbers(tmp_path):
    write(tmp_path / "run.toml", "\ufeffn-layer = 3\nlearning_rate = 1\nsample-prompt = \"ROMEO:\"\n")
    values = read_config_file(tmp_path / "run.toml")
    assert values == {"n_layer": 3, "learning_rate": 1.0, "sample_prompt": "ROMEO:"}
    assert isinstance(values["learning_rate"], float)


def test_a_config_file_value_outside_its_choices_is_refused_in_one_line(tmp_path):
    write(tmp_path / "run.toml", "compile = true\n")
    with pytest.raises(ConfigError, match=r"^.*run.toml: compile must be one of auto, on, off, not true$"):
        read_config_file(tmp_path / "run.toml")


@pytest.mark.parametrize("line, message", [
    ("max-time = inf", "max-time must be a finite number, not inf; to train without a time limit, leave max-time "
                       "out and set max-iters"),
    ("max_time = nan", "max_time must be a finite number, not nan"),
    ("learning-rate = -inf", "learning-rate must be a finite number, not -inf"),
])
def test_a_config_file_number_that_is_not_finite_names_the_file_and_the_key(tmp_path, line, message):
    config = write(tmp_path / "run.toml", line + "\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(config)}: {re.escape(message)}$"):
        read_config_file(config)
    r = CliRunner().invoke(train_cli, ["--config", config, "--device", "cpu"])
    assert r.exit_code == 1 and r.stderr.strip().splitlines() == [f"error: {config}: {message}"], r.stderr


def other_value(spec):
    """A value for the flag `spec` other than its default."""
    if spec.choices:
        return next(c for c in spec.choices if c != spec.default)
    if spec.type is bool:
        return not spec.default
    if spec.type is int:
        return (spec.default or 0) + 3
    if spec.type is float:
        return (spec.default or 0.0) + 0.125
    return 'a "quoted"\tvalue \u4e2d'


def test_config_toml_reads_back_as_every_setting_it_was_written_from(tmp_path):
    values = {cls: {s.dest: other_value(s) for s in flag_specs(cls)} for cls in (ModelConfig, TrainConfig)}
    mcfg, tcfg = ModelConfig(**values[ModelConfig]), TrainConfig(**values[TrainConfig])
    read = read_config_file(write(tmp_path / "config.toml", config_toml(mcfg, tcfg)))
    written = {**values[ModelConfig], **absolute_paths(values[TrainConfig])}
    assert read == {k: v for k, v in written.items() if k not in NOT_WRITTEN}
    assert all(type(read[k]) is type(v) for k, v in read.items())  # 0.125 stays a float, 3 an int


def test_config_toml_leaves_out_what_is_not_set_and_keeps_an_unlimited_step_count_readable():
    model_kw, cfg, _ = new_run_settings({"preset": "cpu", "max_time": 60.0})
    text = config_toml(ModelConfig(**model_kw, vocab_size=65), cfg)
    keys = {line.split(" = ")[0] for line in text.splitlines() if " = " in line}
    assert "min-lr" not in keys and "vocab-size" not in keys and "out-dir" not in keys  # unset, the corpus's, new
    assert keys <= {f.name.replace("_", "-") for cls in (ModelConfig, TrainConfig) for f in fields(cls)}
    assert "max-iters = 1000000000000  # no step limit: max-time decides" in text
