"""Muon for the block matrices, AdamW for the rest: the split, learning, torch.optim.Muon as the reference,
the state in state.safetensors and exact resume; the warmup-stable-decay schedule; --compile auto|on|off;
--save-state end."""

import math
import os

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_FLAGS, run_cli
from safetensors.torch import load_file

import chargpt
from chargpt import runtime
from chargpt.cli import train_cli
from chargpt.config import ModelConfig, TrainConfig
from chargpt.data.tokenizer import Vocab
from chargpt.errors import CheckpointError, ConfigError
from chargpt.model.transformer import CharGPT, EncoderDecoder
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir
from chargpt.runtime import pick_compile, pick_dtype
from chargpt.training import optim
from chargpt.training import trainer as training
from chargpt.training.optim import (
    Muon,
    describe_numerics,
    make_optimizer,
    orthogonalize,
    orthogonalize_all,
    split_params,
)

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", warmup_iters=0, verbose=True)
CPU = torch.device("cpu")


def quiet_train(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_KW, **kw})


# --- the parameter split --------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_every_parameter_is_in_exactly_one_optimizer_and_block_matrices_are_muons(tiny_config, arch):
    cfg = ModelConfig(**{**vars(tiny_config), "arch": arch})
    model = CharGPT(cfg) if arch == "decoder" else EncoderDecoder(cfg)
    matrices, rest = split_params(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}  # the tied head is the embedding: listed once
    muon = [names[id(p)] for p in matrices]
    adamw = [names[id(p)] for g in rest for p in g["params"]]
    assert sorted(muon + adamw) == sorted(names.values())  # each exactly once
    assert all(p.dim() == 2 for p in matrices)
    want = {n for n, p in model.named_parameters() if p.dim() == 2 and ".ln" not in n and n.split(".")[0] in
            ("h", "enc")}
    assert set(muon) == want and "h.0.attn.c_attn.weight" in muon and "h.0.mlp.c_proj.weight" in muon
    assert {"wte.weight", "h.0.attn.c_attn.bias", "h.0.ln_1.weight", "ln_f.weight"} <= set(adamw)
    assert rest[0]["weight_decay"] == 0.1 and rest[1]["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in rest[0]["params"]) and all(p.dim() < 2 for p in rest[1]["params"])


def test_make_optimizer_gives_muon_its_own_rate_through_lr_scale(tiny_config):
    model = CharGPT(tiny_config)
    cfg = TrainConfig(optimizer="muon", learning_rate=4e-3, muon_lr=0.02, muon_momentum=0.9)
    opt = make_optimizer(model, cfg, CPU)
    assert set(opt.parts) == {"optim", "muon"}
    (group,) = opt.parts["muon"].param_groups
    assert group["lr_scale"] == pytest.approx(5.0) and group["momentum"] == 0.9
    assert all(g["lr_scale"] == 1.0 for g in opt.parts["optim"].param_groups)
    assert set(make_optimizer(model, TrainConfig(), CPU).parts) == {"optim"}  # AdamW alone, as before


# --- the update --------------------------------------------------------------------------------------------------
def test_muon_matches_torch_muon_bit_for_bit_in_bf16_and_closely_in_fp32():
    torch.manual_seed(0)
    shapes = [(48, 16), (16, 40), (24, 24)]
    ref = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
    ours = {dt: [torch.nn.Parameter(p.detach().clone()) for p in ref] for dt in (torch.bfloat16, torch.float32)}
    opts = [torch.optim.Muon(ref, lr=0.02, weight_decay=0.1)]
    opts += [Muon(ps, lr=0.02, weight_decay=0.1, ns_dtype=dt) for dt, ps in ours.items()]
    for _ in range(3):
        grads = [torch.randn(s) for s in shapes]
        for ps in (ref, *ours.values()):
            for p, g in zip(ps, grads):
                p.grad = g.clone()
        for opt in opts:
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(ref, ours[torch.bfloat16]))
    assert all(torch.allclose(a, b, atol=0.02) for a, b in zip(ref, ours[torch.float32]))


