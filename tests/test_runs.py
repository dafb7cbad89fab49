"""Issue #10 phase 2, around the training loop: named presets, --config TOML files (precedence, mistakes, the
config.toml a run keeps and repeats from), early stopping with --patience, samples while training, and what
every run leaves at its end (curves.png, the number of processes). Tiny runs of a second or two each."""

import importlib.util
import json
import os
import re
from dataclasses import asdict

import pytest
from click.testing import CliRunner
from helpers import TINY_API_KW, assert_one_line_error, flags, invoke, snapshot

import chargpt
from chargpt.cli import main, train_cli
from chargpt.config import PRESET_ABOUT, PRESETS, ModelConfig
from chargpt.config.flags import cli_names
from chargpt.config.helptext import describe_params, preset_params
from chargpt.config.settings import config_toml, new_run_settings, read_config_file, toml_value, tomllib
from chargpt.errors import ConfigError
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import read_meta
from chargpt.runs.info import run_info
from chargpt.training import validate

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUIET = dict(log=lambda *a: None)


def train(**kw):
    return chargpt.train(**QUIET, **{"data": "corpus.txt", **TINY_API_KW, **kw})


def resume(**kw):
    """--resume with only the flags given: the rest comes from the run."""
    return chargpt.train(**QUIET, out_dir="run", resume=True, **kw)


# --- presets --------------------------------------------------------------------------------------------------
def test_presets_are_one_table_each_with_a_description_and_valid_settings():
    assert {"tiny", "cpu", "shakespeare-char", "gpt2-small-char"} <= set(PRESETS)
    assert set(PRESET_ABOUT) == set(PRESETS) and all(PRESET_ABOUT.values())
    for name in PRESETS:
        model_kw, train_cfg, _ = new_run_settings({"preset": name})  # validated: every key a setting and value
        ModelConfig(**model_kw, vocab_size=65).validate()
        assert train_cfg.preset == name
    gpt2 = {k: PRESETS["gpt2-small-char"][k] for k in ("n_layer", "n_head", "n_embd", "block_size")}
    assert gpt2 == dict(n_layer=12, n_head=12, n_embd=768, block_size=1024)


def test_parameter_counts_are_those_of_the_model_built():
    for name in ("tiny", "cpu", "shakespeare-char"):
        model_kw, _, _ = new_run_settings({"preset": name})
        real = build_model(ModelConfig(**model_kw, vocab_size=65)).num_params()
        assert preset_params(name) == real
    assert 85e6 < preset_params("gpt2-small-char") < 87e6  # GPT-2 small's 12 x 768 blocks, context 1024


def test_help_and_the_runs_guide_list_every_preset_with_its_size():
    shown = invoke(train_cli, ["--help"]).stdout
    readme = open(os.path.join(ROOT, "docs", "runs.md"), encoding="utf-8").read()
    assert "parameters at a vocabulary of 65 characters" in shown
    for name in PRESETS:
        size = describe_params(name)  # auto's: the range of its rungs, 0.11M-10.77M
        assert re.search(rf"^  {re.escape(name)} +{re.escape(size)} parameters", shown, re.M), name
        assert re.search(rf"^\| `{re.escape(name)}` \| {re.escape(size)} \|", readme, re.M), name


def test_without_a_preset_the_device_picks_one():
    (cpu_model, cpu_train, _), (gpu_model, gpu_train, _) = new_run_settings({}, "cpu"), new_run_settings({}, "cuda")
    cpu_model, gpu_model = ModelConfig(**cpu_model), ModelConfig(**gpu_model)
    assert (cpu_train.preset, gpu_train.preset) == ("auto", "shakespeare-char")  # auto sizes its model at start
    assert (cpu_model.n_layer, cpu_model.n_embd, cpu_train.batch_size) == (2, 128, 16)  # until then, the cpu preset's
    assert (gpu_model.n_layer, gpu_model.n_embd, gpu_train.batch_size) == (6, 384, 64)
    tiny_model, tiny_train, _ = new_run_settings({"preset": "tiny"}, "cuda")  # a preset named wins over the device's
    assert tiny_train.preset == "tiny" and tiny_model["n_embd"] == PRESETS["tiny"]["n_embd"]


