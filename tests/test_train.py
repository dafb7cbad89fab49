"""End to end: the real train.py and sample.py as a user runs them, and checkpoint round trips."""

import json
import re
import time

import pytest
import torch
from helpers import TINY_FLAGS, run_cli
from safetensors import safe_open

import chargpt
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import load_model, save_model
from chargpt.runtime import pick_dtype
from chargpt.sampling import engine
from chargpt.training import trainer as training
from chargpt.training import validate


def test_save_load_gives_identical_logits(tmp_path, tiny_config):
    torch.manual_seed(0)
    vocab = Vocab("\nabcdefghij")
    model = CharGPT(tiny_config).eval()
    save_model(tmp_path / "m.safetensors", model, vocab, step=7)
    loaded, vocab2, meta = load_model(tmp_path / "m.safetensors")
    idx = torch.randint(0, 11, (2, 16))
    torch.testing.assert_close(loaded(idx)[0], model(idx)[0], rtol=0, atol=0)
    assert vocab2 == vocab and loaded.config == tiny_config and meta["step"] == 7
    assert loaded.lm_head.weight is loaded.wte.weight  # tying survives the round trip


def test_train_then_sample_end_to_end(corpus, tmp_path):
    out = tmp_path / "run"
    r = run_cli("train.py", "--data", corpus, "--out-dir", out, "--max-iters", "40", "--eval-interval", "20",
                "--learning-rate", "3e-3", "--warmup-iters", "5", *TINY_FLAGS, "--sample-chars", "50")
    assert r.returncode == 0, r.stderr
    assert "step     40" in r.stderr and "bpc" in r.stderr and "--- sample" in r.stderr  # logs: stderr
    assert r.stdout == f"{out}\n"  # the result, for scripts: the run directory
    assert {p.name for p in out.iterdir()} == {"latest.safetensors", "best.safetensors", "state.safetensors",
                                                "metrics.jsonl", "config.toml", "train_loss.jsonl",
                                                "train.log", "status.json"}  # no curves.png
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 20, 40]
    assert metrics[-1]["val_loss"] < metrics[0]["val_loss"] - 0.5  # it learned something

    # the checkpoint opens with safetensors alone: config and vocabulary are in its JSON metadata
    with safe_open(str(out / "best.safetensors"), framework="pt") as f:
        meta = json.loads(f.metadata()["chargpt"])
    assert meta["model_config"]["n_embd"] == 16 and set(meta["vocab"]) == set(corpus.read_text())

    r1 = run_cli("sample.py", "--checkpoint", out, "--prompt", "ROMEO:", "--max-new-tokens", "60", "--seed", "3")
    r2 = run_cli("sample.py", "--checkpoint", out, "--prompt", "ROMEO:", "--max-new-tokens", "60", "--seed", "3")
    assert r1.returncode == 0, r1.stderr
    assert r1.stdout.startswith("ROMEO:") and len(r1.stdout.rstrip("\n")) == len("ROMEO:") + 60
    assert r1.stdout == r2.stdout  # same seed, same text

    # with no --checkpoint, sample.py takes the most recent run under checkpoints/
    r = run_cli("train.py", "--data", corpus, "--max-iters", "2", "--eval-interval", "2", *TINY_FLAGS)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "checkpoints" / "corpus" / "best.safetensors").exists()
    r = run_cli("sample.py", "--max-new-tokens", "5", "--seed", "1")
    assert r.returncode == 0 and "checkpoints/corpus" in r.stderr


def test_chinese_corpus(tmp_path):
    text = "床前明月光，疑是地上霜。舉頭望明月，低頭思故鄉。\n" * 40
    path = tmp_path / "tang.txt"
    path.write_text(text, encoding="utf-8")
    r = run_cli("train.py", "--data", path, "--out-dir", tmp_path / "tang", "--max-iters", "30",
                "--eval-interval", "30", "--learning-rate", "3e-3", *TINY_FLAGS)
    assert r.returncode == 0, r.stderr
    r = run_cli("sample.py", "--checkpoint", tmp_path / "tang", "--prompt", "床前", "--max-new-tokens", "20",
                "--seed", "0")
    assert r.returncode == 0, r.stderr
    generated = r.stdout.rstrip("\n")
    assert generated.startswith("床前") and len(generated) == 22 and set(generated) <= set(text)