def test_matrices_of_one_shape_are_orthogonalised_together_as_each_alone():
    """Muon batches the Newton-Schulz iteration over matrices of one shape (a model's layers repeat a few shapes);
    each result is the one its matrix gets alone, in both precisions, tall and wide, in the order given."""
    torch.manual_seed(0)
    updates = [torch.randn(s) for s in [(32, 8), (8, 24), (32, 8), (8, 24), (12, 12), (32, 8)]]
    coefficients = torch.optim.Muon([torch.nn.Parameter(torch.zeros(2, 2))]).defaults["ns_coefficients"]
    for dtype in (torch.float32, torch.bfloat16):
        together = orthogonalize_all(updates, coefficients, 5, 1e-7, dtype)
        alone = [orthogonalize(u, coefficients, 5, 1e-7, dtype) for u in updates]
        assert [t.shape for t in together] == [u.shape for u in updates]
        assert all(torch.allclose(t.float(), a.float(), atol=1e-2 if dtype == torch.bfloat16 else 1e-6)
                   for t, a in zip(together, alone))
        x = together[0].float()  # (32, 8): nearly orthonormal columns
        assert torch.allclose(x.T @ x, torch.eye(8), atol=0.35)


def test_a_few_muon_steps_reduce_the_loss_of_a_tiny_model(tiny_config):
    torch.manual_seed(0)
    model = CharGPT(tiny_config)
    opt = make_optimizer(model, TrainConfig(optimizer="muon", learning_rate=1e-2, muon_lr=0.05), CPU)
    before = model.h[0].mlp.c_fc.weight.detach().clone()
    x = torch.arange(4 * tiny_config.block_size).view(4, -1) % 7  # a pattern a model can learn quickly
    losses = []
    for _ in range(15):
        _, loss = model(x[:, :-1], x[:, 1:])
        loss.backward()
        for part in opt.parts.values():
            part.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses
    assert not torch.equal(before, model.h[0].mlp.c_fc.weight)  # Muon moved the matrices


# --- what Muon computes in: the run's dtype -------------------------------------------------------------------
@pytest.mark.parametrize("dtype,want", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                        (torch.float16, torch.float32)])
def test_muons_iteration_computes_in_the_runs_dtype(tiny_config, dtype, want):
    opt = make_optimizer(CharGPT(tiny_config), TrainConfig(optimizer="muon"), CPU, dtype)
    assert opt.parts["muon"].ns_dtype == want
    assert f"Muon's Newton-Schulz iteration in {str(want).removeprefix('torch.')}" in describe_numerics(dtype, "muon")


@pytest.mark.dtype
@pytest.mark.parametrize("dtype", ["float32", "auto"])
def test_a_training_computes_where_its_flags_say_and_its_start_says_so(tmp_path, corpus, monkeypatch, dtype):
    """--dtype float32 is float32 everywhere, Muon's iteration included, whichever kind of CPU this is; auto is the
    dtype runtime picked for this CPU (CHARGPT_CPU_BF16 flips it, .ci/run runs this test both ways)."""
    seen = set()

    def spy(updates, coefficients, steps, eps, ns_dtype):
        seen.add(ns_dtype)
        return orthogonalize_all(updates, coefficients, steps, eps, ns_dtype)
    monkeypatch.setattr(optim, "orthogonalize_all", spy)
    logs = []
    chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", max_iters=2, eval_interval=2,
                  **{**TINY_KW, "optimizer": "muon", "dtype": dtype})
    ran = torch.float32 if dtype == "float32" else pick_dtype("auto", CPU)[0]
    assert seen == {ran}
    assert describe_numerics(ran, "muon", copies=ran == torch.bfloat16) in logs  # a CPU's bf16 reads copies
    if dtype == "float32":
        assert "numerics: forward and backward in float32; weights, gradients and optimizer states in float32; " \
               "Muon's Newton-Schulz iteration in float32" in logs


# --- checkpoints and resume ---------------------------------------------------------------------------------------
def test_state_file_round_trips_both_optimizers(tmp_path, tiny_config):
    torch.manual_seed(0)
    model = CharGPT(tiny_config)
    cfg = TrainConfig(optimizer="muon")
    opt = make_optimizer(model, cfg, CPU)
    x = torch.randint(0, tiny_config.vocab_size, (2, 9))
    model(x[:, :-1], x[:, 1:])[1].backward()
    for part in opt.parts.values():
        part.step()
    vocab = Vocab("\nabcdefghij")
    ckpt.save_state(tmp_path / "state.safetensors", model, opt, {"torch": torch.get_rng_state()}, vocab, None)
    names = set(load_file(tmp_path / "state.safetensors"))
    assert any(n.startswith("muon.") and n.endswith(".momentum_buffer") for n in names)
    assert any(n.startswith("optim.") and n.endswith(".exp_avg") for n in names)

    fresh = CharGPT(tiny_config)
    fresh_opt = make_optimizer(fresh, cfg, CPU)
    ckpt.load_state(tmp_path / "state.safetensors", fresh, fresh_opt)
    for name, part in opt.parts.items():
        a, b = part.state_dict()["state"], fresh_opt.parts[name].state_dict()["state"]
        assert a.keys() == b.keys()
        assert all(torch.equal(torch.as_tensor(a[i][k]), torch.as_tensor(b[i][k])) for i in a for k in a[i])
    adamw_only = make_optimizer(CharGPT(tiny_config), TrainConfig(), CPU)  # a run's optimizer cannot change
    with pytest.raises(CheckpointError, match=r"holds muon optimizer state.*--optimizer"):
        ckpt.load_state(tmp_path / "state.safetensors", CharGPT(tiny_config), adamw_only)


