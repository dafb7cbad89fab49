"""The one place that inspects the hardware: device, dtype, autocast, threads, distributed setup."""

import contextlib
import importlib.util
import inspect
import os
import shutil
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from chargpt import platforms
from chargpt.config import THREADS_PER_CPU
from chargpt.config.flags import param
from chargpt.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(name="auto"):
    """'auto' -> CUDA, then Apple MPS, then CPU; an explicit device must exist."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
        if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() and _world_size() == 1:
            return torch.device("mps")  # not under torchrun: MPS has no distributed backend
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown device {name!r}; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {name}: this machine has no CUDA GPU (or this torch build lacks CUDA); "
                              f"use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) here "
                              f"(cuda:0 .. cuda:{torch.cuda.device_count() - 1})")
        if device.index is None:
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    elif device.type == "mps":
        if not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
            raise ConfigError(f"--device {name}: Apple MPS is not available here; use --device cpu or auto")
    elif device.type != "cpu":
        raise ConfigError(f"unsupported device {name!r}; use auto, cpu, cuda, cuda:N or mps")
    return device


def device_memory(device):
    """-> (bytes of memory on `device`, how to name it) for refusing models that cannot fit: a CUDA GPU's total
    memory, else the machine's RAM (MPS shares it); (None, ...) where it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"{device} ({torch.cuda.get_device_name(device)})"
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this machine"
    except (AttributeError, ValueError, OSError):  # Windows has no sysconf
        return None, "this machine"


# CHARGPT_CPU_BF16=1 / =0 makes chargpt treat any CPU as one with / without native bf16, for every choice of its own
# that the detection below drives (--dtype auto, Muon's iteration in an auto run, the benchmarks' rows); unset, the
# hardware decides. bf16 math runs on every CPU (emulated it is only slower), so the test suite can run both kinds
# of machine on one: .ci/run runs the dtype-sensitive tests again under the setting this machine does not have.
CPU_BF16_ENV = "CHARGPT_CPU_BF16"


def cpu_bf16_override():
    """-> True/False where CHARGPT_CPU_BF16 forces the answer of cpu_has_native_bf16(), None where it is unset."""
    value = os.environ.get(CPU_BF16_ENV, "").strip()
    if value == "":
        return None
    if value not in ("0", "1"):
        raise ConfigError(f"{CPU_BF16_ENV}={value!r}: use 1 (treat this CPU as having native bf16), 0 (as lacking "
                          f"it), or leave it unset to detect")
    return value == "1"


