"""The parts of scripts/gpu_check.sh, one per process (the script gives each its own time limit), and the report.

    python scripts/gpu_check.py PART --work DIR [--data CORPUS] [--dry-run]     # a part: DIR/parts/PART.json
    python scripts/gpu_check.py ended PART --work DIR --report FILE --rc N --limit S --started EPOCH
    python scripts/gpu_check.py summary FILE

A part writes what it measured to DIR/parts/PART.json, with "ok" (whether its check passed) and "why" (what did
not pass). `ended` turns that into the part's line of the report (one JSON object per line), or says that the part
timed out or crashed when it wrote nothing; `summary` prints the report as a table and exits 1 unless every part
passed. --dry-run runs every part on the CPU at toy sizes, with torch.compile's "eager" backend (no code is
generated, no C++ compiler needed): the orchestration, the parsing and the report, not the numbers.
"""

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PARTS = ("preflight", "cuda_tests", "recipe", "exact_resume", "fp16", "fused_loss", "ddp", "decode", "nanogpt")
TARGET_VAL_LOSS = 1.47  # nanoGPT's shakespeare-char result (its README: 1.4697), here on the whole validation tenth
# dense bf16 peak by GPU name, for MFU (vendor numbers, without sparsity); the first name found in the GPU's counts
PEAK_BF16_FLOPS = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12,
                   "A10": 125e12, "L4": 121e12}
# nanoGPT's config/train_shakespeare_char.py, the last tenth of the text validating as there
RECIPE = dict(preset="shakespeare-char", n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2, bias=False,
              batch_size=64, max_iters=5000, learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, beta2=0.99,
              eval_interval=250, eval_iters=50, optimizer="adamw", lr_schedule="cosine", save_state="end",
              sample_chars=300, val_split="tail")
TOY = dict(preset="tiny", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
           warmup_iters=2, sample_chars=0, curves=False)


# --- what every part shares -------------------------------------------------------------------------------------------
class Part:
    """One part's run: its arguments, its device, and what it found (written by finish())."""

    def __init__(self, args):
        import torch
        self.args, self.dry = args, args.dry_run
        self.work = Path(args.work)
        self.device = "cpu" if self.dry else "cuda"
        self.found = {}
        if self.dry:
            dry_run_compile()
        torch.manual_seed(0)

    def scaled(self, gpu, dry):
        return dry if self.dry else gpu

    def train(self, **kw):
        """chargpt.train on the check's corpus, its lines printed (to the screen and the part's log)."""
        import chargpt
        return chargpt.train(log=lambda line: print(line, flush=True),
                             **{"data": self.args.data, "device": self.device, **kw})

    def finish(self, ok, why=""):
        out = self.work / "parts" / f"{self.args.part}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"ok": bool(ok), "why": why, **self.found}, default=float))


def dry_run_compile():
    """--dry-run: torch.compile keeps tracing (graphs, recompiles, DDP's splitting) but generates no code."""
    import torch

    from chargpt import runtime
    real = torch.compile
    torch.compile = lambda model=None, **kw: real(model, **{"backend": "eager", **kw})
    runtime.cpp_compiler = lambda: "(dry run: torch.compile's eager backend)"


def compile_counters():
    """-> (graphs torch.compile has compiled in this process, whether it gave up recompiling somewhere)."""
    from torch._dynamo.utils import counters
    gave_up = any("recompile" in reason.lower() for reason in counters["unimplemented"])
    return counters["stats"]["unique_graphs"], gave_up


def peak_memory_mb(device):
    import torch
    return round(torch.cuda.max_memory_allocated() / 2**20, 1) if device == "cuda" else None


def curve(run_dir):
    """A run's metrics.jsonl rows without the wall clock: what two runs that computed alike share."""
    from chargpt.runs import rundir
    return [{k: v for k, v in row.items() if k != "elapsed_s"}
            for row in rundir.read_step_rows(Path(run_dir) / rundir.METRICS)]


def max_diff(a, b):
    """Largest difference between the losses of two curves (inf if their steps differ)."""
    if [r["step"] for r in a] != [r["step"] for r in b]:
        return math.inf
    return max((abs(x[k] - y[k]) for x, y in zip(a, b) for k in ("train_loss", "val_loss")), default=0.0)


