"""CUDA-only checks (skipped without a GPU; scripts/gpu_check.sh runs them): a compiled training step, TF32 readable
after it, checkpoints written on the GPU loading anywhere, bf16 decoding with its weights converted once, and cached
decoding giving the uncached reference's characters in fp32. Their CPU counterparts: tests/test_gpu_paths.py."""

import pytest
import torch
from helpers import WeightCasts
from safetensors.torch import load_file

import chargpt
from chargpt.config import SampleSettings
from chargpt.model.quantize import inference_model
from chargpt.model.transformer import CharGPT
from chargpt.runs import rundir
from chargpt.sampling.decode import decode

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

TINY_KW = dict(device="cuda", n_layer=2, n_head=2, n_embd=32, block_size=32, batch_size=8, eval_iters=2, dropout=0.0,
               sample_chars=0, warmup_iters=0, learning_rate=1e-2)


def quiet_train(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_KW, **kw})


def test_compiled_training_step_learns_and_times_its_compilation(tmp_path, corpus):
    logs = []
    summary = chargpt.train(log=logs.append, data="corpus.txt", out_dir="run", max_iters=40, eval_interval=20,
                            compile="auto", **TINY_KW)
    assert summary["compiled"] and summary["first_step_s"] > 0
    assert any(line.endswith("torch.compile (--compile auto: it wins on CUDA)") for line in logs), logs
    assert any(line.startswith("torch.compile: the first step took") for line in logs), logs
    rows = chargpt.runs.rundir.read_step_rows(tmp_path / "run" / chargpt.runs.rundir.METRICS)
    assert rows[-1]["val_loss"] < rows[0]["val_loss"] - 0.5
    # TF32 was switched on so that torch's older API still reads (the newer one would make it raise from now on)
    assert torch.backends.cuda.matmul.allow_tf32 is True and torch.get_float32_matmul_precision() == "high"


def test_checkpoints_written_on_the_gpu_resume_there_and_load_anywhere(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=6, eval_interval=3, compile="off", optimizer="muon")
    resumed = quiet_train(out_dir="run", resume=True, max_iters=9, compile="off")
    assert resumed["step"] == 9
    state = load_file("run/" + rundir.STATE)
    assert all(t.device.type == "cpu" for t in state.values()) and "rng.cuda" in state
    on_gpu, on_cpu = chargpt.load("run", device="cuda"), chargpt.load("run", device="cpu", dtype="float32")
    fp32_on_gpu = chargpt.load("run", device="cuda", dtype="float32")
    assert next(on_gpu.model.parameters()).is_cuda and on_gpu.dtype == torch.bfloat16  # native on Ampere and newer
    for a, b, c in zip(on_gpu.model.state_dict().values(), on_cpu.model.state_dict().values(),
                       fp32_on_gpu.model.state_dict().values()):
        assert torch.equal(c.cpu(), b) and torch.equal(a.cpu(), b.to(a.dtype))  # bf16: the weights converted once
    assert len(on_gpu.generate("To be", max_new_tokens=20, seed=1)[0]) == 20
    assert len(on_cpu.generate("To be", max_new_tokens=20, seed=1)[0]) == 20


def test_bf16_decoding_casts_no_weight_per_character(tiny_config):
    torch.manual_seed(0)
    model, dtype, _ = inference_model(CharGPT(tiny_config).cuda().eval(), torch.device("cuda"), "bfloat16")
    steps = decode(model, torch.tensor([[1, 2, 3]], device="cuda"), SampleSettings(max_new_tokens=8, temperature=0),
                   torch.Generator(), dtype=dtype)
    next(steps)
    with WeightCasts() as casts:
        for _ in range(5):
            next(steps)
    assert casts.count == 0


def test_cached_decoding_gives_the_uncached_characters_in_fp32(tiny_config):
    matmul = torch.backends.cuda.matmul
    before = matmul.allow_tf32
    matmul.allow_tf32 = False  # training in this process switched fp32 matmuls to TF32 (with this API, as chargpt)
    try:
        torch.manual_seed(0)
        model = CharGPT(tiny_config).cuda().eval()
        ctx = torch.tensor([[1, 2, 3]], device="cuda")
        settings = SampleSettings(max_new_tokens=tiny_config.block_size - 3, temperature=0)
        runs = [torch.stack(list(decode(model, ctx, settings, torch.Generator(), use_cache=c))) for c in (True, False)]
        assert torch.equal(runs[0], runs[1])  # within the window: the same characters
    finally:
        matmul.allow_tf32 = before
