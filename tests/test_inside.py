"""Looking inside a model: the attention hook against the plain forward, and surprise against a direct
computation of -log2 p(character | what came before)."""

import math

import pytest
import torch

from chargpt.config import ModelConfig
from chargpt.data.tokenizer import Vocab
from chargpt.model.inside import look_inside, next_char_logprobs
from chargpt.model.transformer import CharGPT
from chargpt.sampling.engine import Generator

VOCAB = Vocab("\n abcdefghijklmnopqrstuvwxyz")


def model(block_size=16, seed=0):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=len(VOCAB), block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0)
    m = CharGPT(cfg).eval()
    with torch.no_grad():
        m.wte.weight.mul_(10)  # sharper attention and predictions than the 0.02-std init gives
    return m


@pytest.mark.parametrize("kernel", ["auto", "fused", "manual"])
def test_attention_hook_is_causal_and_normalised(kernel):
    """The hook returns one (B, nh, T, T) map per layer: zero above the diagonal (the causal mask), rows
    summing to 1; and asking for it does not change the logits."""
    m = model()
    m.set_attention(kernel)
    idx = torch.randint(len(VOCAB), (3, 16), generator=torch.Generator().manual_seed(1))
    weights = []
    with torch.no_grad():
        logits, _ = m(idx, attn_weights=weights)
        plain, _ = m(idx)
    assert len(weights) == 2 and all(w.shape == (3, 2, 16, 16) for w in weights)
    for w in weights:
        assert torch.all(w.triu(diagonal=1) == 0)
        torch.testing.assert_close(w.sum(-1), torch.ones(3, 2, 16))
        assert torch.all(w[..., 0, 0] == 1)  # the first character can only look at itself
    torch.testing.assert_close(logits, plain, rtol=1e-5, atol=1e-5)


def direct_bits(m, ids, i):
    """Surprise of character i from the longest context that ends just before it (at most block_size)."""
    ctx = ids[max(0, i - m.config.block_size):i]
    with torch.no_grad():
        logp = torch.log_softmax(m(ctx[None])[0][0, -1], dim=-1)
    return -logp[ids[i]].item() / math.log(2)


def test_surprise_within_one_window_is_the_loss_in_bits():
    m = model()
    text = "to be or not to"
    view = look_inside(Generator(m, VOCAB, "cpu"), text, top=3)
    ids = torch.tensor(VOCAB.encode(text))
    assert view.bits[0] is None and len(view.bits) == len(text)
    for i in range(1, len(text)):
        assert view.bits[i] == pytest.approx(direct_bits(m, ids, i), abs=1e-4)
    # the mean surprise is the model's cross-entropy on the text, in bits
    with torch.no_grad():
        _, loss = m(ids[None, :-1], ids[None, 1:])
    assert sum(view.bits[1:]) / (len(text) - 1) == pytest.approx(loss.item() / math.log(2), abs=1e-4)
    assert view.attention.shape == (2, 2, len(text), len(text)) and view.window_start == 0


def test_long_text_uses_overlapping_windows():
    """Past the first window every character is predicted from at least half a window of context, and
    exactly as a direct forward over that context would predict it."""
    m = model(block_size=8)
    text = "the quick brown fox jumps over the lazy dog"
    ids = torch.tensor(VOCAB.encode(text))
    logp = next_char_logprobs(m, ids)
    assert logp.shape == (len(text), len(VOCAB))
    view = look_inside(Generator(m, VOCAB, "cpu"), text)
    for i in range(1, 9):  # the first window: all the context there is
        assert view.bits[i] == pytest.approx(direct_bits(m, ids, i), abs=1e-4)
    with torch.no_grad():
        for i in range(9, len(text)):  # later windows began between 8 and 4 characters back
            candidates = [-torch.log_softmax(m(ids[None, s:i])[0][0, -1], -1)[ids[i]].item() / math.log(2)
                          for s in range(i - 8, i - 3)]
            assert min(abs(view.bits[i] - c) for c in candidates) < 1e-4
    assert view.attention.shape == (2, 2, 8, 8) and view.window_start == len(text) - 8


def test_expected_characters_and_unknown_ones():
    m = model()
    view = look_inside(Generator(m, VOCAB, "cpu"), "caf\u00e9 au lait", top=4)
    assert view.unknown == [3] and view.bits[3] is None  # 'é' is shown, with no surprise of its own
    assert view.expected[0] == [] and len(view.expected) == len("caf\u00e9 au lait") + 1
    for cands in view.expected[1:]:
        probs = [p for _, p in cands]
        assert len(cands) == 4 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    # the most expected character at a position is the argmax of the model there
    ids = torch.tensor(VOCAB.encode("caf", unknown="replace"))
    with torch.no_grad():
        best = m(ids[None])[0][0, -1].argmax().item()
    assert view.expected[3][0][0] == VOCAB.chars[best]


def test_attention_window_can_end_anywhere():
    """end picks the context window: the block_size characters before position end."""
    m = model(block_size=8)
    text = "the quick brown fox jumps"
    gen = Generator(m, VOCAB, "cpu")
    view = look_inside(gen, text, end=12)
    assert view.window_start == 4 and view.attention.shape == (2, 2, 8, 8)
    alone = look_inside(gen, text[4:12])  # the same eight characters on their own: the same attention
    torch.testing.assert_close(view.attention, alone.attention)
    assert look_inside(gen, text, end=3).attention.shape == (2, 2, 3, 3)
    with pytest.raises(ValueError):
        look_inside(gen, text, end=len(text) + 1)
