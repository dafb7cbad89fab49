"""What the tests share, in one place: running the commands, tiny runs, checking errors, small models for sampling,
training processes to interrupt, the sentence-pairs cipher task, the web playground, and a local download server.
Test files import from here (`from helpers import ...`), never from one another; fixtures stay in conftest.py.
Optional dependencies (playwright, starlette) are imported inside the tests that need them, through need()."""

import hashlib
import http.server
import importlib
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils._python_dispatch import TorchDispatchMode

import chargpt
from chargpt.config import ModelConfig
from chargpt.data.corpora import Corpus
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.sampling.engine import Generator

# --- running the commands -----------------------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parent.parent


def run_cli(script, *args, timeout=120, **kw):
    """Run train.py / sample.py as a user would; -> CompletedProcess with text stdout/stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def run_chargpt(*args, timeout=120, **kw):
    """Run the `chargpt` command (python -m chargpt) as a user would; -> CompletedProcess with text output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kw.pop("env", {})}
    return subprocess.run([sys.executable, "-m", "chargpt", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env, **kw)


def flags(kw):
    """{'n_embd': 16, 'resume': True} -> ['--n-embd', '16', '--resume']"""
    out = []
    for k, v in kw.items():
        name = "--" + k.replace("_", "-")
        out += [name] if v is True else [f"--no-{k.replace('_', '-')}"] if v is False else [name, str(v)]
    return out


def invoke(cli, args):
    """A CLI run in this process through click's CliRunner (a subprocess per case would cost seconds of torch
    import)."""
    return CliRunner().invoke(cli, [str(a) for a in args])


# --- tiny runs ----------------------------------------------------------------------------------------------------
# Flags for a training run that finishes in a second or two on one CPU thread.
TINY_FLAGS = ["--device", "cpu", "--n-layer", "1", "--n-head", "2", "--n-embd", "16", "--block-size", "16",
              "--batch-size", "4", "--eval-iters", "2", "--dropout", "0", "--threads", "1", "--sample-chars", "0",
              "--dtype", "float32", "--no-curves", "--verbose"]  # every start-up line: tests read them

# chargpt.train keyword arguments for a training run of well under a second on one CPU thread: two steps,
# evaluated after each, no curves drawn.
TINY_API_KW = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
                   threads=1, sample_chars=0, dtype="float32", warmup_iters=0, max_iters=2, eval_interval=1,
                   curves=False, verbose=True)

# chargpt.train keyword arguments for the tiny model on the CPU, with no length set: the test says how long it runs.
TINY_RUN_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2,
                   dropout=0.0, threads=1, sample_chars=0, dtype="float32", warmup_iters=0, verbose=True)

# chargpt.train keyword arguments for the runs the playground serves (train_tiny).
TINY_WEB_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2,
                   dropout=0.0, threads=1, sample_chars=0, dtype="float32", curves=False, verbose=True)

# The corpus train_tiny trains on.
CORPUS_TEXT = "".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth teach the torches.\n"
                      for i in range(60))


def train_tiny(root, name="tiny", steps=30, seed=1337):
    """A real run in root/name, trained for a few steps (a second or two); -> its directory."""
    corpus = root.parent / f"{root.name}-corpus.txt"
    corpus.write_text(CORPUS_TEXT, encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / name), cache_dir=str(root.parent / f"{root.name}-cache"),
                  max_iters=steps, eval_interval=10, seed=seed, log=lambda *a: None, **TINY_WEB_KW)
    return root / name


# --- checking errors ----------------------------------------------------------------------------------------------
def snapshot(root):
    """Every path under root with its size and content hash: 'nothing on disk changed' is snapshot equality."""
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else "dir") for p in sorted(root.rglob("*"))}