def test_flags_beat_the_config_file_which_beats_the_preset_which_beats_the_defaults(tmp_path):
    (tmp_path / "run.toml").write_text('n_embd = 48\nbatch-size = 8\nn-layer = 4\npreset = "cpu"\nmax-time = 30\n')
    model, cfg, settings = new_run_settings({"config": "run.toml", "preset": "tiny", "n_layer": 3})
    assert cfg.preset == "tiny"  # the flag's preset, not the file's
    assert model["n_layer"] == 3  # flag over file
    assert model["n_embd"] == 48 and cfg.batch_size == 8  # file over preset
    assert cfg.learning_rate == PRESETS["tiny"]["learning_rate"] and model["block_size"] == 32  # preset over default
    assert cfg.weight_decay == 0.1  # the default
    assert cfg.max_time == 30 and cfg.max_iters == 10**12  # a time budget alone lifts the preset's step limit
    with cli_names():
        lines = settings.describe()
    assert lines[0].startswith("preset: tiny (--preset) — tests and demos")
    assert lines[1:] == ["from run.toml: --n-embd 48 --batch-size 8 --max-time 30.0",
                         "from the command line: --n-layer 3"]  # only what is in effect, in the user's spelling


BAD_FILES = [  # (file text, the error after "run.toml: ")
    ("n_layers = 2", r"unknown setting 'n_layers'; did you mean 'n_layer'\?"),
    ("learnin-rate = 0.1", r"unknown setting 'learnin-rate'; did you mean 'learning-rate'\?"),
    ("zzz = 1", r"unknown setting 'zzz'; the keys are the flag names \(chargpt train --help\)"),
    ('n-layer = "4"', r'n-layer must be a whole number, not a string: "4"'),
    ("n-layer = 4.5", r"n-layer must be a whole number, not a float: 4.5"),
    ("learning-rate = true", r"learning-rate must be a number, not true/false: true"),
    ("curves = 1", r"curves must be true or false, not a whole number: 1"),
    ("data = 3", r"data must be a string \(in quotes\), not a whole number: 3"),
    ('dtype = "fp16"', r'dtype must be one of auto, float32, bfloat16, float16, not "fp16"'),
    ('preset = "tinyy"', r"preset must be one of auto, tiny, cpu, .*, not \"tinyy\"; did you mean 'tiny'\?"),
    ("[model]\nn-layer = 2", r"\[model\] is a table; settings are top-level keys"),
    ("resume = true", r"'resume' cannot be set in a config file; pass --resume on the command line"),
    ('config = "other.toml"', r"'config' cannot be set in a config file"),
    ("n-layer = 2\nn_layer = 3", r"'n-layer' and 'n_layer' are the same setting; keep one of them"),
]


@pytest.mark.parametrize("text, message", BAD_FILES, ids=[t.split()[0] for t, _ in BAD_FILES])
def test_config_file_mistakes_are_one_line_errors_naming_the_key(tmp_path, corpus, text, message):
    (tmp_path / "run.toml").write_text(text + "\n", encoding="utf-8")
    before = snapshot(tmp_path)
    assert_one_line_error(invoke(train_cli, ["--config", "run.toml", "--data", "corpus.txt", *flags(TINY_API_KW)]),
                          "^error: run.toml: " + message)
    with pytest.raises(ConfigError, match="^run.toml: " + message):
        train(config="run.toml")
    assert snapshot(tmp_path) == before  # nothing written: no run directory, no cache entry


