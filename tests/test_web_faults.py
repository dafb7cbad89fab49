"""The playground server when things go wrong: Stop pressed again while a training saves, a save abandoned, a full
disk during an upload or at a training's start, clients that leave, and requests the server cannot answer as asked
(a model name with a slash, NUL bytes, files that are no training text, names that would garble a terminal)."""

import errno
import json
import socket
import subprocess
import sys
import time
from urllib.parse import quote

import pytest
from helpers import CORPUS_TEXT, fake_training, get, need, sigterms, train_tiny

need("starlette")
need("uvicorn")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.web import server as serve  # noqa: E402
from chargpt.web.training import how_it_ended  # noqa: E402

HERE = "http://127.0.0.1"
OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture
def training_app(tmp_path):
    app = serve.create_app(tmp_path / "checkpoints", device="cpu")
    proc, signals = fake_training(app, tmp_path)
    yield app, proc, signals
    proc.kill()
    proc.wait()


# --- one Stop per training ------------------------------------------------------------------------------------------
def test_stop_pressed_three_times_sends_one_signal_and_says_it_is_already_stopping(training_app):
    app, proc, signals = training_app
    client = TestClient(app, base_url=HERE)
    first = client.post("/api/train/stop")
    assert first.status_code == 200 and first.json()["training"]["state"] == "stopping"
    assert "message" not in first.json()
    for _ in range(2):  # a double click, a second tab: the save under way is left to finish
        again = client.post("/api/train/stop")
        assert again.status_code == 200 and again.json()["training"]["state"] == "stopping"
        assert again.json()["message"] == "fake is already stopping: it is saving, and ends when the save is written"
    assert sigterms(signals, at_least=1) == 1 and proc.poll() is None


def test_a_save_abandoned_is_not_reported_as_saved():
    said = {"state": "stopped", "step": 40, "elapsed_s": 9.0, "chars_per_step": 64, "max_time": 30.0,
            "max_iters": 10**12, "budget_elapsed_s": 0.0, "error": None, "updated": 1.0}
    assert how_it_ended(143, True, {**said, "saved": True}) == "stopped"
    assert how_it_ended(143, True, said) == "stopped"  # a run that wrote no "saved" (older chargpt) saved
    for code in (143, None):
        assert how_it_ended(code, True, {**said, "saved": False}) == "abandoned"  # a third signal's
        assert how_it_ended(code, True, {**said, "state": "training"}) == "abandoned"  # killed before it saved
    assert how_it_ended(-15, True, None) == "stopped"  # stopped while starting: nothing trained, nothing lost


# --- a full disk ----------------------------------------------------------------------------------------------------
def disk_full(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_during_an_upload_is_one_json_line_and_leaves_nothing(tmp_path, monkeypatch):
    from chargpt.runs import rundir
    from chargpt.web import training
    client = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu"), base_url=HERE)

    def half_then_full(path, write):  # the real atomic write, its file cut short by the disk filling up
        def cut(tmp):
            tmp.write_bytes(b"half")
            disk_full()
        return rundir.write_atomic(path, cut)
    monkeypatch.setattr(training, "write_atomic", half_then_full)
    r = client.post("/api/train/upload?name=poems.txt", content=CORPUS_TEXT.encode(), headers=OCTETS)
    assert r.status_code == 507, r.text  # the test client raises a server's traceback: there is none
    assert r.json() == {"error": "cannot keep the upload as poems.txt (No space left on device); free disk space on "
                                 "the server and upload it again"}
    assert list((tmp_path / "checkpoints" / ".playground" / "uploads").iterdir()) == []


def test_a_full_disk_at_a_trainings_start_leaves_no_child_running_unrecorded(tmp_path, monkeypatch):
    from chargpt.web import training
    client = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu"), base_url=HERE)
    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kw):
            super().__init__(*args, **kw)
            started.append(self)
    monkeypatch.setattr(training.subprocess, "Popen", Recorded)
    monkeypatch.setattr(training, "write_text_atomic", disk_full)  # the record, training.json
    r = client.post("/api/train", json={"source": "builtin", "max_time": 5})
    assert r.status_code == 507 and r.json()["error"] == (
        "cannot start the training: cannot record it in training.json (No space left on device); free disk space on "
        "the server and start it again")
    assert len(started) == 1 and started[0].poll() is not None  # the child was ended, and reaped
    assert client.get("/api/train").json()["training"] is None
    assert list((tmp_path / "checkpoints" / ".playground" / "logs").iterdir()) == []


