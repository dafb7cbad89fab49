"""Benchmarks: training and decoding speed, as ratios measured in one process (shared machines are noisy), and the
profile of a small training step (the command: chargpt/bench/__init__.py).

    python -m chargpt.bench                      # all speed parts; prints Markdown tables
    python -m chargpt.bench --write              # ... and adds them to benchmarks/RESULTS.md, under this machine's kind
    python -m chargpt.bench --only decode --checkpoint RUN --data FILE   # one part; decoding with its cost in loss
    python -m chargpt.bench --only vocab         # ms/step and peak memory at vocabularies 65, 2,000 and 10,000
    python -m chargpt.bench --nanogpt ~/nanoGPT --data data/tinyshakespeare.txt   # against nanoGPT's train.py
    python -m chargpt.bench --quick              # every part on a tiny shape in seconds: a smoke test, not numbers
    python -m chargpt.bench profile              # torch.profiler on the 4x128 ctx64 b12 training loop: top items

Speed parts: peak (best matmul GFLOP/s per dtype), train (ms/step, chars/s, MFU against that peak and against an
fp32 baseline; AdamW and Muon), compile (eager against torch.compile, compile time apart), decode (cached
chars/s at batch 1 in float32, bf16 and int8, with val loss per precision given --checkpoint), nanogpt (with
--nanogpt PATH), vocab (a training step at 65, 2,000 and 10,000 characters on the cpu and gpu presets' shapes,
against 65 in the same run, with the step's peak memory; the fused head + loss of chargpt.model.loss against the full
logits). The machine's kind (CUDA, CPU with or without native bf16) decides which rows apply.
"""

import contextlib
import copy
import math
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import fields, replace

import torch

from chargpt.bench.speculation import speculation_rows
from chargpt.config import ModelConfig, SampleSettings, TrainConfig
from chargpt.config.flags import field_type
from chargpt.model.adaptive import shortlist_for
from chargpt.model.quantize import inference_model
from chargpt.model.transformer import CharGPT
from chargpt.runtime import CPU_BF16_ENV, autocast, cpu_bf16_override, cpu_has_native_bf16, has_native_bf16
from chargpt.sampling.decode import decode
from chargpt.training.mfu import flops_per_token
from chargpt.training.optim import make_optimizer

SHAPES = {  # name: (model config, batch size)
    "4x128 ctx64 b12": (ModelConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=128, dropout=0.0), 12),
    "6x384 ctx256 b8": (ModelConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, dropout=0.0), 8),
}
DECODE_SHAPE = SHAPES["6x384 ctx256 b8"][0]
QUICK_SHAPE = ModelConfig(vocab_size=65, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0)  # --quick
PROFILE_RECIPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=64, batch_size=12, dropout=0.0,  # nanoGPT's CPU
                      optimizer="adamw", lr_schedule="cosine")  # recipe, with its optimizer and schedule
PARTS = ("peak", "train", "baseline", "compile", "decode", "vocab")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def machine_kind(device):
    """The heading of this machine's section in RESULTS.md: its kind decides which numbers compare."""
    if device.type == "cuda":
        return f"CUDA GPU ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return "CPU with native bf16" if cpu_has_native_bf16() else "CPU without native bf16"
    return device.type.upper()


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
    return (f"{cpu}, {torch.get_num_threads()} threads, native bf16: {cpu_has_native_bf16()}{_forced()}{gpu}; "
            f"torch {torch.__version__}, Python {platform.python_version()}")


def _forced():
    """' (CHARGPT_CPU_BF16=0)' when the switch, not the hardware, decided which kind this CPU counts as."""
    forced = cpu_bf16_override()
    return "" if forced is None else f" ({CPU_BF16_ENV}={int(forced)})"


# what torch.profiler's C++ side (libkineto) writes to file descriptor 2 at every start and stop
# ("USDT:... profiler_start", "STAGE:... Completed Stage: Warm Up"), whatever KINETO_LOG_LEVEL says
KINETO_CHATTER = re.compile(r"(USDT|STAGE):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ \w+\.cpp:\d+\] [^\n]*\n?")