def test_unreadable_config_files(tmp_path, corpus):
    (tmp_path / "bad.toml").write_text("n-layer = \n")
    (tmp_path / "latin1.toml").write_bytes('sample-prompt = "caf\xe9"\n'.encode("latin-1"))
    (tmp_path / "folder.toml").mkdir()
    before = snapshot(tmp_path)
    for name, pattern in (("nope.toml", r"config file not found: nope.toml; pass --config an existing TOML file"),
                          ("bad.toml", r"config file bad.toml is not valid TOML \(.*line 1.*\); write one setting"),
                          ("latin1.toml", r"config file latin1.toml is not UTF-8 \(byte offset 20\)"),
                          ("folder.toml", r"cannot read config file folder.toml \(Is a directory\)")):
        assert_one_line_error(invoke(train_cli, ["--config", name, *flags(TINY_API_KW)]), "^error: " + pattern)
    assert_one_line_error(invoke(train_cli, ["--config", "", *flags(TINY_API_KW)]), r"--config is an empty path")
    r = invoke(train_cli, ["--preset", "huge"])
    assert r.exit_code == 2 and "'huge' is not one of 'auto', 'tiny', 'cpu'" in r.stderr  # click's own usage error
    with pytest.raises(ConfigError, match=r"^preset 'tinyy' is not a preset; did you mean 'tiny'\?"):
        train(preset="tinyy")
    assert snapshot(tmp_path) == before


def test_toml_values_read_back_exactly():
    values = {"sample-prompt": 'a "quote" \\ back\nnew\ttab \x7f \u00e9 \u4e2d \U0001f600', "learning-rate": 1e-05,
              "min-lr": 6.000000000000001e-05, "n-layer": 12, "compile": False, "dropout": 0.0}
    text = "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
    assert tomllib.loads(text) == values


# --- config.toml: a run's settings, repeated --------------------------------------------------------------------
def test_config_toml_repeats_the_run_into_a_new_run_directory(tmp_path, corpus):
    (tmp_path / "run.toml").write_text('max-iters = 6\neval-interval = 3\nsample-prompt = "To "\n')
    first = invoke(train_cli, ["--preset", "tiny", "--config", "run.toml", "--data", "corpus.txt", "--out-dir", "a",
                               *flags({**TINY_API_KW, "max_iters": 4, "eval_interval": 2}), "--learning-rate", "0.01"])
    assert first.exit_code == 0, first.stderr
    assert "preset: tiny (--preset)" in first.stderr
    assert "from run.toml: --sample-prompt 'To '" in first.stderr  # its max-iters and eval-interval were overridden
    saved = read_config_file(tmp_path / "a" / "config.toml")
    assert saved["preset"] == "tiny" and saved["max_iters"] == 4 and saved["learning_rate"] == 0.01
    assert saved["data"] == str(corpus.resolve()) and "out_dir" not in saved and "config" not in saved

    again = invoke(train_cli, ["--config", "a/config.toml"])  # from another folder it would find the corpus too
    assert again.exit_code == 0, again.stderr
    run_b = again.stdout.strip()
    assert run_b == os.path.join("checkpoints", "corpus")  # a new run directory, where a run with no --out-dir goes
    meta_a, meta_b = read_meta(tmp_path / "a" / "latest.safetensors")[0], read_meta(tmp_path / run_b /
                                                                                    "latest.safetensors")[0]
    assert meta_a["model_config"] == meta_b["model_config"]
    a, b = asdict(meta_a["train_config"]), asdict(meta_b["train_config"])
    differ = {k for k in a if a[k] != b[k]}
    assert differ == {"out_dir", "config"}  # where it went, what it was read from (checkpoints store paths absolute)
    losses = [[(r["step"], r["train_loss"], r["val_loss"]) for r in map(json.loads, open(d / "metrics.jsonl"))]
              for d in (tmp_path / "a", tmp_path / run_b)]
    assert losses[0] == losses[1] and len(losses[0]) == 3  # the same run, step for step

    # resuming with the file: what it repeats changes nothing, a model it changes is named as the clash
    resumed = invoke(train_cli, ["--config", "a/config.toml", "--out-dir", "a", "--resume", "--max-iters", "6"])
    assert resumed.exit_code == 0, resumed.stderr
    assert "resuming a at step 4" in resumed.stderr
    assert "from a/config.toml: --dtype float32 --threads 1\n" in resumed.stderr  # hardware: from this command
    (tmp_path / "wide.toml").write_text("n-embd = 32\n")
    assert_one_line_error(invoke(train_cli, ["--config", "wide.toml", "--out-dir", "a", "--resume"]),
                          r"--resume: flags disagree with the checkpoint's model: --n-embd 32 from wide.toml "
                          r"\(checkpoint: 16\)")