def test_new_run_never_overwrites_an_old_one(corpus, tmp_path):
    args = ["--data", corpus, "--max-iters", "2", "--eval-interval", "2", *TINY_FLAGS]
    assert run_cli("train.py", *args).returncode == 0
    r = run_cli("train.py", *args)
    assert r.returncode == 0 and (tmp_path / "checkpoints" / "corpus-2" / "best.safetensors").exists()
    before = (tmp_path / "checkpoints" / "corpus-2" / "best.safetensors").read_bytes()
    r = run_cli("train.py", *args, "--out-dir", tmp_path / "checkpoints" / "corpus-2")
    assert r.returncode == 1 and "--resume" in r.stderr and "Traceback" not in r.stderr
    assert (tmp_path / "checkpoints" / "corpus-2" / "best.safetensors").read_bytes() == before


def test_help_lists_every_flag_with_help():
    r = run_cli("train.py", "--help")
    for name in ["--data", "--out-dir", "--n-layer", "--n-head", "--n-embd", "--block-size", "--dropout",
                 "--bias / --no-bias", "--batch-size", "--grad-accum", "--max-iters", "--learning-rate", "--min-lr",
                 "--warmup-iters", "--weight-decay", "--beta1", "--beta2", "--grad-clip", "--eval-interval",
                 "--eval-iters", "--device", "--dtype", "--compile [auto|on|off]", "--no-compile", "--seed", "--resume",
                 "--optimizer [adamw|muon]", "--muon-lr", "--muon-momentum", "--lr-schedule [cosine|wsd|inverse-sqrt]",
                 "--decay-fraction", "--save-state [eval|end]",
                 "--max-time", "--threads"]:
        assert name in r.stdout, name


@pytest.mark.parametrize("capability,dtype", [((7, 5), torch.float16), ((8, 0), torch.bfloat16),
                                              ((9, 0), torch.bfloat16)])
def test_auto_dtype_on_cuda_is_bf16_only_where_the_gpu_has_it_natively(monkeypatch, tiny_config, capability, dtype):
    """torch.cuda.is_bf16_supported() also counts emulated bf16 (slow) on pre-Ampere GPUs: the compute capability
    decides, for training and for sampling alike."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args, **kwargs: capability)
    cuda = torch.device("cuda", 0)
    assert pick_dtype("auto", cuda)[0] == dtype
    assert pick_dtype("bfloat16", cuda)[0] == torch.bfloat16  # asked for by name: allowed where torch supports it

    model, vocab = CharGPT(tiny_config), Vocab("\nabcdefghij")
    monkeypatch.setattr(engine, "pick_device", lambda name: cuda)
    monkeypatch.setattr(engine, "load_model", lambda path, device: (model, vocab, {}))
    assert chargpt.load("run").dtype == (torch.bfloat16 if dtype == torch.bfloat16 else torch.float32)


def test_progress_speeds_leave_out_evaluation_time(tmp_path, corpus, monkeypatch):
    """chars/s and the time left measure training: each evaluation here 'takes' 100 s (a shifted clock)."""
    offset, perf_counter = [0.0], time.perf_counter
    monkeypatch.setattr(time, "perf_counter", lambda: perf_counter() + offset[0])
    estimate = validate.estimate_loss

    def slow_estimate(*args, **kwargs):
        offset[0] += 100.0
        return estimate(*args, **kwargs)

    monkeypatch.setattr(validate, "estimate_loss", slow_estimate)
    tiny = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
                threads=1, sample_chars=0, dtype="float32")
    run = training.start_run({**tiny, "data": "corpus.txt", "out_dir": "run", "max_iters": 20, "eval_interval": 5},
                             log=lambda msg: None)
    trainer = training.Trainer(run)
    trainer.train()  # evaluates at steps 0, 5, 10, 15, 20; the bar's last numbers are over steps 1-11
    shown = trainer.progress.bar.postfix
    speed = float(re.search(r"chars/s=([\d,]+)", shown).group(1).replace(",", ""))
    assert speed > 2 * run.chars_per_step  # 10 steps in under 5 s (with 200 s of evaluation: < 0.05)
    assert int(re.search(r"left=(\d+)s", shown).group(1)) < 100  # 9 steps left at that speed, evaluations aside


def test_a_budget_shorter_than_the_warmup_is_said_at_start(tmp_path, corpus):
    """60 steps with the cpu preset's 100 warmup steps: the rate would only rise; the start-up log says so."""
    logs = []
    tiny = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=1, threads=1,
                sample_chars=0, dtype="float32", curves=False)
    chargpt.train(data="corpus.txt", out_dir="short", max_iters=6, warmup_iters=10, log=logs.append, **tiny)
    assert any(line.startswith("warning: the warmup (warmup_iters=10) does not end before the budget") for line in logs)
    logs.clear()
    chargpt.train(data="corpus.txt", out_dir="long", max_iters=6, warmup_iters=2, log=logs.append, **tiny)
    assert not any(line.startswith("warning: the warmup") for line in logs)