# --- the parts --------------------------------------------------------------------------------------------------------
def preflight(p: Part):
    """The machine and the corpus, before anything long runs: a GPU, the packages, tiny Shakespeare verified."""
    import torch
    for mod in ("numpy", "click", "tqdm", "safetensors", "pytest"):
        __import__(mod)
    p.found.update(torch=torch.__version__, python=sys.version.split()[0])
    if p.dry:
        corpus = p.work / "corpus.txt"
        corpus.write_text("".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth teach the "
                                  f"torches.\n" for i in range(80)), encoding="utf-8")
        p.found.update(device="cpu (dry run)", corpus=str(corpus))
        return p.finish(True)
    if not torch.cuda.is_available():
        return p.finish(False, "no CUDA device visible to torch")
    from chargpt.data.corpora import CORPORA, sha256_of
    capability = ".".join(map(str, torch.cuda.get_device_capability()))
    p.found.update(device=torch.cuda.get_device_name(), capability=capability, cuda=torch.version.cuda,
                   corpus=p.args.data)
    if not Path(p.args.data).is_file():
        return p.finish(False, f"no corpus at {p.args.data}: copy tiny Shakespeare there (python -m chargpt data get "
                               f"tinyshakespeare, on a machine with network), or pass its path")
    if sha256_of(p.args.data) != CORPORA["tinyshakespeare"].sha256:
        return p.finish(False, f"{p.args.data} is not tiny Shakespeare (sha256 differs): the loss target means nothing")
    p.finish(True)


def cuda_tests(p: Part):
    """tests/test_cuda.py: on the GPU (skipped without one, as in the dry run)."""
    xml = p.work / "cuda_tests.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
                        "tests/test_cuda.py"], cwd=ROOT)
    import xml.etree.ElementTree as ET
    suites = ET.parse(xml).getroot()
    suite = suites if suites.tag == "testsuite" else suites.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    p.found.update(counts, passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"])
    ran = p.dry or p.found["passed"] > 0
    p.finish(r.returncode == 0 and ran, "" if r.returncode == 0 else f"pytest exited {r.returncode}")


def recipe(p: Part):
    """nanoGPT's shakespeare-char recipe, compiled, to a full validation loss of at most 1.47."""
    import torch

    from chargpt.model.transformer import estimated_params
    from chargpt.tools.evaluate import evaluate
    run = p.work / "recipe"
    kw = {**RECIPE, "compile": "on"} if not p.dry else {**TOY, "max_iters": 30, "eval_interval": 10, "compile": "on"}
    t0 = time.perf_counter()
    s = p.train(out_dir=str(run), **kw)
    wall = time.perf_counter() - t0
    full = evaluate(str(run), stride=kw["block_size"], device=p.device, dtype="float32", progress=False)["loss"]
    graphs, gave_up = compile_counters()
    steps = s["step"]
    training = s["elapsed_s"] * (1 - s["eval_fraction"]) - s["first_step_s"]  # no evaluation, no compilation
    ms = training / max(1, steps - 1) * 1e3
    L, C, T, B = kw["n_layer"], kw["n_embd"], kw["block_size"], kw["batch_size"]
    from chargpt.config import ModelConfig
    n = estimated_params(ModelConfig(n_layer=L, n_head=kw["n_head"], n_embd=C, block_size=T, vocab_size=65)) - T * C
    flops = (6 * n + 12 * L * C * T) * B * T  # per step: nanoGPT's estimate_mfu (PaLM's appendix B; n without wpe)
    name = torch.cuda.get_device_name() if p.device == "cuda" else ""
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    target = TARGET_VAL_LOSS if not p.dry else 10.0  # a toy model cannot reach the real target
    p.found.update(full_val_loss=round(full, 4), target=target, best_val_loss_estimate=round(s["best_val_loss"], 4),
                   steps=steps, wall_s=round(wall, 1), training_s=round(training, 1),
                   compile_s=round(s["first_step_s"], 1), eval_fraction=round(s["eval_fraction"], 3),
                   ms_per_step=round(ms, 2), mfu=round(flops / (ms / 1e3) / peak, 3) if peak else None,
                   peak_memory_mb=peak_memory_mb(p.device), graphs_compiled=graphs, recompile_limit_hit=gave_up)
    why = [f"full val loss {full:.4f} > {target}"] * (full > target) + ["torch.compile gave up recompiling"] * gave_up
    p.finish(not why, "; ".join(why))


def exact_resume(p: Part):
    """Compiled, Muon, --grad-accum 2 and dropout: N steps then --resume to 2N is the 2N-step run, and the same
    seed twice gives the same curve (or how far apart, where kernels are not deterministic)."""
    n = p.scaled(40, 4)
    kw = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=16, eval_iters=5, sample_chars=0) if not p.dry \
        else TOY
    kw = {**kw, "compile": "on", "optimizer": "muon", "grad_accum": 2, "dropout": 0.1, "eval_interval": n // 2,
          "lr_decay_iters": 2 * n, "warmup_iters": 2, "curves": False}
    for name in ("whole", "again"):
        p.train(out_dir=str(p.work / name), max_iters=2 * n, **kw)
    p.train(out_dir=str(p.work / "split"), max_iters=n, **kw)
    p.train(out_dir=str(p.work / "split"), max_iters=2 * n, resume=True, **kw)
    whole, again, split = (curve(p.work / name) for name in ("whole", "again", "split"))
    same, resumed = max_diff(whole, again), max_diff(whole, split)
    p.found.update(steps=2 * n, same_seed_identical=whole == again, same_seed_max_diff=same,
                   resume_identical=whole == split, resume_max_diff=resumed, graphs_compiled=compile_counters()[0])
    # bitwise where the kernels are deterministic; else no further apart than the noise of two equal runs allows
    ok = whole == split or (resumed <= 0.01 and whole != again)
    p.finish(ok, "" if ok else f"the resumed curve differs from the whole run's by {resumed:.3g} nats "
                               f"(the same seed twice: {same:.3g})")


