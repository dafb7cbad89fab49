"""The network: loss at init, learning, causality, fused attention against the explicit reference; the size a
config implies, known before anything is built."""

import math

import pytest
import torch

from chargpt.config import PRESETS, ModelConfig, split_overrides
from chargpt.errors import ConfigError
from chargpt.model.transformer import CharGPT, KVCache, build_model, check_model_fits, estimated_params


def test_initial_loss_is_log_vocab(tiny_config):
    """An untrained model is uncertain: its loss is ~ ln(V), the loss of a uniform guess."""
    torch.manual_seed(0)
    cfg = ModelConfig(**{**vars(tiny_config), "vocab_size": 50})
    model = CharGPT(cfg)
    idx, targets = torch.randint(0, 50, (2, 8, 16))
    _, loss = model(idx, targets)
    assert loss.item() == pytest.approx(math.log(50), rel=0.05)


def test_overfits_one_batch(tiny_config):
    torch.manual_seed(0)
    model = CharGPT(tiny_config)
    idx = torch.randint(0, tiny_config.vocab_size, (4, 16))
    targets = torch.roll(idx, -1, dims=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        _, loss = model(idx, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1


@pytest.mark.parametrize("kernel", ["fused", "manual"])
def test_causality(tiny_config, kernel):
    """Changing a later character never changes the logits of earlier positions."""
    torch.manual_seed(0)
    model = CharGPT(tiny_config).eval()
    model.set_attention(kernel)
    idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % tiny_config.vocab_size
    a, _ = model(idx)
    b, _ = model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10], rtol=0, atol=0)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


@pytest.mark.parametrize("bias,tie", [(True, True), (False, False)])
def test_fused_attention_equals_masked_softmax(tiny_config, bias, tie):
    torch.manual_seed(0)
    cfg = ModelConfig(**{**vars(tiny_config), "bias": bias, "tie_weights": tie})
    model = CharGPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (3, 16))
    model.set_attention("fused")
    fused, _ = model(idx)
    model.set_attention("manual")
    manual, _ = model(idx)
    torch.testing.assert_close(fused, manual, rtol=1e-5, atol=1e-5)


def test_a_compiled_bf16_cpu_step_traces_the_explicit_attention_in_one_graph_without_warnings(tiny_config):
    """--compile auto compiles long bf16 CPU runs, whose attention is the explicit softmax with its cached causal
    mask: one graph, and no dynamo warning about the cache (it printed 8 lines into every such run's log).
    aot_eager: dynamo's tracing as inductor sees it, without a C++ compiler."""
    import warnings

    from torch._dynamo.testing import CompileCounterWithBackend
    model = CharGPT(tiny_config)
    idx = torch.randint(0, tiny_config.vocab_size, (2, 16))
    counter = CompileCounterWithBackend("aot_eager")
    with warnings.catch_warnings(record=True) as seen, torch.autocast("cpu", torch.bfloat16):
        warnings.simplefilter("always")
        loss = torch.compile(model, backend=counter)(idx, idx)[1]
    assert counter.frame_count == 1 and torch.isfinite(loss)
    assert not [w for w in seen if "lru_cache" in str(w.message)]


def test_cached_forward_equals_full_forward(tiny_config):
    """Prefill + one position at a time through the KV cache gives the full forward's logits."""
    torch.manual_seed(0)
    model = CharGPT(tiny_config).eval()
    idx = torch.randint(0, tiny_config.vocab_size, (2, 12))
    full, _ = model(idx)
    for kernel in ("fused", "manual"):
        model.set_attention(kernel)
        cache = KVCache(tiny_config, batch_size=2)
        steps = [model(idx[:, :5], cache=cache)[0]]
        steps += [model(idx[:, t:t + 1], cache=cache)[0] for t in range(5, 12)]
        torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 4:], rtol=1e-5, atol=1e-5)


