"""The `chargpt` command: one group over the same command objects as train.py and sample.py, and a user's
whole session with it on a tiny run."""

import importlib.util
import json
import os

import pytest
from click.testing import CliRunner
from helpers import ROOT, TINY_FLAGS, run_chargpt

from chargpt.cli import eval_cli, main, sample_cli, train_cli
from chargpt.config import TrainConfig


def test_subcommands_share_one_definition_with_train_and_sample():
    assert main.commands["train"] is train_cli and main.commands["sample"] is sample_cli
    assert set(main.list_commands(None)) == {"train", "sample", "translate", "eval", "info", "novelty", "plot",
                                             "bench", "data", "serve", "export", "report"}
    eval_params = {p.name: p for p in eval_cli.params}
    sample_params = {p.name: p for p in sample_cli.params}
    assert eval_params["checkpoint_path"] is sample_params["checkpoint_path"]
    assert eval_params["device"] is sample_params["device"]
    encoding = next(f for f in TrainConfig.__dataclass_fields__.values() if f.name == "encoding")
    assert eval_params["encoding"].help.startswith(encoding.metadata["help"])
    assert eval_params["encoding"].default == "utf-8"


def test_python_dash_m_chargpt_lists_the_subcommands():
    r = run_chargpt("--help")
    assert r.returncode == 0, r.stderr
    assert all(f"  {name} " in r.stdout for name in ("train", "sample", "eval", "info", "plot", "bench", "data",
                                                    "serve", "export"))


def test_console_script_and_plots_extra_are_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["chargpt"] == "chargpt.__main__:chargpt"  # a Ctrl-C while it starts is quiet
    assert any(d.startswith("matplotlib") for d in project["optional-dependencies"]["plots"])
    extras = project["optional-dependencies"]
    assert any(d.startswith("chargpt[") and "plots" in d for d in extras["test"])  # the tests install the plots
    assert '".[test]"' in (ROOT / ".ci" / "run").read_text()


def test_bench_passes_its_arguments_through():
    r = CliRunner().invoke(main, ["bench", "--help"])
    assert r.exit_code == 0 and "usage: chargpt bench" in r.stdout and "--only" in r.stdout


def test_a_session_with_the_chargpt_command(corpus, tmp_path):
    """train, sample, info, eval and plot on one tiny run, through the group (train as a real process)."""
    run = tmp_path / "run"
    r = run_chargpt("train", "--data", corpus, "--out-dir", run, "--max-iters", "20", "--eval-interval", "10",
                    "--warmup-iters", "5", "--learning-rate", "3e-3", *TINY_FLAGS)
    assert r.returncode == 0, r.stderr
    assert (run / "best.safetensors").exists()

    def chargpt(*args):
        result = CliRunner().invoke(main, [str(a) for a in args])
        assert result.exit_code == 0, result.stderr
        return result.stdout

    out = chargpt("sample", "--checkpoint", run, "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "1")
    assert out.startswith("ROMEO:") and len(out.rstrip("\n")) == 26
    info = json.loads(chargpt("info", run, "--json"))
    assert info["steps"] == 20 and info["vocab_size"] == len(set(corpus.read_text()))
    result = json.loads(chargpt("eval", "--checkpoint", run, "--data", corpus, "--json"))
    assert result["scored"] == len(corpus.read_text()) - 1 and result["unknown"] == 0
    assert 0 < result["loss"] < info["best_val_loss"] + 0.5
    if importlib.util.find_spec("matplotlib") or os.environ.get("CI"):  # CI installs the plots extra
        chargpt("plot", run, "-o", tmp_path / "curves.png")
        assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_unknown_subcommand_is_a_usage_error():
    r = CliRunner().invoke(main, ["evaluate"])
    assert r.exit_code == 2 and "No such command 'evaluate'" in r.stderr
