"""The 2017 Transformer parts: one attention (causal, padding, cross; fused == reference), the encoder-decoder,
and the options for both architectures — while the default GPT and its checkpoints stay exactly as they were."""

import math

import pytest
import torch
from torch.nn import functional as F

from chargpt.config import ARCH_FIELDS, ModelConfig, model_config_from_dict
from chargpt.errors import ConfigError
from chargpt.model.transformer import (
    Attention,
    CharGPT,
    EncoderDecoder,
    KVCache,
    Memory,
    build_model,
    sinusoidal_positions,
)
from chargpt.runs.checkpoint import load_model, model_tensors, write_safetensors

TINY = dict(vocab_size=13, block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0)


def tiny(**kw):
    return ModelConfig(**{**TINY, **kw})


def model_of(seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(tiny(**kw)).eval()


# --- the default GPT is untouched ---------------------------------------------------------------------------

def old_state_dict_names(cfg):
    """Parameter names and shapes of CharGPT as released before the encoder-decoder existed."""
    C, V = cfg.n_embd, cfg.vocab_size
    names = [("wte.weight", (V, C)), ("wpe.weight", (cfg.block_size, C))]
    for i in range(cfg.n_layer):
        names += [(f"h.{i}.{n}", s) for n, s in [
            ("ln_1.weight", (C,)), ("ln_1.bias", (C,)),
            ("attn.c_attn.weight", (3 * C, C)), ("attn.c_attn.bias", (3 * C,)),
            ("attn.c_proj.weight", (C, C)), ("attn.c_proj.bias", (C,)), ("ln_2.weight", (C,)), ("ln_2.bias", (C,)),
            ("mlp.c_fc.weight", (4 * C, C)), ("mlp.c_fc.bias", (4 * C,)), ("mlp.c_proj.weight", (C, 4 * C)),
            ("mlp.c_proj.bias", (C,))]]
    return names + [("ln_f.weight", (C,)), ("ln_f.bias", (C,)), ("lm_head.weight", (V, C))]


def test_default_gpt_keeps_its_parameter_names_and_shapes():
    cfg = ModelConfig()
    assert (cfg.arch, cfg.pos_emb, cfg.emb_scale, cfg.norm, cfg.activation) == (
        "decoder", "learned", False, "pre", "gelu")
    with torch.device("meta"):
        model = CharGPT(cfg)
    assert [(k, tuple(v.shape)) for k, v in model.state_dict().items()] == old_state_dict_names(cfg)


def test_checkpoint_without_the_new_fields_still_loads(tmp_path):
    """A checkpoint written before the architecture options existed (its model config lacks them) loads as the
    same GPT, giving the same logits."""
    torch.manual_seed(0)
    model = CharGPT(tiny()).eval()
    old_config = {k: v for k, v in vars(model.config).items() if k not in ARCH_FIELDS}
    meta = {"model_config": old_config, "vocab": "".join(chr(97 + i) for i in range(13)), "step": 5}
    write_safetensors(tmp_path / "old.safetensors", model_tensors(model), meta)
    loaded, vocab, _ = load_model(tmp_path / "old.safetensors")
    assert loaded.config == model.config and len(vocab) == 13
    idx = torch.randint(0, 13, (2, 10))
    assert torch.equal(loaded(idx)[0], model(idx)[0])


@pytest.mark.parametrize("bad,message", [
    ({"arch": "rnn"}, "--arch must be one of decoder, encoder-decoder"),
    ({"pos_emb": "rotary"}, "--pos-emb must be one of learned, sinusoidal"),
    ({"norm": "mid"}, "--norm must be one of pre, post"),
    ({"activation": "tanh"}, "--activation must be one of gelu, relu"),
    ({"n_enc_layer": 2}, "--n-enc-layer 2 needs --arch encoder-decoder"),
    ({"n_enc_layer": -1, "arch": "encoder-decoder"}, "--n-enc-layer must be at least 0"),
])
def test_bad_architecture_options_are_one_line_errors(bad, message):
    """Checked wherever a config comes from, including untrusted checkpoint metadata."""
    with pytest.raises(ConfigError, match=message):
        model_config_from_dict({**vars(tiny()), **bad})


def test_chargpt_refuses_an_encoder_decoder_config():
    with pytest.raises(ConfigError, match="build_model"):
        CharGPT(tiny(arch="encoder-decoder"))
    assert isinstance(build_model(tiny(arch="encoder-decoder")), EncoderDecoder)


# --- the tutorial options ----------------------------------------------------------------------------------

@pytest.mark.parametrize("n,d", [(12, 8), (5, 7)])
def test_sinusoidal_positions_match_the_formula(n, d):
    """PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(p / 10000^(2i/d))."""
    want = torch.tensor([[math.sin(p / 10000 ** (j / d)) if j % 2 == 0 else math.cos(p / 10000 ** ((j - 1) / d))
                          for j in range(d)] for p in range(n)])
    torch.testing.assert_close(sinusoidal_positions(n, d), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_sinusoidal_positions_have_no_parameters_and_are_added(arch):
    model = model_of(arch=arch, pos_emb="sinusoidal")
    assert not any("wpe" in k or k == "pe" for k in model.state_dict())  # rebuilt from the config, never stored
    idx = torch.zeros(1, 16, dtype=torch.long)
    torch.testing.assert_close(model.embed(idx)[0] - model.wte.weight[0], sinusoidal_positions(16, 16))


def test_emb_scale_multiplies_token_embeddings_by_sqrt_width():
    plain, scaled = model_of(), model_of(emb_scale=True)
    scaled.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 13, (2, 9))
    pos = plain.wpe.weight[:9]
    torch.testing.assert_close(scaled.embed(idx) - pos, (plain.embed(idx) - pos) * math.sqrt(16))


def test_post_ln_normalises_each_block_output_and_relu_is_used():
    model = model_of(norm="post", activation="relu")
    assert isinstance(model.h[0].mlp.act, torch.nn.ReLU)
    x = torch.randn(2, 7, 16) * 5 + 3
    y = model.h[0](x)
    torch.testing.assert_close(y.mean(-1), torch.zeros(2, 7), atol=1e-5, rtol=0)  # LayerNorm after the sum
    torch.testing.assert_close(y.std(-1, unbiased=False), torch.ones(2, 7), atol=1e-3, rtol=0)


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_paper_options_build_and_train(arch):
    """Post-LN, ReLU, sinusoidal positions and sqrt(d) scaling together: the loss on a fixed batch drops."""
    model = model_of(arch=arch, norm="post", activation="relu", pos_emb="sinusoidal", emb_scale=True).train()
    gen = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 13, (4, 12), generator=gen)
    batch = dict(idx=seq[:, :-1]) if arch == "decoder" else dict(src=seq.flip(1), tgt=seq[:, :-1])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(80):
        _, loss = model(**batch, targets=seq[:, 1:], label_smoothing=0.1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]


