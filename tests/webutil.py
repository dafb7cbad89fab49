"""Helpers shared by the web playground's tests (test_serve.py, test_browser.py)."""

import importlib
import json
import os
import urllib.request

import pytest

import chargpt

TEXT = "".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth teach the torches.\n"
               for i in range(60))
TINY = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
            threads=1, sample_chars=0, dtype="float32", curves=False)


def need(module):
    """Import an optional test dependency; skip without it, except in CI (CI=true), where it must be there."""
    if os.environ.get("CI") == "true":
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e \".[web,test]\")")


def train_tiny(root, name="tiny", steps=30, seed=1337):
    """A real run in root/name, trained for a few steps (a second or two); -> its directory."""
    corpus = root.parent / f"{root.name}-corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / name), cache_dir=str(root.parent / f"{root.name}-cache"),
                  max_iters=steps, eval_interval=10, seed=seed, log=lambda *a: None, **TINY)
    return root / name


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
