"""The fused output head + cross-entropy (chargpt.model.loss) against the reference: F.cross_entropy on the full logits.
Same loss and gradients for random shapes, masks, label smoothing and chunk sizes; the same models (tied and untied
heads, both architectures) and the same training curve either way; checkpoints that do not know it exists."""

import json

import pytest
import torch
from safetensors import safe_open
from torch.nn import functional as F

import chargpt
from chargpt.config import ModelConfig
from chargpt.data.tokenizer import Vocab
from chargpt.model import loss as fused
from chargpt.model.loss import head_loss
from chargpt.model.transformer import build_model, lm_loss
from chargpt.runs.checkpoint import load_model, save_model


def reference(hidden, weight, targets, bias=None, loss_mask=None, label_smoothing=0.0):
    """The plain path: the full (N, V) logits, then the model's lm_loss (F.cross_entropy)."""
    logits = F.linear(hidden, weight, bias)[None]  # (1, N, V)
    return lm_loss(logits, targets[None], None if loss_mask is None else loss_mask[None], label_smoothing)


def problem(seed, N, C, V, bias=False, mask=None):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, C, generator=g, dtype=torch.float32).requires_grad_()
    weight = (torch.randn(V, C, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).requires_grad_() if bias else None
    targets = torch.randint(0, V, (N,), generator=g)
    loss_mask = None if mask is None else torch.rand(N, generator=g) < mask
    return hidden, weight, b, targets, loss_mask


def grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


# (N, C, V, chunk, group): chunks and groups that divide N, a ragged last chunk and group, a group that is not a
# whole number of chunks, single rows, one chunk larger than N
SHAPES = [(64, 16, 50, 16, 32), (37, 8, 11, 5, 5), (100, 24, 301, 7, 30), (5, 4, 3, 1, 1), (33, 16, 1000, 200, None)]


@pytest.mark.parametrize("N,C,V,chunk,group", SHAPES)
@pytest.mark.parametrize("mask,label_smoothing,bias", [(None, 0.0, False), (0.5, 0.0, False), (None, 0.1, True),
                                                        (0.3, 0.2, True)])
def test_fused_loss_and_gradients_equal_cross_entropy_on_full_logits(N, C, V, chunk, group, mask, label_smoothing,
                                                                      bias):
    hidden, weight, b, targets, loss_mask = problem(N * V + chunk, N, C, V, bias, mask)
    want = reference(hidden, weight, targets, b, loss_mask, label_smoothing)
    got = head_loss(hidden, weight, targets, b, loss_mask, label_smoothing, chunk=chunk, group=group)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    for g, r in zip(grads(got, (hidden, weight, b)), grads(want, (hidden, weight, b))):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-6)


def test_ignored_targets_and_empty_masks_count_as_cross_entropy_does():
    hidden, weight, _, targets, _ = problem(1, 20, 8, 30)
    targets[::3] = -100  # F.cross_entropy's ignore_index
    torch.testing.assert_close(head_loss(hidden, weight, targets, chunk=6),
                               F.cross_entropy(hidden @ weight.t(), targets), rtol=1e-5, atol=1e-5)
    nothing = torch.zeros(20, dtype=torch.bool)  # lm_loss: 0 over a count clamped to 1, and no gradient
    loss = head_loss(hidden, weight, targets.clamp(min=0), loss_mask=nothing)
    assert loss.item() == 0.0 and not grads(loss, (hidden,))[0].any()


def test_backward_scales_the_stored_gradients_by_the_incoming_one():
    """A loss scaler (float16 training) multiplies the loss before backward: the gradients scale with it."""
    hidden, weight, _, targets, _ = problem(4, 30, 8, 40)
    g1 = grads(head_loss(hidden, weight, targets, chunk=7), (hidden, weight))
    g2 = grads(head_loss(hidden, weight, targets, chunk=7) * 1024.0, (hidden, weight))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(b, a * 1024.0)


def test_no_grad_computes_the_same_loss():
    hidden, weight, _, targets, loss_mask = problem(2, 40, 8, 70, mask=0.5)
    with torch.no_grad():
        got = head_loss(hidden, weight, targets, loss_mask=loss_mask, label_smoothing=0.1, chunk=9)
    assert not got.requires_grad
    torch.testing.assert_close(got, reference(hidden, weight, targets, None, loss_mask, 0.1), rtol=1e-5, atol=1e-5)


def test_bf16_autocast_stays_close_to_the_plain_path():
    """Under autocast the matmuls run in bf16 on both paths; the softmax is float32 on both."""
    hidden, weight, _, targets, _ = problem(3, 64, 32, 500)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = head_loss(hidden, weight, targets, chunk=24, group=48)
        want = reference(hidden, weight, targets)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)
    gh, gw = grads(got, (hidden, weight))
    assert gh.dtype == hidden.dtype and gw.dtype == weight.dtype  # float32, as the parameters and activations
    rh, rw = grads(want, (hidden, weight))
    torch.testing.assert_close(gh, rh, rtol=5e-2, atol=1e-3)
    torch.testing.assert_close(gw, rw, rtol=5e-2, atol=1e-3)


