"""Shared fixtures: every test runs hermetically — cache and run directories live under tmp_path. Plain helpers
(constants and functions a test imports) live in helpers.py."""

import pytest
import torch

from chargpt.config import ModelConfig


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on a CUDA GPU (tests/test_cuda.py); other tests run on the CPU")
    config.addinivalue_line("markers", "dtype: what it checks depends on whether chargpt counts the CPU as having "
                                       "native bf16; .ci/run runs these again with CHARGPT_CPU_BF16 set to the other "
                                       "kind (docs/contributing.md)")


@pytest.fixture(autouse=True)
def hermetic(tmp_path, monkeypatch, request):
    """Encoded-corpus cache and the default checkpoints/ folder go under tmp_path; one torch thread. A test runs on
    the CPU unless marked `cuda`: --device auto finds no GPU, in this process or in the ones it starts, so every
    test checks the same thing on a machine with a GPU (where a GPU changes presets, dtypes and timing)."""
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))  # torch.compile's disk cache
    monkeypatch.chdir(tmp_path)
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
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


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A run trained for 20 steps (about a second), shared by the eval, info, plot and command tests. Read it;
    copy it before changing anything in it."""
    import chargpt
    root = tmp_path_factory.mktemp("tiny_run")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth teach the "
                              f"torches.\n" for i in range(60)), encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / "run"), cache_dir=str(root / "cache"), max_iters=20,
                  eval_interval=10, device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4,
                  eval_iters=2, dropout=0.0, threads=1, sample_chars=0, dtype="float32", learning_rate=3e-3,
                  warmup_iters=5, log=lambda *a: None)
    return root / "run"