def assert_one_line_error(result, pattern):
    """Exit 1, exactly one line on stderr starting 'error:', the last one (after any log lines: training logs to
    stderr), matching pattern, and nothing escaped (an escaped exception is what would print a traceback outside
    the runner)."""
    assert isinstance(result.exception, SystemExit) and result.exit_code == 1, (result.exception, result.output)
    assert "Traceback" not in result.output
    shown = re.sub(r"[^\n]*\r", "", result.stderr)  # what a terminal shows: a progress bar cleared by \r is gone
    lines = [line for line in shown.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("error: "), result.stderr
    assert sum(line.startswith("error") for line in lines) == 1, result.stderr
    assert re.search(pattern, lines[-1]), lines[-1]
    return lines[-1]


def api_pattern(pattern):
    """The pattern as the Python API words the message: `--block-size 2` -> `block_size=2`, `--unknown skip` ->
    `unknown='skip'` (a message that still names the flag matches too)."""
    return re.sub(r"--([a-z][a-z0-9-]*)( ?)", lambda m: f"(?:--{m[1]}|{m[1].replace('-', '_')})"
                  + ("[= ]'?" if m[2] else ""), pattern)


# --- models for sampling ------------------------------------------------------------------------------------------
# Tiny models built in memory over a small alphabet.
MODEL_ALPHABET = "\n abcdefghijklmnopqrstuvwxyz"  # sorted, as a Vocab must be
VOCAB = Vocab(MODEL_ALPHABET)
MODEL_BLOCK = 16


def random_model(vocab_size=len(MODEL_ALPHABET), block_size=MODEL_BLOCK, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    model = CharGPT(cfg).eval()
    with torch.no_grad():
        model.wte.weight.mul_(10)  # a less flat next-character distribution than the 0.02-std init gives
    return model


def counter_model(vocab_size=len(MODEL_ALPHABET), block_size=MODEL_BLOCK):
    """A real CharGPT wired so that the character after id i is almost surely id i+1 (cyclic): attention and
    MLP add nothing, embeddings are one-hot and the head maps one-hot i to a large logit for i+1. It makes
    expected text easy to write down ("ab" -> "cdef...") through the real forward pass and KV cache."""
    cfg = ModelConfig(vocab_size=vocab_size, block_size=block_size, n_layer=1, n_head=1, n_embd=vocab_size,
                      dropout=0.0, bias=False, tie_weights=False)
    model = CharGPT(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0 if name.startswith(("ln_", "h.0.ln_")) else 0.0)
        model.wte.weight.copy_(torch.eye(vocab_size))
        model.lm_head.weight.copy_(10 * torch.eye(vocab_size).roll(1, dims=0))  # row j reads one-hot j-1
    return model


def counter_gen():
    return Generator(counter_model(), VOCAB, "cpu")


# --- training processes and faults --------------------------------------------------------------------------------
def start_training(tmp_path, *extra):
    """A real `python train.py` process, output to files (a full pipe would block it)."""
    out, err = open(tmp_path / "stdout.txt", "w"), open(tmp_path / "stderr.txt", "w")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--data", "corpus.txt", "--out-dir", "run",
                             *TINY_FLAGS, "--max-iters", "100000", *extra], stdout=out, stderr=err, env=env)
    out.close(), err.close()
    return proc


def wait_for_training(condition, proc, tmp_path, timeout=60.0, poll=0.005):
    """Wait until condition() holds; fail the test if the training process exits first or nothing happens in time."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            pytest.fail(f"training exited early ({proc.returncode}): {(tmp_path / 'stderr.txt').read_text()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("training made no progress")
        time.sleep(poll)


# --- sentence pairs -----------------------------------------------------------------------------------------------
# A synthetic translation task a tiny model learns in seconds, and a short run of the real trainer on it.
CIPHER_ALPHABET = "abcdefgh"
CIPHER = dict(zip(CIPHER_ALPHABET, "EFGHABCD"))
# Steps after which each architecture translates the held-out cipher pairs (99-100% exact match on every seed
# tried; the tests ask for 90%).
STEPS = {"decoder": 300, "encoder-decoder": 150}


def cipher(word):
    """The task: a fixed character substitution of the reversed string."""
    return "".join(CIPHER[c] for c in reversed(word))


def cipher_pairs(n, seed=0):
    rng = random.Random(seed)
    words = ["".join(rng.choice(CIPHER_ALPHABET) for _ in range(rng.randint(3, 6))) for _ in range(n)]
    return [(w, cipher(w)) for w in words]


def write_cipher(path, n=2000, seed=0):
    path.write_text("".join(f"{s}\t{t}\n" for s, t in cipher_pairs(n, seed)), encoding="utf-8")
    return path


def train_pairs(data, out_dir, arch="decoder", steps=None, cache_dir=None, **kw):
    """The real trainer on a pairs file with a tiny model (2 layers x 64, context 16): a few seconds on one thread."""
    settings = dict(task="pairs", arch=arch, max_iters=steps or STEPS[arch], eval_interval=100, device="cpu",
                    n_layer=2, n_head=4, n_embd=64, block_size=16, batch_size=32, eval_iters=2, dropout=0.0,
                    threads=1, dtype="float32", learning_rate=3e-3, optimizer="adamw", lr_schedule="cosine",
                    warmup_iters=50, eval_pairs=50, sample_chars=0, log=lambda *a: None)
    return chargpt.train(data=str(data), out_dir=str(out_dir), cache_dir=str(cache_dir) if cache_dir else None,
                         **{**settings, **kw})


# --- the playground -----------------------------------------------------------------------------------------------
# A training started from the page (chargpt/web/training.py): the size fields a person may send (TRAIN_SIZE), and
# the server's own flags for its children (create_app's train_args): one thread, float32, short samples, no curves.
TRAIN_SIZE = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4)
TRAIN_ARGS = ("--threads", "1", "--dtype", "float32", "--eval-iters", "2", "--sample-chars", "40", "--no-curves")


def need(module):
    """Import an optional test dependency; skip without it, except in CI (CI=true), where it must be there."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e \".[web,test]\")")


def parse_sse(text):
    """A server-sent events body -> [(event, data)]."""
    events = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        events.append((lines["event"], json.loads(lines["data"])))
    return events


def texts_of(events, num_samples):
    """The samples' texts, joined from the `text` events."""
    out = [""] * num_samples
    for event, data in events:
        if event == "text":
            for i, piece in data:
                out[i] += piece
    return out


