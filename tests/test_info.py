"""chargpt info: what a run is, from the headers of its files (never the weights)."""

import json
import re
from dataclasses import asdict

import pytest
import safetensors
from click.testing import CliRunner
from helpers import run_chargpt

import chargpt.runs.checkpoint as ckpt_module
import chargpt.runs.info as runinfo_module
from chargpt.cli import info_cli
from chargpt.config import FORMAT_VERSION, ModelConfig, TrainConfig
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import (
    checkpoint_meta,
    load_model,
    model_tensors,
    save_model,
    saved_train_config,
    write_safetensors,
)
from chargpt.runs.info import format_info, run_info
from chargpt.textio import escape


def test_info_reports_the_run(tiny_run):
    info = run_info(tiny_run)
    model, vocab, _ = load_model(tiny_run)
    metrics = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    assert info["parameters"] == model.num_params()  # from tensor shapes, tied embedding counted once
    assert info["vocab_size"] == len(vocab) and info["model_config"]["n_embd"] == 16
    assert info["steps"] == 20 and info["evaluations"] == len(metrics) == 3
    assert info["best_val_loss"] == pytest.approx(min(m["val_loss"] for m in metrics), abs=1e-6)
    assert info["best_val_bpc"] == pytest.approx(min(m["val_bpc"] for m in metrics), abs=1e-5)
    assert info["characters_seen"] == 20 * 4 * 16  # steps x batch x context
    assert info["training_time_s"] > 0 and info["train_config"].max_iters == 20
    assert info["format_version"] == FORMAT_VERSION
    assert info["files"] == {p.name: p.stat().st_size for p in tiny_run.iterdir()}
    assert set(info["files"]) >= {"best.safetensors", "latest.safetensors", "state.safetensors", "metrics.jsonl"}


def test_info_reads_headers_only(tiny_run, monkeypatch):
    """No tensor is ever read: a safe_open whose get_tensor fails does not bother run_info."""
    real = safetensors.safe_open

    class HeadersOnly:
        def __init__(self, *args, **kw):
            self.f = real(*args, **kw)

        def __enter__(self):
            self.f.__enter__()
            return self

        def __exit__(self, *exc):
            return self.f.__exit__(*exc)

        def get_tensor(self, name):
            raise AssertionError(f"read tensor {name}")

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(ckpt_module, "safe_open", HeadersOnly)
    monkeypatch.setattr(runinfo_module, "safe_open", HeadersOnly)
    assert run_info(tiny_run)["parameters"] > 0


def test_vocabulary_preview_makes_whitespace_visible(tmp_path):
    vocab = Vocab(sorted("\t\n a\u3000b"))
    cfg = ModelConfig(vocab_size=len(vocab), block_size=8, n_layer=1, n_head=1, n_embd=8, dropout=0.0)
    save_model(tmp_path / "m.safetensors", CharGPT(cfg), vocab, step=3)
    info = run_info(tmp_path / "m.safetensors")  # a lone checkpoint file: no run directory, no training config
    assert info["vocab_preview"] == "\\t\\n ab\\u3000" and info["steps"] == 3 and info["train_config"] is None
    text = format_info(info)
    assert '"\\t\\n ab\\u3000"' in text and "m.safetensors" in text
    assert escape("a\rb\\\x0b😀") == "a\\rb\\\\\\u000b😀"


def test_info_command(tiny_run):
    r = run_chargpt("info", tiny_run)
    assert r.returncode == 0, r.stderr
    for needle in ("parameters", "20 steps", "best val loss", "bits/char", "characters seen", "checkpoint format",
                   "state.safetensors", '"\\n '):
        assert needle in r.stdout, needle
    r = CliRunner().invoke(info_cli, [str(tiny_run), "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout)["steps"] == 20


@pytest.mark.parametrize("args,needle", [
    ([], "no trained run under checkpoints/"),
    (["junk.safetensors"], "not a readable"),
    (["missing"], "checkpoint not found: missing"),
])
def test_info_bad_input_is_one_line(tmp_path, args, needle):
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 20)
    r = CliRunner().invoke(info_cli, args)
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_info_counts_processes_in_good_english_and_names_the_split(tiny_run):
    text = format_info(run_info(tiny_run))
    assert "per step, on 1 process)" in text and "1 processes" not in text
    assert "10% for validation, in blocks spread through it" in text
    info = run_info(tiny_run)
    saved_before = {k: v for k, v in asdict(info["train_config"]).items() if k != "val_split"}  # an older checkpoint
    old = {**info, "processes": 2, "train_config": saved_train_config(saved_before)}
    text = format_info(old)
    assert "on 2 processes)" in text and "the last 10% for validation" in text  # from before --val-split: the tail


# Screen clear, OSC window title and clipboard writes, an 8-bit CSI, a forged line, a bidi override, a BEL.
HOSTILE = "\x1b[2J\x1b]0;owned\x07\x1b]52;c;ZXZpbA==\x07\x9b31m\n\rforged: line\u202e\x00"
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202e]")  # what must never reach the terminal as it is


def test_info_shows_a_hostile_checkpoint_s_strings_escaped_never_as_terminal_codes(tmp_path):
    """A checkpoint from anywhere: every string its metadata holds (corpus, the run it started from, the
    training settings, when it was saved) is printed escaped, in the human format and in --json."""
    vocab = Vocab(sorted("ab\n"))
    cfg = ModelConfig(vocab_size=len(vocab), block_size=8, n_layer=1, n_head=1, n_embd=8, dropout=0.0)
    (tmp_path / "evil").mkdir()
    lineage = {"path": HOSTILE, "weights": HOSTILE, "corpus": HOSTILE, "step": HOSTILE, "val_loss": 1.0,
               "task": HOSTILE, "base_vocab_size": 2, "added_chars": HOSTILE}
    model = CharGPT(cfg)  # a file written by hand, not by chargpt: its train config as the attacker typed it
    meta = checkpoint_meta(model, vocab, TrainConfig(), corpus=HOSTILE, init_from=lineage, saved_at=HOSTILE,
                           world_size=HOSTILE)
    meta["train_config"] |= {"preset": HOSTILE, "data": HOSTILE, "encoding": HOSTILE}
    write_safetensors(tmp_path / "evil" / "best.safetensors", model_tensors(model), meta)
    text = format_info(run_info(tmp_path / "evil"))
    assert not RAW.search(text), repr(text)
    assert not any(line.lstrip().startswith("forged") for line in text.splitlines())
    assert escape(HOSTILE, backslashes=False) in text  # shown, escaped: \u001b[2J ... \n\rforged
    assert "\\u001b[2J\\u001b]0;owned\\u0007" in text and "\\n\\rforged" in text
    for line in ("corpus", "started from", "saved", "training config"):
        assert re.search(rf"^{line} .*\\u001b\[2J", text, re.M), line
    r = CliRunner().invoke(info_cli, [str(tmp_path / "evil")])
    assert r.exit_code == 0 and not RAW.search(r.stdout), repr(r.stdout)
    r = CliRunner().invoke(info_cli, [str(tmp_path / "evil"), "--json"])
    assert r.exit_code == 0 and not RAW.search(r.stdout), repr(r.stdout)
    assert json.loads(r.stdout)["corpus"] == HOSTILE  # the same value, written with \u escapes
