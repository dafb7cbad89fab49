"""A run's records reach every sink: its own .jsonl files, and any logger passed to chargpt.train beside them,
with the same content, in step order; the loop needs no change for a new one."""

import json

import pytest

import chargpt
from chargpt.runs.rundir import LOSSES, METRICS, SAMPLES, STATUS

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=1, dropout=0.0,
               threads=1, dtype="float32", curves=False, sample_chars=8, sample_every=10, eval_interval=10)


class Recorder:
    def __init__(self):
        self.records, self.closed = [], 0

    def write(self, kind, record):
        self.records.append((kind, dict(record)))

    def close(self):
        self.closed += 1


def lines(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_logger_gets_what_the_run_files_get(tmp_path, corpus):
    sink = Recorder()
    chargpt.train(data=str(corpus), out_dir="run", max_iters=20, log=lambda m: None, sinks=[sink], **TINY_KW)
    by_kind = {kind: [r for k, r in sink.records if k == kind] for kind in ("train", "eval", "sample")}
    assert by_kind["eval"] == lines(tmp_path / "run" / METRICS)
    assert by_kind["train"] == lines(tmp_path / "run" / LOSSES)
    assert by_kind["sample"] == lines(tmp_path / "run" / SAMPLES)
    assert [r["step"] for r in by_kind["eval"]] == [0, 10, 20]
    assert [r["step"] for r in by_kind["sample"]] == [10, 20]
    assert [r["step"] for r in by_kind["train"]] == [1, 11]
    assert {"val_loss", "val_bpc", "lr", "elapsed_s"} <= by_kind["eval"][0].keys()
    assert sink.closed == 1


def test_a_logger_is_closed_when_the_run_fails(tmp_path, corpus):
    sink = Recorder()
    with pytest.raises(chargpt.ChargptError, match="loss became"):
        chargpt.train(data=str(corpus), out_dir="run", max_iters=20, learning_rate=1e6, log=lambda m: None,
                      sinks=[sink], **{**TINY_KW, "optimizer": "adamw", "warmup_iters": 0, "grad_clip": 0.0})
    assert sink.closed == 1


def status(run_dir):
    return json.loads((run_dir / STATUS).read_text(encoding="utf-8"))


def test_the_run_says_how_it_goes_and_how_it_ended_in_status_json(tmp_path, corpus):
    """What the playground reads to follow a training it started (not the log's text): the last step exactly (the
    running-loss rows come every 10 steps), the characters a step, and how the session ended."""
    chargpt.train(data=str(corpus), out_dir="run", max_iters=13, log=lambda m: None, **TINY_KW)
    done = status(tmp_path / "run")
    assert (done["state"], done["step"], done["error"]) == ("finished", 13, None)
    assert done["chars_per_step"] == 4 * 16 and done["max_iters"] == 13 and done["elapsed_s"] > 0
    assert lines(tmp_path / "run" / LOSSES)[-1]["step"] < 13  # what the rows alone would have said
    with pytest.raises(chargpt.ChargptError, match="loss became"):
        chargpt.train(data=str(corpus), out_dir="bad", max_iters=40, learning_rate=1e6, log=lambda m: None,
                      **{**TINY_KW, "optimizer": "adamw", "warmup_iters": 0, "grad_clip": 0.0})
    failed = status(tmp_path / "bad")
    assert failed["state"] == "failed" and failed["error"].startswith("loss became") and "\n" not in failed["error"]


def test_a_start_that_fails_writes_no_status(tmp_path, corpus):
    with pytest.raises(chargpt.ChargptError):
        chargpt.train(data=str(corpus), out_dir="run", max_iters=2, log_to="nonsense", log=lambda m: None, **TINY_KW)
    assert not (tmp_path / "run").exists()  # the new run directory is gone again, empty
