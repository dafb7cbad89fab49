"""Benchmarks: training and decoding speed, as ratios measured in one process (shared machines are noisy).

    python -m chargpt.bench                      # all speed benchmarks; prints a Markdown table
    python -m chargpt.bench --write              # ... and appends it to benchmarks/RESULTS.md
    python -m chargpt.bench --only decode        # one part: peak, train, baseline, decode
    python -m chargpt.bench --quick              # every part on a tiny shape in seconds: a smoke test, not numbers
    python -m chargpt.bench quality --data data/shakespeare.txt --max-time 120
    python -m chargpt.bench pairs --data ../shared/data/tang_poems.txt --max-time 300   # decoder vs encoder-decoder

MFU is model FLOPs per second against the best matmul throughput measured in the same process, per dtype.
"""

import argparse
import platform
import re
import statistics
import sys
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import torch

from .config import ModelConfig, SampleSettings, TrainConfig, field_type
from .model import CharGPT
from .runtime import autocast, configure_threads, cpu_has_native_bf16, pick_device
from .sampling import decode

SHAPES = {  # name: (model config, batch size)
    "4x128 ctx64 b12": (ModelConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0), 12),
    "6x384 ctx256 b8": (ModelConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.0), 8),
}
DECODE_SHAPE = SHAPES["6x384 ctx256 b8"][0]
QUICK_SHAPE = ModelConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)  # --quick


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def matmul_peak(device, dtype, sizes=(512, 1024, 2048), seconds=0.5):
    """Best GFLOP/s of a square matmul over a few sizes."""
    best = 0.0
    for n in sizes:
        a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
        a @ b
        sync(device)
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            reps += 1
        sync(device)
        best = max(best, 2 * n**3 * reps / (time.perf_counter() - t0) / 1e9)
    return best


def flops_per_step(cfg, batch):
    """Training FLOPs per step: 6 per parameter per token, plus attention scores (PaLM appendix B)."""
    n = CharGPT(cfg).num_params() - cfg.block_size * cfg.n_embd  # position embeddings do no matmul work
    per_token = 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size
    return per_token * batch * cfg.block_size


