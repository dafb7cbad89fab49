"""A loaded model made ready for inference (sampling, scoring): its precision, and int8 weights on a CPU.

    chargpt.load("checkpoints/shakespeare", quantize="int8")       # python sample.py --quantize int8
    evaluate("checkpoints/shakespeare", "play.txt", quantize="int8")   # what int8 costs in loss

Cached decoding at batch 1 reads every weight once per character, so on a CPU it is bound by memory traffic, not
arithmetic. Halving the bytes per weight (bf16, where the CPU computes it natively) or quartering them (int8) is
what makes it faster; on a CPU, autocast alone would not help, since it re-reads the fp32 weights to cast them
on every call. So on a CPU, bf16 inference converts the weights themselves. On a GPU the model keeps fp32 weights
and runs under bf16 autocast, as in training.

int8 is torch's own dynamic quantisation (torch.ao.quantization.quantize_dynamic): every nn.Linear of the blocks
and the head gets int8 weights, one scale per output channel, and its input is quantised on the fly at each call
(fbgemm/oneDNN int8 kernels); embeddings, LayerNorms and attention stay float32. It runs on CPUs only.
torch marks this API deprecated in favour of torchao, but it is present and working in torch 2.13.
"""

import warnings

import torch

from .errors import ConfigError
from .runtime import pick_decode_dtype

QUANTIZE = ("none", "int8")


def quantize_int8(model):
    """A copy of `model` (on the CPU, in eval mode) whose nn.Linear layers have int8 weights."""
    try:
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
    except ImportError:
        raise ConfigError(f"--quantize int8 needs torch.ao.quantization, which torch {torch.__version__} no longer "
                          f"has; drop --quantize") from None
    with warnings.catch_warnings():  # torch's notices about the API's future, not about this model
        warnings.simplefilter("ignore")
        return quantize_dynamic(model.eval(), {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=False)


def check_precision(device, dtype="auto", quantize=None):
    """Refuse a bad dtype/quantize pair before anything is loaded; -> (compute dtype, what it is, in words)."""
    quantize = quantize or "none"
    if quantize not in QUANTIZE:
        raise ConfigError(f"--quantize must be none or int8 (got {quantize!r})")
    if quantize == "none":
        return pick_decode_dtype(dtype, device)
    if device.type != "cpu":
        raise ConfigError(f"--quantize int8 is for CPUs (torch's int8 kernels run there); on {device.type} drop "
                          f"--quantize: bf16 is used where the GPU has it")
    if dtype not in ("auto", "float32"):
        raise ConfigError(f"--quantize int8 computes in float32 around its int8 weights; drop --dtype {dtype}")
    return torch.float32, "int8 weights (dynamic quantisation), float32 activations"


def inference_model(model, device, dtype="auto", quantize=None):
    """A model loaded on `device` -> (model to run, compute dtype, one line saying what was chosen). dtype:
    auto (runtime.pick_decode_dtype), float32 or bfloat16; quantize: None/'none' or 'int8' (CPU only, float32)."""
    torch_dtype, reason = check_precision(device, dtype, quantize)
    if quantize == "int8":
        return quantize_int8(model), torch_dtype, reason
    if device.type == "cpu" and torch_dtype == torch.bfloat16:
        model = model.to(torch.bfloat16)  # the weights themselves: see the module docstring
    return model, torch_dtype, reason
