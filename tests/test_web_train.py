"""Training from the playground (chargpt/web/training.py, endpoints/train.py) through Starlette's test client:
names that try to leave the server's folders, uploads too large or not UTF-8, --no-training, and real child
trainings (`python -m chargpt train`, a tiny model for a few seconds): start, watch, a second start refused, a
restarted server that finds the training, stop (saved), resume (the same run goes on), a crash reported with its
lines, and a folder of texts trained with labels. Four child processes in all, each paying torch's import."""

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest
from helpers import CORPUS_TEXT, TRAIN_ARGS, TRAIN_SIZE, assert_one_line_error, invoke, need, parse_sse, snapshot

need("starlette")
need("uvicorn")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.cli import serve_cli  # noqa: E402
from chargpt.web import limits  # noqa: E402
from chargpt.web import server as serve  # noqa: E402
from chargpt.web.body import RequestError  # noqa: E402
from chargpt.web.training import run_name, text_name  # noqa: E402

HERE = "http://127.0.0.1"
TINY = TRAIN_SIZE  # a model a person could ask for from the page (its size fields): tiny, so it trains at once
OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """(outer folder, checkpoints folder, data folder): data holds a text, a hidden one, an empty folder, a folder
    of texts by author (authors/a, authors/b), a folder with a link out, one named with an escape sequence, and a
    symlink to a secret beside the served folders."""
    outer = tmp_path_factory.mktemp("trainplace")
    checkpoints, data = outer / "checkpoints", outer / "data"
    checkpoints.mkdir(), data.mkdir(), (data / "sub").mkdir()
    (data / "corpus.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / ".hidden.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / "README.md").write_text("# data/\n\nPut your corpora here.\n", encoding="utf-8")  # as the repo's data/
    (outer / "secret.txt").write_text("the secret, which no request may read\n" * 200, encoding="utf-8")
    (data / "outside.txt").symlink_to(outer / "secret.txt")
    for label, text in (("a", CORPUS_TEXT), ("b", CORPUS_TEXT.upper())):
        (data / "authors" / label).mkdir(parents=True)
        (data / "authors" / label / "1.txt").write_text(text, encoding="utf-8")
    (data / "leaky").mkdir(), (data / "leaky" / "ok.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / "leaky" / "secret.txt").symlink_to(outer / "secret.txt")
    (data / "red\x1b[31m").mkdir(), (data / "red\x1b[31m" / "ok.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    old = os.environ.get("CHARGPT_CACHE_DIR")
    os.environ["CHARGPT_CACHE_DIR"] = str(outer / "cache")  # the children's encoded corpora stay in tmp
    yield outer, checkpoints, data
    if old is None:
        os.environ.pop("CHARGPT_CACHE_DIR", None)
    else:
        os.environ["CHARGPT_CACHE_DIR"] = old


@pytest.fixture(scope="module")
def client(place):
    app = serve.create_app(place[1], device="cpu", data_dir=place[2], train_args=TRAIN_ARGS)
    yield TestClient(app, base_url=HERE)
    if (app.state.trainings.record or {}).get("state") == "running":  # a failed test's child: saved and ended
        with contextlib.suppress(RequestError):  # unless it ended meanwhile
            app.state.trainings.stop()


def one_line_error(r, status):
    assert r.status_code == status, r.text
    message = r.json()["error"]
    assert "\n" not in message and len(message) < 300
    return message


def wait_for(client, condition, timeout=90):
    deadline = time.monotonic() + timeout
    while True:
        t = client.get("/api/train").json()["training"]
        if condition(t):
            return t
        assert time.monotonic() < deadline, t
        time.sleep(0.1)


def ended(t):
    return t["state"] not in ("running", "stopping")


# --- names and folders ----------------------------------------------------------------------------------------
def test_names_that_try_to_leave_the_folders_are_refused_and_nothing_outside_is_read_or_written(client, place):
    outer, checkpoints, data = place
    before = {k: v for k, v in snapshot(outer).items() if not k.startswith(("checkpoints", "cache"))}
    listed = client.get("/api/corpora").json()
    # not the link out, the hidden file, the empty folder, the folder with a link out, the one with an escape in its
    # name, nor the folder's README
    assert [(c["name"], c["kind"]) for c in listed["data"]] == [("corpus.txt", "file"), ("authors", "folder")]
    assert listed["data"][1] == {"name": "authors", "kind": "folder", "files": 2, "bytes": 2 * len(CORPUS_TEXT),
                                 "labels": ["none", "folders", "files"]}  # names only, never a path
    for name in ("../secret.txt", str(outer / "secret.txt"), "outside.txt", "sub", ".hidden.txt", "corpus.txt/..",
                 "..", "", "corpus.txt\x00", "leaky", "red\x1b[31m", "authors/a", str(data / "authors")):
        message = one_line_error(client.post("/api/train", json={"source": "data", "corpus": name, "max_time": 5}),
                                 404)
        assert "GET /api/corpora lists them" in message
    one_line_error(client.post("/api/train", json={"source": "data", "corpus": ["corpus.txt"], "max_time": 5}), 400)
    one_line_error(client.post("/api/train", json={"source": "disk", "corpus": "/etc/passwd", "max_time": 5}), 400)
    bad_preset = client.post("/api/train", json={"max_time": 5, "preset": "x"})
    assert one_line_error(bad_preset, 400).startswith("preset must be one of auto")
    for name in ("../tiny", "/etc", ".playground", "..", "%2e%2e"):
        one_line_error(client.post("/api/train/resume", json={"run": name}), 404)
    # uploads land in the server's uploads folder whatever their name says
    for name, kept in (("../../evil.txt", "evil.txt"), ("/etc/passwd", "passwd.txt"), ("..\\..\\win.ini", "win.txt"),
                       (".bashrc", "bashrc.txt"), ("", "upload.txt"), ("con.txt", "con_.txt")):
        r = client.post(f"/api/train/upload?name={name}", content=b"hello\n" * 10, headers=OCTETS)
        assert r.status_code == 200 and r.json()["corpus"] == kept, (name, r.text)
        assert (checkpoints / ".playground" / "uploads" / kept).read_bytes() == b"hello\n" * 10
    assert {k: v for k, v in snapshot(outer).items() if not k.startswith(("checkpoints", "cache"))} == before
    assert client.get("/api/train").json()["training"] is None  # nothing was started
    # run names become one folder name inside the checkpoints folder, never hidden (.playground is the server's)
    for name in ("../x", "/etc/passwd", ".playground", "..", "a/../../b", "nul", " . "):
        made = run_name(name)
        assert "/" not in made and "\\" not in made and not made.startswith(".") and made
        assert (checkpoints / made).resolve().parent == checkpoints.resolve()
    assert text_name("C:\\Users\\me\\notes.md") == "notes"


def test_a_server_folder_that_links_out_is_refused(tmp_path):
    (tmp_path / "checkpoints").mkdir(), (tmp_path / "elsewhere").mkdir()
    (tmp_path / "checkpoints" / ".playground").symlink_to(tmp_path / "elsewhere")
    linked = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu"), base_url=HERE)
    r = linked.post("/api/train/upload?name=a.txt", content=b"some text\n", headers=OCTETS)
    assert "is a link" in one_line_error(r, 500)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_serve_takes_the_training_flags_and_names_a_missing_data_folder(tmp_path):
    r = invoke(serve_cli, ["--checkpoints", tmp_path, "--data-dir", tmp_path / "nope", "--no-training"])
    assert_one_line_error(r, "no data folder .*nope; pass --data-dir a folder of text files")


def test_oversized_and_non_utf8_uploads_are_refused_with_nothing_left_behind(client, place):
    checkpoints = place[1]
    before = snapshot(checkpoints)
    big = b"a" * (limits.MAX_UPLOAD_BYTES + 1)
    assert "limit" in one_line_error(client.post("/api/train/upload?name=big.txt", content=big, headers=OCTETS), 413)

    def chunks():  # no Content-Length: the cap holds on the bytes that arrive
        for _ in range(limits.MAX_UPLOAD_BYTES // 2**20 + 1):
            yield b"a" * 2**20
    one_line_error(client.post("/api/train/upload?name=big.txt", content=chunks(), headers=OCTETS), 413)
    message = one_line_error(client.post("/api/train/upload?name=latin.txt", content="café".encode("latin-1") * 9,
                                         headers=OCTETS), 400)
    assert "not UTF-8" in message and "byte 3" in message
    one_line_error(client.post("/api/train/upload?name=half.txt", content="é".encode()[:1], headers=OCTETS), 400)
    assert "empty" in one_line_error(client.post("/api/train/upload?name=e.txt", content=b"", headers=OCTETS), 400)
    # a type a cross-site form could send is refused: another site's page cannot upload here
    one_line_error(client.post("/api/train/upload?name=t.txt", content=b"hi", headers={"content-type": "text/plain"}),
                   415)
    assert snapshot(checkpoints) == before


def test_no_training_answers_403_everywhere_and_writes_nothing(place, tmp_path):
    off = TestClient(serve.create_app(tmp_path, device="cpu", training=False, data_dir=place[2]), base_url=HERE)
    for method, path, kw in (("get", "/api/train", {}), ("get", "/api/corpora", {}),
                             ("post", "/api/train", {"json": {"max_time": 5}}), ("post", "/api/train/stop", {}),
                             ("post", "/api/train/resume", {"json": {"run": "x"}}),
                             ("post", "/api/train/upload?name=a.txt", {"content": b"abc", "headers": OCTETS})):
        message = one_line_error(getattr(off, method)(path, **kw), 403)
        assert "--no-training" in message
    assert list(tmp_path.iterdir()) == []


def test_labels_from_the_page_reach_the_child_and_a_bad_choice_is_one_line(tmp_path, monkeypatch):
    """The labels choice becomes chargpt train's --labels (a manifest by its path in the folder); a value that is no
    choice, a choice the folder lacks, and labels on a corpus that is one text are 400s the page shows."""
    from chargpt.web import training
    data = tmp_path / "data"
    for label in ("a", "b"):
        (data / "authors" / label).mkdir(parents=True)
        (data / "authors" / label / "1.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / "flat").mkdir(), (data / "flat" / "x.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / "flat" / "who.tsv").write_text("x.txt\tx\n", encoding="utf-8")
    (data / "one.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    launched = []

    class Recorded(subprocess.Popen):  # the command is kept; the child ends at once, training nothing
        def __init__(self, argv, *args, **kw):
            super().__init__([sys.executable, "-c", ""], *args, **kw)
            launched.append((argv, self))
    monkeypatch.setattr(training.subprocess, "Popen", Recorded)
    client = TestClient(serve.create_app(tmp_path / "checkpoints", device="cpu", data_dir=data), base_url=HERE)
    assert {c["name"]: c.get("labels") for c in client.get("/api/corpora").json()["data"]} == {
        "one.txt": None, "authors": ["none", "folders", "files"], "flat": ["none", "files", "who.tsv"]}

    def labels_of(corpus, labels):
        r = client.post("/api/train", json={"source": "data", "corpus": corpus, "max_time": 5, "labels": labels})
        assert r.status_code == 200, r.text
        argv, proc = launched[-1]
        proc.wait()
        assert argv[argv.index("--data") + 1] == str((data / corpus).resolve())
        return argv[argv.index("--labels") + 1] if "--labels" in argv else None
    assert labels_of("authors", "folders") == "folders"
    assert labels_of("flat", "who.tsv") == str((data / "flat" / "who.tsv").resolve())
    assert labels_of("authors", "none") is None and labels_of("flat", None) is None  # one text of its files
    (data / "flat" / "out.tsv").write_text("x.txt\tx\n../one.txt\ty\n", encoding="utf-8")  # reaches past the folder
    r = client.post("/api/train", json={"source": "data", "corpus": "flat", "max_time": 5, "labels": "out.tsv"})
    assert r.status_code == 400 and "out.tsv line 2 names '../one.txt', which is outside the folder flat" in r.text
    for body, said in (
            ({"corpus": "authors", "labels": "authors"}, "labels must be none, folders, files or the name of a .tsv "
                                                         "manifest in the chosen folder"),
            ({"corpus": "authors", "labels": "../flat/who.tsv"}, "labels must be none, folders, files"),
            ({"corpus": "authors", "labels": ["folders"]}, "labels must be a string or null"),
            ({"corpus": "authors", "labels": "who.tsv"}, "labels 'who.tsv' is not a choice for the folder authors; "
                                                         "its choices: none, folders, files"),
            ({"corpus": "flat", "labels": "folders"}, "labels 'folders' is not a choice for the folder flat (it has "
                                                      "texts outside its subfolders"),
            ({"corpus": "one.txt", "labels": "folders"}, "labels 'folders' need a folder of texts, and one.txt is one "
                                                         "text; choose a folder from the data folder for Text, or set "
                                                         "Labels to none"),
            ({"source": "builtin", "labels": "files"}, "labels 'files' need a folder of texts, and the built-in "
                                                       "corpus is one text")):
        r = client.post("/api/train", json={"source": "data", "max_time": 5, **body})
        assert one_line_error(r, 400).startswith(said), r.text
    assert len(launched) == 4  # nothing more was started


# --- real trainings -------------------------------------------------------------------------------------------
def test_start_watch_restart_stop_and_resume_one_run(client, place):
    checkpoints = place[1]
    r = client.post("/api/train", json={"source": "data", "corpus": "corpus.txt", "name": "web run", "max_time": 60,
                                        "sample_every": 20, **TINY})
    assert r.status_code == 200, r.text
    assert r.json()["training"]["state"] == "running" and r.json()["training"]["run"] == "web run"
    run = checkpoints / "web run"
    t = wait_for(client, lambda t: t["progress"]["step"] >= 20 and t["samples"] or ended(t))
    assert t["state"] == "running", t["log"]
    startup = "\n".join(t["startup"])  # what --preset auto chose, and the budget, before the first evaluation
    assert "auto: the model's size is given (1 x 16, context 16, batch 4)" in startup and "budget: 60 s" in startup
    assert t["samples"][-1]["step"] % 20 == 0 and t["progress"]["chars_per_s"] > 0 and 0 < t["progress"]["left_s"] < 60
    metrics = client.get("/api/runs/web run/metrics").json()  # the live curves: the Runs view's endpoint
    assert metrics["rows"] and metrics["running"]

    second = client.post("/api/train", json={"max_time": 5, **TINY})
    assert "uses all of this machine's cores" in one_line_error(second, 409)
    one_line_error(client.post("/api/train/resume", json={"run": "web run"}), 409)

    # a server started again on the folder finds the training by its pid and its run's lock, and can stop it
    again = TestClient(serve.create_app(checkpoints, device="cpu", train_args=TRAIN_ARGS), base_url=HERE)
    found = again.get("/api/train").json()["training"]
    assert (found["state"], found["pid"], found["run"]) == ("running", t["pid"], "web run")
    assert again.post("/api/train/stop").json()["training"]["state"] == "stopping"
    t = wait_for(client, ended)
    assert (t["state"], t["exit_code"]) == ("stopped", 143), t["log"]  # the server that started it knows its code
    assert t["resumable"] and (run / "state.safetensors").is_file()
    assert any(line.startswith("interrupted at step") for line in t["log"])
    assert wait_for(again, ended)["state"] == "stopped"  # watched by pid: the state from its last lines
    stopped_at = client.get("/api/runs/web run").json()["step"]

    r = client.post("/api/train/resume", json={"run": "web run", "max_time": 1})
    assert r.status_code == 200 and r.json()["training"]["run"] == "web run"
    t = wait_for(client, ended)
    assert (t["state"], t["exit_code"]) == ("finished", 0), t["log"]
    assert any(line.startswith(f"resuming {run.resolve()} at step") for line in t["startup"]), t["startup"]
    assert client.get("/api/runs/web run").json()["step"] > stopped_at
    assert [p.name for p in checkpoints.iterdir() if p.name.startswith("web run")] == ["web run"]  # the same run
    # went on
    # at once in Write, from its final checkpoint (the model cache keys by the file's mtime)
    events = parse_sse(client.post("/api/generate", json={"run": "web run", "prompt": "To", "max_new_tokens": 5,
                                                          "seed": 1}).text)
    assert events[-1][0] == "done" and events[-1][1]["chars"] == 5
    best = run.resolve() / "best.safetensors"
    assert (str(best), best.stat().st_mtime_ns) in client.app.state.models.loaded


def test_a_crashed_training_is_reported_with_its_last_lines(client, place):
    name = client.post("/api/train/upload?name=short.txt", content=b"ab", headers=OCTETS).json()["corpus"]
    r = client.post("/api/train", json={"source": "upload", "corpus": name, "max_time": 5, **TINY})
    assert r.status_code == 200, r.text
    t = wait_for(client, ended)
    assert (t["state"], t["exit_code"]) == ("crashed", 1)
    assert t["error"].startswith("error: the validation split is empty") and t["log"][-1].startswith(t["error"][:60])
    assert t["error"].endswith("--block-size, --val-fraction, --val-split: not a setting of this page; train in a "
                               "terminal with chargpt train to set them)")  # the page has no such field
    assert not t["resumable"] and not (place[1] / "short").exists()  # a failed start leaves no run directory


def test_a_labels_run_trained_from_the_page_lists_its_labels(client, place):
    r = client.post("/api/train", json={"source": "data", "corpus": "authors", "labels": "folders", "name": "by author",
                                        "max_time": 2, **TINY})
    assert r.status_code == 200, r.text
    t = wait_for(client, ended)
    assert (t["state"], t["exit_code"]) == ("finished", 0), t["log"]
    assert any(line.startswith("labels: 2 (a 50.0%, b 50.0% of the characters)") for line in t["startup"]), t["startup"]
    assert {r["name"]: r["labels"] for r in client.get("/api/runs").json()["runs"]}["by author"] == ["a", "b"]


def test_how_a_training_went_is_read_from_what_the_run_wrote(tmp_path):
    """status.json (written by the run) says how a session ended and its last step: no log text is parsed, and a
    status a killed training left ('training') means it crashed, or, when a stop was asked for, stopped without
    its save."""
    from chargpt.web.training import how_it_ended, progress, run_status
    run = tmp_path / "run"
    run.mkdir()
    assert run_status(run) is None and how_it_ended(None, False, None) == "crashed"  # it never trained a step
    said = {"state": "finished", "step": 273, "elapsed_s": 29.5, "chars_per_step": 64, "max_time": 30.0,
            "max_iters": 10**12, "budget_elapsed_s": 0.0, "error": None, "updated": 1.0}
    (run / "status.json").write_text(json.dumps(said), encoding="utf-8")
    status = run_status(run)
    assert how_it_ended(None, False, status) == "finished" and how_it_ended(143, True, status) == "stopped"
    rows = [{"step": s, "elapsed_s": s / 10} for s in (231, 241, 251, 261, 271)]  # every 10 steps: 271 the last
    shown = progress(rows, status, 30.0, 0.0)
    assert shown["step"] == 273 and shown["chars_per_s"] == pytest.approx(640) and 0 <= shown["left_s"] <= 30
    assert progress([], None, 30.0, 0.0)["left_s"] == 30.0  # nothing trained yet: all of it, never more
    for killed in ({**said, "state": "training"}, {**said, "state": "failed", "error": "loss became nan"}):
        (run / "status.json").write_text(json.dumps(killed), encoding="utf-8")
        assert how_it_ended(None, False, run_status(run)) == "crashed"
    assert how_it_ended(None, True, {**said, "state": "training"}) == "abandoned"  # killed before its save
    (run / "status.json").write_text('{"state": "finished", "step": "lots"}', encoding="utf-8")
    assert run_status(run) is None  # not one chargpt wrote