def time_train_step(cfg, batch, device, dtype, attention="auto", fused_adam=True, steps=8, warmup=3):
    """Median seconds of a full step (forward, backward, clip, AdamW) on random data."""
    torch.manual_seed(0)
    model = CharGPT(cfg).to(device)
    model.set_attention(attention)
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, fused=fused_adam or None,
                            foreach=False if not fused_adam else None)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), device=device)
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        with autocast(device, dtype):
            _, loss = model(x, x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def decode_speed(device, new_tokens=1000, use_cache=True, cfg=DECODE_SHAPE):
    """Characters per second for one stream of new_tokens characters from a one-character prompt."""
    torch.manual_seed(0)
    model = CharGPT(cfg).to(device).eval()
    ctx = torch.zeros(1, 1, dtype=torch.long, device=device)
    settings = SampleSettings(max_new_tokens=new_tokens, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    n = sum(1 for _ in decode(model, ctx, settings, gen, use_cache=use_cache))
    sync(device)
    return n / (time.perf_counter() - t0)


def machine():
    cpu = platform.processor() or platform.machine()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return (f"{cpu}, {torch.get_num_threads()} threads, native bf16: {cpu_has_native_bf16()}{gpu}; "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def speed(parts, device, quick=False):
    shapes = {"1x16 ctx16 b4": (QUICK_SHAPE, 4)} if quick else SHAPES
    peak_kw, step_kw = (dict(sizes=(64,), seconds=0.02), dict(steps=2, warmup=1)) if quick else ({}, {})
    decode_cfg, decode_chars = (QUICK_SHAPE, 20) if quick else (DECODE_SHAPE, 1000)
    dtypes = [torch.float32]
    if device.type == "cuda" or cpu_has_native_bf16():
        dtypes.append(torch.bfloat16)
    rows = [f"machine: {machine()}", ""]
    peaks = {}
    if {"peak", "train", "baseline"} & parts:
        for dt in dtypes:
            peaks[dt] = matmul_peak(device, dt, **peak_kw)
            rows.append(f"matmul peak {str(dt)[6:]}: {peaks[dt]:.0f} GFLOP/s")
        rows.append("")
    if {"train", "baseline"} & parts:
        rows += ["| shape | dtype | attention | AdamW | ms/step | chars/s | MFU | vs fp32 baseline |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, (cfg, batch) in shapes.items():
            flops = flops_per_step(cfg, batch)
            chars = batch * cfg.block_size
            base = time_train_step(cfg, batch, device, torch.float32, "manual", fused_adam=False, **step_kw)
            peak32 = peaks[torch.float32]
            rows.append(f"| {name} | float32 | manual | for-loop | {base * 1e3:.1f} | {chars / base:,.0f} | "
                        f"{flops / base / 1e9 / peak32:.0%} | 1.00x (baseline) |")
            if "train" in parts:
                for dt in dtypes:
                    t = time_train_step(cfg, batch, device, dt, "auto", fused_adam=True, **step_kw)
                    rows.append(f"| {name} | {str(dt)[6:]} | auto | fused | {t * 1e3:.1f} | {chars / t:,.0f} | "
                                f"{flops / t / 1e9 / peaks[dt]:.0%} | {base / t:.2f}x |")
        rows.append("")
    if "decode" in parts:
        cached = decode_speed(device, decode_chars, use_cache=True, cfg=decode_cfg)
        uncached = decode_speed(device, decode_chars, use_cache=False, cfg=decode_cfg)
        shape = f"{decode_cfg.n_layer}x{decode_cfg.n_embd} ctx{decode_cfg.block_size}"
        rows.append(f"decode {decode_chars} chars, batch 1, {shape}: cached {cached:,.0f} chars/s, uncached "
                    f"{uncached:,.0f} chars/s, ratio {cached / uncached:.1f}x")
    return "\n".join(rows)


def quality(args):
    """Train with the defaults (plus any --set overrides) for --max-time seconds; report the full val loss."""
    import tempfile

    from .training import train
    overrides = {"data": args.data, "max_time": args.max_time, "sample_chars": 0, **set_overrides(args.set)}
    out = args.out_dir or tempfile.mkdtemp(prefix="chargpt-quality-")
    t0 = time.perf_counter()
    summary = train(out_dir=out, **overrides)
    wall = time.perf_counter() - t0
    # consecutive windows (stride = context), as for the numbers already in benchmarks/RESULTS.md
    from .checkpoint import read_meta, resolve
    from .evaluate import evaluate
    block = read_meta(resolve(out))[0]["model_config"].block_size
    val = evaluate(out, stride=block, device=args.device, progress=False)["loss"]
    sets = " ".join(f"--{k}" for k in args.set)
    return (f"quality: --max-time {args.max_time:g} {sets}: full val loss {val:.4f} (loop estimate "
            f"{summary['best_val_loss']:.4f}), {summary['step']} steps, {wall:.0f} s wall")


# pairs: decoder-only against encoder-decoder at about the same size (a decoder block has 12 C^2 weights, an encoder
# block 12 C^2, a cross-attending decoder block 16 C^2: 5 layers = 60 C^2 against 2 + 2 = 56 C^2)
PAIRS_ARCHS = {"decoder-only": dict(arch="decoder", n_layer=5),
               "encoder-decoder": dict(arch="encoder-decoder", n_layer=2, n_enc_layer=2)}
# evaluations during training only at the start and the end, on few batches: the scores come after, the same for both
PAIRS_SETTINGS = dict(task="pairs", n_embd=128, n_head=4, block_size=32, dropout=0.0, batch_size=64,
                      learning_rate=2e-3, warmup_iters=100, eval_interval=10**9, eval_iters=5, eval_pairs=0,
                      sample_chars=0)
# one couplet: a first line, its punctuation (mostly a comma), a second line, its end punctuation
COUPLET = re.compile(r"([^，。？！；：\t]+)[，？！；]([^，。？！；：\t]+)[。？！]")


def couplets(poems, out):
    """Tang poems (chargpt's tang_poems.txt: title, author, then one couplet per line, `first，second。`) -> a TSV
    of first line -> second line (punctuation dropped) at `out`; lines that are not one couplet are skipped.
    -> number of pairs."""
    n = 0
    with open(poems, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as w:
        for line in f:
            m = COUPLET.fullmatch(line.strip())
            if m:
                w.write(f"{m[1]}\t{m[2]}\n")
                n += 1
    return n


def pairs(args):
    """Both architectures, --max-time seconds of training each on the same couplets; -> a Markdown table of val loss,
    chrF and exact match (greedy) on the same --eval-pairs validation pairs, and training chars/s."""
    import tempfile

    from .evaluate import score_pairs
    from .pairs import encode_pairs, split_pairs
    from .sampling import load
    from .training import train
    from .translate import chrf, exact_match
    if not args.data:
        raise SystemExit("pairs needs --data: the Tang poems (tang_poems.txt)")
    work = Path(args.out_dir or tempfile.mkdtemp(prefix="chargpt-pairs-"))
    work.mkdir(parents=True, exist_ok=True)
    n = couplets(args.data, work / "couplets.tsv")
    enc = encode_pairs(str(work / "couplets.tsv"), log=lambda m: None)
    _, val = split_pairs(enc.n_pairs, 0.1)
    block = PAIRS_SETTINGS["block_size"]  # scored on pairs both architectures can hold (the decoder-only's limit)
    fits = [p for p in map(enc.pair, np.random.default_rng(0).permutation(val)) if len(p[0]) + len(p[1]) < block]
    sample = fits[:args.eval_pairs]
    rows = [f"{n:,} couplets of {Path(args.data).name} (first line -> second), {args.max_time:g} s of training each "
            f"on {machine()}", "", "| model | parameters | steps | train chars/s | val loss (nats/char) | chrF | "
            "exact match |", "|---|---|---|---|---|---|---|"]
    for name, arch in PAIRS_ARCHS.items():
        out = work / name
        overrides = {**PAIRS_SETTINGS, **arch, **set_overrides(args.set), "max_time": args.max_time}
        summary = train(data=str(work / "couplets.tsv"), out_dir=str(out), device=args.device, **overrides,
                        log=lambda m: print(m, file=sys.stderr))  # stdout: the table alone
        gen = load(out, device=args.device)  # its best checkpoint
        cfg = gen.model.config
        name += f" {cfg.n_enc_layer}+{cfg.n_layer}" if cfg.n_enc_layer else f" {cfg.n_layer}"
        name += f" x {cfg.n_embd}"
        hyps, refs = gen.translate([s for s, _ in sample]), [t for _, t in sample]
        total, scored = score_pairs(gen.model, gen.vocab, sample, dtype=gen.dtype)[:2]
        score = chrf(hyps, refs)
        shown = "n/a" if score is None else f"{score:.1f}"
        rows.append(f"| {name} | {gen.model.num_params() / 1e6:.2f}M | {summary['step']:,} | "
                    f"{summary['chars_per_s']:,.0f} | {total / scored:.4f} | {shown} | {exact_match(hyps, refs):.1%} |")
    return "\n".join(rows + ["", f"(on the same {len(sample)} validation pairs: val loss of the target characters "
                                 f"given the source, and chrF and exact match of greedy translations; chars/s: "
                                 f"characters of the examples, source and target, per second of training)"])


def set_overrides(items):
    """--set NAME=VALUE items -> {name: typed value}."""
    out = {}
    for item in items:
        key, _, value = item.partition("=")
        out[key.replace("-", "_")] = type_of(key.replace("-", "_"))(value)
    return out


def type_of(name):
    for f in fields(ModelConfig) + fields(TrainConfig):
        if f.name == name:
            t = field_type(f)
            return (lambda v: v.lower() in ("1", "true", "yes")) if t is bool else t
    raise SystemExit(f"unknown setting {name}")


def main(argv=None, prog=None):
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="speed", choices=["speed", "quality", "pairs"])
    p.add_argument("--only", nargs="*", default=["peak", "train", "baseline", "decode"],
                   help="parts of the speed benchmark: peak train baseline decode")
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--data", default=None, help="corpus for the quality benchmark; the Tang poems for pairs")
    p.add_argument("--max-time", type=float, default=120.0, help="seconds of training (pairs: for each model)")
    p.add_argument("--eval-pairs", type=int, default=1000, help="pairs: validation pairs scored (val loss) and "
                   "translated (chrF, exact match)")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="quality: override a training flag, e.g. --set n-embd=192 (repeatable)")
    p.add_argument("--write", action="store_true", help="append the results to benchmarks/RESULTS.md")
    p.add_argument("--quick", action="store_true", help="speed: every part on a tiny shape in seconds, to check "
                   "that the benchmark runs (its numbers mean nothing)")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    if device.type == "cpu":
        configure_threads(args.threads)
    report = {"speed": lambda: speed(set(args.only), device, args.quick), "quality": lambda: quality(args),
              "pairs": lambda: pairs(args)}[args.mode]()
    print(report)
    if args.write:
        path = Path("benchmarks/RESULTS.md")
        path.parent.mkdir(exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — python -m chargpt.bench {args.mode}\n\n{report}\n")


if __name__ == "__main__":
    main()