def test_config_toml_holds_every_setting_and_no_null():
    model_kw, cfg, _ = new_run_settings({"preset": "cpu", "max_time": 60, "sample_prompt": "Q:"})
    text = config_toml(ModelConfig(**model_kw, vocab_size=65), cfg)
    values = tomllib.loads(text)
    assert values["max-time"] == 60 and values["max-iters"] == 10**12 and "# no step limit" in text
    assert "min-lr" not in values and "vocab-size" not in values  # None: not set; the vocabulary is the corpus's
    with open("written.toml", "w", encoding="utf-8") as f:  # the cwd is the test's tmp_path
        f.write(text)
    model_kw2, cfg2, _ = new_run_settings({"config": "written.toml"})
    assert ModelConfig(**model_kw2) == ModelConfig(**model_kw)  # nothing lost, nothing added
    assert {**vars(cfg2), "config": None} == vars(cfg)


# --- early stopping -------------------------------------------------------------------------------------------
@pytest.fixture
def scripted_losses(monkeypatch):
    """Validation losses in the order evaluations ask for them (the train loss is the same number)."""
    queue = []

    def fake(model, batches, cfg, device, dtype, dist, check_stop=None, iters=None):
        loss = queue.pop(0)
        return {"train": loss, "val": loss}
    monkeypatch.setattr(validate, "estimate_loss", fake)
    return queue


def test_patience_stops_saves_and_resumes_consistently(tmp_path, corpus, scripted_losses):
    scripted_losses += [3.0, 2.0, 2.5, 2.1]  # steps 0, 2, 4, 6: the best at 2, then two without improvement
    logs = []
    summary = chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", **{**TINY_API_KW, "max_iters": 20,
                                                                                  "eval_interval": 2}, patience=2)
    assert summary["step"] == 6 and summary["stopped_by"] == "patience" and summary["stopped_early"]
    assert "stopped early at step 6: no improvement in 2 evaluations (best val loss 2.0000)" in logs
    assert any(line.startswith("done: 6 steps (stopped early: no improvement in 2 evaluations)") for line in logs)
    state = read_meta(tmp_path / "run" / "state.safetensors")[0]
    assert state["step"] == 6 and state["run_state"]["since_best"] == 2 and state["run_state"]["evaluated"]
    assert read_meta(tmp_path / "run" / "best.safetensors")[0]["step"] == 2

    before = snapshot(tmp_path / "run")
    assert_one_line_error(invoke(train_cli, ["--out-dir", "run", "--resume"]),
                          r"--resume: the run in run stopped early at step 6 \(no new best validation loss in 2 "
                          r"evaluations\); to train on, raise --patience above 2, or pass --patience 0")
    assert snapshot(tmp_path / "run") == before

    scripted_losses.append(2.2)  # more patience: the count goes on from the 2 it was saved with
    summary = resume(patience=3)
    assert summary["step"] == 8 and summary["stopped_by"] == "patience"
    scripted_losses += [2.0, 2.0]  # a loss equal to the best is no improvement
    summary = resume(patience=5, max_iters=14)
    assert summary["step"] == 12 and summary["stopped_by"] == "patience" and not scripted_losses
    steps = [json.loads(line)["step"] for line in open(tmp_path / "run" / "metrics.jsonl")]
    assert steps == [0, 2, 4, 6, 8, 10, 12]


def test_patience_counts_across_an_interrupted_budget(tmp_path, corpus, scripted_losses):
    scripted_losses += [3.0, 2.0, 2.5]  # steps 0, 2, 4: one evaluation without improvement when the budget ends
    assert train(out_dir="run", max_iters=4, eval_interval=2, patience=2)["stopped_by"] == "max_iters"
    scripted_losses += [2.4]
    summary = resume(max_iters=20)
    assert summary["step"] == 6 and summary["stopped_by"] == "patience"