def test_exact_resume_with_muon(tmp_path, corpus):
    """N steps, then resume for N more == 2N steps in one go, bit for bit, with both optimizers' state."""
    n = 5
    kw = dict(optimizer="muon", eval_interval=5, lr_decay_iters=2 * n, warmup_iters=2, lr_schedule="wsd")
    quiet_train(out_dir="whole", max_iters=2 * n, **kw)
    quiet_train(out_dir="split", max_iters=n, **kw)
    quiet_train(out_dir="split", resume=True, max_iters=2 * n, **kw)
    whole, split = load_file("whole/" + rundir.STATE), load_file("split/" + rundir.STATE)
    assert whole.keys() == split.keys() and any(k.startswith("muon.") for k in whole)
    for name in whole:
        assert torch.equal(whole[name], split[name]), name


def test_resume_refuses_another_optimizer(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=2, eval_interval=2, optimizer="adamw")
    with pytest.raises(ConfigError, match=r"trained with --optimizer adamw.*drop --optimizer muon"):
        quiet_train(out_dir="run", resume=True, max_iters=4, optimizer="muon")


# --- the warmup-stable-decay schedule (its rates: tests/test_schedules.py) ------------------------------------
def test_wsd_trains_and_logs_its_rates(tmp_path, corpus):
    summary = quiet_train(out_dir="run", max_iters=10, eval_interval=2, learning_rate=1e-2, min_lr=1e-3,
                          lr_schedule="wsd", decay_fraction=0.5)
    assert summary["step"] == 10
    lrs = [m["lr"] for m in chargpt.runs.rundir.read_step_rows(tmp_path / "run" / chargpt.runs.rundir.METRICS)]
    assert lrs[:3] == pytest.approx([1e-2] * 3) and lrs[3] < 1e-2 and lrs[-1] == pytest.approx(1e-3)


# --- --compile auto|on|off ------------------------------------------------------------------------------------
def test_compile_auto_uses_torch_compile_on_cuda_only_and_says_so(tmp_path, corpus, monkeypatch):
    assert pick_compile("auto", torch.device("cuda", 0))[0] is True
    assert pick_compile("auto", CPU)[0] is False
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: "/usr/bin/g++")  # whether this machine has one or not
    assert pick_compile("on", CPU) == (True, "torch.compile (requested)")
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: None)  # Windows without MSVC, say: one line at start
    with pytest.raises(ConfigError, match=r"--compile on: torch.compile turns CPU code into C\+\+ and no C\+\+ "
                                          r"compiler was found .* or train with --compile off"):
        pick_compile("on", CPU)
    logs = []
    chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", max_iters=2, eval_interval=2, **TINY_KW)
    device_line = next(line for line in logs if line.startswith("device: cpu"))
    assert device_line.endswith("; eager (--compile auto: on a CPU a compiled step wins in bfloat16 only)")


def test_compile_auto_on_a_cpu_compiles_long_bf16_runs_only(monkeypatch):
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: "/usr/bin/g++")
    bf16 = torch.bfloat16
    assert pick_compile("auto", CPU, bf16, 3600.0)[0] is True
    assert "a 3600 s budget repays compiling" in pick_compile("auto", CPU, bf16, 3600.0)[1]
    assert pick_compile("auto", CPU, bf16, runtime.CPU_COMPILE_MIN_S)[0] is True  # the threshold itself
    assert pick_compile("auto", CPU, bf16, 600.0) == (False, "eager (--compile auto: a 600 s budget would not repay "
                                                          "compiling, 30 s or more the first time; from --max-time "
                                                          "1800 it compiles)")
    assert pick_compile("auto", CPU, bf16, None)[0] is False  # steps, not time: nothing says it pays
    assert pick_compile("auto", CPU, torch.float32, 1e5) == (False, "eager (--compile auto: on a CPU a compiled "
                                                                 "step wins in bfloat16 only)")
    assert pick_compile("off", CPU, bf16, 1e5)[0] is False  # the user's word wins both ways
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: None)
    assert pick_compile("auto", CPU, bf16, 1e5) == (False, "eager (--compile auto: no C++ compiler for "
                                                         "torch.compile)")


