"""--log-to: a run logged to TensorBoard, W&B and MLflow holds, read back with each tracker's own reader, the numbers
of its metrics.jsonl and train_loss.jsonl, its samples and its settings; --resume continues the same tracker runs;
a missing tracker package is a one-line error before any work, and a tracker that fails mid-run is dropped with
one warning while training completes. Everything offline: W&B writes its offline run files, MLflow a file store,
both inside the run directory."""

import json
import math
import struct
import sys

import pytest
from helpers import CORPUS_TEXT, TINY_FLAGS, TINY_RUN_KW, api_pattern, assert_one_line_error, invoke, need

import chargpt
from chargpt.cli import train_cli
from chargpt.errors import ChargptError, ConfigError

TRACKERS = ("tensorboard", "wandb", "mlflow")


def tracker_env(mp, root):
    """Offline and hermetic: the trackers' own settings and caches under root, none of the user's choices."""
    for name in ("WANDB_MODE", "WANDB_PROJECT", "WANDB_SILENT", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                 "MLFLOW_ALLOW_FILE_STORE"):  # deleted now, and whatever the trackers set is undone afterwards
        mp.delenv(name, raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        mp.setenv(name, str(root / name.lower()))


def jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A run logged to all three trackers: 20 steps, then --resume to 40 (evaluations every 10 steps, a sample
    every 10) -> (run directory, trackers.json after the first session, after the second, the log lines)."""
    for module in TRACKERS:
        need(module)
    root = tmp_path_factory.mktemp("tracked")
    corpus = root / "corpus.txt"
    corpus.write_text(CORPUS_TEXT, encoding="utf-8")
    out, lines = root / "run", []
    kw = dict(TINY_RUN_KW, data=str(corpus), out_dir=str(out), cache_dir=str(root / "cache"), eval_interval=10,
              sample_every=10, sample_chars=12, curves=False, log=lines.append)
    with pytest.MonkeyPatch.context() as mp:
        tracker_env(mp, root)
        mp.chdir(root)
        chargpt.train(max_iters=20, log_to="tensorboard,wandb,mlflow", **kw)
        first = json.loads((out / "trackers.json").read_text())
        chargpt.train(max_iters=40, resume=True, **kw)  # --log-to is kept with the run's settings
        second = json.loads((out / "trackers.json").read_text())
        __import__("wandb").teardown()  # W&B's service process would otherwise idle until the tests end
        assert not list(root.glob("mlruns")) and not list(root.glob("wandb"))  # nothing in the current folder
        yield out, first, second, lines


def expected(out):
    """{metric: {step: value}} as the run's own files say: what every tracker must hold."""
    want = {}
    for row in jsonl(out / "metrics.jsonl"):
        for key in ("train_loss", "val_loss", "train_bpc", "val_bpc", "train_bpb", "val_bpb", "lr"):
            want.setdefault(f"eval/{key}", {})[row["step"]] = row[key]
    for row in jsonl(out / "train_loss.jsonl"):
        want.setdefault("train/loss", {})[row["step"]] = row["train_loss"]
        want.setdefault("train/bpc", {})[row["step"]] = row["train_loss"] / math.log(2)
        want.setdefault("train/lr", {})[row["step"]] = row["lr"]
    assert sorted(want["eval/val_loss"]) == [0, 10, 20, 30, 40]  # both sessions, each evaluation once
    return want


def assert_same(got, want, rel):
    for key, steps in want.items():
        assert key in got, (key, sorted(got))
        assert got[key].keys() == steps.keys(), key
        for step, value in steps.items():
            assert got[key][step] == pytest.approx(value, rel=rel), (key, step)


def test_tensorboard_event_files_hold_the_runs_numbers_samples_and_settings(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    out, first, second, _ = tracked
    assert first["tensorboard"] == second["tensorboard"] == {"log_dir": "tensorboard"}
    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    got = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    assert_same(got, expected(out), rel=1e-6)  # TensorBoard keeps float32
    assert all(v > 0 for v in got["train/chars_per_s"].values())

    def texts(tag):
        return {e.step: e.tensor_proto.string_val[0].decode() for e in events.Tensors(f"{tag}/text_summary")}
    samples = jsonl(out / "samples.jsonl")
    assert [s["step"] for s in samples] == [10, 20, 30, 40]
    assert all(s["text"].split("\n")[-1] in texts("samples")[s["step"]] for s in samples)
    assert sorted(texts("settings")) == [0, 20]  # once per session, at the step it starts from
    assert "model.n_embd = 16" in texts("settings")[20] and str(out.resolve()) in texts("run_dir")[0]
    assert "auto" in texts("auto_sizing")[0]  # what --preset auto chose, and why


def wandb_records(path):
    """The records of an offline W&B run file (run-ID.wandb): LevelDB's log framing, 32 KiB blocks of chunks
    (crc32, length, type), around wandb's own protobuf Records."""
    from wandb.proto import wandb_internal_pb2
    data, block, head = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B"
    pos, pending, records = head, b"", []
    while pos + head <= len(data):
        if block - pos % block < head:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + head])
        if kind == 0:
            pos += block - pos % block
            continue
        pending += data[pos + head:pos + head + length]
        pos += head + length
        if kind in (1, 4):  # a full record, or a record's last chunk
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def test_wandb_offline_run_holds_the_runs_numbers_and_settings_and_resume_continues_it(tracked):
    out, first, second, lines = tracked
    assert first["wandb"]["id"] == second["wandb"]["id"]
    run_id = first["wandb"]["id"]
    sessions = sorted((out / "wandb").glob("offline-run-*"))
    assert len(sessions) == 2 and all(s.name.endswith(run_id) for s in sessions)
    got, config, ids = {}, {}, set()
    for session in sessions:
        for record in wandb_records(next(session.glob("run-*.wandb"))):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
                config.update({u.key: json.loads(u.value_json) for u in record.run.config.update})
            elif kind == "config":
                config.update({u.key: json.loads(u.value_json) for u in record.config.update})
            elif kind == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}
                for key, value in row.items():
                    if isinstance(value, float | int) and "step" in row:
                        got.setdefault(key, {})[row["step"]] = value
    assert ids == {run_id}  # the resumed session continued the same W&B run
    assert_same(got, expected(out), rel=1e-9)
    assert config["model"]["n_embd"] == 16 and config["train"]["log_to"] == "tensorboard,wandb,mlflow"
    assert config["run_dir"] == str(out.resolve()) and config["auto_sizing"]
    table = sorted((sessions[1] / "files" / "media" / "table").glob("samples_*.table.json"))[-1]
    rows = json.loads(table.read_text())["data"]
    assert [r[0] for r in rows] == [30, 40] and rows[-1][2] == jsonl(out / "samples.jsonl")[-1]["text"]
    said = [line for line in lines if line.startswith("trackers: ")]
    assert len(said) == 2 and f"wandb run {run_id} -> {out / 'wandb'} (offline" in said[0]