# --- samples while training ---------------------------------------------------------------------------------
def test_sample_every_shows_and_keeps_samples_without_changing_training(tmp_path, corpus):
    r = invoke(train_cli, ["--data", "corpus.txt", "--out-dir", "run", *flags({**TINY_API_KW, "max_iters": 6}),
                           "--sample-every", "2", "--sample-chars", "12", "--sample-prompt", "To "])
    assert r.exit_code == 0, r.stderr
    rows = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl", encoding="utf-8")]
    assert [row["step"] for row in rows] == [2, 4, 6] and all(row["prompt"] == "To " for row in rows)
    assert all(len(row["text"]) == 12 for row in rows)
    assert not (tmp_path / "run" / "curves.png").exists()  # --no-curves (in TINY_API_KW): nothing drawn
    for row in rows:
        assert f"--- sample at step {row['step']} ---\nTo {row['text']}\n---" in r.stderr
    # the last one is what sampling writes from the checkpoint of that step, with the run's seed
    gen = chargpt.load(tmp_path / "run" / "latest.safetensors", device="cpu")
    assert gen.generate("To ", max_new_tokens=12, temperature=0.8, seed=1337)[0] == rows[-1]["text"]
    # and sampling leaves training alone: the same losses as a run without samples
    train(out_dir="plain", max_iters=6)
    metrics = [[(m["step"], m["val_loss"]) for m in map(json.loads, open(tmp_path / d / "metrics.jsonl"))]
               for d in ("run", "plain")]
    assert metrics[0] == metrics[1]

    # a resumed run drops samples logged past its saved step (a kill between them), then samples on
    with open(tmp_path / "run" / "samples.jsonl", "a") as f:
        f.write(json.dumps({"step": 8, "prompt": "To ", "text": "left by a killed run"}) + "\n")
    resume(max_iters=8)
    rows = [json.loads(line) for line in open(tmp_path / "run" / "samples.jsonl", encoding="utf-8")]
    assert [row["step"] for row in rows] == [2, 4, 6, 8] and rows[-1]["text"] != "left by a killed run"


def test_sample_settings_that_cannot_work_are_refused(tmp_path, corpus):
    before = snapshot(tmp_path)
    assert_one_line_error(invoke(train_cli, ["--data", "corpus.txt", *flags(TINY_API_KW), "--sample-prompt", "Zoë"]),
                          r"--sample-prompt has characters the corpus does not: 'Z' \(U\+005A\) at 0, 'ë'")
    assert_one_line_error(invoke(train_cli, ["--data", "corpus.txt", *flags(TINY_API_KW), "--sample-every", "5"]),
                          r"--sample-every needs --sample-chars above 0 \(the length of each sample\); drop "
                          r"--sample-chars 0")
    with pytest.raises(ConfigError, match=r"^sample_every must be non-negative"):
        train(sample_every=-1)
    assert {k for k in snapshot(tmp_path) if not k.startswith("cache")} == \
        {k for k in before if not k.startswith("cache")}  # the corpus was cached; no run was left behind


# --- the end of every run -----------------------------------------------------------------------------------------
def test_every_run_ends_with_its_curves_and_records_its_processes(tmp_path, corpus):
    logs = []
    chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", **{**TINY_API_KW, "curves": True})
    assert read_meta(tmp_path / "run" / "latest.safetensors")[0]["world_size"] == 1
    assert run_info(tmp_path / "run")["processes"] == 1
    if importlib.util.find_spec("matplotlib") is None and os.environ.get("CI") != "true":
        pytest.skip("matplotlib is not installed (pip install -e '.[plots]')")
    assert (tmp_path / "run" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"loss curves: {os.path.join('run', 'curves.png')}" in logs


def test_the_chargpt_group_serves_the_playground():
    from chargpt import serve
    assert main.get_command(None, "serve") is serve.main  # python -m chargpt.serve is the same command
    r = CliRunner().invoke(main, ["serve", "--help"])
    assert r.exit_code == 0 and "--checkpoints" in r.stdout and "web playground" in r.stdout