def cpu_detects_native_bf16():
    """What the hardware says: True when the CPU computes bf16 matmuls in hardware (AVX512-BF16 or AMX); emulated
    bf16 is far slower than fp32 (about 1 GFLOP/s against 150 measured on an AVX2-only EPYC)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, name, lambda: False)() for name in checks)


def cpu_has_native_bf16():
    """Whether chargpt treats this CPU as computing bf16 natively: the hardware's answer, unless CHARGPT_CPU_BF16
    overrides it."""
    forced = cpu_bf16_override()
    return cpu_detects_native_bf16() if forced is None else forced


def describe_cpu_bf16(native):
    """Why chargpt counts this CPU as one with native bf16 (native=True) or without: the hardware, or
    CHARGPT_CPU_BF16."""
    forced = cpu_bf16_override()
    if forced is not None:
        return f"{CPU_BF16_ENV}={int(forced)}: treated as a CPU {'with' if forced else 'without'} native bf16"
    return "CPU has native bf16" if native else "no native bfloat16 on this CPU"


def cuda_has_native_bf16(device):
    """True on GPUs that compute bf16 in hardware: compute capability 8.0 (Ampere) and newer. Older ones only
    emulate it, much slower than fp16, and torch.cuda.is_bf16_supported() counts the emulation as support."""
    return torch.cuda.get_device_capability(device) >= (8, 0)


def pick_dtype(name, device):
    """-> (torch dtype, reason). 'auto' is bf16 where the hardware does it natively; else fp16 with a loss scaler
    on CUDA, fp32 elsewhere."""
    if name == "auto":
        if device.type == "cuda":
            if cuda_has_native_bf16(device):
                return torch.bfloat16, "bfloat16 autocast (GPU has native bf16)"
            return torch.float16, "float16 autocast with loss scaling (GPU lacks native bf16: compute capability < 8.0)"
        if device.type == "cpu":
            native = cpu_has_native_bf16()
            return (torch.bfloat16, f"bfloat16 autocast ({describe_cpu_bf16(native)})") if native else \
                (torch.float32, f"float32 ({describe_cpu_bf16(native)})")
        return torch.float32, "float32 (no native bfloat16 on this " + device.type.upper() + ")"
    if name not in DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; use auto, float32, bfloat16 or float16")
    dtype = DTYPES[name]
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise ConfigError("--dtype bfloat16: this GPU does not support bfloat16; use --dtype float16 or auto")
    if device.type == "cpu" and dtype == torch.float16:
        raise ConfigError("--dtype float16 is not supported for training on CPU; use --dtype bfloat16 or float32")
    return dtype, f"{name} (requested)"


def has_native_bf16(device):
    """Whether bf16 matmuls run in hardware on this device (CUDA from Ampere on, CPUs with AVX512-BF16 or AMX)."""
    if device.type == "cuda":
        return cuda_has_native_bf16(device)
    return device.type == "cpu" and cpu_has_native_bf16()


def pick_decode_dtype(name, device):
    """-> (torch dtype, reason) for sampling and scoring. 'auto' is bf16 on a GPU that does bf16 natively: decoding
    one character at a time reads every weight per character, and half the bytes per weight makes it faster there.
    On a CPU 'auto' stays float32, even with native bf16: measured on a 2-core Xeon with AMX, cached bf16 decoding
    at batch 1 on 6x384 ran 0.81x float32's speed (python -m chargpt.bench --only decode; benchmarks/RESULTS.md),
    and float32 gives exactly the uncached reference's characters. Ask for bfloat16 by name to try it."""
    if name == "auto":
        if device.type != "cpu" and has_native_bf16(device):
            return torch.bfloat16, f"bfloat16 ({device.type.upper()} has native bf16)"
        if device.type == "cpu":
            return torch.float32, "float32 (on a CPU bf16 decoding measured slower, even where it is native)"
        return torch.float32, f"float32 (no native bfloat16 on this {device.type.upper()})"
    if name not in ("float32", "bfloat16"):
        raise ConfigError(f"--dtype for sampling must be auto, float32 or bfloat16 (got {name!r})")
    return DTYPES[name], f"{name} (requested)"


# torch.compile: where it wins. Inductor fuses the chains of small elementwise kernels (LayerNorm, GELU, residual
# adds, dtype casts) that dominate small models; on CUDA that removes launch overhead and wins clearly, so auto
# compiles there, wherever Triton (the GPU code generator behind it) can run. On a CPU it wins in bf16 only, by
# little, and only once paid for. On a 2-core Xeon with native bf16 (benchmarks/RESULTS.md), against the eager step
# as training runs it (bf16 weight copies, Muon): 4 x 256 1.02x, 5 x 320 1.10x, 3 x 160 with dropout 1.35x, after a
# first step of 31-34 s that compiles (a few seconds once torch's on-disk cache holds the code); float32 measured
# 0.93-1.16x. So auto compiles a CPU run only from CPU_COMPILE_MIN_S, where 10% of the budget is several times the
# first compile, and only with a C++ compiler.
CPU_COMPILE_MIN_S = 1800.0


