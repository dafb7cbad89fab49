"""Inference precision: int8 weights (sample.py --quantize int8, load(quantize='int8')) and bf16 decoding, against
the float32 model: the same greedy text where the model is sure, a small cost in loss, clear errors."""

import pytest
import torch
from helpers import run_cli

import chargpt
from chargpt import runtime
from chargpt.errors import ConfigError
from chargpt.model.quantize import Int8Linear, uses_dynamic_int8
from chargpt.runtime import pick_decode_dtype
from chargpt.tools.evaluate import evaluate

PROMPT = "To be, or not"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny model trained until it is sure of this corpus's continuations (a few seconds)."""
    root = tmp_path_factory.mktemp("quantize")
    corpus = root / "corpus.txt"
    corpus.write_text("".join(f"To be, or not to be: that is the question {i % 10}.\nROMEO: O, she doth teach the "
                              f"torches.\n" for i in range(80)), encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / "run"), cache_dir=str(root / "cache"), max_iters=300,
                  eval_interval=300, device="cpu", n_layer=1, n_head=2, n_embd=32, block_size=48, batch_size=8,
                  eval_iters=2, dropout=0.0, threads=1, sample_chars=0, dtype="float32", learning_rate=1e-2,
                  warmup_iters=10, log=lambda *a: None)
    return root / "run"



def is_int8(model):
    """Whether the model decodes with int8 weights of either kind (torch's dynamic modules or chargpt's own)."""
    return uses_dynamic_int8(model) or any(isinstance(m, Int8Linear) for m in model.modules())

def greedy_margins(gen, prompt, n):
    """The float32 model's greedy continuation and, at each step, its top-1 minus top-2 logit."""
    ids = torch.tensor([gen.vocab.encode(prompt)])
    margins = []
    with torch.no_grad():
        for _ in range(n):
            logits = gen.model(ids)[0][0, -1]
            top = logits.topk(2).values
            margins.append(float(top[0] - top[1]))
            ids = torch.cat([ids, logits.argmax()[None, None]], dim=1)
    return gen.vocab.decode(ids[0, len(prompt):].tolist()), margins


@pytest.mark.parametrize("native_bf16", [True, False], ids=["weight-only", "dynamic"])
def test_int8_and_bf16_write_the_float32_text_where_the_model_is_sure(trained, monkeypatch, native_bf16):
    """Both kinds of int8 (weight-only with bf16 activations where the CPU has native bf16, torch's dynamic
    quantisation elsewhere), whichever CPU runs the test."""
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native_bf16)
    exact = chargpt.load(trained, device="cpu", dtype="float32")
    text, margins = greedy_margins(exact, PROMPT, 24)
    assert min(margins) > 1.0, margins  # the premise: no near-ties that rounding could flip
    assert exact.generate(PROMPT, max_new_tokens=24, temperature=0) == [text]
    int8 = chargpt.load(trained, device="cpu", quantize="int8")
    bf16 = chargpt.load(trained, device="cpu", dtype="bfloat16")
    assert int8.generate(PROMPT, max_new_tokens=24, temperature=0) == [text]
    assert bf16.generate(PROMPT, max_new_tokens=24, temperature=0) == [text]
    # what each one runs: int8 Linear layers; bf16 weights (on a CPU the weights themselves are converted)
    fc = int8.model.h[0].mlp.c_fc
    assert int8.precision.startswith("int8")
    assert isinstance(fc, Int8Linear) and fc.weight.dtype == torch.int8 if native_bf16 else \
        fc.weight().dtype == torch.qint8
    assert next(bf16.model.parameters()).dtype == torch.bfloat16 and bf16.dtype == torch.bfloat16
    assert next(exact.model.parameters()).dtype == torch.float32
    # sampling (not only greedy) runs on the int8 model and is reproducible by seed
    assert int8.generate("RO", max_new_tokens=30, seed=3) == int8.generate("RO", max_new_tokens=30, seed=3)


