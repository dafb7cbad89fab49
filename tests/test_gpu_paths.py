"""The CUDA and torchrun paths, checked on a CPU: what would go wrong on the first GPU run, reproduced here with Gloo,
torch.compile's "eager" backend and mocks of the GPU's answers (a GPU runs the real thing: scripts/gpu_check.sh)."""

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import torch
from helpers import ROOT, WeightCasts

from chargpt import platforms, runtime
from chargpt.config import ModelConfig, SampleSettings, TrainConfig
from chargpt.data.corpus import corpus_key, corpus_sources, encode_corpus
from chargpt.errors import ConfigError
from chargpt.model.quantize import inference_model
from chargpt.model.transformer import build_model
from chargpt.runs import rundir
from chargpt.runtime import Dist, ddp, pick_compile
from chargpt.sampling.decode import decode
from chargpt.training.optim import Muon
from chargpt.training.start import build, wrap

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


def dead_pid():
    """The id of a process that has ended (on this machine)."""
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def fake_gpu(monkeypatch, capability=(9, 0), triton=True, name="NVIDIA H100"):
    """A CUDA GPU of this compute capability, with or without the triton package."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(runtime, "triton_installed", lambda: triton)


@pytest.fixture
def one_process_group(tmp_path):
    """A Gloo process group of one process (DDP needs one; one rank shows what DDP and torch.compile do to the
    graph as well as eight), and torch.compile's caches emptied before and after."""
    if torch.distributed.is_initialized():
        pytest.skip("a process group is already set up in this process")
    torch._dynamo.reset()
    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous", rank=0, world_size=1)
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        torch._dynamo.reset()


def counting_compile(monkeypatch):
    """torch.compile with the "eager" backend (no code generated), counting the graphs it is handed -> the list
    that grows by one per graph compiled."""
    graphs, real = [], torch.compile

    def backend(gm, example_inputs):
        graphs.append(len(gm.graph.nodes))
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, **{**kw, "backend": backend}))
    return graphs


def tiny_model_and_optimizer(n_layer=2, vocab_size=65, optimizer="adamw", n_embd=32):
    mcfg = ModelConfig(n_layer=n_layer, n_head=2, n_embd=n_embd, block_size=16, vocab_size=vocab_size,
                       dropout=0.0).validate()
    cfg = TrainConfig(optimizer=optimizer, compile="on", dtype="float32")
    model, opt, scaler, gen = build(mcfg, cfg, CPU, torch.float32, Dist())
    return model, opt, cfg, mcfg


def train_steps(model, steps=3, vocab_size=65, T=16):
    torch.manual_seed(1)
    for _ in range(steps):
        x = torch.randint(0, vocab_size, (2, T))
        model(x, targets=x)[1].backward()


# --- 1. DDP and torch.compile: one graph, whatever the flat parameters do to DDP's bucket sizes -----------------------
def test_ddp_under_compile_traces_the_model_as_one_graph_with_flat_parameters(one_process_group, monkeypatch):
    """chargpt's parameters are views of one buffer, and DDP's graph splitter sizes each by its storage: the whole
    buffer. Plain DDP + torch.compile cut the model into a piece per parameter or so; wrap()'s DDP keeps one graph."""
    def pieces(model):  # plain DDP, its buckets (1 MB) as small beside this model as the default is beside 6 x 384
        torch._dynamo.reset()
        graphs.clear()
        train_steps(torch.nn.parallel.DistributedDataParallel(torch.compile(model), bucket_cap_mb=1), steps=1)
        return len(graphs)

    graphs = counting_compile(monkeypatch)
    model, opt, cfg, mcfg = tiny_model_and_optimizer(n_embd=128)  # 1.7 MB of parameters
    separate, flat = pieces(build_model(mcfg)), pieces(model)
    assert flat > 3 * separate, (flat, separate)  # the problem (at 6 x 384 by default: 40 pieces against 3)

    torch._dynamo.reset()
    graphs.clear()
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: "/usr/bin/g++")  # --compile on is checked, then mocked
    wrapped = wrap(model, opt, cfg, CPU, torch.float32, Dist(world_size=2))  # "two processes": the group has one
    assert isinstance(wrapped.train_model, torch.nn.parallel.DistributedDataParallel) and wrapped.compiled
    train_steps(wrapped.train_model)
    assert len(graphs) == 1  # one graph, compiled once, reused by every step
    assert torch._dynamo.config.optimize_ddp is True  # changed inside chargpt's DDP only, not for the process


