"""Shared fixtures: every test runs hermetically — cache and run directories live under tmp_path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from chargpt.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch):
    """Encoded-corpus cache and the default checkpoints/ folder go under tmp_path; one torch thread."""
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    yield


@pytest.fixture
def tiny_config():
    return ModelConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


@pytest.fixture
def corpus(tmp_path):
    """A small English corpus with enough structure for a model to learn from in a few steps."""
    text = "".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth teach the torches.\n"
                   for i in range(60))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


# Flags for a training run that finishes in a second or two on one CPU thread.
TINY = ["--device", "cpu", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
        "--batch-size", "4", "--eval-iters", "2", "--dropout", "0", "--threads", "1", "--sample-chars", "0",
        "--dtype", "float32"]


def run_cli(script, *args, timeout=120, **kw):
    """Run train.py / sample.py as a user would; -> CompletedProcess with text stdout/stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)
