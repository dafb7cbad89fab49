"""Flat parameters (chargpt/training/flat.py): every parameter and gradient a view of one buffer, so clipping and AdamW
are a few calls per step; the same updates as torch's per-parameter AdamW and clipping, and the same state format."""

import copy
import dataclasses

import pytest
import torch

from chargpt.config import TrainConfig
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.runs import checkpoint as ckpt
from chargpt.training.optim import make_optimizer

CPU = torch.device("cpu")
ADAMW = TrainConfig(optimizer="adamw", learning_rate=1e-2, weight_decay=0.1)


def batch(cfg, seed=0):
    return torch.randint(0, cfg.vocab_size, (4, cfg.block_size + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model, x):
    return model(x[:, :-1], x[:, 1:])[1]


def reference_adamw(model):
    """What training did before flat buffers: torch's fused AdamW over the parameters, one tensor at a time."""
    return torch.optim.AdamW(model.optimizer_groups(ADAMW.weight_decay), lr=ADAMW.learning_rate,
                             betas=(ADAMW.beta1, ADAMW.beta2), fused=True)


def test_flat_adamw_and_clipping_train_as_torchs_per_parameter_ones(tiny_config):
    """Same steps, bit for bit without clipping and to rounding with it; gradients stay views of the buffer."""
    torch.manual_seed(0)
    ref = CharGPT(tiny_config)
    ours = copy.deepcopy(ref)
    ref_opt, opt = reference_adamw(ref), make_optimizer(ours, ADAMW, CPU)
    for step in range(4):
        x, clip = batch(tiny_config, step), 1e9 if step < 2 else 0.05  # then a clip that bites
        loss_of(ref, x).backward()
        loss_of(ours, x).backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
        opt.clip_grad_norm_(clip)
        ref_opt.step()
        opt.parts["optim"].step()
        ref_opt.zero_grad()
        opt.zero_grad()
        pairs = list(zip(ref.parameters(), ours.parameters()))
        if step < 2:
            assert all(torch.equal(a, b) for a, b in pairs), step
        else:
            assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in pairs), step
    start, end = opt.flat.grad.data_ptr(), opt.flat.grad.data_ptr() + opt.flat.grad.numel() * 4
    assert all(start <= p.grad.data_ptr() < end for p in ours.parameters())  # autograd added into the views
    assert ours.lm_head.weight is ours.wte.weight  # the tied head still is the embedding


def test_a_foreign_zero_grad_cannot_detach_the_gradients_from_the_buffer(tiny_config):
    model = CharGPT(tiny_config)
    opt = make_optimizer(model, ADAMW, CPU)
    model.zero_grad(set_to_none=True)  # as any torch code may do
    opt.zero_grad()
    loss_of(model, batch(tiny_config)).backward()
    assert opt.flat.grad.abs().sum() > 0 and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_state_keeps_the_per_parameter_format_both_ways(tmp_path, tiny_config, optimizer):
    """A state saved by torch's per-parameter AdamW (runs from before flat buffers) resumes in the flat one, and
    the flat one saves the same tensors under the same names."""
    torch.manual_seed(0)
    ref = CharGPT(tiny_config)
    ours = copy.deepcopy(ref)
    ref_opt, opt = reference_adamw(ref), make_optimizer(ours, ADAMW, CPU)
    for step in range(2):
        for model, o in ((ref, ref_opt), (ours, opt.parts["optim"])):
            loss_of(model, batch(tiny_config, step)).backward()
            o.step()
            o.zero_grad()
    want, got = ref_opt.state_dict(), opt.parts["optim"].state_dict()
    assert [g["params"] for g in want["param_groups"]] == [g["params"] for g in got["param_groups"]]
    assert want["state"].keys() == got["state"].keys()
    assert all(torch.equal(want["state"][i][k], got["state"][i][k]) for i in want["state"] for k in want["state"][i])

    vocab = Vocab("\nabcdefghij")
    path = tmp_path / "state.safetensors"
    ckpt.save_state(path, ref, ref_opt, {"torch": torch.get_rng_state()}, vocab, None)  # the old format
    cfg = TrainConfig(optimizer=optimizer) if optimizer == "muon" else ADAMW
    fresh = CharGPT(tiny_config)
    fresh_opt = make_optimizer(fresh, cfg, CPU)
    if optimizer == "muon":  # the matrices are Muon's here: AdamW state for them does not fit
        with pytest.raises(ckpt.CheckpointError):
            ckpt.load_state(path, fresh, fresh_opt)
        return
    ckpt.load_state(path, fresh, fresh_opt)
    x = batch(tiny_config, 9)
    for model, o in ((ref, ref_opt), (fresh, fresh_opt.parts["optim"])):
        loss_of(model, x).backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(ref.parameters(), fresh.parameters()))