def test_ddp_never_views_gradients_as_buckets_nor_syncs_constant_buffers(one_process_group):
    """gradient_as_bucket_view=True would leave the flat gradient buffer, the one the optimizer steps, at zero from
    the second step on (DDP's buckets hold the gradients instead): a rule, and this is why."""
    def flat_grad_after_two_steps(wrapped):
        for _ in range(2):
            opt.zero_grad()
            train_steps(wrapped, steps=1)
        return opt.flat.grad.abs().sum().item()

    model, opt, _, _ = tiny_model_and_optimizer()
    views = torch.nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
    assert flat_grad_after_two_steps(views) == 0.0  # the optimizer would step zeros
    model, opt, _, _ = tiny_model_and_optimizer()
    ours = ddp(model, CPU)
    assert flat_grad_after_two_steps(ours) > 0
    assert ours.gradient_as_bucket_view is False and ours.broadcast_buffers is False

    # no buffer sync at each forward is right only while every buffer is a constant of the config (no running
    # statistics): a new buffer that changes while training needs DDP's default back
    for pos_emb in ("learned", "sinusoidal"):
        for arch in ("decoder", "encoder-decoder"):
            cfg = ModelConfig(arch=arch, pos_emb=pos_emb, n_layer=1, n_head=2, n_embd=16, block_size=8,
                              vocab_size=11)
            buffers = dict(build_model(cfg).named_buffers())
            assert set(buffers) <= {"pe"}, buffers.keys()
            assert "pe" not in build_model(cfg).state_dict()  # rebuilt from the config, never trained or saved


# --- 2. TF32: both of torch's APIs read back after start-up -----------------------------------------------------------
def test_tf32_is_switched_on_so_that_both_apis_read_back():
    """After the newer API (fp32_precision = "tf32"), reading the older one raises RuntimeError for the rest of the
    process; inductor's autotuning and any user code after chargpt.train() read it. A fresh process: the setting is
    global."""
    code = ("import torch; from chargpt.runtime import enable_fast_math; enable_fast_math(torch.device('cuda')); "
            "m = torch.backends.cuda.matmul; "
            "print(m.allow_tf32, torch.get_float32_matmul_precision(), getattr(m, 'fp32_precision', 'tf32'))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["True", "high", "tf32"]


# --- 3. --compile auto only where Triton runs -------------------------------------------------------------------------
@pytest.mark.parametrize("capability,triton,windows,compiles", [
    ((9, 0), True, False, True), ((7, 0), True, False, True), ((6, 0), True, False, False),
    ((8, 0), False, False, False), ((8, 0), True, True, False)],
    ids=["hopper", "volta", "pascal", "no-triton", "windows"])
def test_compile_auto_compiles_only_where_triton_can_run(monkeypatch, capability, triton, windows, compiles):
    fake_gpu(monkeypatch, capability, triton, name="Tesla P100" if capability < (7, 0) else "NVIDIA GPU")
    monkeypatch.setattr(platforms, "WINDOWS", windows)
    compiled, reason = pick_compile("auto", CUDA)
    assert compiled is compiles, reason
    if capability < (7, 0):
        assert reason == ("eager (--compile auto: Triton, which torch.compile generates GPU code with, needs compute "
                          "capability 7.0 or newer, and Tesla P100 has 6.0)")
    if not windows and not compiles:  # --compile on there would crash at the first step: refused at start
        with pytest.raises(ConfigError, match=r"^--compile on: .*; train with --compile off$"):
            pick_compile("on", CUDA)


# --- 4. bf16 decoding on a GPU: the weights converted once, not cast at every character ------------------------------
def test_bf16_decoding_on_a_gpu_converts_the_weights_once(monkeypatch, tiny_config):
    """A GPU with native bf16 decodes in bf16 by default. Under autocast with float32 weights every step would cast
    every weight again (autocast's cache is cleared at each exit): 5 matrices here, per character. The decode loop
    runs on the CPU below (autocast behaves alike); the choice of weights is the GPU's."""
    fake_gpu(monkeypatch, (8, 0))
    torch.manual_seed(0)
    model, dtype, reason = inference_model(build_model(tiny_config).eval(), CUDA, "auto")
    assert dtype == torch.bfloat16 and next(model.parameters()).dtype == torch.bfloat16, reason
    steps = decode(model, torch.tensor([[1, 2, 3]]), SampleSettings(max_new_tokens=8, temperature=0),
                   torch.Generator(), dtype=dtype)
    next(steps)  # the prefill
    with WeightCasts() as casts:
        for _ in range(5):
            next(steps)
    assert casts.count == 0


# --- 5. the process group's timeout: the long work rank 0 does alone fits in it --------------------------------------
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_process_group_waits_30_minutes_for_nccl_as_for_gloo(monkeypatch, device):
    """NCCL's default is 10 minutes: ranks wait that long at most while rank 0 encodes a large corpus or builds the
    novelty index."""
    joined = {}
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    if device == "cuda":
        fake_gpu(monkeypatch)
        monkeypatch.setattr(torch.cuda, "set_device", lambda d: None)
        monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda **kw: joined.update(kw))
    runtime.init_distributed(device)
    assert joined["backend"] == ("nccl" if device == "cuda" else "gloo")
    assert joined["timeout"] == timedelta(minutes=30) == runtime.PROCESS_GROUP_TIMEOUT