@contextlib.contextmanager
def profiler_quiet():
    """Run a torch.profiler block without its C++ start and stop lines on stderr: file descriptor 2 goes to a
    temporary file for the block, and everything else written there (a warning, an error) is passed on after it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            rest = KINETO_CHATTER.sub("", caught.read().decode("utf-8", "replace"))  # also inside a progress bar
            if rest:
                sys.stderr.write(rest)
                sys.stderr.flush()


def matmul_peak(device, dtype, sizes=None, seconds=0.5):
    """Best GFLOP/s of a square matmul over a few sizes (a GPU needs large ones to reach its peak)."""
    sizes = sizes or ((2048, 4096, 8192) if device.type == "cuda" else (512, 1024, 2048))
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
    """Training FLOPs per step: 6 per multiplying weight per token, plus attention scores (PaLM appendix B), as
    training's MFU counts them (chargpt/training/mfu.py)."""
    return flops_per_token(CharGPT(cfg)) * batch * cfg.block_size


def time_train_step(cfg, batch, device, dtype, attention="auto", optimizer="flat", compile=False, steps=8,
                    warmup=3):
    """-> (median seconds of a full step: forward, backward, clip, optimizer; seconds of the first step, which
    includes torch.compile's compilation). optimizer: 'flat' (training's: fused AdamW over the flat buffer,
    chargpt/training/flat.py), 'muon' (training's Muon + AdamW), or torch's per-tensor AdamW and clipping, 'fused' or
    'for-loop' (the baseline)."""
    torch.manual_seed(0)
    model = CharGPT(cfg).to(device)
    model.set_attention(attention)
    opt = None
    if optimizer in ("flat", "muon"):
        opt = make_optimizer(model, TrainConfig(optimizer="adamw" if optimizer == "flat" else "muon"), device, dtype)
        parts = list(opt.parts.values())
    else:
        fused = optimizer == "fused"
        parts = [torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-3, fused=fused or None,
                                   foreach=False if not fused else None)]
    step_model = torch.compile(model) if compile else model
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size), device=device)
    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        with autocast(device, dtype):
            _, loss = step_model(x, x)
        loss.backward()
        if opt is None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        else:
            opt.clip_grad_norm_(1.0)
        for part in parts:
            part.step()
            part.zero_grad(set_to_none=True)  # a FlatAdamW zeroes the buffer in place
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]), times[0]


