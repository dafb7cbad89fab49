"""Which dtype --dtype picks on each kind of hardware, with the hardware queries monkeypatched (no GPU needed)."""

import pytest
import torch

from chargpt import runtime
from chargpt.errors import ConfigError
from chargpt.runtime import pick_dtype

CPU, CUDA = torch.device("cpu"), torch.device("cuda", 0)


@pytest.mark.parametrize("native,want", [(True, torch.bfloat16), (False, torch.float32)])
def test_auto_on_cpu_uses_bf16_only_where_the_cpu_has_it_natively(monkeypatch, native, want):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: native)
    assert pick_dtype("auto", CPU)[0] == want


def fake_gpu(monkeypatch, capability):
    """A CUDA GPU of this compute capability. is_bf16_supported says yes even on old GPUs, as torch's does
    there (it counts emulation), so a choice that trusts it would pick slow emulated bf16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


@pytest.mark.parametrize("capability,want", [((9, 0), torch.bfloat16), ((8, 0), torch.bfloat16),
                                             ((7, 5), torch.float16), ((6, 0), torch.float16)],
                         ids=["hopper", "ampere", "turing", "pascal"])
def test_auto_on_cuda_uses_native_bf16_from_ampere_and_fp16_below(monkeypatch, capability, want):
    fake_gpu(monkeypatch, capability)
    dtype, reason = pick_dtype("auto", CUDA)
    assert dtype == want, reason


def test_explicit_choices(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_native_bf16", lambda: False)
    assert pick_dtype("float32", CPU) == (torch.float32, "float32 (requested)")
    assert pick_dtype("bfloat16", CPU)[0] == torch.bfloat16  # slow without native support, but the user asked
    assert pick_dtype("auto", torch.device("mps"))[0] == torch.float32
    with pytest.raises(ConfigError, match=r"--dtype float16 is not supported for training on CPU"):
        pick_dtype("float16", CPU)
    with pytest.raises(ConfigError, match=r"unknown dtype 'float8'"):
        pick_dtype("float8", CPU)


# --- CHARGPT_CPU_BF16: one CPU tested as either kind -----------------------------------------------------------
@pytest.mark.parametrize("detected", [True, False], ids=["native", "emulated"])
def test_the_switch_makes_any_cpu_count_as_either_kind_and_the_start_says_so(monkeypatch, detected):
    monkeypatch.setattr(runtime, "cpu_detects_native_bf16", lambda: detected)
    monkeypatch.delenv(runtime.CPU_BF16_ENV, raising=False)
    assert runtime.cpu_has_native_bf16() is detected  # unset: the hardware decides
    for value, dtype in (("1", torch.bfloat16), ("0", torch.float32)):
        monkeypatch.setenv(runtime.CPU_BF16_ENV, value)
        assert runtime.cpu_has_native_bf16() is (value == "1")
        assert runtime.has_native_bf16(CPU) is (value == "1")
        got, reason = pick_dtype("auto", CPU)
        kind = "with" if value == "1" else "without"
        assert got == dtype and f"CHARGPT_CPU_BF16={value}: treated as a CPU {kind} native bf16" in reason
        assert pick_dtype("float32", CPU)[0] == torch.float32  # a named dtype is never overridden


def test_a_bad_switch_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(runtime.CPU_BF16_ENV, "yes")
    with pytest.raises(ConfigError, match=r"CHARGPT_CPU_BF16='yes': use 1 .*, 0 .*, or leave it unset to detect"):
        pick_dtype("auto", CPU)
