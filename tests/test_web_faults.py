"""The playground server when things go wrong: Stop pressed again while a training saves, a save abandoned, a full
disk during an upload or at a training's start, clients that leave, and requests the server cannot answer as asked
(a model name with a slash, NUL bytes, files that are no training text, names that would garble a terminal)."""

import sys

import pytest
from helpers import fake_training, need, sigterms

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