def test_a_run_that_compiles_keeps_torch_s_compile_cache_under_chargpt_s(tmp_path, corpus, monkeypatch):
    """Runs share the compiled code (a later run of the same shapes loads it in seconds), in a folder a reboot keeps;
    a cache folder the user chose wins."""
    from chargpt.training import start
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # so that the teardown restores what was there before
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(start, "pick_compile", lambda *a: (True, "torch.compile (--compile auto: a test)"))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)  # compiling itself is not what is tested
    logs = []
    chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", max_iters=2, eval_interval=2, **TINY_KW)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "torchinductor")
    assert any("torch.compile (--compile auto: a test)" in line for line in logs)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    chargpt.train(log=logs.append, data="corpus.txt", out_dir="run2", max_iters=2, eval_interval=2, **TINY_KW)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "mine")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")  # sampling's compiled decode step shares the same folder
    from chargpt.config import ModelConfig
    from chargpt.model.transformer import CharGPT
    from chargpt.sampling.decode import StepRunner
    StepRunner(CharGPT(ModelConfig(vocab_size=8, n_layer=1, n_head=1, n_embd=8, block_size=8)), compiled=True)
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "torchinductor")


@pytest.mark.parametrize("args,want", [([], None), (["--compile"], "on"), (["--no-compile"], "off"),
                                       (["--compile", "auto"], "auto"), (["--compile", "off"], "off")])
def test_compile_flag_keeps_its_old_spellings(monkeypatch, args, want):
    seen = {}
    monkeypatch.setattr(training, "train", lambda log, **kw: seen.update(kw) or {"out_dir": "run"})
    result = CliRunner().invoke(train_cli, [*args, "--max-iters", "3"])
    assert result.exit_code == 0, result.output
    assert seen.get("compile") == want and seen["max_iters"] == 3


def test_compile_true_from_python_and_old_checkpoints_mean_on():
    assert TrainConfig(compile=True).compile == "on" and TrainConfig(compile=False).compile == "off"
    with pytest.raises(ConfigError, match=r"compile must be one of auto, on, off"):
        TrainConfig(compile="always").validate()


# --- --save-state end ----------------------------------------------------------------------------------------
def test_save_state_end_writes_state_once_and_best_when_improved(tmp_path, corpus, monkeypatch):
    calls = {"state": 0, "model": []}
    save_state, save_model = ckpt.save_state, ckpt.save_model

    def count_state(*a, **k):
        calls["state"] += 1
        return save_state(*a, **k)

    def count_model(path, *a, **k):
        calls["model"].append(path.name)
        return save_model(path, *a, **k)

    monkeypatch.setattr(ckpt, "save_state", count_state)
    monkeypatch.setattr(ckpt, "save_model", count_model)
    summary = quiet_train(out_dir="run", max_iters=8, eval_interval=2, learning_rate=1e-2, save_state="end")
    assert calls["state"] == 1 and calls["model"].count(rundir.LATEST) == 1  # at the end only
    assert calls["model"].count(rundir.BEST) >= 2  # whenever validation improved (it does early on)
    assert ckpt.read_meta(tmp_path / "run" / rundir.STATE)[0]["step"] == summary["step"] == 8
    resumed = quiet_train(out_dir="run", resume=True, max_iters=10)  # the end state resumes as usual
    assert resumed["step"] == 10


def test_cli_flags_for_the_new_settings(tmp_path, corpus):
    r = run_cli("train.py", "--data", "corpus.txt", "--out-dir", "run", *TINY_FLAGS, "--max-iters", "4",
                "--eval-interval", "2", "--optimizer", "muon", "--muon-lr", "0.01", "--lr-schedule", "wsd",
                "--save-state", "end")
    assert r.returncode == 0, r.stderr
    assert "optimizer: Muon (lr 0.01, momentum 0.95) for the block matrices, AdamW" in r.stderr
    meta = ckpt.read_meta(tmp_path / "run" / rundir.STATE)[0]["train_config"]
    assert (meta.optimizer, meta.muon_lr, meta.lr_schedule, meta.save_state) == ("muon", 0.01, "wsd", "end")
    bad = run_cli("train.py", "--data", "corpus.txt", *TINY_FLAGS, "--muon-momentum", "1.5")
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == \
        "error: --muon-momentum must be in [0, 1) (got 1.5)"
    assert math.isfinite(meta.muon_momentum)