# --- 6. machines sharing a cache folder: each sweeps only its own dead writers' files ---------------------------------
def test_temporary_files_name_their_machine_and_the_sweep_spares_other_machines(tmp_path, corpus, monkeypatch):
    _, sources = corpus_sources(str(corpus))
    key, cache = corpus_key(sources, "utf-8", "strict"), tmp_path / "cache"
    cache.mkdir()
    here, dead = rundir.host_tag(), dead_pid()
    other = f"{key}.bin.tmp{dead}-node7"  # another machine encoding the same corpus now: its pid means nothing here
    ours = f"{key}.bin.tmp{dead}-{here}"  # this machine's, its process gone: a leftover
    old = f".{key}.json.tmp{dead}-node8"  # another machine's, untouched for two days: a leftover too
    for name in (other, ours, old):
        (cache / name).write_bytes(b"partial")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(cache / old, (two_days_ago, two_days_ago))

    written = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (written.append(os.path.basename(src)), real_replace(src, dst)))
    encode_corpus(str(corpus), cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == sorted([f"{key}.bin", f"{key}.json", other])
    assert written[0] == f"{key}.bin.tmp{os.getpid()}-{here}"  # the ids, written under this machine's name
    assert all(name.endswith(f".tmp{os.getpid()}-{here}") for name in written), written

    # names from before hosts were added (pid alone) are judged as this machine's, as they always were
    legacy_dead, legacy_alive = cache / f".x.tmp{dead}", cache / f".y.tmp{os.getppid()}"
    for p in (legacy_dead, legacy_alive):
        p.write_bytes(b"x")
    rundir.remove_stale_temps(cache)
    assert not legacy_dead.exists() and legacy_alive.exists() and (cache / other).exists()


def test_host_tag_is_safe_in_a_file_name(monkeypatch):
    monkeypatch.setattr(rundir.socket, "gethostname", lambda: "gpu-node.tmp3.example.org/x")
    assert rundir.host_tag() == "gpu-node-tmp3-example-org-x"
    assert rundir.temp_suffix().rsplit(".tmp", 1)[-1] == f"{os.getpid()}-gpu-node-tmp3-example-org-x"


# --- 7. the fused head + loss under torch.compile with sentence pairs: no recompile per length ------------------------
def test_fused_loss_under_compile_does_not_recompile_per_pair_length(monkeypatch):
    """Pairs batches vary in length. The fused loss's chunk loop, traced, specialised the graph to each length:
    torch recompiled until its limit (8), then ran the forward eagerly. Now the model compiles twice (the first
    length, then dynamic for all), in one graph, and the loss keeps its value."""
    torch._dynamo.reset()
    graphs = counting_compile(monkeypatch)
    V = 1100  # fused by default from chargpt.model.loss.FUSED_MIN_VOCAB
    torch.manual_seed(0)
    model = build_model(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=64, vocab_size=V, dropout=0.0))
    compiled = torch.compile(model)
    try:
        for T in range(20, 50, 3):  # ten lengths
            x = torch.randint(0, V, (4, T))
            mask = torch.arange(T)[None, :].expand(4, T) >= T // 2  # the target side counts
            loss = compiled(x, targets=x, loss_mask=mask)[1]
            loss.backward()
            assert loss.item() == pytest.approx(model(x, targets=x, loss_mask=mask)[1].item(), rel=1e-5)
        assert len(graphs) == 2, graphs  # before: 8, and the limit hit
        assert not any("recompile" in k.lower() for k in torch._dynamo.utils.counters["unimplemented"])
    finally:
        torch._dynamo.reset()


