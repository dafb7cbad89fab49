"""The web playground's server (chargpt/web/): every endpoint through Starlette's test client, bad inputs
and traversal attempts, streamed text against sample.py, cancellation, limits, and the command itself.
One tiny run is trained per module (a second or two)."""

import json
import logging
import math
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import get, need, open_stream, parse_sse, post, texts_of, train_tiny

import chargpt
from chargpt.errors import ChargptError

need("starlette")
need("uvicorn")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.web import limits  # noqa: E402
from chargpt.web import runs as web_runs  # noqa: E402
from chargpt.web import server as serve  # noqa: E402
from chargpt.web.body import clipped  # noqa: E402
from chargpt.web.endpoints.page import PAGE_FILES  # noqa: E402
from chargpt.web.middleware import host_name  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HERE = "http://127.0.0.1"  # the Host the app answers by default (DNS-rebinding guard)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    train_tiny(root)
    return root


@pytest.fixture
def client(served):
    return TestClient(serve.create_app(served, device="cpu"), base_url=HERE)


def generate(client, **body):
    r = client.post("/api/generate", json={"run": "tiny", **body})
    assert r.status_code == 200, r.text
    return parse_sse(r.text)


# --- the page -------------------------------------------------------------------------------------------------
def test_page_is_served_with_its_assets_and_nothing_from_the_internet(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "default-src 'self'" in page.headers["content-security-policy"]
    for asset in ("/static/main.js", "/static/style.css"):
        assert asset in page.text
    for name in PAGE_FILES:
        r = client.get(f"/static/{name}")
        assert r.status_code == 200 and ("javascript" in r.headers["content-type"]) == name.endswith(".js")
    web = ROOT / "chargpt" / "web"
    scripts = {f.name for f in web.glob("*.js")}
    assert scripts == {n for n in PAGE_FILES if n.endswith(".js")}  # every module is served, and nothing else is
    for f in scripts:  # the modules import one another by their served names, nothing from elsewhere
        imported = re.findall(r'^import .* from "([^"]+)";$', (web / f).read_text(encoding="utf-8"), re.M)
        assert all(i.startswith("./") and i[2:] in scripts for i in imported), (f, imported)
    for f in web.rglob("*"):  # no CDN, no web fonts: every asset ships in the package
        if f.suffix in (".html", ".js", ".css", ".py"):
            text = f.read_text(encoding="utf-8")
            assert not any(bad in text for bad in ('src="http', "href=\"http", "url(http", "@import", "fetch(\"http"))


# --- runs -----------------------------------------------------------------------------------------------------
def test_runs_list_details_and_metrics(client, served):
    runs = client.get("/api/runs").json()["runs"]
    assert [r["name"] for r in runs] == ["tiny"]
    run = runs[0]
    gen = chargpt.load(served / "tiny", device="cpu")
    assert run["params"] == gen.model.num_params() and run["step"] == 30 and run["vocab_size"] == len(gen.vocab)
    assert run["best_bpc"] == pytest.approx(run["best_val_loss"] / math.log(2))
    assert run["best_bpb"] == pytest.approx(run["best_bpc"], abs=1e-4)  # ASCII text: one byte per character
    assert run["budget"] == {"max_iters": 30, "max_time": None}  # for the chart's "share of budget" axis
    details = client.get("/api/runs/tiny").json()
    assert details["model_config"]["n_embd"] == 16 and details["train_config"]["max_iters"] == 30
    assert {"best.safetensors", "latest.safetensors", "metrics.jsonl"} <= set(details["files"])
    metrics = client.get("/api/runs/tiny/metrics").json()
    lines = (served / "tiny" / "metrics.jsonl").read_text().splitlines()
    assert metrics["rows"] == [json.loads(line) for line in lines] and [r["step"] for r in metrics["rows"]] == [
        0, 10, 20, 30]
    # polling: nothing is resent until the file changes
    assert client.get("/api/runs/tiny/metrics", params={"since": metrics["mtime"]}).json()["unchanged"]


def test_metrics_carry_the_running_loss_and_details_the_whole_vocabulary(client, served, monkeypatch):
    metrics = client.get("/api/runs/tiny/metrics").json()
    assert [r["step"] for r in metrics["running"]] == [1, 11, 21]  # train_loss.jsonl: every 10 steps
    monkeypatch.setattr(web_runs, "MAX_RUNNING_POINTS", 2)  # a long run's are thinned evenly, the first kept
    assert [r["step"] for r in client.get("/api/runs/tiny/metrics").json()["running"]] == [1, 21]
    details = client.get("/api/runs/tiny").json()
    gen = chargpt.load(served / "tiny", device="cpu")
    assert details["vocab_chars"] == gen.vocab.chars  # characters, not an escaped string
    assert details["closing_prompt"] == gen.meta["closing_prompt"] and details["closing_prompt"]


def test_a_run_is_marked_training_exactly_while_a_training_holds_its_lock(client, served):
    from chargpt.runs.rundir import RunDir
    assert client.get("/api/runs").json()["runs"][0]["training"] is False
    owner = RunDir(served / "tiny")
    owner.claim()  # what a training does for its whole life
    try:
        assert client.get("/api/runs").json()["runs"][0]["training"] is True
    finally:
        owner.release()
    assert client.get("/api/runs").json()["runs"][0]["training"] is False
    assert (served / "tiny" / "best.safetensors").exists()  # releasing the lock never removes a real run


def test_metrics_of_a_run_still_training_update_and_torn_lines_are_skipped(client, served, tmp_path):
    before = client.get("/api/runs/tiny/metrics").json()
    path = served / "tiny" / "metrics.jsonl"
    saved = path.read_text()
    try:
        with open(path, "a") as f:
            f.write(json.dumps({"step": 40, "train_loss": 3.0, "val_loss": 3.1}) + "\n" + '{"step": 5')  # cut short
        os.utime(path, (time.time() + 5, time.time() + 5))
        after = client.get("/api/runs/tiny/metrics", params={"since": before["mtime"]}).json()
        assert [r["step"] for r in after["rows"]] == [0, 10, 20, 30, 40]
    finally:
        path.write_text(saved)


def test_a_run_shows_the_samples_it_wrote_while_training(client, served):
    assert client.get("/api/runs/tiny").json()["samples"] == []  # trained without --sample-every
    path = served / "tiny" / "samples.jsonl"
    rows = [{"step": 10 * i, "prompt": "To ", "text": f"be {i}\n<b>"} for i in range(1, limits.MAX_SAMPLE_ROWS + 3)]
    try:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 9', encoding="utf-8")  # cut short
        assert client.get("/api/runs/tiny").json()["samples"] == rows[-limits.MAX_SAMPLE_ROWS:]  # the newest
    finally:
        path.unlink()


def test_an_empty_folder_has_no_runs_yet(tmp_path):
    client = TestClient(serve.create_app(tmp_path, device="cpu"), base_url=HERE)
    assert client.get("/api/runs").json() == {"folder": tmp_path.name, "runs": []}  # its name: no server path
    assert client.post("/api/generate", json={"run": "tiny"}).status_code == 404


def test_a_damaged_run_is_listed_with_its_error_and_refused_with_422(tmp_path):
    root = tmp_path / "runs"
    (root / "broken").mkdir(parents=True)
    (root / "broken" / "best.safetensors").write_bytes(b"not a checkpoint")
    client = TestClient(serve.create_app(root, device="cpu"), base_url=HERE)
    run = client.get("/api/runs").json()["runs"][0]
    assert run["name"] == "broken" and "not a readable safetensors checkpoint" in run["error"]
    r = client.post("/api/generate", json={"run": "broken"})
    assert r.status_code == 422 and "re-train or re-copy" in r.json()["error"]
    assert client.get("/api/status").json()["busy"] == 0  # the refused request gave its slot back


# --- generation -----------------------------------------------------------------------------------------------
def test_streamed_text_equals_sample_py_and_the_library(client, served):
    """Same seed and settings, same text: the page, chargpt.load(...).generate and sample.py --json agree."""
    settings = dict(temperature=0.9, top_k=10, top_p=0.95, max_new_tokens=60, seed=7, num_samples=2)
    events = generate(client, prompt="To be", **settings)
    kinds = [e for e, _ in events]
    assert kinds[0] == "start" and kinds[-1] == "done" and set(kinds[1:-1]) == {"text"}
    start, done = events[0][1], events[-1][1]
    assert start["prompt"] == "To be" and start["seed"] == 7 and not done["stopped"] and done["error"] is None
    texts = texts_of(events, 2)
    assert texts == chargpt.load(served / "tiny", device="cpu").generate("To be", **settings)
    cli = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--checkpoint", str(served / "tiny"), "--prompt",
                          "To be", "--temperature", "0.9", "--top-k", "10", "--top-p", "0.95", "--max-new-tokens", "60",
                          "--seed", "7", "--num-samples", "2", "--json", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert cli.returncode == 0, cli.stderr
    assert [json.loads(line)["text"] for line in cli.stdout.splitlines()] == texts
    assert done["chars"] == sum(map(len, texts))


def test_stop_strings_greedy_and_a_random_seed_that_is_reported(client, served):
    gen = chargpt.load(served / "tiny", device="cpu")
    events = generate(client, prompt="ROMEO", temperature=0, max_new_tokens=40, stop=["e"])
    assert texts_of(events, 1) == gen.generate("ROMEO", temperature=0, max_new_tokens=40, stop=["e"])
    events = generate(client, max_new_tokens=30)  # no seed: one is drawn and reported, so the text can be replayed
    seed = events[0][1]["seed"]
    assert isinstance(seed, int) and texts_of(events, 1) == gen.generate("", max_new_tokens=30, seed=seed)


def test_constrained_text_and_its_scores_equal_the_librarys(client, served):
    """Form, acrostic, banned characters: the same text and scores as chargpt.load(...).samples; best-of's samples
    come ranked, checked for copies of the run's training text, each as one piece."""
    gen = chargpt.load(served / "tiny", device="cpu")
    kw = dict(form="_____ *.\\n", acrostic="T", ban="e", seed=3, num_samples=2, max_new_tokens=80)
    events = generate(client, prompt="", **kw)
    want = gen.samples("", **kw)
    assert texts_of(events, 2) == [s.text for s in want] and all(t.startswith("T") and "e" not in t for t in
                                                                   texts_of(events, 2))
    done = events[-1][1]
    assert done["scores"] == [s.record() for s in want] and all(s["removed"] > 0 for s in done["scores"])
    events = generate(client, prompt="To be", best_of=4, num_samples=2, seed=5, max_new_tokens=30, min_span=8)
    done, want = events[-1][1], gen.samples("To be", best_of=4, num_samples=2, seed=5, max_new_tokens=30,
                                            min_span=8)
    assert texts_of(events, 2) == [s.text for s in want] and done["copy_check"] is True
    assert done["scores"] == [s.record(4) for s in want] and [s["best_of"] for s in done["scores"]] == [4, 4]
    assert generate(client, prompt="To be", max_new_tokens=5)[-1][1].get("scores") is None  # none asked for


def test_unknown_prompt_characters_are_shown_not_crashed_on(client, served):
    r = client.post("/api/generate", json={"run": "tiny", "prompt": "To bé or nöt"})
    assert r.status_code == 400
    assert r.json()["unknown_chars"] == [[4, "é"], [10, "ö"]] and "U+00E9" in r.json()["error"]
    gen = chargpt.load(served / "tiny", device="cpu")
    for policy in ("skip", "replace"):
        events = generate(client, prompt="To bé", unknown=policy, seed=1, max_new_tokens=20)
        start = events[0][1]
        assert start["prompt"] == gen.prompt_text("To bé", policy) and start["warning"]
        assert texts_of(events, 1) == gen.generate("To bé", unknown=policy, seed=1, max_new_tokens=20)


BAD_GENERATE = [  # (body fields, status, words the error must contain)
    # the sampling settings' own rules are config.SampleSettings's; the server's limits are its own
    ({"temperature": -1}, 400, "temperature must be >= 0"),
    ({"temperature": 11}, 400, "temperature must be at most 10"),
    ({"temperature": "hot"}, 400, "temperature must be a number"),
    ({"temperature": True}, 400, "temperature must be a number"),
    ({"top_k": -3}, 400, "top_k must be >= 0"),
    ({"top_k": 10**7}, 400, "top_k must be at most 1000000"),
    ({"top_k": 2.5}, 400, "top_k must be an integer or null"),
    ({"top_p": 0}, 400, "top_p must be in (0, 1]"),
    ({"top_p": 1.5}, 400, "top_p must be in (0, 1]"),
    ({"max_new_tokens": -1}, 400, "max_new_tokens must be >= 0"),
    ({"max_new_tokens": 10**6}, 400, "max_new_tokens must be at most 5000"),
    ({"max_new_tokens": True}, 400, "max_new_tokens must be an integer"),
    ({"num_samples": 0}, 400, "num_samples must be between 1 and 8"),
    ({"num_samples": 1000}, 400, "num_samples must be between 1 and 8"),
    ({"seed": -1}, 400, "seed must be a whole number from 0 to"),
    ({"seed": 10**30}, 400, "seed must be a whole number from 0 to"),
    ({"seed": 1.0}, 400, "seed must be an integer or null"),
    ({"prompt": "x" * 10_001}, 400, "the limit is 10000"),
    ({"prompt": 5}, 400, "prompt must be a string"),
    ({"unknown": "ignore"}, 400, "unknown must be one of error, skip, replace"),
    ({"stop": "\n"}, 400, "stop must be a list"),
    ({"stop": [""]}, 400, "stop needs a non-empty string"),
    ({"stop": ["a"] * 5}, 400, "at most 4"),
    ({"stop": ["a" * 101]}, 400, "stop must be a list of at most 4 strings of at most 100 characters"),
    ({"stop": [3]}, 400, "stop must be a list of at most 4 strings"),
    ({"colour": "red"}, 400, "unknown field(s) colour; allowed: run, prompt, max_new_tokens"),
    ({"run": None}, 400, "run must be a string"),
    ({"run": "nope"}, 404, "no run named 'nope'"),
    # the constraints: their own rules (config), then what the run's vocabulary can write, before any decoding
    ({"form": "*_"}, 400, "form: a * must be followed by fixed text"),
    ({"form": "_，_"}, 400, "form: the form's character '，' (U+FF0C) is not in this model's vocabulary"),
    ({"acrostic": "漢"}, 400, "acrostic: the acrostic's character '漢'"),
    ({"ban": "abcdefghijklmnopqrstuvwxyzTROMEO.,:!? \n0123456789"}, 400, "leave no character"),
    ({"best_of": 2, "num_samples": 3}, 400, "best_of (2) must be at least num_samples (3)"),
    ({"best_of": 9}, 400, "best_of must be at most 8"),
    ({"min_p": 2.0}, 400, "min_p must be in [0, 1]"),
    ({"no_repeat_ngram": -1}, 400, "no_repeat_ngram must be >= 0"),
    ({"min_span": 0}, 400, "min_span must be between 1 and"),
]


@pytest.mark.parametrize("fields,status,words", BAD_GENERATE, ids=[str(b[0])[:30] for b in BAD_GENERATE])
def test_bad_generate_requests_get_one_clear_json_error(client, fields, status, words):
    r = client.post("/api/generate", json={"run": "tiny", **fields})
    assert r.status_code == status and words in r.json()["error"], r.text


def test_a_generate_request_is_the_engine_s_one_options_object():
    """Every sampling option is a field of /api/generate by the same name, and the request becomes the engine's
    SampleOptions in one place as it is parsed (config's rules checked there)."""
    from dataclasses import fields

    from chargpt.sampling.options import SETTINGS, SampleOptions
    from chargpt.web.schemas import GenerateRequest
    own = {f.name for f in fields(SampleOptions)} - {"settings", "use_cache"}  # the server always caches
    assert set(SETTINGS) | own <= set(GenerateRequest.model_fields)
    req = GenerateRequest.parse({"run": "tiny", "temperature": 0.5, "stop": ["\n"], "form": "__", "num_samples": 2,
                                 "seed": 3})
    options = req.options()
    assert isinstance(options, SampleOptions) and options == SampleOptions.of(temperature=0.5, stop=("\n",),
                                                                                  form="__", num_samples=2, seed=3)


def test_bodies_that_are_not_json_objects_or_too_large(client):
    def raw(body, kind="application/json"):
        return client.post("/api/generate", content=body, headers={"Content-Type": kind})
    cases = [(raw(b"{oops"), 400, "not valid JSON"),
             (raw(b'{"run": "tiny", "temperature": NaN}'), 400, "NaN"),
             (raw(b"\xff\xfe"), 400, "not valid"),
             (raw(b'{"run": "tiny"}', "text/plain"), 415, "JSON"),
             (client.post("/api/generate", json=["tiny"]), 400, "must be a JSON object"),
             (client.post("/api/generate", json={}), 400, "run is required"),
             (client.post("/api/generate", json={"run": "tiny", "prompt": "x" * 300_000}), 413, "the limit is 262144"),
             (client.get("/api/generate"), 405, "Method Not Allowed"),
             (client.get("/api/nothing-here"), 404, "Not Found")]
    for r, status, words in cases:
        assert r.status_code == status and words in r.json()["error"], (status, r.text)


def test_requests_for_another_host_are_refused(served):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 must not drive the server."""
    client = TestClient(serve.create_app(served, device="cpu"), base_url="http://evil.example")
    assert client.get("/api/runs").status_code == 400


# --- runs by name only ----------------------------------------------------------------------------------------
TRAVERSALS = ["..", "../tiny", "tiny/..", "/etc/passwd", "./tiny", "tiny/", "~", "", " tiny", "tiny\x00"]


@pytest.mark.parametrize("name", TRAVERSALS)
def test_run_names_never_reach_the_filesystem(client, served, name):
    for body in ({"run": name}, {"run": str(served / "tiny")}):
        assert client.post("/api/generate", json=body).status_code == 404
        assert client.post("/api/inside", json={**body, "text": "To"}).status_code == 404


@pytest.mark.parametrize("path", ["/api/runs/..", "/api/runs/%2e%2e", "/api/runs/..%2F..%2Fetc%2Fpasswd",
                                  "/api/runs/%2E%2E/metrics", "/api/runs/..%5c..", "/api/runs/%2Fetc%2Fpasswd",
                                  "/static/../serve.py", "/static/%2e%2e/serve.py", "/static/..%2Fserve.py",
                                  "/static/%2e%2e%2f%2e%2e%2fpyproject.toml"])
def test_url_encoded_traversal_is_refused(client, path):
    r = client.get(path)
    assert r.status_code == 404 and "chargpt" not in r.text.lower()


def test_symlinks_out_of_the_served_folder_are_not_runs(served, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "escape").symlink_to(served / "tiny", target_is_directory=True)  # a run dir outside the folder
    (root / "sneaky").mkdir()  # a run dir inside whose checkpoint points outside
    (root / "sneaky" / "best.safetensors").symlink_to(served / "tiny" / "best.safetensors")
    (root / "inside").symlink_to(root / "sneaky")  # inside the folder, but still nothing in it is inside
    client = TestClient(serve.create_app(root, device="cpu"), base_url=HERE)
    assert client.get("/api/runs").json()["runs"] == []
    for name in ("escape", "sneaky", "inside"):
        assert client.post("/api/generate", json={"run": name}).status_code == 404
        assert client.get(f"/api/runs/{name}/metrics").status_code == 404


# --- limits and the model cache -----------------------------------------------------------------------------
def test_a_busy_server_answers_429(served):
    app = serve.create_app(served, device="cpu", max_busy=1)
    client = TestClient(app, base_url=HERE)
    app.state.busy.take()  # one generation in flight
    try:
        for path, body in (("/api/generate", {"run": "tiny"}), ("/api/inside", {"run": "tiny", "text": "To"})):
            r = client.post(path, json=body)
            assert r.status_code == 429 and "busy" in r.json()["error"]
    finally:
        app.state.busy.give()
    assert client.post("/api/inside", json={"run": "tiny", "text": "To"}).status_code == 200


def test_models_load_once_and_reload_when_the_checkpoint_changes(served, tmp_path):
    app = serve.create_app(served, device="cpu")
    client = TestClient(app, base_url=HERE)
    generate(client, max_new_tokens=3)
    generate(client, max_new_tokens=3)
    (first,) = app.state.models.loaded.values()
    best = served / "tiny" / "best.safetensors"
    stat = best.stat()
    try:
        os.utime(best, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # a run still training saved again
        generate(client, max_new_tokens=3)
        (second,) = app.state.models.loaded.values()
        assert second is not first
    finally:
        os.utime(best, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_the_model_cache_is_small(tmp_path):
    root = tmp_path / "runs"
    for name in ("a", "b", "c"):
        train_tiny(root, name, steps=1)
    app = serve.create_app(root, device="cpu", max_models=2)
    client = TestClient(app, base_url=HERE)
    for name in ("a", "b", "c", "b"):
        assert client.post("/api/generate", json={"run": name, "max_new_tokens": 2}).status_code == 200
    assert [Path(p).parent.name for p, _ in app.state.models.loaded] == ["c", "b"]  # least recently used first


# --- a real server: cancellation and a free event loop --------------------------------------------------------
LONG = {"run": "tiny", "max_new_tokens": 5000, "num_samples": 8, "seed": 0}


def wait_until(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_stop_cancels_a_generation_and_the_event_loop_stays_free(served):
    app = serve.create_app(served, device="cpu")
    with serve.running(app) as url:
        response, events = open_stream(url, LONG)
        with response:
            event, start = next(events)
            assert event == "start"
            assert next(events)[0] == "text"
            # the page is answered while a generation runs: decoding is not on the event loop
            state = get(url + "/api/status")
            assert state["busy"] == 1 and state["generations"] == [start["id"]]
            assert post(url + "/api/stop", {"id": start["id"]}) == (200, {"stopping": start["id"]})
            rest = list(events)
        done = rest[-1]
        assert done[0] == "done" and done[1]["stopped"] and done[1]["chars"] < 8 * 5000
        assert post(url + "/api/stop", {"id": start["id"]})[0] == 404  # finished: nothing to stop
        wait_until(lambda: app.state.busy.count == 0)


def test_a_client_that_goes_away_cancels_its_generation(served):
    app = serve.create_app(served, device="cpu")
    with serve.running(app) as url:
        response, events = open_stream(url, LONG)
        event, start = next(events)
        job = app.state.jobs[start["id"]]
        next(events)
        response.close()  # the tab was closed
        wait_until(lambda: job.result is not None)
        assert job.result["stopped"] and job.result["chars"] < 8 * 5000
        wait_until(lambda: app.state.busy.count == 0 and not app.state.jobs)


def test_stopping_the_server_ends_open_streams_with_done(served):
    app = serve.create_app(served, device="cpu")
    with serve.running(app) as url:
        response, events = open_stream(url, LONG)
        assert next(events)[0] == "start"
    with response:  # the server stopped (Ctrl-C does the same): the stream was ended properly, not cut
        rest = list(events)
    assert rest[-1][0] == "done" and rest[-1][1]["stopped"] and rest[-1][1]["chars"] < 8 * 5000
    # it decodes eager: a compile in the request (sample.py's --compile auto at 40,000 characters) held the stream
    # past the server's 5 s to stop, and the stream was cut instead of ended
    runner, why = app.state.models.get(app.state.runs.checkpoint("tiny")).decode_runner(8 * 5000)
    assert runner is None and "--compile off" in why
    client = TestClient(app, base_url=HERE)
    r = client.post("/api/generate", json={"run": "tiny"})  # a request that arrives while it stops
    assert r.status_code == 503 and "shutting down" in r.json()["error"] and app.state.busy.count == 0


# --- look inside ----------------------------------------------------------------------------------------------
def test_inside_returns_surprise_expectations_and_causal_attention(client, served):
    import base64

    import numpy as np
    text = "To be, or not to be: that"
    r = client.post("/api/inside", json={"run": "tiny", "text": text, "top": 3})
    assert r.status_code == 200
    d = r.json()
    assert len(d["bits"]) == len(text) and d["bits"][0] is None and all(b > 0 for b in d["bits"][1:])
    assert len(d["expected"]) == len(text) + 1 and all(len(c) == 3 for c in d["expected"][1:])
    L, H, W = d["layers"], d["heads"], d["window"]
    assert (L, H, W) == (1, 2, 16) and d["window_start"] == len(text) - 16
    att = np.frombuffer(base64.b64decode(d["attention"]), dtype=np.uint8).reshape(L, H, W, W) / 255
    assert np.all(np.triu(att, 1) == 0) and np.allclose(att.sum(-1), 1, atol=W / 255)
    moved = client.post("/api/inside", json={"run": "tiny", "text": text, "end": 16}).json()
    assert moved["window_start"] == 0 and moved["bits"] == d["bits"]  # the window moves; surprise does not
    for bad, words in (({"text": ""}, "1 to 2000"), ({"text": "x" * 2001}, "1 to 2000"), ({"top": 0}, "top must be"),
                       ({"top": 11}, "top must be"), ({"text": 3}, "text must be a string"),
                       ({"end": 0}, "end must be between 1 and 2"), ({"end": 3}, "end must be between 1 and 2")):
        r = client.post("/api/inside", json={"run": "tiny", "text": "To", **bad})
        assert r.status_code == 400 and words in r.json()["error"]


# --- the command ----------------------------------------------------------------------------------------------
def run_serve(*args, code=None, timeout=60):
    prefix = ["-c", code] if code else ["-m", "chargpt.serve"]
    return subprocess.run([sys.executable, *prefix, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_without_the_web_extra_the_command_names_it(tmp_path):
    code = ("import sys; sys.modules['starlette'] = sys.modules['uvicorn'] = None; import runpy; "
            "sys.argv[0] = 'chargpt.serve'; runpy.run_module('chargpt.serve', run_name='__main__')")
    r = run_serve("--checkpoints", str(tmp_path), code=code)
    assert r.returncode == 1 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: ") and 'pip install -e ".[web]"' in r.stderr and "Traceback" not in r.stderr


def test_bad_folders_ports_and_hosts_are_one_line_errors(tmp_path):
    with pytest.raises(ChargptError, match="no checkpoints folder"):
        serve.serve(tmp_path / "missing")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    with taken, pytest.raises(ChargptError, match="choose another --port"):
        serve.bind("127.0.0.1", taken.getsockname()[1])
    with pytest.raises(ChargptError, match="not an address"):
        serve.bind("no such host.invalid", 0)
    r = run_serve("--checkpoints", str(tmp_path / "missing"))
    assert r.returncode == 1 and r.stderr.startswith("error: no checkpoints folder") and r.stderr.count("\n") == 1


def test_a_first_start_makes_the_default_folder_when_the_page_can_train(tmp_path, monkeypatch):
    """A newcomer's `chargpt serve` before any training: the page can train, so checkpoints/ is made (and said);
    without training there is nothing to show, and the error stays."""
    with pytest.raises(ChargptError, match="no checkpoints folder"):
        serve.serve(training=False)
    assert not (tmp_path / "checkpoints").exists()

    class Bound(Exception):
        pass

    def bound(host, port):
        raise Bound
    monkeypatch.setattr(serve, "bind", bound)
    said = []
    with pytest.raises(Bound):  # the folder check passed: the server went on to bind its port
        serve.serve(say=said.append)
    assert (tmp_path / "checkpoints").is_dir() and "New run" in said[0]


@pytest.mark.parametrize("host,warned", [("127.0.0.1", False), ("0.0.0.0", True)])
def test_the_command_prints_its_url_and_warns_off_localhost(served, host, warned):
    """Off localhost without a key (--no-auth: tests/test_web_security.py has the key it asks for otherwise)."""
    proc = subprocess.Popen([sys.executable, "-m", "chargpt.serve", "--checkpoints", str(served), "--host", host,
                             "--port", "0", "--device", "cpu", *(["--no-auth"] if warned else [])],
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "CHARGPT_API_KEY": ""})
    try:
        line = proc.stderr.readline()
        assert line.startswith("chargpt playground: http://127.0.0.1:"), line
        url = line.split()[2]
        if warned:
            warning = proc.stderr.readline()
            assert warning.startswith("warning: serving on 0.0.0.0 with --no-auth: anyone who can reach this machine")
        assert [run["name"] for run in get(url + "/api/runs")["runs"]] == ["tiny"]
        status, refused = post(url + "/api/generate", {"run": "tiny", "temperature": -1})  # the JSON name, not a flag
        assert status == 400 and refused["error"].startswith("temperature must be >= 0"), refused
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    if not warned:
        assert "warning" not in proc.stderr.read()


# --- the Host check, static files, surrogates, deep JSON and huge integers, clients that leave mid-body ---------
def raw_get(host, port, path, host_header):
    """A GET with the Host header given (urllib would send the URL's own): -> (status, body)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as s:
        s.settimeout(30)
        s.connect((host, port))
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: {host_header}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode("utf-8", "replace")


@pytest.mark.parametrize("host", ["::1", "127.0.0.2"])
def test_the_host_check_covers_ipv6_loopback_and_the_host_asked_for(served, host):
    if ":" in host and not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    proc = subprocess.Popen([sys.executable, "-m", "chargpt.serve", "--checkpoints", str(served), "--host", host,
                             "--port", "0", "--device", "cpu"], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        line = proc.stderr.readline()
        url = line.split()[2]  # http://[::1]:PORT or http://127.0.0.2:PORT
        port = int(url.rsplit(":", 1)[1])
        shown = url.removeprefix("http://")
        assert raw_get(host, port, "/api/runs", shown)[0] == 200  # the URL printed works
        assert raw_get(host, port, "/api/runs", f"localhost:{port}")[0] == 200
        status, body = raw_get(host, port, "/api/runs", "evil.example")
        assert status == 400 and "Invalid host header" in body
        assert raw_get(host, port, "/api/runs", f"evil.example:{port}")[0] == 400
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_host_names_are_parsed_with_ports_and_brackets():
    assert host_name("[::1]:8000") == "::1" and host_name("[::1]") == "::1"
    assert host_name("LocalHost:80") == "localhost" and host_name("127.0.0.1") == "127.0.0.1"
    client = TestClient(serve.create_app(Path("."), device="cpu"), base_url="http://[::1]:8000")
    assert client.get("/api/status").status_code == 200
    for junk in ("[::1]evil:8000", "[::1]:8000@evil.example", "[::1]:80x"):  # nothing but :PORT after the bracket
        assert host_name(junk) == "", junk


def test_static_serves_the_page_files_only(client):
    assert client.get("/static/main.js").status_code == 200 and client.get("/static/style.css").status_code == 200
    for name in ("server.py", "__init__.py", "index.html", "endpoints", "app.js"):  # only the page's own files
        r = client.get(f"/static/{name}")
        assert r.status_code == 404 and "main.js, common.js" in r.json()["error"]


def test_lone_surrogates_in_a_request_are_one_clear_error(client):
    for path, body in (("/api/generate", '{"run": "tiny", "prompt": "\\ud800"}'),
                       ("/api/generate", '{"run": "tiny", "prompt": "a", "stop": ["\\udc00"]}'),
                       ("/api/inside", '{"run": "tiny", "text": "\\ud800"}')):
        r = client.post(path, content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "lone UTF-16 surrogate" in r.json()["error"], (path, r.text)


def test_deep_json_and_huge_integers_are_one_clear_error(client):
    def raw(body):
        return client.post("/api/generate", content=body, headers={"Content-Type": "application/json"})
    deep = raw(b'{"run": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    assert deep.status_code == 400 and "nests arrays or objects too deeply" in deep.json()["error"]
    deep = client.post("/api/inside", content=b"[" * 100_000, headers={"Content-Type": "application/json"})
    assert deep.status_code == 400
    huge = raw(b'{"run": "tiny", "seed": ' + b"9" * 5000 + b"}")
    error = huge.json()["error"]
    assert huge.status_code == 400 and "an integer of 5,000 digits; the most is 100" in error
    assert clipped("one two three", 9) == "one two ..."


def test_a_server_run_inside_a_program_leaves_its_logging_as_it_was(served):
    """serve.running (tests, benchmarks) serves from a thread of another program: uvicorn's own set-up of its
    loggers is undone when it stops, so that program's logging is as it was."""
    def logging_state():
        return {name: (logging.getLogger(name).handlers[:], logging.getLogger(name).level)
                for name in ("", "uvicorn", "uvicorn.error", "uvicorn.access")}
    before = logging_state()
    with serve.running(serve.create_app(served, device="cpu")) as url:
        assert get(url + "/api/status")["busy"] == 0
    assert logging_state() == before


def test_a_client_that_leaves_mid_body_is_no_traceback(served, capfd):
    app = serve.create_app(served, device="cpu")
    with serve.running(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /api/generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000\r\n\r\n{\"run\": ")
            time.sleep(0.3)
        time.sleep(0.5)  # the server notices the disconnect
        assert get(url + "/api/status")["busy"] == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "ClientDisconnect" not in err


def test_a_runs_report_card_is_served_as_a_page_that_loads_nothing(client, served):
    missing = client.get("/api/runs/tiny/report")
    assert missing.status_code == 404 and "chargpt report tiny" in missing.json()["error"]
    assert client.get("/api/runs/tiny").json()["report"] is False
    page = "<!doctype html><title>tiny</title><p>bits per character</p>"
    (served / "tiny" / "report.html").write_text(page, encoding="utf-8")
    try:
        shown = client.get("/api/runs/tiny/report")
        assert shown.status_code == 200 and shown.text == page and shown.headers["content-type"].startswith("text/html")
        policies = shown.headers.get_list("content-security-policy")  # its own alone: its inline style applies
        assert policies == ["default-src 'none'; img-src data:; style-src 'unsafe-inline'"]
        assert client.get("/api/runs/tiny").json()["report"] is True
        assert client.get("/api/runs/nosuch/report").status_code == 404
    finally:
        (served / "tiny" / "report.html").unlink()
