"""chargpt's train.py against nanoGPT's train.py (github.com/karpathy/nanoGPT) on the same recipe and machine, in
one run: steady-state milliseconds per training step, both ways.

    python -m chargpt.bench --only --nanogpt ~/src/nanoGPT --data data/tinyshakespeare.txt

The recipe is nanoGPT's own: on a CPU, its README's CPU line (config/train_shakespeare_char.py with 4 layers x 128,
context 64, batch 12, dropout 0, fp32, no compile); on a GPU, config/train_shakespeare_char.py as it is (6 x 384,
context 256, batch 64, dropout 0.2, bf16, compiled). chargpt trains the same model (no bias, as nanoGPT's
default), the same batch and learning-rate settings.

nanoGPT runs unchanged from a temporary copy of the checkout (its .git left behind), its data prepared there by its
own data/shakespeare_char/prepare.py with our corpus as its input.txt (so it downloads nothing): train.bin/val.bin
(uint16 ids, the first 90% / last 10%) and its vocabulary in meta.pkl, written and read by nanoGPT's code alone.
Steady state: nanoGPT prints each iteration's time (log_interval=1), and the median after
the first 10 is taken; for chargpt, the training time of a run of 2N steps minus that of a run of N steps, over N
(evaluation excluded), so start-up and warm-up cancel out.
"""

import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

RECIPES = {  # nanoGPT flags over config/train_shakespeare_char.py, per device type
    "cpu": dict(device="cpu", compile=False, eval_iters=20, block_size=64, batch_size=12, n_layer=4, n_head=4,
                n_embd=128, dropout=0.0),
    "cuda": dict(device="cuda"),
}
GPU_CONFIG = dict(block_size=256, batch_size=64, n_layer=6, n_head=6, n_embd=384, dropout=0.2)  # that config's model
SHARED = dict(learning_rate=1e-3, min_lr=1e-4, beta2=0.99, warmup_iters=100, weight_decay=0.1,  # and optimizer:
              optimizer="adamw", lr_schedule="cosine")  # AdamW and cosine, as nanoGPT (chargpt's CPU default is Muon)


def prepare_data(checkout, copy, text):
    """The corpus as nanoGPT reads it, made by the copy's own data/shakespeare_char/prepare.py from `text`."""
    if len(set(text)) > 65535:
        raise SystemExit("nanoGPT stores ids as uint16: the corpus has more than 65,535 distinct characters")
    data_dir = copy / "data" / "shakespeare_char"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "input.txt").write_text(text, encoding="utf-8")  # present, so prepare.py downloads nothing
    r = subprocess.run([sys.executable, "prepare.py"], cwd=data_dir, capture_output=True, text=True,
                       env={**os.environ, "PYTHONUTF8": "1"})  # it opens input.txt in the locale's encoding
    if r.returncode != 0:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"nanoGPT's data/shakespeare_char/prepare.py failed in {checkout}: {tail[0][:200]}")


def nanogpt_step_ms(checkout, text, device, steps, threads):
    """Median ms per iteration of nanoGPT's train.py after its first 10 iterations."""
    with tempfile.TemporaryDirectory(prefix="chargpt-nanogpt-") as tmp:
        copy = Path(tmp) / "nanoGPT"
        shutil.copytree(checkout, copy, ignore=shutil.ignore_patterns(".git", "out*"))
        prepare_data(checkout, copy, text)
        flags = {**RECIPES[device.type], "max_iters": steps, "lr_decay_iters": steps, "eval_interval": 10**9,
                 "log_interval": 1, "out_dir": str(Path(tmp) / "out")}
        args = [f"--{k}={v}" for k, v in flags.items()]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        r = subprocess.run([sys.executable, "train.py", "config/train_shakespeare_char.py", *args], cwd=copy,
                           capture_output=True, text=True, env=env)
    times = [float(t) for t in re.findall(r"^iter \d+: loss [\d.]+, time ([\d.]+)ms", r.stdout, re.M)]
    if r.returncode != 0 or len(times) < 12:
        tail = (r.stderr or r.stdout).strip().splitlines()[-1:] or ["no output"]
        raise SystemExit(f"nanoGPT's train.py failed in {checkout}: {tail[0][:200]}")
    return statistics.median(times[10:])


def chargpt_step_ms(data, device, steps, dtype, threads):
    """Steady-state ms per step of chargpt's training loop on the recipe (see the module docstring)."""
    from chargpt.training.trainer import train
    recipe = {**(RECIPES["cpu"] if device.type == "cpu" else GPU_CONFIG), **SHARED}
    flags = {k: v for k, v in recipe.items() if k not in ("device", "compile", "eval_iters")}
    flags.update(device=str(device), dtype=dtype, bias=False, eval_iters=20, sample_chars=0, data=data)
    flags["compile"] = "on" if device.type == "cuda" else "off"
    if device.type == "cpu":
        flags["threads"] = threads

    def seconds(n):
        with tempfile.TemporaryDirectory(prefix="chargpt-vs-nanogpt-") as out:
            s = train(out_dir=out, max_iters=n, eval_interval=10**9, log=lambda msg: None, **flags)
        return s["elapsed_s"] * (1 - s["eval_fraction"])

    half = max(steps // 2, 10)
    return (seconds(2 * half) - seconds(half)) / half * 1e3


def side_by_side(checkout, data, device, steps=200):
    """Markdown rows: nanoGPT's and chargpt's steady-state step time on nanoGPT's recipe for this device."""
    from chargpt.data.corpus import corpus_sources, iter_text
    _, sources = corpus_sources(data)
    text = "".join(iter_text(sources))
    threads = torch.get_num_threads()
    recipe = RECIPES["cpu"] if device.type == "cpu" else GPU_CONFIG
    shape = f"{recipe['n_layer']}x{recipe['n_embd']} ctx{recipe['block_size']} b{recipe['batch_size']}"
    theirs = nanogpt_step_ms(checkout, text, device, steps, threads)
    rows = [f"against nanoGPT's train.py ({checkout}), its {device.type.upper()} recipe: {shape}, {steps} steps, "
            f"{threads} threads", "", "| trainer | dtype | ms/step (steady state) | speed-up |", "|---|---|---|---|",
            f"| nanoGPT train.py | {'float32' if device.type == 'cpu' else 'bfloat16'} | {theirs:.1f} | 1.00x |"]
    for dtype in ("float32", "auto") if device.type == "cpu" else ("auto",):
        ours = chargpt_step_ms(data, device, steps, dtype, threads)
        rows.append(f"| chargpt train.py | {dtype} | {ours:.1f} | {theirs / ours:.2f}x |")
    return rows + [""]
