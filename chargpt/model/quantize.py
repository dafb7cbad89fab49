"""A loaded model made ready for inference (sampling, scoring): its precision, and int8 weights on a CPU.

    chargpt.load("checkpoints/shakespeare", quantize="int8")       # python sample.py --quantize int8
    evaluate("checkpoints/shakespeare", "play.txt", quantize="int8")   # what int8 costs in loss

Cached decoding at batch 1 reads every weight once per character, so it is bound by memory traffic and launches,
not arithmetic. Halving the bytes per weight (bf16, where the device computes it natively) or quartering them (int8)
is what makes it faster; autocast alone would not help: it casts every fp32 weight again at every step (its cast
cache is cleared each time decoding leaves its context, once per character), reading and writing more bytes than
fp32 decoding reads. So bf16 inference converts the weights themselves, once, on a CPU and a GPU alike.

int8: every nn.Linear of the blocks and the head gets int8 weights, one scale per output channel; embeddings,
LayerNorms and attention stay float32. It runs on CPUs only, in one of two ways, by the CPU:
- with native bf16 (AVX512-BF16, AMX): weight-only int8 (Int8Linear), the activations in bf16 through
  torch._weight_int8pack_mm, which dequantises inside the matmul. Its decode step also compiles (sampling's
  --compile); at 6 x 384 on a 2-core Xeon with AMX it measured 1.7 ms a step eager, 1.0 ms compiled, against
  float32's 2.2 ms and dynamic quantisation's 1.8 ms (benchmarks/RESULTS.md, compiled sampling);
- without: torch's dynamic quantisation (torch.ao.quantization.quantize_dynamic), the input quantised to int8 on
  the fly at each call (fbgemm/oneDNN int8 kernels). torch marks this API deprecated in favour of torchao, but it
  is present and working in torch 2.13. Its modules do not compile.
"""

import time
import warnings

import torch

from chargpt.errors import ConfigError
from chargpt.runtime import pick_decode_dtype

QUANTIZE = ("none", "int8", "auto")
# --quantize auto takes int8 where it measures at least this much faster here, at most this loss cost
AUTO_MIN_SPEEDUP = 1.15
AUTO_MAX_NATS = 0.01
AUTO_TEXT = 128  # characters the float32 model writes (timed) for the comparison
AUTO_STEPS = 32  # int8 steps timed
# Int8Linear: from this many rows (a prefill), dequantise and use a bf16 matmul. Measured on a 2-core Xeon with AMX,
# 384 -> 1152: torch._weight_int8pack_mm 18 us at 1 row (float32 16 us), 175 us at 32 rows, 1,038 us at 192;
# dequantised, 80, 95 and 180 us.
DEQUANTIZE_FROM_ROWS = 16


class Int8Linear(torch.nn.Module):
    """nn.Linear with int8 weights, one bf16 scale per output row (symmetric, -127 .. 127), computing in bf16:
    x (..., in) of any float dtype -> (..., out) in x's dtype, through torch._weight_int8pack_mm."""

    def __init__(self, linear):
        super().__init__()
        w = linear.weight.detach().float()  # (out, in)
        scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12).to(torch.bfloat16)  # (out,): the kernel's dtype
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("weight", torch.round(w / scale.float()[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))

    def forward(self, x):
        x2 = x.reshape(-1, self.in_features).to(torch.bfloat16)  # (rows, in)
        if x2.size(0) < DEQUANTIZE_FROM_ROWS:  # decoding: the fused kernel reads a quarter of float32's bytes
            y = torch._weight_int8pack_mm(x2, self.weight, self.scale)
        else:  # a prefill: one bf16 copy of the weights and a bf16 matmul beat the kernel's row-by-row loop
            y = torch.nn.functional.linear(x2, self.weight.to(torch.bfloat16)) * self.scale
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features).to(x.dtype)


def weight_only_int8(model):
    """A copy of `model` whose nn.Linear layers are Int8Linear (a tied head gets its own int8 copy of the
    embedding, which itself stays float32)."""
    import copy
    model = copy.deepcopy(model).eval()
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8Linear(child))
    return model


def uses_dynamic_int8(model):
    """Whether `model` has torch's dynamic int8 modules (which torch.compile does not take)."""
    return any("quantized" in type(m).__module__ for m in model.modules())


def int8_kind():
    """The int8 this CPU gets, in words (see the module docstring)."""
    from chargpt.runtime import cpu_has_native_bf16
    if cpu_has_native_bf16():
        return "int8 weights (weight-only, bf16 activations: native bf16 here)"
    return "int8 weights (dynamic quantisation), float32 activations"


def quantize_int8(model):
    """A copy of `model` (on the CPU, in eval mode) whose nn.Linear layers have int8 weights: weight-only with bf16
    activations on a CPU with native bf16, else torch's dynamic quantisation (the module docstring)."""
    from chargpt.runtime import cpu_has_native_bf16
    if cpu_has_native_bf16():
        return weight_only_int8(model)
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:
        raise ConfigError(f"--quantize int8 needs torch.ao.quantization, which torch {torch.__version__} no longer "
                          f"has; drop --quantize") from None
    with warnings.catch_warnings():  # torch's notices about the API's future, not about this model
        warnings.simplefilter("ignore")
        return quantize_dynamic(model.eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=False)