def pick_compile(setting, device, dtype=None, budget_s=None):
    """--compile auto|on|off -> (whether to compile, reason printed at start). dtype: the training dtype; budget_s:
    the run's --max-time (None: a step budget), which decide a CPU's auto."""
    if setting == "on":
        require_compiler(device, "train")
        return True, "torch.compile (requested)"
    if setting == "off":
        return False, "eager (--compile off)"
    if device.type == "cuda":
        if platforms.WINDOWS:
            return False, ("eager (--compile auto: not on Windows, where torch ships no Triton for torch.compile; "
                           "--compile on if you installed one)")
        missing = triton_missing(device)
        if missing:
            return False, f"eager (--compile auto: {missing})"
        return True, "torch.compile (--compile auto: it wins on CUDA)"
    if device.type != "cpu":
        return False, f"eager (--compile auto: torch.compile has not measured faster on {device.type.upper()})"
    if dtype != torch.bfloat16:
        return False, "eager (--compile auto: on a CPU a compiled step wins in bfloat16 only)"
    if budget_s is None or budget_s < CPU_COMPILE_MIN_S:
        budget = "a step budget" if budget_s is None else f"a {budget_s:g} s budget"
        return False, (f"eager (--compile auto: {budget} would not repay compiling, 30 s or more the first time; "
                       f"from --max-time {CPU_COMPILE_MIN_S:g} it compiles)")
    if cpp_compiler() is None:
        return False, "eager (--compile auto: no C++ compiler for torch.compile)"
    return True, (f"torch.compile (--compile auto: a {budget_s:g} s budget repays compiling, 30 s or more the first "
                  f"time, a few seconds from torch's on-disk cache; bf16 steps measured 1.02-1.35x faster compiled)")


TRITON_MIN_CAPABILITY = (7, 0)  # Triton's oldest NVIDIA GPU: Volta. A P100 (6.0) fails at its first compiled step


def triton_missing(device):
    """Why torch.compile cannot generate code for the CUDA GPU `device` (Triton does not run there, or is not
    installed), in words; None when it can."""
    if not torch.cuda.is_available():
        return None  # nothing to ask: pick_device hands out a CUDA device only where there is one
    capability = torch.cuda.get_device_capability(device)
    if tuple(capability) < TRITON_MIN_CAPABILITY:
        return (f"Triton, which torch.compile generates GPU code with, needs compute capability "
                f"{'.'.join(map(str, TRITON_MIN_CAPABILITY))} or newer, and {torch.cuda.get_device_name(device)} has "
                f"{capability[0]}.{capability[1]}")
    if not triton_installed():
        return "the triton package that torch.compile generates GPU code with is not installed"
    return None


def triton_installed():
    return importlib.util.find_spec("triton") is not None


# --compile auto for sampling compiles the decode step from this many new characters (all samples together) on a
# CPU with a C++ compiler. Measured on a 2-core Xeon with native bf16 (benchmarks/RESULTS.md), 6 x 384 at
# batch 1: the compiled float32 step writes 444 characters/s against the eager step's 345 (0.65 ms saved per
# character; int8's 723 against 467, 0.76 ms), and compiling costs a sample.py run about 3 s with torch's on-disk
# cache warm and 15 s cold; so it pays from about 5,000 characters warm and 23,000 cold. Below this, decoding stays
# eager, through the model's forward and its growing cache, as before the static step existed.
DECODE_COMPILE_MIN_CHARS = 30_000


def pick_decode_compile(setting, device, new_chars, quantized=False):
    """--compile auto|on|off for sampling -> (compile the decode step?, the reason in words). quantized: the model
    has torch's dynamic int8 modules (which do not compile)."""
    if setting not in ("auto", "on", "off"):
        raise ConfigError(f"--compile must be auto, on or off (got {setting!r})")
    if setting == "on":
        if quantized:
            raise ConfigError("--compile on cannot compile int8 decoding on a CPU without native bf16 (--quantize "
                              "int8 is torch's dynamic quantisation there, whose modules do not compile); drop one")
        require_compiler(device, "sample")
        return True, "decode step: torch.compile (requested)"
    if setting == "off":
        return False, "decode step: eager (--compile off)"
    if quantized:
        return False, "decode step: eager (--compile auto: int8 modules do not compile)"
    if device.type != "cpu":
        return False, f"decode step: eager (--compile auto: compiling has not been measured on {device.type.upper()})"
    if cpp_compiler() is None:
        return False, "decode step: eager (--compile auto: no C++ compiler for torch.compile)"
    if new_chars < DECODE_COMPILE_MIN_CHARS:
        return False, (f"decode step: eager (--compile auto: {new_chars:,} characters would not repay compiling; "
                       f"from {DECODE_COMPILE_MIN_CHARS:,} it compiles)")
    return True, f"decode step: torch.compile (--compile auto: {new_chars:,} characters repay compiling it)"