# --- messages -------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    train_tiny(root)
    return root


def test_a_model_id_with_a_slash_is_not_found_not_a_wrong_method(served):
    client = TestClient(serve.create_app(served, device="cpu"), base_url=HERE)
    for path in ("/v1/models/a/b", "/v1/models/tiny/x"):
        r = client.get(path)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"].startswith(f"no model named {path.removeprefix('/v1/models/')!r} on this "
                                                       f"server; its models are the runs in its folder: tiny")
    assert client.post("/v1/models/a/b").status_code == 405  # a wrong method is still said as such


def test_a_client_that_leaves_a_whole_reply_cancels_its_generation(served):
    app = serve.create_app(served, device="cpu")
    ended = []
    finished = app.state.finished
    app.state.finished = lambda job: (ended.append(job.result), finished(job))
    body = json.dumps({"model": "tiny", "prompt": "ROMEO:", "max_tokens": 5000, "n": 8, "seed": 1}).encode()
    with serve.running(app) as url:
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            deadline = time.monotonic() + 30
            while get(url + "/api/status")["busy"] == 0:  # it started
                assert time.monotonic() < deadline and not ended
                time.sleep(0.01)
        deadline = time.monotonic() + 60
        while not ended:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert get(url + "/api/status")["busy"] == 0
    assert ended[0]["stopped"] and ended[0]["chars"] < 8 * 5000  # cancelled, not written to its end


def test_an_upload_with_a_nul_byte_is_refused_saying_training_would_refuse_it(tmp_path):
    client = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu"), base_url=HERE)
    r = client.post("/api/train/upload?name=notes.txt", content=b"one line\n" * 2000 + b"\0two\n", headers=OCTETS)
    assert r.status_code == 400 and r.json()["error"].startswith("the file holds a NUL byte (at byte 18,000), which "
                                                                 "no text has and training refuses")
    assert not (tmp_path / "checkpoints" / ".playground" / "uploads").exists() or \
        not list((tmp_path / "checkpoints" / ".playground" / "uploads").iterdir())


def test_the_texts_listed_are_texts_with_names_a_terminal_shows_as_they_are(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    names = ["README.md", "readme.txt", "Readme", "red\x1b[31m.txt", "two\nlines.txt", "back\u202etxt.exe",
             "bell\x07.txt", "ok.txt", "詩.txt"]
    for name in names:
        (data / name).write_text(CORPUS_TEXT, encoding="utf-8")
    client = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu", data_dir=data), base_url=HERE)
    assert [c["name"] for c in client.get("/api/corpora").json()["data"]] == ["ok.txt", "詩.txt"]
    for name in names[:7]:  # nor can they be chosen by name
        r = client.post("/api/train", json={"source": "data", "corpus": name, "max_time": 5})
        assert r.status_code == 404, r.text
    r = client.post("/api/train/upload?name=" + quote("a\x1b[2Jb\u202e\nc.txt"), content=b"text\n", headers=OCTETS)
    assert r.status_code == 200 and r.json()["corpus"].isprintable() and "\x1b" not in r.json()["corpus"]


def test_a_page_started_trainings_error_names_the_pages_fields_not_flags_it_cannot_set():
    from chargpt.web.training import for_the_page
    said = for_the_page("error: out of memory; lower --batch-size (--grad-accum keeps the global batch), --block-size "
                        "or the model size (--n-embd, --n-layer)")
    assert said == ("error: out of memory; lower --batch-size (--grad-accum keeps the global batch), --block-size or "
                    "the model size (\"Width\", \"Layers\") (--batch-size, --grad-accum, --block-size: "
                    "not a setting of this page; train in a terminal with chargpt train to set them)")
    assert for_the_page("error: a --max-time of 3 s is too short") == 'error: a "Time budget" of 3 s is too short'
    assert for_the_page("error: the text is empty") == "error: the text is empty" and for_the_page(None) is None
