"""Model FLOPs utilisation (MFU): the FLOPs a training step's model does per second, against the device's peak, as
nanoGPT's estimate_mfu reports it (PaLM, appendix B).

FLOPs per token = 6N + 12·L·H·Q·T: 6 per weight (2 forward, 4 backward) for the N weights that multiply (the token
embedding's lookup does not, unless it is also the output head, and neither does a learned position table), and the
attention scores and their weighted sum, 12 per layer L, head H, head width Q and context position T. Per character
of training this is the same number: each window position is a token.

The peak: on a CUDA GPU, the dense bf16/fp16 tensor-core figure its maker publishes (PEAKS), else the best of a short
matmul at the run's dtype, measured once per process and device (under a second: MEASURE_S). On a CPU there is no
published figure to trust (it depends on the cores, the clock, AVX-512 or AMX and the threads the run uses), so it
is always measured, at the run's threads: an MFU near 100% then means as fast as this machine multiplies matrices.
"""

import functools
import time

import torch

# dense (no sparsity) tensor-core TFLOP/s in bf16 and fp16, by a part of the device's name; tried in order
PEAKS = (("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("A100", 312e12), ("L40S", 362e12),
         ("A10G", 70e12), ("L4", 121e12))
TENSOR_DTYPES = (torch.bfloat16, torch.float16)
MEASURE_S = 0.1  # seconds of timed matmuls at the size chosen; the whole measurement stays well under a second
ONE_MATMUL_S = 0.01  # grow the matrix while one product takes less than this
MAX_SIDE = {"cuda": 8192, "cpu": 2048}


def flops_per_token(model):
    """Training FLOPs per token of a decoder (CharGPT) -> int, or None for a model the formula does not describe
    (the encoder-decoder of sentence pairs, whose positions are split between two stacks)."""
    from chargpt.model.transformer import CharGPT
    if not isinstance(model, CharGPT):
        return None
    cfg = model.config
    n = model.num_params()
    if cfg.pos_emb == "learned":
        n -= model.wpe.weight.numel()  # a lookup: no multiply
    if not cfg.tie_weights:
        n -= model.wte.weight.numel()  # a lookup too (tied, it is also the output head, which multiplies)
    return 6 * n + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size  # H·Q = n_embd


def device_peak(device, dtype):
    """(FLOP/s the device can do at dtype, how that was found: a line for the start-up)."""
    device = torch.device(device)
    if device.type == "cuda" and dtype in TENSOR_DTYPES:
        name = torch.cuda.get_device_name(device)
        known = next((peak for part, peak in PEAKS if part in name), None)
        if known is not None:
            return known, f"{known / 1e12:.0f} TFLOP/s, the published dense {dtype_name(dtype)} peak of the {name}"
    peak, side = measured_peak(device.type, device.index, dtype, torch.get_num_threads())
    threads = torch.get_num_threads()
    on = f", {threads} thread{'s' if threads > 1 else ''}" if device.type == "cpu" else ""
    each = " on one thread, times the threads" if device.type == "cpu" and threads > 1 else ""
    return peak, f"{peak / 1e9:,.0f} GFLOP/s, measured on this {device.type.upper()} ({side} x {side} " \
                 f"{dtype_name(dtype)} matmuls{each}{on})"


@functools.cache
def measured_peak(kind, index, dtype, threads):
    """(best FLOP/s of square matmuls at dtype, the side measured): the side doubles while one product is quick,
    so a slow dtype (bf16 emulated on a CPU: about 1 GFLOP/s) is measured small and as briefly as a fast one.
    Cached per device, dtype and thread count: the same process trains on (tests: many runs) at no new cost."""
    device = torch.device(kind, index) if index is not None else torch.device(kind)
    if kind == "cpu" and threads > 1:
        # one thread's peak times the threads: torch's threads wait for each other at every product, so beside a busy
        # process a 2-thread measure can come out tens of times low (and MFU past 100%); one thread is not held up
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            one, side = measured_peak(kind, index, dtype, 1)
        finally:
            torch.set_num_threads(before)
        return one * threads, side
    side = 128
    while True:
        a = torch.randn(side, side, device=device, dtype=dtype)
        seconds = timed(a, 1, device)  # the first product at a size is also its warm-up
        if seconds >= ONE_MATMUL_S or side >= MAX_SIDE.get(kind, 2048):
            break
        side *= 2
    reps = max(1, int(MEASURE_S / 2 / max(seconds, 1e-6)))
    best = min(timed(a, reps, device) / reps for _ in range(2))
    return 2 * side**3 / max(best, 1e-12), side


def timed(a, reps, device):
    """Seconds of `reps` products a @ a."""
    synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ a
    synchronize(device)
    return time.perf_counter() - t0


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


class Utilisation:
    """A run's MFU: characters per second -> the share of its devices' peak its model's FLOPs are. devices: the
    processes training together (each on its own device), whose characters chars_per_s counts together."""

    def __init__(self, flops_per_char, peak, devices=1, how=""):
        self.flops_per_char, self.peak, self.devices, self.how = flops_per_char, peak, devices, how

    @classmethod
    def of(cls, run):
        """The run's (training/start.Run), or None where its model has no formula (pairs)."""
        per_token = flops_per_token(run.model)
        if per_token is None:
            return None
        peak, how = device_peak(run.device, run.dtype)
        return cls(per_token, peak, run.dist.world_size, how)

    def __call__(self, chars_per_s):
        return chars_per_s * self.flops_per_char / (self.peak * self.devices)

    def line(self):
        """The start-up line: what MFU is measured against, and how that peak was found."""
        devices = f" per process ({self.devices})" if self.devices > 1 else ""
        return f"mfu: model FLOPs ({self.flops_per_char:,} a character, 6N + 12·L·H·Q·T) against a peak of " \
               f"{self.how}{devices}"