def test_label_smoothing_is_the_mixture_with_uniform():
    model = model_of()
    idx = torch.randint(0, 13, (2, 10))
    logits, loss = model(idx, idx, label_smoothing=0.1)
    logp = F.log_softmax(logits, -1)
    nll = -logp.gather(-1, idx[..., None]).mean()
    torch.testing.assert_close(loss, 0.9 * nll + 0.1 * -logp.mean(), rtol=1e-5, atol=1e-6)


# --- one attention: fused == reference in every variant ----------------------------------------------------

def attention(kernel, causal=True, cross=False, seed=0):
    torch.manual_seed(seed)
    att = Attention(tiny(), layer=0, causal=causal, cross=cross).eval()
    att.kernel = kernel
    return att


@pytest.mark.parametrize("variant", ["causal", "causal+padding", "bidirectional", "padding", "cross",
                                     "cached prefill", "cached step"])
def test_fused_attention_equals_reference(variant):
    gen = torch.Generator().manual_seed(1)
    x, m = torch.randn(3, 6, 16, generator=gen), torch.randn(3, 9, 16, generator=gen)
    key_mask = torch.arange(9)[None, :] < torch.tensor([[9], [4], [1]])  # (3, 9): rows padded differently
    causal, cross = variant.startswith(("causal", "cached")), variant == "cross"
    kernels = []
    for kernel in ("fused", "manual"):
        att = attention(kernel, causal=causal, cross=cross)
        if variant == "cross":
            kernels.append(att(x, memory=Memory(m, key_mask)))
        elif variant.startswith("cached"):
            cache = KVCache(tiny(n_layer=1), 3)
            first = att(x[:, :4], cache)
            cache.pos = 4
            kernels.append(first if variant == "cached prefill" else att(x[:, 4:], cache))
        else:
            mask = key_mask[:, :6] if "padding" in variant else None
            kernels.append(att(x, key_mask=mask))
    torch.testing.assert_close(kernels[0], kernels[1], rtol=1e-5, atol=1e-5)


