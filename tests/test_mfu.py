"""Model FLOPs utilisation (chargpt/training/mfu.py): nanoGPT's FLOPs per token for a tiny model counted by hand, the
peak from the published table on a known GPU and measured elsewhere, and `mfu` in a real run's train records (and so
in every tracker's metrics), in its start-up lines with how the peak was found, and on the progress bar."""

import json
import math

import pytest
import torch
from helpers import CORPUS_TEXT, TINY_RUN_KW

import chargpt
from chargpt.config import ModelConfig
from chargpt.model.transformer import CharGPT
from chargpt.training import mfu
from chargpt.training.progress import LOG_EVERY, Progress
from chargpt.training.trackers import metrics

TINY = dict(n_layer=2, n_head=2, n_embd=16, block_size=8, vocab_size=10, dropout=0.0)


def test_flops_per_token_is_six_per_multiplying_weight_and_twelve_per_attention_position():
    # by hand, for 2 layers of width 16 (4x MLP, biases), 8 positions, 10 characters:
    per_block = 2 * 32 + (16 * 48 + 48) + (16 * 16 + 16) + (16 * 64 + 64) + (64 * 16 + 16)  # 2 norms, qkv, proj, MLP
    weights = 10 * 16 + 2 * per_block + 32  # the embedding (also the output head: tied), the blocks, the last norm
    model = CharGPT(ModelConfig(**TINY))
    assert model.num_params() == weights + 8 * 16  # and the learned positions, which do not multiply
    attention = 12 * 2 * 2 * (16 // 2) * 8  # 12 L H Q T
    assert mfu.flops_per_token(model) == 6 * weights + attention == 43_584
    untied = CharGPT(ModelConfig(**TINY, tie_weights=False))  # a separate head: the same multiplies
    assert mfu.flops_per_token(untied) == 43_584
    sinusoidal = CharGPT(ModelConfig(**{**TINY, "pos_emb": "sinusoidal"}))  # no position table to leave out
    assert mfu.flops_per_token(sinusoidal) == 43_584


def test_a_known_gpu_uses_its_published_peak_and_others_are_measured_once(monkeypatch):
    for name, peak in (("NVIDIA H200", 989e12), ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device, name=name: name)
        got, how = mfu.device_peak(torch.device("cuda", 0), torch.bfloat16)
        assert got == peak and how == f"{peak / 1e12:.0f} TFLOP/s, the published dense bfloat16 peak of the {name}"
    first, how = mfu.device_peak("cpu", torch.float32)
    assert first > 0 and "measured on this CPU" in how and "float32 matmuls" in how
    assert mfu.device_peak("cpu", torch.float32)[0] == first  # cached: measured once per process


def test_the_progress_record_and_bar_carry_the_utilisation(monkeypatch):
    now = [0.0]
    monkeypatch.setattr("time.perf_counter", lambda: now[0])
    p = Progress(step=0, elapsed=0.0, max_iters=101, chars_per_step=100, show=False,
                 mfu=mfu.Utilisation(flops_per_char=2_000, peak=4e6))
    p.step(1, torch.tensor(2.0), 1e-3, 0.0, None)
    for step in range(2, LOG_EVERY + 2):
        now[0] += 0.1
        record = p.step(step, torch.tensor(1.0), 1e-3, now[0], None)
    assert record["chars_per_s"] == 1000.0 and record["mfu"] == 0.5  # 1,000 chars/s x 2,000 FLOPs of 4 MFLOP/s
    assert "mfu=50.0%" in p.bar.postfix
    assert p.session_mfu(11) == pytest.approx(11 * 100 / 1.0 * 2_000 / 4e6)  # 11 steps of 100 in 1 s
    assert Progress(0, 0.0, 101, 100, show=False).step(1, torch.tensor(1.0), 1e-3, 0.0, None).keys() == {
        "step", "train_loss", "lr", "elapsed_s", "chars_per_s"}  # a model without a formula: no mfu


def test_a_tiny_run_logs_mfu_in_its_train_records_and_says_how_it_found_the_peak(tmp_path):
    (tmp_path / "corpus.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    records = []

    class Tracker:  # what a tracker is handed (training/trackers.py makes its metrics from it)
        def write(self, kind, record):
            records.append((kind, record))

        def close(self):
            pass
    chargpt.train(**TINY_RUN_KW, data=str(tmp_path / "corpus.txt"), out_dir=str(tmp_path / "run"), max_iters=30,
                  cache_dir=str(tmp_path / "cache"), curves=False, log=lambda *a: None, sinks=[Tracker()])
    rows = [json.loads(line) for line in (tmp_path / "run" / "train_loss.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all(math.isfinite(r["mfu"]) and 0 < r["mfu"] <= 1.5 for r in rows)
    handed = [r for kind, r in records if kind == "train"]
    assert [r["mfu"] for r in handed] == [r["mfu"] for r in rows]
    assert metrics("train", handed[-1])["train/mfu"] == rows[-1]["mfu"]  # tensorboard, wandb and mlflow alike
    log = (tmp_path / "run" / "train.log").read_text(encoding="utf-8")
    line = next(ln for ln in log.splitlines() if "mfu: model FLOPs" in ln)
    assert "a character, 6N + 12·L·H·Q·T) against a peak of" in line and "GFLOP/s, measured on this CPU" in line