def test_only_large_vocabularies_take_the_fused_path_by_default():
    assert not fused.use_fused("auto", 65) and fused.use_fused("auto", 10_000)
    assert fused.use_fused("fused", 65) and not fused.use_fused("full", 10_000)
    with pytest.raises(ValueError, match="auto, fused or full"):
        fused.use_fused("fast", 65)
    assert fused.chunk_rows(10, 10_000, "cpu") == 10 and fused.chunk_rows(4096, 10_000, "cpu") % 16 == 0


TINY = dict(vocab_size=37, block_size=12, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def model_batch(seed=0, **kw):
    cfg = ModelConfig(**{**TINY, **kw})
    torch.manual_seed(seed)
    model = build_model(cfg)
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, cfg.vocab_size, (4, cfg.block_size + 1), generator=g)
    mask = torch.rand(4, cfg.block_size, generator=g) < 0.6
    if cfg.arch == "encoder-decoder":
        src = torch.randint(0, cfg.vocab_size, (4, 7), generator=g)
        batch = dict(src=src, tgt=seq[:, :-1], targets=seq[:, 1:], loss_mask=mask)
    else:
        batch = dict(idx=seq[:, :-1], targets=seq[:, 1:], loss_mask=mask)
    return model, batch


@pytest.mark.parametrize("kw", [dict(), dict(tie_weights=False), dict(arch="encoder-decoder"),
                                dict(arch="encoder-decoder", tie_weights=False, bias=False)])
def test_models_give_the_same_loss_and_gradients_with_either_kernel(kw):
    """Every parameter's gradient (a tied head's is the embedding's too) is the same, masked and smoothed."""
    model, batch = model_batch(**kw)
    out = {}
    for kernel in ("full", "fused"):
        model.set_loss(kernel)
        model.zero_grad()
        logits, loss = model(**batch, label_smoothing=0.1)
        assert (logits is None) == (kernel == "fused")  # the fused loss never makes the logits
        loss.backward()
        out[kernel] = loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.testing.assert_close(out["fused"][0], out["full"][0], rtol=1e-5, atol=1e-5)
    for name, g in out["full"][1].items():
        torch.testing.assert_close(out["fused"][1][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_torch_compile_traces_the_fused_loss_in_one_graph():
    """CUDA compiles by default: the fused loss (masked too) must trace without breaks and give the same numbers.
    aot_eager: dynamo and autograd tracing as inductor sees them, without needing a C++ compiler."""
    model, batch = model_batch(vocab_size=2000)
    loss = model(**batch)[1]
    want = grads(loss, [model.lm_head.weight])[0]
    from torch._dynamo.testing import CompileCounterWithBackend
    counter = CompileCounterWithBackend("aot_eager")
    got = torch.compile(model, backend=counter)(**batch)[1]
    assert counter.frame_count == 1  # one graph: no break
    torch.testing.assert_close(got, loss)
    torch.testing.assert_close(grads(got, [model.lm_head.weight])[0], want)


def test_logits_are_still_there_for_callers_that_need_them():
    model, batch = model_batch(vocab_size=2000)  # large enough for auto to fuse the loss
    assert model(**batch)[0] is None
    logits, loss = model(batch["idx"])  # sampling, Look inside and per-character scores call without targets
    assert logits.shape == (4, TINY["block_size"], 2000) and loss is None


def read(path):
    """A checkpoint's tensors and metadata, less the time it was saved."""
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["chargpt"])
        meta.pop("saved_at")
        return {k: f.get_tensor(k) for k in f.keys()}, meta


def test_checkpoints_do_not_change(tmp_path):
    """The loss kernel is how a loss is computed, not part of the model: same tensors saved, same model loaded."""
    model, batch = model_batch()
    vocab = Vocab("".join(chr(ord("A") + i) for i in range(TINY["vocab_size"])))
    save_model(tmp_path / "full.safetensors", model, vocab)
    model.set_loss("fused")
    save_model(tmp_path / "fused.safetensors", model, vocab)
    (full, meta_full), (fused_, meta_fused) = (read(tmp_path / f"{k}.safetensors") for k in ("full", "fused"))
    assert meta_full == meta_fused and full.keys() == fused_.keys()
    assert all(torch.equal(full[k], fused_[k]) for k in full)
    loaded = load_model(tmp_path / "fused.safetensors")[0]
    assert loaded.loss_kernel == "auto"
    torch.testing.assert_close(loaded(batch["idx"])[0], model(batch["idx"])[0])


def test_training_follows_the_same_curve_with_the_fused_loss(tmp_path, corpus, monkeypatch):
    """50 steps of float32 AdamW, train and val loss every 10 steps: the fused loss (forced on for this small
    vocabulary) and the plain path agree within float32 reordering."""
    curves = {}
    for name, min_vocab in (("full", 10**9), ("fused", 1)):
        monkeypatch.setattr(fused, "FUSED_MIN_VOCAB", min_vocab)
        out = tmp_path / name
        chargpt.train(data=str(corpus), out_dir=str(out), max_iters=50, eval_interval=10, device="cpu",
                      n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
                      threads=1, sample_chars=0, dtype="float32", optimizer="adamw", lr_schedule="cosine",
                      learning_rate=3e-3, warmup_iters=5, label_smoothing=0.1, log=lambda *a: None)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        curves[name] = [(r["step"], r["train_loss"], r["val_loss"]) for r in rows if "val_loss" in r]
    assert [c[0] for c in curves["fused"]] == [0, 10, 20, 30, 40, 50]
    assert curves["fused"][-1][2] < curves["fused"][0][2] - 0.3  # it learned
    for (_, t1, v1), (_, t2, v2) in zip(curves["fused"], curves["full"]):
        assert t1 == pytest.approx(t2, abs=2e-4) and v1 == pytest.approx(v2, abs=2e-4)


def _ddp_rank(rank, root):
    """One of two ranks: DDP over the fused loss, each on its half of the batch; rank 0 saves the gradients."""
    import os

    from safetensors.torch import save_file
    os.environ.update(RANK=str(rank), WORLD_SIZE="2")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=2)
    try:
        model, batch = model_batch(vocab_size=2000)  # auto: fused
        half = {k: v[rank * 2:(rank + 1) * 2] for k, v in batch.items()}
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        logits, loss = ddp(half["idx"], half["targets"])
        assert logits is None
        loss.backward()
        if rank == 0:
            save_file({n: p.grad.contiguous() for n, p in model.named_parameters()}, f"{root}/grads.safetensors")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="needs torch.distributed")