def decode_speed(model, device, dtype, new_tokens=1000, use_cache=True, runner=None):
    """Characters per second for one stream of new_tokens characters from a one-character prompt; runner: a
    sampling.StepRunner for the steps (None: the model's forward with a growing cache)."""
    ctx = torch.zeros(1, 1, dtype=torch.long, device=device)
    settings = SampleSettings(max_new_tokens=new_tokens, temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    t0 = time.perf_counter()
    n = sum(1 for _ in decode(model, ctx, settings, gen, use_cache=use_cache, dtype=dtype, runner=runner))
    sync(device)
    return n / (time.perf_counter() - t0)


def dtypes_for(device):
    """float32, and bf16 where the hardware computes it natively (elsewhere it is emulated, far slower)."""
    return [torch.float32] + ([torch.bfloat16] if has_native_bf16(device) else [])


def name_of(dtype):
    return str(dtype).removeprefix("torch.")


def shapes_for(args):
    if args.quick:
        return {"1x16 ctx16 b4": (QUICK_SHAPE, 4)}
    if not args.batch:
        return SHAPES
    return {f"{name.rsplit(' b', 1)[0]} b{args.batch}": (cfg, args.batch) for name, (cfg, _) in SHAPES.items()}


# --- the speed parts -------------------------------------------------------------------------------------------
def peak_rows(device, quick):
    """-> ({dtype: GFLOP/s}, lines). --quick measures no peak (a tiny matmul for a few milliseconds says nothing of
    the machine's, and an MFU against it was nonsense such as 5123%): no figure, and no MFU."""
    if quick:
        return {}, ["matmul peak: not measured with --quick (so no MFU either)", ""]
    peaks = {dt: matmul_peak(device, dt) for dt in dtypes_for(device)}
    return peaks, [f"matmul peak {name_of(dt)}: {p:.0f} GFLOP/s" for dt, p in peaks.items()] + [""]


def mfu(flops, seconds, peak):
    """Model FLOPs utilisation as a table cell: "-" without a measured peak."""
    return f"{flops / seconds / 1e9 / peak:.0%}" if peak else "-"


def train_rows(parts, device, peaks, args):
    """One table: the fp32 baseline (explicit attention, for-loop AdamW), then per dtype both attention kernels
    with fused AdamW (torch's fused CPU attention backward can be the slower one in bf16), and Muon (its
    Newton-Schulz iterations cost time per step; they pay for it in loss per step)."""
    step_kw = dict(steps=2, warmup=1) if args.quick else {}
    rows = ["| shape | dtype | attention | optimizer | ms/step | chars/s | MFU | vs fp32 baseline |",
            "|---|---|---|---|---|---|---|---|"]
    for name, (cfg, batch) in shapes_for(args).items():
        flops, chars = flops_per_step(cfg, batch), batch * cfg.block_size
        base, _ = time_train_step(cfg, batch, device, torch.float32, "manual", "for-loop", **step_kw)
        rows.append(f"| {name} | float32 | manual | AdamW for-loop | {base * 1e3:.1f} | {chars / base:,.0f} | "
                    f"{mfu(flops, base, peaks.get(torch.float32))} | 1.00x (baseline) |")
        if "train" not in parts:
            continue
        for dt in dtypes_for(device):  # the kernels --attention auto chooses from, each with AdamW; then Muon
            for attention, optimizer in (("auto", "fused"), ("fused", "flat"), ("manual", "flat"), ("auto", "muon")):
                t, _ = time_train_step(cfg, batch, device, dt, attention, optimizer, **step_kw)
                label = {"fused": "AdamW fused, per tensor", "flat": "AdamW fused, flat",
                         "muon": "Muon + AdamW, flat"}[optimizer]
                rows.append(f"| {name} | {name_of(dt)} | {attention} | {label} | {t * 1e3:.1f} | {chars / t:,.0f} | "
                            f"{mfu(flops, t, peaks.get(dt))} | {base / t:.2f}x |")
    return rows + [""]


def compile_rows(device, args):
    """Eager against torch.compile per shape and dtype: the evidence behind --compile auto (runtime.pick_compile)."""
    if args.quick:
        return ["compile: skipped with --quick (compiling takes tens of seconds)", ""]
    rows = ["| shape | dtype | eager ms/step | compiled ms/step | speed-up | compile time (first step) |",
            "|---|---|---|---|---|---|"]
    for name, (cfg, batch) in shapes_for(args).items():
        for dt in dtypes_for(device):
            eager, _ = time_train_step(cfg, batch, device, dt)
            try:
                compiled, first = time_train_step(cfg, batch, device, dt, compile=True)
            except Exception as e:  # e.g. no C++ compiler for inductor's CPU backend
                rows.append(f"| {name} | {name_of(dt)} | {eager * 1e3:.1f} | failed: {str(e).splitlines()[0][:60]} "
                            f"| | |")
                continue
            rows.append(f"| {name} | {name_of(dt)} | {eager * 1e3:.1f} | {compiled * 1e3:.1f} | "
                        f"{eager / compiled:.2f}x | {first:.1f} s |")
    return rows + [""]


def decode_rows(device, args):
    """Cached decoding at batch 1 per precision (float32; bf16 where native; int8 on a CPU), against float32, and
    with --checkpoint the validation loss of each (chargpt.tools.evaluate, consecutive windows): what the speed
    costs."""
    from chargpt.runs.checkpoint import load_model
    from chargpt.tools.evaluate import evaluate
    n = 20 if args.quick else 1000
    if args.checkpoint:
        base, _, _ = load_model(args.checkpoint, device)
    else:
        torch.manual_seed(0)
        base = CharGPT(QUICK_SHAPE if args.quick else DECODE_SHAPE).to(device).eval()
    cfg = base.config
    shape = f"{cfg.n_layer}x{cfg.n_embd} ctx{cfg.block_size}"
    choices = [("float32", None)]
    if has_native_bf16(device):
        choices.append(("bfloat16", None))
    if device.type == "cpu":
        choices.append(("float32", "int8"))
    rows = [f"decode {n} chars, batch 1, {shape}" + (f" ({args.checkpoint})" if args.checkpoint else
                                                      ", random weights (--checkpoint RUN adds val loss)"), "",
            "| precision | cached chars/s | vs float32 | val loss | vs float32 |", "|---|---|---|---|---|"]
    speed0 = loss0 = None
    for dtype, quantize in choices:
        model, torch_dtype, _ = inference_model(copy.deepcopy(base), device, dtype, quantize)
        speed = decode_speed(model, device, torch_dtype, n)
        speed0 = speed0 or speed
        loss = ""
        if args.checkpoint:
            r = evaluate(args.checkpoint, args.data, stride=cfg.block_size, device=str(device), progress=False,
                         dtype=dtype, quantize=quantize)
            loss0 = loss0 if loss0 is not None else r["loss"]
            loss = f"{r['loss']:.4f} | {r['loss'] - loss0:+.4f}"
        label = "int8" if quantize else dtype
        rows.append(f"| {label} | {speed:,.0f} | {speed / speed0:.2f}x | {loss or '- | -'} |")
    uncached = decode_speed(inference_model(base, device, "float32")[0], device, torch.float32, n, use_cache=False)
    rows += ["", f"uncached float32 reference: {uncached:,.0f} chars/s (cached float32 is {speed0 / uncached:.1f}x)",
             ""]
    return rows + step_rows(base, device, n, speed0, args) + [""] + speculation_rows(args, device, n)


def step_rows(model, device, n, before, args):
    """Decoding with the static step (sampling.StepRunner), eager and compiled, in float32 and (on a CPU) int8,
    against the float32 growing cache (`before`: the float32 row above); the cost in loss: teacher-forced through
    the step over validation text, against the float32 model's full forward (the static step's own bar: within
    0.001 nats)."""
    from chargpt.model.quantize import quantize_int8, uses_dynamic_int8
    from chargpt.runtime import cpp_compiler
    from chargpt.sampling.decode import StepRunner
    text_ids = step_text(model, args)
    rows = ["| decode step | chars/s | vs float32 growing cache | first call (compiles) | loss through the step "
            "| vs float32 full forward |", "|---|---|---|---|---|---|"]
    full = step_loss(model, text_ids, None)
    models = [("float32", model)] + ([("int8", quantize_int8(model))] if device.type == "cpu" else [])
    for precision, m in models:
        compiles = (cpp_compiler() or device.type != "cpu") and not uses_dynamic_int8(m) and not args.quick
        for label, compiled in [("eager", False)] + ([("torch.compile", True)] if compiles else []):
            runner = StepRunner(m, compiled)
            t0 = time.perf_counter()
            decode_speed(m, device, torch.float32, 2, runner=runner)  # the first step compiles
            first = time.perf_counter() - t0
            speed = decode_speed(m, device, torch.float32, n, runner=runner)
            loss = step_loss(m, text_ids, runner)
            rows.append(f"| {precision}, static, {label} | {speed:,.0f} | {speed / before:.2f}x | {first:.1f} s | "
                        f"{loss:.4f} | {loss - full:+.5f} |")
    return rows


def step_text(model, args):
    """Up to 4 windows of validation ids (--data's last tenth, else random ids) for step_loss, (N, block_size)."""
    cfg, n = model.config, 1 if args.quick else 4
    if args.data and args.checkpoint:
        from chargpt.data.corpus import corpus_sources, iter_text
        from chargpt.runs.checkpoint import load_model
        _, vocab, _ = load_model(args.checkpoint, "cpu")
        text = "".join(iter_text(corpus_sources(args.data)[1]))
        tail = [vocab.stoi[c] for c in text[-len(text) // 10:] if c in vocab.stoi][:n * cfg.block_size]
        if len(tail) == n * cfg.block_size:
            return torch.tensor(tail).view(n, cfg.block_size)
    return torch.randint(cfg.vocab_size, (n, cfg.block_size), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def step_loss(model, ids, runner):
    """Mean next-character loss over ids (N, T): each window from its first character, one position at a time
    through `runner` (None: the model's full forward over the window)."""
    from chargpt.model.transformer import KVCache
    device = next(model.parameters()).device
    ids = ids.to(device)
    if runner is None:
        logits = model(ids[:, :-1])[0]  # (N, T-1, V)
    else:
        cache = KVCache(model.config, ids.size(0), device)
        steps = [model(ids[:, :1], cache=cache)[0][:, -1]]
        steps += [runner(ids[:, t:t + 1], cache) for t in range(1, ids.size(1) - 1)]
        logits = torch.stack(steps, dim=1)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).item()


# --- vocabulary size: what 10,000 characters (Chinese) cost against 65 (English) -------------------------------
VOCAB_SIZES = (65, 2000, 10000)
VOCAB_PRESETS = {"cpu": "cpu", "gpu": "shakespeare-char"}  # the shapes the two devices train by default


def vocab_shapes(quick, batch=None):
    """{label: (ModelConfig, TrainConfig)} for the cpu and gpu presets (config.PRESETS over the defaults): their
    shape, dropout and optimizer. --quick: one tiny shape with the cpu preset's optimizer."""
    from chargpt.config import PRESETS, split_overrides
    out = {}
    for kind, preset in VOCAB_PRESETS.items():
        settings = {**PRESETS[preset], **(QUICK_SHAPE_FLAGS if quick else {})}
        settings = {**settings, "batch_size": batch or settings.get("batch_size", TrainConfig.batch_size)}
        m, t = split_overrides(settings)
        mcfg, tcfg = ModelConfig(**m), TrainConfig(**t)
        out[f"{kind} preset {mcfg.n_layer}x{mcfg.n_embd} ctx{mcfg.block_size} b{tcfg.batch_size}"] = (mcfg, tcfg)
        if quick:
            break
    return out


def step_peak(step, device):
    """Bytes a training step allocates at its peak above what it held when it began: on CUDA the allocator's peak
    (torch.cuda.max_memory_allocated); elsewhere the running sum of torch.profiler's memory events (every torch
    CPU allocation and free; tracemalloc does not see them)."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    with profiler_quiet(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                                  profile_memory=True) as prof:
        step()
    now = peak = 0
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    for e in sorted(events, key=lambda e: e.start_ns()):
        now += e.nbytes()
        peak = max(peak, now)
    return peak


def zipf_counts(vocab_size):
    """How often a text uses each of vocab_size characters under Zipf's law (1 / rank; Tang poems are close)."""
    return 1.0 / torch.arange(1, vocab_size + 1, dtype=torch.float64)


def time_vocab_step(mcfg, tcfg, device, dtype, loss="auto", compile=False, steps=8, warmup=3):
    """-> (median seconds of a training step as train.py takes it: forward and backward under autocast, clipping,
    the preset's optimizer; peak bytes of one more step (step_peak)). loss: the model's loss kernel (set_loss);
    compile: torch.compile the model (the first warm-up step compiles)."""
    torch.manual_seed(0)
    model = CharGPT(mcfg).to(device)
    model.set_loss(loss)
    opt = make_optimizer(model, tcfg, device)  # AdamW, or Muon + AdamW
    step_model = torch.compile(model) if compile else model
    shape = (tcfg.batch_size, mcfg.block_size)
    if mcfg.softmax == "adaptive":  # its cost follows the characters used: a text's, as Zipf's law has them
        counts = zipf_counts(mcfg.vocab_size)
        model.lm_head.set_frequencies(counts)
        x, y = (torch.multinomial(counts, math.prod(shape), replacement=True).view(shape).to(device) for _ in range(2))
    else:
        x, y = (torch.randint(0, mcfg.vocab_size, shape, device=device) for _ in range(2))

    def step():
        with autocast(device, dtype):
            _, out = step_model(x, y)
        out.backward()
        opt.clip_grad_norm_(tcfg.grad_clip or float("inf"))
        for part in opt.parts.values():
            part.step()
        opt.zero_grad()

    times = []
    for _ in range(warmup + steps):
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warmup:]), step_peak(step, device)


def vocab_rows(device, args, peaks=None):
    """ms/step per vocabulary size on the cpu and gpu presets' shapes, in the dtype training picks, each against
    vocabulary 65 in the same run; the loss as training computes it (auto) and, where auto fuses, the full logits
    (what it replaced). Peak: the step's own allocations (step_peak); logits: one float32 copy of them. Eager or
    compiled as training is by default (--compile auto). Floor: the output layer's three matrix products (logits,
    and the gradients of the hidden states and of the weights: 6 x characters x width x vocabulary FLOPs) at the
    machine's measured matmul peak; "vs 65 + floor" is the step against vocabulary 65's step plus that floor, the
    most a large alphabet can be made to cost without computing fewer logits."""
    from chargpt.model.loss import use_fused
    from chargpt.runtime import pick_compile, pick_dtype
    dtype, compiled = pick_dtype("auto", device)[0], pick_compile("auto", device)[0]
    peak = (peaks or {}).get(dtype) or (None if args.quick else matmul_peak(device, dtype))
    step_kw = dict(steps=2, warmup=1) if args.quick else dict(steps=5, warmup=2)
    step_kw["compile"] = compiled and not args.quick
    how = "torch.cuda.max_memory_allocated" if device.type == "cuda" else "torch.profiler memory events"
    rows = [f"training step by vocabulary size, {name_of(dtype)}, {'compiled' if step_kw['compile'] else 'eager'}; "
            f"peak: above what the step began with ({how}); head floor at the measured matmul peak "
            + (f"{peak:.0f} GFLOP/s" if peak else "(not measured with --quick)"), "",
            "| shape | vocab | loss | ms/step | vs vocab 65 | head floor ms | vs 65 + floor | peak MB | "
            "float32 logits MB |",
            "|---|---|---|---|---|---|---|---|---|"]
    for name, (mcfg, tcfg) in vocab_shapes(args.quick, args.batch).items():
        base = None
        for V in VOCAB_SIZES:
            cfg = ModelConfig(**{**vars(mcfg), "vocab_size": V})
            chars = tcfg.batch_size * cfg.block_size
            floor = 6 * chars * cfg.n_embd * V / (peak * 1e9) if peak else None
            adaptive = replace(cfg, softmax="adaptive", shortlist=shortlist_for(zipf_counts(V))).validate()
            for loss in ("auto", "full", "adaptive") if use_fused("auto", V) else ("auto",):
                t, mem = time_vocab_step(adaptive if loss == "adaptive" else cfg, tcfg, device, dtype,
                                         "auto" if loss == "adaptive" else loss, **step_kw)
                base = base or t
                label = "adaptive (Zipf text)" if loss == "adaptive" else \
                    ("fused" if use_fused(loss, V) else "full") + (" (auto)" if loss == "auto" else "")
                floor_cells = (f"{floor * 1e3:.1f} | {t / (base + floor):.2f}x" if floor is not None else "- | -")
                rows.append(f"| {name} | {V:,} | {label} | {t * 1e3:.1f} | {t / base:.2f}x | {floor_cells} | "
                            f"{mem / 2**20:,.1f} | {chars * V * 4 / 2**20:,.1f} |")
    return rows + [""]


def speed(parts, device, args):
    rows = [f"machine: {machine()}", f"kind: {machine_kind(device)}", ""]
    peaks = {}
    if {"peak", "train", "baseline"} & parts:
        peaks, lines = peak_rows(device, args.quick)
        rows += lines
    if {"train", "baseline"} & parts:
        rows += train_rows(parts, device, peaks, args)
    if "compile" in parts:
        rows += compile_rows(device, args)
    if "decode" in parts:
        rows += decode_rows(device, args)
    if "vocab" in parts:
        rows += vocab_rows(device, args, peaks)
    if args.nanogpt:
        from chargpt.bench.nanogpt import side_by_side
        rows += side_by_side(args.nanogpt, args.data, device, steps=20 if args.quick else args.steps)
    return "\n".join(rows).rstrip()

# --- profile ----------------------------------------------------------------------------------------------------
def profile(args, device):
    """torch.profiler over the real training loop (4x128 ctx64 b12 by default), after warm-up steps: time per
    labelled phase of a step, then the top operators by self CPU time. Work that is not model math shows up as
    its own phase or operator."""
    steps, warm = (20, 5) if args.quick else (args.steps, 20)
    recipe = {**(QUICK_SHAPE_FLAGS if args.quick else PROFILE_RECIPE), **parse_sets(args.set)}
    schedule = torch.profiler.schedule(wait=0, warmup=warm, active=steps, repeat=1)
    prof, trainer = profiled_run(args, device, recipe, warm + steps, schedule)
    calls, (short, long) = calls_per_step(args, device, recipe), call_steps(args)
    averages = prof.key_averages()
    phases = sorted(e.key for e in averages if e.key[:1].isdigit() and " " in e.key)
    by_key = {e.key: e for e in averages}
    loop = sum(by_key[k].cpu_time_total for k in phases if k[1] == " ") or 1.0  # the top-level phases
    recipe_text = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in recipe.items())
    rows = [f"profile: {steps} training steps after {warm} of warm-up, {recipe_text}, device {device}, dtype "
            f"{name_of(trainer.run.dtype)}, {torch.get_num_threads()} threads", "",
            f"aten calls per training step: {calls:,.0f} (every aten:: operator torch.profiler records, nested ones "
            f"included: the difference between runs of {short} and {long} steps, over {long - short})", "",
            "| phase | ms per step | share of the loop |", "|---|---|---|"]
    rows += [f"| {k} | {by_key[k].cpu_time_total / 1e3 / steps:.3f} | {by_key[k].cpu_time_total / loop:.1%} |"
             for k in phases]
    ops = sorted((e for e in averages if e.key not in phases), key=lambda e: e.self_cpu_time_total, reverse=True)
    self_total = sum(e.self_cpu_time_total for e in ops) or 1.0
    rows += ["", "| operator | calls per step | self CPU ms per step | share of self CPU time |", "|---|---|---|---|"]
    rows += [f"| {e.key} | {e.count / steps:.1f} | {e.self_cpu_time_total / 1e3 / steps:.3f} | "
             f"{e.self_cpu_time_total / self_total:.1%} |" for e in ops[:args.top]]
    return "\n".join(rows)