def test_low_precision_copies_train_exactly_as_autocast(tiny_config):
    """A bf16 step with the weights' bf16 copies in their place (no casts per step) is autocast's step to the bit,
    the tied head included; over two micro-batches too, except that the tied weight's sum of three gradients
    (two micro-batches, embedding and head) is added in another order (an ulp); the copies follow every change of
    the weights when refreshed."""
    from chargpt.runtime import autocast
    from chargpt.training.flat import LowPrecisionCopies
    torch.manual_seed(0)
    ref = CharGPT(tiny_config)
    ours = copy.deepcopy(ref)
    ref_opt, opt = make_optimizer(ref, ADAMW, CPU), make_optimizer(ours, ADAMW, CPU)
    copies = LowPrecisionCopies(ours, opt.flat, torch.bfloat16)
    for step in range(4):
        copies.refresh()  # once per optimizer step
        for micro in range(1 if step < 3 else 2):  # then two micro-batches: the gradients sum in float32
            x = batch(tiny_config, 10 * step + micro)
            with autocast(CPU, torch.bfloat16):
                ref_loss = loss_of(ref, x)
                our_loss = copies.forward(ours, dict(idx=x[:, :-1], targets=x[:, 1:]))[1]
            ref_loss.backward()
            our_loss.backward()
            copies.grads_to_flat()
            assert torch.equal(ref_loss, our_loss)
        pairs = list(zip(ref.parameters(), ours.parameters()))
        if step < 3:
            assert all(torch.equal(a.grad, b.grad) for a, b in pairs), step
        else:
            assert all(torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-9) for a, b in pairs)
            assert all(torch.equal(a.grad, b.grad) for a, b in pairs[1:])  # all but the tied embedding
        for o in (ref_opt, opt):
            o.clip_grad_norm_(1.0)
            o.parts["optim"].step()
            o.zero_grad()
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(ref.parameters(), ours.parameters()))
    with torch.no_grad():
        ours.h[0].mlp.c_fc.weight.add_(1.0)  # a change outside the optimizer (as loading a checkpoint does)
    copies.refresh()
    assert torch.equal(copies.params["h.0.mlp.c_fc.weight"], ours.h[0].mlp.c_fc.weight.to(torch.bfloat16))


def aten_calls(fn):
    with torch.profiler.profile() as prof:
        fn()
    return sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_clipping_and_the_adamw_step_cost_the_same_calls_however_many_tensors(tiny_config, optimizer):
    """Per step, clipping, AdamW and zeroing are a fixed handful of operator calls, not a few per parameter
    tensor: a model of three times the layers (three times the tensors) costs no more of them."""
    counts = []
    for n_layer in (1, 3):
        cfg = dataclasses.replace(tiny_config, n_layer=n_layer)
        model = CharGPT(cfg)
        opt = make_optimizer(model, TrainConfig(optimizer=optimizer), CPU)
        loss_of(model, batch(cfg)).backward()

        def step(opt=opt):
            opt.clip_grad_norm_(1.0)
            opt.parts["optim"].step()
            opt.zero_grad()
        step()  # AdamW's state is created on the first step
        loss_of(model, batch(cfg, 1)).backward()
        counts.append(aten_calls(step))
    assert counts[0] == counts[1] and counts[0] < 40, counts


def test_a_bf16_training_with_the_copies_saves_the_weights_autocast_alone_would(tmp_path, corpus, monkeypatch):
    """Through the trainer: a bf16 run on a CPU (which uses the copies) and the same run with autocast's casts
    end with the same weights, bit for bit."""
    from safetensors.torch import load_file

    import chargpt
    from chargpt.training import optim, start
    kw = dict(data="corpus.txt", max_iters=4, eval_interval=4, device="cpu", n_layer=1, n_head=2, n_embd=16,
              block_size=16, batch_size=4, eval_iters=1, dropout=0.0, threads=1, sample_chars=0, dtype="bfloat16",
              warmup_iters=0, log=lambda *a: None)
    used = []
    real = optim.low_precision_copies
    monkeypatch.setattr(start, "low_precision_copies", lambda *a: used.append(real(*a)) or used[-1])
    chargpt.train(out_dir="with", **kw)
    monkeypatch.setattr(start, "low_precision_copies", lambda *a: None)
    chargpt.train(out_dir="without", **kw)
    assert used and used[0] is not None  # the first run did use them
    a, b = (load_file(tmp_path / run / "latest.safetensors") for run in ("with", "without"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