def test_ddp_averages_the_fused_gradients_as_one_process_on_the_whole_batch(tmp_path):
    from safetensors.torch import load_file
    torch.multiprocessing.spawn(_ddp_rank, args=(str(tmp_path),), nprocs=2)
    model, batch = model_batch(vocab_size=2000)
    model.set_loss("full")
    model(batch["idx"], batch["targets"])[1].backward()
    got = load_file(str(tmp_path / "grads.safetensors"))
    for name, p in model.named_parameters():
        torch.testing.assert_close(got[name], p.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_the_vocabulary_benchmark_times_every_size_against_65_on_tiny_shapes():
    """python -m chargpt.bench --only vocab, on a tiny shape: a row per vocabulary size and loss (the adaptive softmax
    on a Zipf text's characters too), 65 the unit."""
    from argparse import Namespace

    from chargpt.bench.speed import vocab_rows
    peak = 1.0  # GFLOP/s, as if measured (a slow one, so that the floors are whole milliseconds)
    rows = vocab_rows(torch.device("cpu"), Namespace(quick=True, batch=None), {torch.float32: peak,
                                                                                torch.bfloat16: peak})
    table = [r.split(" | ") for r in rows if r.startswith("| cpu preset")]
    assert [(r[1], r[2]) for r in table] == [("65", "full (auto)"), ("2,000", "fused (auto)"), ("2,000", "full"),
                                             ("2,000", "adaptive (Zipf text)"), ("10,000", "fused (auto)"),
                                             ("10,000", "full"), ("10,000", "adaptive (Zipf text)")]
    assert table[0][4] == "1.00x" and all(float(r[7].replace(",", "")) > 0 for r in table)  # peak MB
    floors = {r[1]: float(r[5]) for r in table}  # 6 x characters x width x vocabulary FLOPs at the peak
    assert floors["10,000"] == pytest.approx(floors["2,000"] * 5, rel=0.01)
    assert floors["65"] == pytest.approx(6 * 4 * 16 * 16 * 65 / (peak * 1e9) * 1e3, abs=0.05)
    assert all(float(r[6].rstrip("x")) <= float(r[4].rstrip("x")) + 0.01 for r in table)  # the floor is credited
    unmeasured = vocab_rows(torch.device("cpu"), Namespace(quick=True, batch=None))  # --quick measures no peak
    assert all(r.split(" | ")[5:7] == ["-", "-"] for r in unmeasured if r.startswith("| cpu preset"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype,compiled", [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)])
def test_on_cuda_the_fused_loss_matches_the_full_logits(dtype, compiled):
    """As training runs on a GPU: bf16 autocast, torch.compile (inductor) by default; float32 for exactness."""
    model, batch = model_batch(vocab_size=2000)
    model, batch = model.cuda(), {k: v.cuda() for k, v in batch.items()}
    out = {}
    for kernel in ("full", "fused"):
        model.set_loss(kernel)
        model.zero_grad()
        step = torch.compile(model) if compiled else model
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = step(**batch, label_smoothing=0.1)[1]
        loss.backward()
        out[kernel] = loss.detach(), model.lm_head.weight.grad.clone()
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(out["fused"][0], out["full"][0], **tol)
    torch.testing.assert_close(out["fused"][1], out["full"][1], **tol)