# --- 8. fp16's loss scaler without a host sync per step ---------------------------------------------------------------
def items_read(monkeypatch):
    reads, real = [], torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: (reads.append(1), real(t))[1])
    return reads


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_loss_scaled_steps_read_nothing_on_the_host(monkeypatch, optimizer):
    """GradScaler.step reads found_inf with .item() (a GPU sync each step) unless the optimizer takes the scale and
    the flag as tensors: torch's fused AdamW does, and chargpt's Muon now does too."""
    model, opt, _, _ = tiny_model_and_optimizer(optimizer=optimizer)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    x = torch.randint(0, 65, (2, 16))
    scaler.scale(model(x, targets=x)[1]).backward()
    for part in opt.parts.values():
        scaler.unscale_(part)
    reads = items_read(monkeypatch)
    for part in opt.parts.values():
        scaler.step(part)
    scaler.update()
    assert reads == []


def test_muon_under_a_loss_scaler_skips_inf_steps_and_takes_the_others_exactly():
    torch.manual_seed(0)
    weights = [torch.randn(8, 4), torch.randn(4, 4)]
    grads = [torch.randn(8, 4), torch.randn(4, 4)]

    def muon_after(steps, scaler=None):
        params = [torch.nn.Parameter(w.clone()) for w in weights]
        opt = Muon([{"params": params}], lr=0.02, weight_decay=0.1, momentum=0.95, ns_dtype=torch.float32)
        for g in steps:
            scale = scaler.scale(torch.ones(())).item() if scaler else 1.0  # as a scaled loss's gradients would be
            for p, grad in zip(params, g):
                p.grad = grad.clone() * scale
            if scaler:
                scaler.step(opt)
                scaler.update()
            else:
                opt.step()
        return [p.detach() for p in params], [opt.state[p]["momentum_buffer"] for p in params]

    plain = muon_after([grads, grads])
    inf = [g.clone() for g in grads]
    inf[0][0, 0] = float("inf")
    scaled = muon_after([grads, inf, grads], torch.amp.GradScaler("cpu", init_scale=256.0))
    for a, b in zip(plain[0] + plain[1], scaled[0] + scaled[1]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)  # the inf step left weights and momentum alone


# --- scripts/gpu_check.sh, end to end on a CPU ------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None, reason="bash and coreutils")
def test_gpu_check_dry_run_writes_a_report_line_per_part(tmp_path):
    """--dry-run: every part on the CPU at toy sizes (no GPU, no corpus, no network), through the same parsing and
    report as on a GPU. Its verdict does not depend on the machine's load: here a busy machine is played by a
    python3 that takes the fused_loss part past its 25 s limit, which a dry run does not enforce."""
    busy = tmp_path / "bin"
    busy.mkdir()
    (busy / "python3").write_text(f'#!/bin/sh\n[ "$2" = fused_loss ] && sleep 26\nexec "{sys.executable}" "$@"\n')
    (busy / "python3").chmod(0o755)
    env = {**os.environ, "OUT": str(tmp_path / "out"), "PYTHONPATH": str(ROOT), "PATH": f"{busy}:{os.environ['PATH']}"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run"], capture_output=True,
                       text=True, timeout=1800, env=env, cwd=tmp_path)  # against a hang, not a speed check
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "out" / "gpu_check_report.jsonl").read_text().splitlines()]
    limits = {line["part"]: line["limit_s"] for line in lines}
    assert limits == {"preflight": 30, "cuda_tests": 60, "recipe": 165, "exact_resume": 55, "fp16": 30,
                      "fused_loss": 25, "ddp": 40, "decode": 35}  # the GPU run's limits, in its order
    assert list(limits) == ["preflight", "cuda_tests", "recipe", "exact_resume", "fp16", "fused_loss", "ddp", "decode"]
    assert all(line["ok"] and line["dry_run"] for line in lines), lines
    assert lines[5]["seconds"] > lines[5]["limit_s"]  # past its limit, and passed
    recipe = lines[2]
    assert {"full_val_loss", "ms_per_step", "mfu", "peak_memory_mb", "graphs_compiled"} <= recipe.keys()
    assert lines[3]["same_seed_max_diff"] is not None and lines[6]["subgraphs"] == 1
    assert "PASS" in r.stdout and "gpu_check_report.jsonl" in r.stdout