def profiled_run(args, device, recipe, iters, schedule=None):
    """The training loop on `recipe` for `iters` steps under torch.profiler -> (profiler, trainer)."""
    from chargpt.training.trainer import Trainer, start_run
    threads = {"threads": args.threads} if args.threads and device.type == "cpu" else {}
    with tempfile.TemporaryDirectory(prefix="chargpt-profile-") as out:
        settings = {"data": args.data, "out_dir": out, "device": str(device), "max_iters": iters,
                    "eval_interval": 10**9, "eval_iters": 1, "sample_chars": 0, "warmup_iters": 0, **recipe, **threads}
        trainer = Trainer(start_run(settings, log=lambda msg: None))
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with profiler_quiet(), torch.profiler.profile(activities=activities, schedule=schedule) as prof:
            trainer.profiler = prof if schedule is not None else None
            trainer.train()
    return prof, trainer


CALL_STEPS = (10, 30)  # two run lengths: set-up, the evaluations and saving cancel out of their difference


def call_steps(args):
    return (2, 4) if args.quick else CALL_STEPS


def calls_per_step(args, device, recipe):
    """aten operator calls per training step (nested ones included), counted, so independent of the machine's
    load: the difference of two whole runs' counts over their difference in steps."""
    def count(iters):
        prof, _ = profiled_run(args, device, recipe, iters)
        return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    short, long = call_steps(args)
    return (count(long) - count(short)) / (long - short)


QUICK_SHAPE_FLAGS = dict(n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, dropout=0.0)


# --- --set NAME=VALUE (profile, quality) ---------------------------------------------------------------------------
def parse_sets(items):
    """['n-embd=192', 'optimizer=muon'] -> {'n_embd': 192, 'optimizer': 'muon'}, typed as the config fields."""
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