def check_precision(device, dtype="auto", quantize=None, auto=True):
    """Refuse a bad dtype/quantize pair before anything is loaded; -> (compute dtype, what it is, in words).
    auto: whether --quantize auto is allowed (for decoding, not for scoring)."""
    quantize = quantize or "none"
    if quantize not in QUANTIZE or quantize == "auto" and not auto:
        allowed = "none, int8 or auto" if auto else "none or int8"
        raise ConfigError(f"--quantize must be {allowed} (got {quantize!r})")
    if quantize == "auto" and (device.type != "cpu" or dtype not in ("auto", "float32")):
        return pick_decode_dtype(dtype, device)  # int8 is out of the question: as none
    if quantize == "auto":
        return torch.float32, "float32 or int8 weights, by measurement (--quantize auto)"
    if quantize == "none":
        return pick_decode_dtype(dtype, device)
    if device.type != "cpu":
        raise ConfigError(f"--quantize int8 is for CPUs (torch's int8 kernels run there); on {device.type} drop "
                          f"--quantize: bf16 is used where the GPU has it")
    if dtype not in ("auto", "float32"):
        raise ConfigError(f"--quantize int8 computes in float32 around its int8 weights; drop --dtype {dtype}")
    return torch.float32, int8_kind()


def inference_model(model, device, dtype="auto", quantize=None):
    """A model loaded on `device` -> (model to run, compute dtype, one line saying what was chosen). dtype:
    auto (runtime.pick_decode_dtype), float32 or bfloat16; quantize: None/'none' or 'int8' (CPU only, float32)."""
    torch_dtype, reason = check_precision(device, dtype, quantize)
    if quantize == "auto" and torch_dtype == torch.float32 and device.type == "cpu":
        return auto_quantize(model.eval())
    if quantize == "int8":
        return quantize_int8(model), torch_dtype, reason
    if torch_dtype == torch.bfloat16:
        model = model.to(torch.bfloat16)  # the weights themselves, once: see the module docstring
    return model, torch_dtype, reason


@torch.no_grad()
def auto_quantize(model):
    """--quantize auto on a CPU: int8 weights if, measured here and now, they decode at least AUTO_MIN_SPEEDUP x
    faster than float32 and cost at most AUTO_MAX_NATS per character; -> (model, torch.float32, the choice and its
    reason in words). The float32 model writes AUTO_TEXT characters (timed, at batch 1, as sample.py decodes
    without --compile), int8 decodes AUTO_STEPS (timed); the cost is the mean KL divergence of int8's next-character
    distribution from float32's over the written text, which is int8's expected extra loss on text like the
    model's own. About a second for a 10M-parameter model."""
    from chargpt.model.transformer import KVCache
    if model.config.arch != "decoder":  # the encoder-decoder decodes through decode(), not this loop
        return model, torch.float32, "float32 (--quantize auto measures decoder-only models; --quantize int8 to choose)"
    int8 = quantize_int8(model)
    cfg = model.config
    n = min(AUTO_TEXT, cfg.block_size - 1)
    gen = torch.Generator().manual_seed(0)

    def timed_steps(m, ids, count):
        """-> (seconds per step after the first, ids written): count steps continuing ids (1, t) through the
        model's forward and its growing cache, as eager sampling decodes."""
        cache = KVCache(cfg, 1)
        logits = m(ids, cache=cache)[0][:, -1]
        out, t0 = [ids], None
        for i in range(count):
            nxt = torch.multinomial(torch.softmax(logits.float(), -1), 1, generator=gen)  # (1, 1)
            out.append(nxt)
            if i == 1:
                t0 = time.perf_counter()  # the first step warms up: steps 1 .. count - 1 are timed
            logits = m(nxt, cache=cache)[0][:, -1]
        return (time.perf_counter() - t0) / max(1, count - 1), torch.cat(out, dim=1)

    fp32_s, text = timed_steps(model, torch.zeros(1, 1, dtype=torch.long), n)
    int8_s, _ = timed_steps(int8, text[:, :1], min(AUTO_STEPS, n))
    logp = torch.log_softmax(model(text)[0].float(), -1)  # (1, T, V)
    logq = torch.log_softmax(int8(text)[0].float(), -1)
    nats = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    take, reason = prefer_int8(fp32_s / int8_s, nats)
    return (int8 if take else model), torch.float32, reason


def prefer_int8(speedup, nats):
    """--quantize auto's rule, from what was measured: int8's decoding speed over float32's and its cost in nats
    per character -> (take int8?, the choice and its reason in words)."""
    cost = f"{nats:.4f}" if nats >= 1e-4 else "under 0.0001"
    measured = f"int8 decodes at {speedup:.2f}x float32's speed here, {cost} nats per character from it"
    if speedup >= AUTO_MIN_SPEEDUP and nats <= AUTO_MAX_NATS:
        return True, f"{int8_kind()} (--quantize auto: {measured})"
    why = f"not {AUTO_MIN_SPEEDUP:.2f}x faster" if speedup < AUTO_MIN_SPEEDUP else f"more than {AUTO_MAX_NATS} nats"
    return False, f"float32 (--quantize auto: {measured}; {why})"