def test_int8_costs_little_loss_and_evaluate_reports_it(trained):
    full = evaluate(trained, device="cpu", progress=False)
    int8 = evaluate(trained, device="cpu", progress=False, quantize="int8")
    bf16 = evaluate(trained, device="cpu", progress=False, dtype="bfloat16")
    assert (full["precision"], int8["precision"], bf16["precision"]) == ("float32", "int8", "bfloat16")
    assert int8["loss"] != full["loss"] and abs(int8["loss"] - full["loss"]) < 0.05
    assert abs(bf16["loss"] - full["loss"]) < 0.05


def test_sample_cli_quantize_int8(trained):
    r = run_cli("sample.py", "--checkpoint", trained, "--prompt", PROMPT, "--max-new-tokens", "10",
                "--temperature", "0", "--device", "cpu", "--quantize", "int8")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(PROMPT) and "int8 weights" in r.stderr and "Warning" not in r.stderr
    bad = run_cli("sample.py", "--checkpoint", trained, "--device", "cpu", "--quantize", "int8", "--dtype",
                  "bfloat16")
    assert bad.returncode == 1 and bad.stderr.strip() == ("error: --quantize int8 computes in float32 around its "
                                                          "int8 weights; drop --dtype bfloat16")


def test_bad_precision_choices_are_refused_before_loading(tmp_path):
    with pytest.raises(ConfigError, match=r"--quantize must be none, int8 or auto \(got 'int4'\)"):
        chargpt.load(tmp_path / "missing", device="cpu", quantize="int4")  # refused before the missing file
    with pytest.raises(ConfigError, match=r"must be auto, float32 or bfloat16 \(got 'float16'\)"):
        chargpt.load(tmp_path / "missing", device="cpu", dtype="float16")


@pytest.mark.parametrize("native", [True, False])
def test_decoding_on_cpu_is_float32_unless_bf16_is_asked_for(monkeypatch, native):
    """bf16 decoding measured slower than float32 on a CPU with native bf16 (benchmarks/RESULTS.md): auto keeps
    float32, which also gives exactly the uncached reference's characters; bf16 by name is honoured."""
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    assert pick_decode_dtype("auto", torch.device("cpu"))[0] == torch.float32
    assert pick_decode_dtype("float32", torch.device("cpu"))[0] == torch.float32
    if native:
        assert pick_decode_dtype("bfloat16", torch.device("cpu"))[0] == torch.bfloat16


# --- --quantize auto: int8 where it measures faster here and costs little -----------------------------------------
def test_quantize_auto_rule_takes_int8_only_when_faster_and_nearly_free():
    from chargpt.model.quantize import AUTO_MAX_NATS, AUTO_MIN_SPEEDUP, prefer_int8
    assert prefer_int8(2.8, 0.001)[0]  # 2.8x faster at a thousandth of a nat: int8
    assert not prefer_int8(1.05, 0.001)[0]  # within noise of float32
    assert not prefer_int8(3.0, 5 * AUTO_MAX_NATS)[0]  # fast, but the text would change
    take, reason = prefer_int8(AUTO_MIN_SPEEDUP - 0.01, 0.0)
    assert not take and reason.startswith("float32 (--quantize auto: int8 decodes at") and "not" in reason


def test_quantize_auto_measures_and_says_what_it_chose(trained):
    """Whatever this CPU measures, the model loaded is the one the line names, and the text is the model's."""
    gen = chargpt.load(trained, device="cpu", quantize="auto")
    int8 = is_int8(gen.model)
    assert gen.precision.startswith("int8 weights (" if int8 else "float32 (--quantize auto:")
    assert "nats per character" in gen.precision
    assert len(gen.generate(PROMPT, max_new_tokens=20, temperature=0.0)[0]) == 20


def test_quantize_auto_is_for_decoding_not_for_scoring(trained):
    with pytest.raises(ConfigError, match="none or int8"):
        evaluate(trained, quantize="auto", progress=False)