def test_padding_mask_hides_padded_keys():
    """A masked key changes nothing: the output equals attention over the unpadded keys alone."""
    att = attention("manual", causal=False, cross=True)
    gen = torch.Generator().manual_seed(2)
    x, m = torch.randn(1, 3, 16, generator=gen), torch.randn(1, 5, 16, generator=gen)
    padded = torch.cat([m, torch.randn(1, 4, 16, generator=gen) * 100], dim=1)
    mask = torch.arange(9)[None, :] < 5
    torch.testing.assert_close(att(x, memory=Memory(padded, mask)), att(x, memory=Memory(m)), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", ["fused", "manual"])
def test_encoder_decoder_kernels_agree(kernel):
    model = model_of(arch="encoder-decoder")
    src, tgt = torch.randint(0, 13, (3, 9)), torch.randint(0, 13, (3, 7))
    mask = torch.arange(9)[None, :] < torch.tensor([[9], [5], [2]])
    model.set_attention("manual")
    ref = model(src, tgt, src_mask=mask)[0]
    model.set_attention(kernel)
    torch.testing.assert_close(model(src, tgt, src_mask=mask)[0], ref, rtol=1e-5, atol=1e-5)


# --- the encoder-decoder ------------------------------------------------------------------------------------

@pytest.mark.parametrize("kernel", ["fused", "manual"])
def test_decoder_is_causal_and_encoder_is_not(kernel):
    model = model_of(arch="encoder-decoder")
    model.set_attention(kernel)
    src, tgt = torch.randint(0, 13, (2, 8)), torch.randint(0, 13, (2, 10))
    base = model(src, tgt)[0]
    later = tgt.clone()
    later[:, 6:] = (later[:, 6:] + 1) % 13
    changed = model(src, later)[0]
    assert torch.equal(changed[:, :6], base[:, :6])  # a future target character changes no earlier output
    assert not torch.allclose(changed[:, 6:], base[:, 6:])
    last_src = src.clone()
    last_src[:, -1] = (last_src[:, -1] + 1) % 13
    assert not torch.allclose(model(last_src, tgt)[0][:, 0], base[:, 0])  # the first output sees the last source


def test_padding_does_not_change_outputs():
    """A source padded (with any ids) and masked translates exactly like the unpadded source."""
    model = model_of(arch="encoder-decoder")
    src, tgt = torch.randint(0, 13, (1, 5)), torch.randint(0, 13, (1, 6))
    padded = torch.cat([src, torch.randint(0, 13, (1, 4))], dim=1)
    mask = torch.arange(9)[None, :] < 5
    for kernel in ("fused", "manual"):
        model.set_attention(kernel)
        torch.testing.assert_close(model(padded, tgt, src_mask=mask)[0], model(src, tgt)[0], rtol=1e-5, atol=1e-5)


def test_cached_decoding_equals_full_decoder_pass():
    """Self-attention KV cache plus cross-attention keys/values computed once: same logits as a full pass."""
    model = model_of(arch="encoder-decoder")
    src, tgt = torch.randint(0, 13, (2, 7)), torch.randint(0, 13, (2, 9))
    full = model(src, tgt)[0]
    memory = model.encode(src)
    cache = KVCache(model.config, 2)
    steps = [model.decode(tgt[:, :3], memory, cache)] + [model.decode(tgt[:, t:t + 1], memory, cache)
                                                         for t in range(3, 9)]
    assert len(memory.kv) == model.config.n_layer  # one k/v projection per layer for the whole decode
    torch.testing.assert_close(torch.cat(steps, dim=1), full[:, 2:], rtol=1e-5, atol=1e-5)


def test_encoder_decoder_loss_counts_only_masked_positions():
    model = model_of(arch="encoder-decoder")
    src, tgt, targets = (torch.randint(0, 13, (2, n)) for n in (5, 6, 6))
    mask = torch.ones(2, 6, dtype=torch.bool)
    mask[1, 3:] = False
    logits, loss = model(src, tgt, targets, loss_mask=mask)
    per = F.cross_entropy(logits.reshape(-1, 13), targets.reshape(-1), reduction="none")
    torch.testing.assert_close(loss, per[mask.reshape(-1)].mean())


def test_encoder_decoder_shares_one_embedding_and_head():
    """Source and target share one vocabulary, so one embedding serves the encoder, the decoder and (tied) the
    output head; --n-enc-layer sizes the encoder."""
    model = model_of(arch="encoder-decoder", n_enc_layer=3)
    assert len(model.enc) == 3 and len(model.h) == 2
    assert model.lm_head.weight is model.wte.weight