def get(url):
    """GET from a running server -> parsed JSON."""
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def post(url, body):
    """A JSON POST to a running server -> (status, parsed JSON)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def open_stream(url, body):
    """Start a generation on a running server; -> (response, iterator of (event, data)) read as they arrive."""
    req = urllib.request.Request(url + "/api/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    response = urllib.request.urlopen(req, timeout=60)

    def events():
        event = None
        for raw in response:
            line = raw.decode("utf-8").rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                yield event, json.loads(line[6:])
    return response, events()


# --- a browser ------------------------------------------------------------------------------------------------------
# Debian's Chromium, driven by Playwright (tests/test_webpage.py); CHARGPT_CHROMIUM names another one.
CHROMIUM = os.environ.get("CHARGPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage"]  # as root in a container; a small /dev/shm


def launch_chromium(playwright):
    """Headless Chromium (CHROMIUM) from a sync_playwright() context."""
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


# --- a local download server --------------------------------------------------------------------------------------
BODY = bytes(range(256)) * 800  # 204,800 bytes: several reads of 64 KiB
# The corpus the server publishes: tests put it into chargpt.data.corpora.CORPORA under its name.
GOOD = Corpus("testcorpus", "test.txt", "http://unused.invalid/test.txt", hashlib.sha256(BODY).hexdigest(),
              len(BODY), "a test corpus")


class Server:
    """A local server for BODY at /<any name> (or files[name]). `drops`: how many responses break off after
    `drop_at` bytes; `ranges`: whether Range requests are honoured; `body`: what it serves. Records each request's
    Range and path."""

    def __init__(self):
        self.body, self.drops, self.drop_at, self.ranges, self.status = BODY, 0, 50_000, True, 200
        self.refuse_ranges = False  # answer a Range request with 416 Range Not Satisfiable
        self.requests, self.paths = [], []
        self.files = {}  # file name -> body served at /<that name>, instead of `body`
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append(rng)
                server.paths.append(self.path)
                body = server.files.get(self.path.rsplit("/", 1)[-1], server.body)
                if server.status != 200 or (rng and server.refuse_ranges):
                    self.send_error(416 if rng and server.refuse_ranges else server.status)
                    return
                start = int(rng[len("bytes="):].rstrip("-")) if rng and server.ranges else 0
                self.send_response(206 if start else 200)
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                if server.drops:
                    server.drops -= 1
                    self.wfile.write(body[start:start + server.drop_at])
                    self.close_connection = True
                    return
                self.wfile.write(body[start:])

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# --- counting casts ---------------------------------------------------------------------------------------------------
class WeightCasts(TorchDispatchMode):
    """Counts float32 -> bf16 casts of matrices (the linear weights; activations are 3-D)."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func is torch.ops.aten._to_copy.default and args[0].dim() == 2 and args[0].dtype == torch.float32
                and kwargs.get("dtype") == torch.bfloat16):
            self.count += 1
        return func(*args, **kwargs)


# --- a training the playground watches ------------------------------------------------------------------------------
def fake_training(app, tmp_path):
    """A child the server takes for its training: it counts the SIGTERMs it gets (one line each in `signals`)."""
    signals, ready = tmp_path / "signals", tmp_path / "ready"
    code = (f"import signal, time, pathlib\n"
            f"def got(*_): open({str(signals)!r}, 'a').write('TERM\\n')\n"
            f"signal.signal(signal.SIGTERM, got)\n"
            f"pathlib.Path({str(ready)!r}).touch()\n"
            f"time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    t = app.state.trainings
    t.proc, t.record = proc, {"run": "fake", "pid": proc.pid, "out_dir": str(t.root / "fake"),
                              "output": str(t.home / "logs" / "fake.log"), "command": [], "started": time.time(),
                              "ended": None, "state": "running", "exit_code": None, "stop_requested": False,
                              "budget": 60, "budget_start": 0.0}
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.02)
    return proc, signals


def sigterms(signals, at_least=0, settle=0.3):
    """How many SIGTERMs the fake training got: waited for until at least `at_least` (a busy machine delivers late),
    then `settle` seconds more for any that should not come."""
    def count():
        return signals.read_text().count("TERM") if signals.exists() else 0
    deadline = time.monotonic() + 30
    while count() < at_least and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(settle)
    return count()


# --- the six-word run (suggestions) ----------------------------------------------------------------------------------
TOY_WORDS = ["cat", "dog", "sat", "ran", "mat", "log"]


def train_toy_words(root):
    """A tiny model trained on 400 lines of the six TOY_WORDS in random order (about two seconds) -> its run
    directory, root/checkpoints/toy."""
    import chargpt
    rng = random.Random(0)
    (root / "toy.txt").write_text("".join(" ".join(rng.choice(TOY_WORDS) for _ in range(6)) + "\n" for _ in range(400)),
                                  encoding="utf-8")
    chargpt.train(**{**TINY_RUN_KW, "n_embd": 32}, data=str(root / "toy.txt"), out_dir=str(root / "checkpoints/toy"),
                  cache_dir=str(root / "cache"), max_iters=150, eval_interval=150, learning_rate=2e-2, seed=1,
                  log=lambda *a: None)
    return root / "checkpoints/toy"