def test_too_long_input_is_a_clear_error(tiny_config):
    model = CharGPT(tiny_config)
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_gpt2_init_and_weight_tying(tiny_config):
    torch.manual_seed(0)
    model = CharGPT(ModelConfig(**{**vars(tiny_config), "n_embd": 64, "n_layer": 4}))
    assert model.lm_head.weight is model.wte.weight
    proj = model.h[0].mlp.c_proj.weight.std().item()
    fc = model.h[0].mlp.c_fc.weight.std().item()
    assert fc == pytest.approx(0.02, rel=0.1)
    assert proj == pytest.approx(0.02 / math.sqrt(2 * 4), rel=0.15)  # residual projections scaled by depth
    untied = CharGPT(ModelConfig(**{**vars(tiny_config), "tie_weights": False}))
    assert untied.num_params() > CharGPT(tiny_config).num_params()


def test_weight_decay_only_on_matrices(tiny_config):
    """Every parameter in exactly one group: matrices and embeddings decay, biases and norm gains do not."""
    model = CharGPT(tiny_config)
    decay, no_decay = model.optimizer_groups(0.1)
    names = {id(p): n for n, p in model.named_parameters()}  # the tied head is the embedding: listed once
    decayed, kept = ({names[id(p)] for p in g["params"]} for g in (decay, no_decay))
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {"wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.mlp.c_proj.weight"} <= decayed
    assert {"h.0.attn.c_attn.bias", "h.0.ln_1.weight", "ln_f.bias"} <= kept
    assert decayed | kept == set(names.values()) and not decayed & kept
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() < 2 for p in no_decay["params"])


@pytest.mark.parametrize("dropout,training,dtype,fused", [(0.0, True, torch.float32, True),
                                                           (0.1, True, torch.float32, False),
                                                           (0.1, False, torch.float32, True),
                                                           (0.0, True, torch.bfloat16, False),
                                                           (0.0, False, torch.bfloat16, False)])
def test_attention_auto_on_cpu_avoids_the_slow_fused_paths(tiny_config, dropout, training, dtype, fused):
    """--attention auto: torch's fused kernel on CPU unless attention dropout is active (training with dropout),
    where its generic fallback is slower than the explicit softmax, or the queries are bf16, where its backward
    is the slower one; both give the same function."""
    model = CharGPT(ModelConfig(**{**vars(tiny_config), "dropout": dropout})).train(training)
    model.set_attention("auto")
    x = torch.zeros(1, 4, tiny_config.n_embd, dtype=dtype)
    assert all(block.attn.use_fused(x) is fused for block in model.h)
    for kernel, want in (("fused", True), ("manual", False)):  # an explicit choice always wins
        model.set_attention(kernel)
        assert all(block.attn.use_fused(x) is want for block in model.h)


# --- sizes known from the config alone -------------------------------------------------------------------------
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_the_size_estimate_is_within_a_few_per_cent_of_every_preset_built(preset):
    cfg = ModelConfig(**split_overrides(PRESETS[preset])[0], vocab_size=65)
    with torch.device("meta"):  # nothing allocated, even for the largest
        built = build_model(cfg).num_params()
    assert abs(estimated_params(cfg) - built) / built < 0.05


def test_a_model_too_large_for_the_memory_is_refused_naming_what_to_lower():
    cfg = ModelConfig(vocab_size=65, n_layer=48)  # about 85M parameters: 1.4 GB of weights, gradients and moments
    check_model_fits(cfg, None, "this machine")  # memory unknown: nothing to refuse
    check_model_fits(cfg, 2 * 10**9, "this machine")
    with pytest.raises(ConfigError, match=r"^a model of 48 layers x 384 wide, 6 heads, context 256 has about 8.53e\+07 "
                                          r"parameters: training it needs at least 1.365 GB, and this machine has 1.0 "
                                          r"GB; lower n_layer \(now 48 in big.toml\)$"):
        check_model_fits(cfg, 10**9, "this machine", source=lambda name: "big.toml")