def test_mlflow_store_holds_the_runs_numbers_samples_and_settings_in_one_run_over_a_resume(tracked):
    from mlflow.tracking import MlflowClient
    out, first, second, _ = tracked
    assert first["mlflow"] == second["mlflow"]
    run_id, uri = first["mlflow"]["run_id"], first["mlflow"]["tracking_uri"]
    assert uri == (out / "mlruns").resolve().as_uri()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's own switch for its file store
        client = MlflowClient(uri)
        want = expected(out)
        got = {key: {m.step: m.value for m in client.get_metric_history(run_id, key)} for key in want}
        run = client.get_run(run_id)
        samples = client.list_artifacts(run_id, "samples")
        sizing = client.download_artifacts(run_id, "auto_sizing.txt", str(out.parent / "artifacts"))
    assert_same(got, want, rel=1e-9)
    assert run.info.status == "FINISHED" and run.data.params["model.n_embd"] == "16"
    assert run.data.tags["chargpt.run_dir"] == str(out.resolve())
    assert [a.path for a in samples] == [f"samples/step-{s:09d}.txt" for s in (10, 20, 30, 40)]
    assert "auto" in open(sizing, encoding="utf-8").read()


@pytest.mark.parametrize("tracker,extra", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("mlflow", "mlflow")])
def test_a_missing_tracker_package_is_a_one_line_error_before_any_work(tmp_path, monkeypatch, corpus, tracker, extra):
    monkeypatch.setitem(sys.modules, tracker, None)  # what an import of a package that is not installed does
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=api_pattern(rf"--log-to {tracker}'? needs the .*pip install -e "
                                                      rf"\"\.\[{extra}\]\"")):
        chargpt.train(data=str(corpus), out_dir=str(out), max_iters=2, log_to=f"{tracker},mlflow",
                      log=lambda *a: None, **TINY_RUN_KW)
    assert not out.exists()
    r = invoke(train_cli, ["--data", corpus, "--out-dir", out, "--max-iters", "2", "--log-to", tracker, *TINY_FLAGS])
    assert_one_line_error(r, rf'--log-to {tracker} needs .* not installed: pip install -e "\.\[{extra}\]"')
    assert not out.exists()