def fp16(p: Part):
    """float16 with the loss scaler (what GPUs without bf16 train in) and Muon, a few hundred steps: the loss falls
    and stays finite; host syncs per step counted (torch.cuda.set_sync_debug_mode)."""
    import torch
    steps = p.scaled(300, 20)
    kw = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, batch_size=16, eval_iters=5) if not p.dry else TOY
    syncs = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if p.device == "cuda":
            torch.cuda.set_sync_debug_mode("warn")
        s = p.train(out_dir=str(p.work / "fp16"), **{**kw, "max_iters": steps, "eval_interval": steps // 2,
                                                     "dtype": p.scaled("float16", "float32"), "optimizer": "muon",
                                                     "compile": "off", "sample_chars": 0, "curves": False})
        if p.device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
    rows = curve(p.work / "fp16")
    falls = rows[-1]["train_loss"] < rows[0]["train_loss"] and all(math.isfinite(r["val_loss"]) for r in rows)
    p.found.update(dtype=p.scaled("float16", "float32 (no float16 training on a CPU)"), steps=s["step"],
                   first_loss=rows[0]["train_loss"], last_loss=rows[-1]["train_loss"], host_syncs=syncs,
                   syncs_per_step=round(syncs / steps, 2) if syncs is not None else None)
    p.finish(falls, "" if falls else "the loss did not fall, or was not finite")


