"""Shared fixtures: every test runs hermetically — cache and run directories live under tmp_path — and leaves the
process as it found it (process_unchanged). Plain helpers (constants and functions a test imports) live in
helpers.py."""

import logging
import os
import signal

import pytest
import torch

from chargpt.config import ModelConfig


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: runs on a CUDA GPU (tests/test_cuda.py); other tests run on the CPU")
    config.addinivalue_line("markers", "dtype: what it checks depends on whether chargpt counts the CPU as having "
                                       "native bf16; .ci/run runs these again with CHARGPT_CPU_BF16 set to the other "
                                       "kind (docs/contributing.md)")


def pytest_addoption(parser):
    parser.addoption("--reverse-files", action="store_true",
                     help="run the test files in reverse order (each file's tests in their own): a test that passes "
                          "only after another file's has left something behind fails (docs/contributing.md)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("reverse_files"):
        files = list(dict.fromkeys(item.path for item in items))
        rank = {path: -i for i, path in enumerate(files)}
        items.sort(key=lambda item: rank[item.path])  # stable: within a file the order stays


def pytest_sessionstart(session):
    # One torch thread per worker process, for the whole session (pyproject.toml's addopts: a worker per core); a
    # test that changes it fails (process_unchanged).
    torch.set_num_threads(1)


# What one test could change for the tests after it in the same worker: each is restored and named by
# process_unchanged. (torch's interop threads can be set once per process, so only compared.)
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK") if hasattr(signal, name))
# torch's own set-up, done once per process at its first torch.compile (its trace logger drops its handler, inductor
# publishes an address in the environment): no test's doing, and none for a test to undo.
ONCE_PER_PROCESS_ENV, ONCE_PER_PROCESS_LOGGER = "_TORCHINDUCTOR_", "torch.__trace"


def process_state():
    """name -> value of each piece of process-wide state a test must leave as it was."""
    state = {f"the {signal.Signals(sig).name} handler": signal.getsignal(sig) for sig in SIGNALS}
    if hasattr(signal, "pthread_sigmask"):  # a blocked SIGINT never reaches its handler
        state["the blocked signals"] = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    environ = {k: v for k, v in os.environ.items()  # PYTEST_CURRENT_TEST: pytest's own, set at each phase
               if k != "PYTEST_CURRENT_TEST" and not k.startswith(ONCE_PER_PROCESS_ENV)}
    state.update({"os.environ": environ, "the working directory": os.getcwd(),
                  "torch's default dtype": torch.get_default_dtype(), "torch's threads": torch.get_num_threads(),
                  "torch's interop threads": torch.get_num_interop_threads()})
    loggers = {"": logging.getLogger(), **{name: logger for name, logger in logging.root.manager.loggerDict.items()
                                            if isinstance(logger, logging.Logger) and name != ONCE_PER_PROCESS_LOGGER}}
    for name, logger in loggers.items():
        shown = f"logger {name!r}" if name else "the root logger"
        state[f"{shown}'s handlers"] = list(logger.handlers)
        state[f"{shown}'s level"] = logger.level
    return state


def changes(before, after):
    """-> one line per piece of state that differs (for os.environ: the variables set, unset or changed)."""
    lines = []
    for name in before.keys() | after.keys():
        was, now = before.get(name), after.get(name)
        if was == now or name.startswith("logger ") and (was is None or now is None):  # a logger made meanwhile
            continue
        if name == "os.environ":
            lines += [f"os.environ[{key!r}]: {was.get(key)!r} -> {now.get(key)!r}"
                      for key in sorted(was.keys() | now.keys()) if was.get(key) != now.get(key)]
        else:
            lines.append(f"{name}: {was!r} -> {now!r}")
    return sorted(lines)


def restore(state):
    """Put back what process_state read (all but interop threads, which cannot be set again)."""
    for sig in SIGNALS:
        handler = state[f"the {signal.Signals(sig).name} handler"]
        signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    if "the blocked signals" in state:
        signal.pthread_sigmask(signal.SIG_SETMASK, state["the blocked signals"])
    for key in os.environ.keys() - state["os.environ"].keys():
        if key != "PYTEST_CURRENT_TEST" and not key.startswith(ONCE_PER_PROCESS_ENV):
            del os.environ[key]
    os.environ.update(state["os.environ"])
    os.chdir(state["the working directory"])
    torch.set_default_dtype(state["torch's default dtype"])
    torch.set_num_threads(state["torch's threads"])
    for name in [""] + list(logging.root.manager.loggerDict):
        shown = f"logger {name!r}" if name else "the root logger"
        if f"{shown}'s handlers" in state:
            logger = logging.getLogger(name)
            logger.handlers[:] = state[f"{shown}'s handlers"]
            logger.setLevel(state[f"{shown}'s level"])


@pytest.fixture(autouse=True)
def process_unchanged():
    """Fails the test that leaves a signal handler, an environment variable, the working directory, torch's dtype or
    threads, or a logger's handlers or level changed, naming each (and puts it back): in one worker every test runs
    after others, in an order set by xdist (and --reverse-files), and a test that inherits another's Ctrl-C
    handler fails in the full suite only, never alone. hermetic requests it, so it is set up before monkeypatch and
    every other fixture of the test, and torn down after them: it compares once they have undone what they did.
    (A logger first made during the test is left out: a library imported late sets its own up once.)"""
    before = process_state()
    yield
    changed = changes(before, process_state())
    if changed:
        restore(before)
        pytest.fail("the test changed the process for the tests after it:\n  " + "\n  ".join(changed),
                    pytrace=False)


@pytest.fixture(autouse=True)
def hermetic(process_unchanged, tmp_path, monkeypatch, request):
    """Encoded-corpus cache and the default checkpoints/ folder go under tmp_path. A test runs on the CPU unless
    marked `cuda`: --device auto finds no GPU, in this process or in the ones it starts, so every test checks the
    same thing on a machine with a GPU (where a GPU changes presets, dtypes and timing)."""
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))  # torch.compile's disk cache
    monkeypatch.chdir(tmp_path)
    if request.node.get_closest_marker("cuda") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
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