def require_compiler(device, verb):
    """--compile on: refuse a CPU run without the C++ compiler torch.compile's CPU backend needs, and a GPU where
    Triton cannot run (it would fail at the first compiled step)."""
    if device.type == "cpu" and cpp_compiler() is None:
        raise ConfigError("--compile on: torch.compile turns CPU code into C++ and no C++ compiler was found (g++ "
                          "or clang++; on Windows MSVC's cl, from a Developer Command Prompt; or set CXX); "
                          f"install one, or {verb} with --compile off")
    missing = triton_missing(device) if device.type == "cuda" else None
    if missing:
        raise ConfigError(f"--compile on: {missing}; {verb} with --compile off")


def cpp_compiler():
    """The C++ compiler torch.compile's CPU backend would find ($CXX, else the usual names on PATH), or None."""
    names = [os.environ.get("CXX")] + ["cl", "clang-cl"] * (os.name == "nt") + ["g++", "clang++", "c++"]
    return next((found for found in map(shutil.which, filter(None, names)) if found), None)


def autocast(device, dtype):
    """Mixed-precision context for forward passes; a no-op in float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def cpu_count():
    """CPUs this process may run on: its affinity mask, which containers and taskset narrow, else all of them."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def others_cpu_use(seconds, sleep=time.sleep):
    """CPUs' worth of work other processes did on this machine over the next `seconds` (Linux: /proc/stat's busy
    time of all CPUs less this process's own), or None where the system does not say."""
    def sample():
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:9]]  # guest time, after these, is already in user
        busy = sum(fields) - fields[3] - (fields[4] if len(fields) > 4 else 0)  # all but idle and iowait
        own = os.times()
        return busy / os.sysconf("SC_CLK_TCK"), own.user + own.system, time.perf_counter()
    try:
        b0, o0, t0 = sample()
        sleep(seconds)
        b1, o1, t1 = sample()
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux, or an unreadable /proc
        return None
    return max(0.0, (b1 - b0) - (o1 - o0)) / max(t1 - t0, 1e-9)


def check_threads(threads):
    most = THREADS_PER_CPU * cpu_count()
    if not 1 <= threads <= most:
        raise ConfigError(f"{param('threads')} must be between 1 and {most} ({THREADS_PER_CPU} per CPU; this machine "
                          f"has {cpu_count()}), got {threads}; more threads than CPUs only slow torch down, so "
                          f"leave it out for the default")


