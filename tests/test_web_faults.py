"""The playground server when things go wrong: Stop pressed again while a training saves, a save abandoned, a full
disk during an upload or at a training's start, clients that leave, and requests the server cannot answer as asked
(a model name with a slash, NUL bytes, files that are no training text, names that would garble a terminal)."""

import errno
import subprocess
import sys

import pytest
from helpers import CORPUS_TEXT, fake_training, need, sigterms

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