def fused_loss(p: Part):
    """chargpt.model.loss's fused head + loss against the full logits at 2,000 and 10,000 characters, one training
    step's rows (batch 64 x 256) in bf16 autocast: the same loss and gradients, and each one's time and memory, to set
    the GPU's threshold (chargpt.model.loss.FUSED_MIN_VOCAB, measured on a CPU only) from measurement."""
    import torch

    from chargpt.model.loss import head_loss
    from chargpt.model.transformer import lm_loss
    from chargpt.runtime import autocast
    dev = torch.device(p.device)
    N, C = p.scaled(64 * 256, 256), p.scaled(384, 32)
    dtype = torch.bfloat16 if p.device == "cuda" else torch.float32
    results, ok = {}, True

    def step(loss_of, h, w, t):
        """-> (median ms of a forward and backward, peak MB, loss, gradients of h and w)."""
        times = []
        for _ in range(p.scaled(8, 2)):
            h.grad = w.grad = None
            if p.device == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            with autocast(dev, dtype):
                loss = loss_of(h, w, t)
            loss.backward()
            if p.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        return dict(ms=round(sorted(times)[len(times) // 2] * 1e3, 2), peak_mb=peak_memory_mb(p.device),
                    loss=loss.item(), grad=(h.grad.float().clone(), w.grad.float().clone()))

    paths = {"fused": lambda h, w, t: head_loss(h, w, t),
             "full": lambda h, w, t: lm_loss(torch.nn.functional.linear(h, w)[None], t[None])}
    for V in p.scaled((2000, 10000), (50, 1100)):
        h = torch.randn(N, C, device=dev, requires_grad=True)
        w = (torch.randn(V, C, device=dev) * 0.02).requires_grad_()
        t = torch.randint(0, V, (N,), device=dev)
        row = {name: step(fn, h, w, t) for name, fn in paths.items()}
        agree = abs(row["fused"]["loss"] - row["full"]["loss"]) < 1e-2 and all(
            torch.allclose(a, b, rtol=5e-2, atol=1e-3) for a, b in zip(row["fused"]["grad"], row["full"]["grad"]))
        ok &= agree
        for r in row.values():
            del r["grad"]
        results[str(V)] = {**row, "agree": agree, "faster": min(row, key=lambda k: row[k]["ms"])}
    p.found.update(rows=N, n_embd=C, by_vocab=results)
    p.finish(ok, "" if ok else "the fused loss or its gradients differ from the full logits'")


def ddp(p: Part):
    """DDP with NCCL in one process (one GPU), the model compiled inside it: one graph (chargpt's DDP), against
    the pieces plain DDP cuts flat parameters into; a few steps train."""
    import torch
    import torch.distributed as dist

    from chargpt.config import ModelConfig, TrainConfig
    from chargpt.runtime import Dist
    from chargpt.runtime import ddp as chargpt_ddp
    from chargpt.training.start import build
    dev = torch.device(p.device, 0) if p.device == "cuda" else torch.device("cpu")
    backend = "nccl" if p.device == "cuda" else "gloo"
    extra = {"device_id": dev} if p.device == "cuda" else {}
    dist.init_process_group(backend, init_method=f"file://{p.work / 'rendezvous'}", rank=0, world_size=1, **extra)
    size = dict(n_layer=6, n_head=6, n_embd=384, block_size=256) if not p.dry else dict(n_layer=2, n_head=2,
                                                                                      n_embd=128, block_size=16)
    mcfg = ModelConfig(vocab_size=65, dropout=0.0, **size).validate()
    cfg = TrainConfig(optimizer="adamw", compile="on")
    graphs = []
    real_backend = "eager" if p.dry else "inductor"

    def counting(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        if real_backend == "eager":
            return gm.forward
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs)

    def steps(model, optimizer, n, batch):
        losses, t0 = [], time.perf_counter()
        for i in range(n):
            if i == 1:  # the first step compiles
                if p.device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
            x = torch.randint(0, 65, (batch, mcfg.block_size), device=dev)
            with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=p.device == "cuda"):
                loss = model(x, targets=x)[1]
            loss.backward()
            if optimizer is not None:
                optimizer.parts["optim"].step()
                optimizer.zero_grad()
            losses.append(loss.detach())
        if p.device == "cuda":
            torch.cuda.synchronize()
        return [v.item() for v in losses], (time.perf_counter() - t0) / max(1, n - 1) * 1e3

    try:
        model, optimizer, _, _ = build(mcfg, cfg, dev, torch.float32, Dist())
        torch._dynamo.reset()
        wrapped = chargpt_ddp(torch.compile(model, backend=counting), dev)
        losses, ms = steps(wrapped, optimizer, p.scaled(30, 4), p.scaled(64, 2))
        ours = len(graphs)
        plain_model = build(mcfg, cfg, dev, torch.float32, Dist())[0]
        torch._dynamo.reset()
        graphs.clear()
        real_backend = "eager"  # plain DDP's pieces are only counted, not compiled for real
        steps(torch.nn.parallel.DistributedDataParallel(torch.compile(plain_model, backend=counting)), None, 1, 2)
        p.found.update(backend=backend, subgraphs=ours, plain_ddp_subgraphs=len(graphs), ms_per_step=round(ms, 2),
                       first_loss=losses[0], last_loss=losses[-1])
        ok = ours == 1 and all(math.isfinite(v) for v in losses)
        p.finish(ok, "" if ok else f"{ours} subgraphs under chargpt's DDP (want 1), or a non-finite loss")
    finally:
        dist.destroy_process_group()


def decode(p: Part):
    """Decoding at batch 1: float32, bf16 (the weights converted once) and the compiled static step, in characters
    per second, with the recipe's model (a random one of its size if it is missing); bf16 must not be slower."""
    import torch

    from chargpt.model.quantize import inference_model
    from chargpt.runs.checkpoint import load_model
    from chargpt.sampling.engine import Generator
    run = p.work / "recipe"
    if (run / "best.safetensors").exists():
        base, vocab, meta = load_model(str(run), p.device)
    else:
        from chargpt.config import ModelConfig
        from chargpt.data.tokenizer import Vocab
        from chargpt.model.transformer import build_model
        vocab = Vocab(sorted(set(Path(p.args.data).read_text(encoding="utf-8"))))
        size = dict(n_layer=6, n_head=6, n_embd=384, block_size=256) if not p.dry else dict(n_layer=1, n_head=2,
                                                                                          n_embd=16, block_size=16)
        base, meta = build_model(ModelConfig(vocab_size=len(vocab), dropout=0.0, **size)).to(p.device), {}
    import copy
    n = p.scaled(500, 20)
    speeds = {}
    for name, dtype, compile in (("float32", "float32", "off"), ("bfloat16", "bfloat16", "off"),
                                 ("compiled", "auto", "on")):
        model, torch_dtype, _ = inference_model(copy.deepcopy(base), torch.device(p.device), dtype)
        gen = Generator(model, vocab, p.device, torch_dtype, meta, compile=compile)
        gen.generate("\n", max_new_tokens=min(n, 50), seed=0)  # warm-up (and, compiled, the compilation)
        if p.device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        gen.generate("\n", max_new_tokens=n, seed=0)
        if p.device == "cuda":
            torch.cuda.synchronize()
        speeds[name] = round(n / (time.perf_counter() - t0), 1)
    p.found.update(chars=n, chars_per_s=speeds, model=str(run) if meta else "random, the recipe's size")
    slower = not p.dry and speeds["bfloat16"] < 0.95 * speeds["float32"]
    p.finish(not slower, f"bf16 decodes at {speeds['bfloat16']} chars/s, float32 at {speeds['float32']}" * slower)


def nanogpt(p: Part):
    """nanoGPT's train.py on the same recipe and GPU, from the checkout given (--nanogpt): ms per step, beside the
    recipe part's."""
    import torch

    from chargpt.bench.nanogpt import nanogpt_step_ms
    text = Path(p.args.data).read_text(encoding="utf-8")
    theirs = nanogpt_step_ms(p.args.nanogpt, text, torch.device(p.device), 200, torch.get_num_threads())
    ours = None
    with contextlib.suppress(OSError, ValueError):
        ours = json.loads((p.work / "parts" / "recipe.json").read_text())["ms_per_step"]
    p.found.update(nanogpt_ms_per_step=round(theirs, 2), chargpt_ms_per_step=ours)
    p.finish(True)


# --- the report -------------------------------------------------------------------------------------------------------
def ended(args):
    """The part's line of the report: what it wrote, or why it wrote nothing (timed out, crashed)."""
    found = args.work / "parts" / f"{args.part}.json"
    line = {"part": args.part}
    try:
        line.update(json.loads(found.read_text()))
    except (OSError, ValueError):
        if args.rc in (124, 137):
            why = f"timed out after its limit of {args.limit:g} s"
        else:
            log = args.work.parent / f"gpu_check_{args.part}.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            why = f"exited {args.rc} without a result" + (f": {tail[0][:300]}" if tail else "")
        line.update(ok=False, why=why)
    line.update(seconds=round(time.time() - args.started, 1), limit_s=args.limit, dry_run=args.dry_run)
    with open(args.report, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")
    print(f"== {args.part}: {'ok' if line['ok'] else 'FAILED: ' + line['why']} ({line['seconds']:.0f} s of "
          f"{args.limit:g})", flush=True)
    return 0 if line["ok"] else 1


def summary(args):
    lines = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]
    width = max(len(line["part"]) for line in lines)
    for line in lines:
        shown = {k: v for k, v in line.items() if k not in ("part", "ok", "why", "dry_run", "limit_s")}
        print(f"{line['part']:<{width}}  {'ok  ' if line['ok'] else 'FAIL'}  {json.dumps(shown)[:400]}"
              + (f"\n{'':<{width}}        {line['why']}" if line["why"] else ""))
    failed = [line["part"] for line in lines if not line["ok"]]
    total = sum(line["seconds"] for line in lines)
    print(f"{'FAIL: ' + ', '.join(failed) if failed else 'PASS'} ({total:.0f} s; report: {args.report})")
    return 1 if failed else 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("part", choices=PARTS + ("ended", "summary"))
    ap.add_argument("name", nargs="?", help="ended: the part that ended; summary: the report")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "chargpt-gpu-check" / "work")
    ap.add_argument("--data", default=str(ROOT / "data" / "tinyshakespeare.txt"))
    ap.add_argument("--nanogpt", default=None)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--report", type=Path)
    ap.add_argument("--rc", type=int, default=0)
    ap.add_argument("--limit", type=float, default=0)
    ap.add_argument("--started", type=float, default=0, help="ended: when the part started (seconds since 1970)")
    args = ap.parse_args(argv)
    if args.part == "ended":
        args.part = args.name
        return ended(args)
    if args.part == "summary":
        args.report = args.name
        return summary(args)
    if args.dry_run and args.part != "preflight":
        args.data = str(args.work / "corpus.txt")
    os.environ.setdefault("CHARGPT_CACHE_DIR", str(args.work / "cache"))
    globals()[args.part](Part(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