def configure_threads(threads=None, local_world_size=1):
    """Default: the CPUs this process may use, split between the processes on this machine. Two processes each
    using every core run several times slower than one thread each, so oversubscription is avoided."""
    if threads is None:
        threads = max(1, cpu_count() // max(1, local_world_size))
    check_threads(threads)  # torch crashes (SIGSEGV) near 100000 threads
    torch.set_num_threads(threads)
    return threads


def enable_fast_math(device):
    if device.type == "cuda":
        # TF32 matmuls: several times faster on Ampere and newer, and precise enough for training. Set with the
        # older API on purpose: after the newer one (matmul.fp32_precision = "tf32", torch >= 2.9), reading the older
        # one (matmul.allow_tf32, torch.get_float32_matmul_precision()) raises RuntimeError for the rest of the
        # process, and inductor's autotuning, flex attention and the caller's own code read it. Set this way, both
        # read back (tests/test_gpu_paths.py); CPU matmuls are left alone.
        torch.backends.cuda.matmul.allow_tf32 = True


# Seeds of the random streams. Rank 0 uses the seeds a single process uses; each other rank shifts them by a
# multiple of a large prime, and the offsets between streams are not multiples of it, so no two streams of any
# two ranks ever share a seed (the model's initial weights come from `seed` itself, the same on every rank).
STREAM_OFFSETS = {"dropout": 0, "data": 7919, "eval": 1_000_003}
RANK_STRIDE = 104_729


def stream_seed(seed, stream, rank=0):
    """Seed of one random stream ('dropout', 'data' or 'eval') of one rank."""
    return seed + STREAM_OFFSETS[stream] + RANK_STRIDE * rank


def _world_size():
    return int(os.environ.get("WORLD_SIZE", 1))


@dataclass
class Dist:
    """Where this process stands in a torchrun job (rank 0 of 1 when run plainly)."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    device: torch.device = torch.device("cpu")  # where collectives' tensors live: the GPU for NCCL, else CPU

    @property
    def enabled(self):
        return self.world_size > 1

    @property
    def is_main(self):
        return self.rank == 0


# How long a collective waits for the slowest rank before the job fails, for NCCL and Gloo alike. NCCL's default is
# 10 minutes (Gloo's, which the tests saw, 30), and ranks wait while rank 0 does long work alone: encoding a corpus
# into the cache (the others at a barrier) and building the novelty index at the first --sample-every sample (the
# others in the next all-reduce). Building that index takes 9-29 s per 100M characters (benchmarks/RESULTS.md), so
# 30 minutes covers corpora of billions of characters; encoding (two passes over the text) has not been timed at that
# scale. A rank that dies is noticed by torchrun at once; this only bounds how long a hung one holds the others.
PROCESS_GROUP_TIMEOUT = timedelta(minutes=30)


def init_distributed(device_name):
    """Read torchrun's environment and join the process group: NCCL for CUDA, Gloo for CPU. Each process
    takes the GPU numbered by its LOCAL_RANK (choose which GPUs with CUDA_VISIBLE_DEVICES)."""
    world = _world_size()
    if world <= 1:
        return Dist()
    if not torch.distributed.is_available():
        raise ConfigError(f"torchrun started {world} processes, but this torch build has no torch.distributed; train "
                          f"in one process (python train.py), or install a torch build with it")
    import torch.distributed as dist
    d = Dist(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)), world,
             int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    if device_name.startswith("mps"):
        raise ConfigError("--device mps cannot train in several processes (Apple MPS has no distributed backend); "
                          "use --device cpu under torchrun, or train in one process")
    use_cuda = device_name.startswith("cuda") or (device_name == "auto" and torch.cuda.is_available())
    if use_cuda:
        if device_name not in ("cuda", "auto"):
            raise ConfigError(f"--device {device_name}: under torchrun each process takes the GPU of its "
                              f"LOCAL_RANK; pass --device cuda (or auto) and pick GPUs with CUDA_VISIBLE_DEVICES")
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {device_name}: this machine has no CUDA GPU; use --device cpu")
        if not dist.is_nccl_available():
            raise ConfigError("several processes on CUDA GPUs need NCCL, which this torch build lacks (torch has it on "
                              "Linux only); train in one process, or with --device cpu under torchrun")
        if d.local_rank >= torch.cuda.device_count():
            raise ConfigError(f"torchrun started {d.local_world_size} processes on this machine but it has "
                              f"{torch.cuda.device_count()} GPU(s); use --nproc-per-node "
                              f"{torch.cuda.device_count()} (one process per GPU)")
        d.device = torch.device("cuda", d.local_rank)
        torch.cuda.set_device(d.device)
    if not dist.is_initialized():
        if use_cuda:
            dist.init_process_group(backend="nccl", device_id=d.device, timeout=PROCESS_GROUP_TIMEOUT)
        else:
            dist.init_process_group(backend="gloo", timeout=PROCESS_GROUP_TIMEOUT)
    return d


class OneGraphDDP(torch.nn.parallel.DistributedDataParallel):
    """DistributedDataParallel whose compiled module is traced as one graph.

    Under DDP, torch.compile cuts the graph where DDP's gradient buckets end (torch/_dynamo/backends/distributed.py,
    so that each bucket's all-reduce can start while the backward goes on), and it sizes a bucket by
    param.untyped_storage().nbytes(). chargpt's parameters are views of one flat buffer (chargpt/training/flat.py), so
    every parameter counts as the whole buffer, and the graph fell into about one piece per parameter: 40 at 6 x 384,
    against 3 with separate parameters, each piece compiled on its own, no fusion across them. In one graph the
    gradients are all-reduced after the backward instead of during it, which costs little at chargpt's sizes on
    one machine (tens of MB of gradients over NVLink); across machines it is not yet measured (docs/gpu.md)."""

    def forward(self, *args, **kwargs):
        with torch._dynamo.config.patch(optimize_ddp=False):  # read when the module compiles, in its first call
            return super().forward(*args, **kwargs)


def ddp(model, device):
    """The training step's model under DDP: `model` in a DistributedDataParallel, a OneGraphDDP if it is compiled.
    Two of DDP's options are rules here, not tuning:
    - no buffer sync before each forward: a model's only buffers are constants of its config (the sinusoidal
      position table), the same on every rank, and DDP's default broadcasts them from rank 0 at every forward
      (forward_sync_buffers=False since torch 2.13, which deprecates broadcast_buffers=False for it).
    - gradient_as_bucket_view=False, always: the optimizer steps the flat gradient buffer (chargpt/training/flat.py),
      and with it DDP would make each .grad a view of its own buckets from the second step on, leaving the flat buffer
      at zero: the optimizer would step zeros (tests/test_gpu_paths.py shows it)."""
    takes = inspect.signature(torch.nn.parallel.DistributedDataParallel).parameters
    no_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in takes else {"broadcast_buffers": False}
    compiled = hasattr(model, "_orig_mod")  # torch.compile's wrapper
    kind = OneGraphDDP if compiled else torch.nn.parallel.DistributedDataParallel
    return kind(model, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=False,
                **no_sync)


def broadcast_str(text, d: Dist):
    """Rank 0's string, on every rank (e.g. a path that ranks on other machines would choose differently)."""
    if not d.enabled:
        return text
    import torch.distributed as dist
    box = [text]
    dist.broadcast_object_list(box, src=0, device=d.device if d.device.type == "cuda" else None)
    return box[0]