def test_an_unknown_tracker_is_a_one_line_error_naming_the_ones_there_are(tmp_path, corpus):
    r = invoke(train_cli, ["--data", corpus, "--out-dir", tmp_path / "run", "--log-to", "tensorbord", *TINY_FLAGS])
    assert_one_line_error(r, r"--log-to: no tracker named 'tensorbord' \(did you mean tensorboard\?\); name one or "
                             r"more of tensorboard, wandb, mlflow")
    assert not (tmp_path / "run").exists()


def test_none_beside_trackers_is_an_error_saying_it_cannot_be_combined(tmp_path, corpus):
    r = invoke(train_cli, ["--data", corpus, "--out-dir", tmp_path / "run", "--log-to", "none,tensorboard",
                           *TINY_FLAGS])
    assert_one_line_error(r, r"--log-to: none \(no tracker\) cannot be combined with trackers; give it alone$")
    assert not (tmp_path / "run").exists()


def test_a_tracker_that_cannot_start_is_a_one_line_error_and_leaves_no_run_directory(tmp_path, monkeypatch,
                                                                                      corpus):
    need("mlflow")
    tracker_env(monkeypatch, tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "nosuchscheme://nowhere")  # MLflow knows no such store
    out = tmp_path / "run"
    with pytest.raises(ChargptError, match=r"^log_to='mlflow': MLflow did not start \(.*nosuchscheme.*\); fix that, "
                                           r"or drop it from log_to$"):
        chargpt.train(data=str(corpus), out_dir=str(out), max_iters=2, log_to="tensorboard,mlflow",
                      log=lambda *a: None, **TINY_RUN_KW)
    assert not out.exists()  # TensorBoard's folder, opened first, went with it


def closed_port():
    import socket
    with socket.socket() as sock:  # bound, never listening: a connection is refused at once
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_tracking_server_that_does_not_answer_is_said_at_once_and_refused_within_seconds(tmp_path, monkeypatch,
                                                                                         corpus):
    import time
    need("mlflow")
    tracker_env(monkeypatch, tmp_path)
    url = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", url)
    said, out, t0 = [], tmp_path / "run", time.perf_counter()
    with pytest.raises(ConfigError, match=rf"^MLflow: cannot reach {url} \(.+\); start the tracking server"):
        chargpt.train(data=str(corpus), out_dir=str(out), max_iters=2, log_to="mlflow", log=said.append,
                      **TINY_RUN_KW)
    assert time.perf_counter() - t0 < 60  # not MLflow's minutes of retries
    assert f"MLflow: connecting to {url} (at most 5 s)" in said and not out.exists()


def test_a_server_is_reachable_or_says_why_within_its_timeout():
    import socket
    import time

    from chargpt.training.trackers import unreachable
    t0 = time.perf_counter()
    assert unreachable(f"http://127.0.0.1:{closed_port()}", timeout=2.0)
    assert unreachable("http://192.0.2.1:9", timeout=0.5)  # a documentation address: nothing answers
    assert time.perf_counter() - t0 < 10
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        assert unreachable(f"http://127.0.0.1:{server.getsockname()[1]}/api", timeout=2.0) is None
    assert unreachable("file:///tmp/mlruns") is None and unreachable("databricks") is None


def test_a_tracker_failing_mid_run_warns_once_and_training_completes(tmp_path, monkeypatch, corpus):
    need("tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    calls = []

    def full_disk(self, *args, **kw):
        calls.append(args)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(SummaryWriter, "add_scalar", full_disk)
    lines, out = [], tmp_path / "run"
    summary = chargpt.train(data=str(corpus), out_dir=str(out), max_iters=30, eval_interval=10, log_to="tensorboard",
                            log=lines.append, **TINY_RUN_KW)
    assert summary["step"] == 30 and [r["step"] for r in jsonl(out / "metrics.jsonl")] == [0, 10, 20, 30]
    warnings = [line for line in lines if "TensorBoard failed" in line]
    assert len(calls) == 1 and len(warnings) == 1 and "\n" not in warnings[0]
    assert warnings[0].startswith("warning: TensorBoard failed (OSError: [Errno 28] No space left on device)")


def test_per_label_validation_losses_are_metrics_every_tracker_takes():
    """--labels: each label's validation loss (metrics.jsonl's val_loss_by_label) reaches the trackers as its own
    curve, under a name MLflow accepts too (letters of any script, digits, _ - . and spaces)."""
    from chargpt.training.trackers import metrics
    record = {"step": 10, "val_loss": 1.5, "val_loss_by_label": {"Li Bai": 1.25, "杜甫": 1.75, "a&b?": 2.0,
                                                                  "empty": float("nan")}}
    got = metrics("eval", record)
    assert got == {"eval/val_loss": 1.5, "eval/val_loss_by_label/Li Bai": 1.25, "eval/val_loss_by_label/杜甫": 1.75,
                   "eval/val_loss_by_label/a_b_": 2.0}