def gather_to_main(tensor, d: Dist):
    """All ranks' copies of a same-sized CPU tensor, as a list on rank 0 (None on the others). Collective:
    every rank must call it."""
    if not d.enabled:
        return [tensor]
    import torch.distributed as dist
    local = tensor.to(d.device)
    parts = [torch.empty_like(local) for _ in range(d.world_size)] if d.is_main else None
    dist.gather(local, parts, dst=0)
    return [p.cpu() for p in parts] if d.is_main else None


# --- random streams, saved and restored (exact resume) -------------------------------------------------------------
def gather_rng_state(data_gen, device, d: Dist):
    """Every rank's random streams, gathered to rank 0 (None elsewhere): rank 0's under the names a single process
    uses (torch, data, cuda), rank r's as rank{r}.torch ... A collective under DDP."""
    local = {"torch": torch.get_rng_state(), "data": data_gen.get_state()}
    if device.type == "cuda":
        local["cuda"] = torch.cuda.get_rng_state(device)
    names, sizes = list(local), [v.numel() for v in local.values()]
    gathered = gather_to_main(torch.cat(list(local.values())), d)  # (bytes,) per rank, same size
    if gathered is None:
        return None
    rng = dict(local)
    for r, flat in enumerate(gathered[1:], start=1):
        rng.update({f"rank{r}.{n}": part.clone() for n, part in zip(names, flat.split(sizes))})
    return rng


def restore_rng_state(rng, data_gen, device, d: Dist, seed):
    """Continue this rank's streams exactly where they stopped. A rank the checkpoint has none for (it was written
    by fewer processes) starts new streams, reproducibly, from `seed` (the run's seed plus its step) and its rank."""
    prefix = "" if d.is_main else f"rank{d.rank}."
    if prefix + "torch" in rng and prefix + "data" in rng:
        torch.set_rng_state(rng[prefix + "torch"])
        data_gen.set_state(rng[prefix + "data"])
        if prefix + "cuda" in rng and device.type == "cuda":
            torch.cuda.set_rng_state(rng[prefix + "cuda"], device)
    else:
        torch.manual_seed(stream_seed(seed, "dropout", d.rank))
        data_gen.manual_seed(stream_seed(seed, "data", d.rank))
