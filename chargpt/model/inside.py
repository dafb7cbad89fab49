"""Look inside a model: how surprised it is by each character of a text, what it expected instead, and what
each attention head looks at. One forward pass per context window, on the model's explicit-softmax path.

    from chargpt import load
    from chargpt.model.inside import look_inside
    view = look_inside(load("checkpoints/shakespeare"), "ROMEO: O, she doth teach the torches")
    view.bits[7], view.expected[7], view.attention.shape    # 2.1, [('e', 0.41), ...], (L, nh, W, W)

Surprise is the loss in bits, -log2 p(character | the characters before it). The first character has nothing
before it, so it has no surprise. Texts longer than the context window are scored with overlapping windows
(stride half a window), so every character after the first window is predicted from at least half a window
of context. Attention is shown for one window, the block_size characters the model can see at once: by
default the last one, or the one ending at a chosen position.

Characters the model never saw are shown, not refused: they are replaced in the context by the vocabulary's
stand-in (as sample.py's --unknown replace does) and get no surprise of their own.
"""

import math
from dataclasses import dataclass

import torch
from torch.nn import functional as F

from chargpt.errors import ChargptError
from chargpt.runtime import autocast

LN2 = math.log(2)


@dataclass
class Inside:
    text: str  # the text as given (unknown characters included)
    bits: list  # len N: surprise of each character in bits; None for the first and for unknown characters
    expected: list  # len N + 1: [(char, probability)] the model expected at each position; [0] is [], [N] is after
    unknown: list  # positions of characters outside the vocabulary
    attention: torch.Tensor  # (L, nh, W, W) float32 weights over the last W = min(N, block_size) characters
    window_start: int  # position in text of the attention window's first character


@torch.no_grad()
def next_char_logprobs(model, ids, dtype=torch.float32):
    """ids (N,) -> (N, V) float32 log-probabilities of the character after each position, each from the
    longest context the strided windows give it."""
    block, N = model.config.block_size, ids.numel()
    stride = max(1, block // 2)
    out = torch.empty(N, model.config.vocab_size)
    done = 0  # positions whose prediction is in `out`
    while done < N:
        end = min(N, done + stride) if done else min(N, block)
        start = max(0, end - block)
        with autocast(ids.device, dtype):
            logits = model(ids[None, start:end])[0][0]  # (end - start, V)
        out[done:end] = F.log_softmax(logits[done - start:].float(), dim=-1).cpu()
        done = end
    return out


@torch.no_grad()
def attention_maps(model, ids, dtype=torch.float32):
    """ids (N,) -> (L, nh, W, W) attention weights of every layer and head over the last W ids (W <= block)."""
    window = ids[-model.config.block_size:]
    weights = []  # one (1, nh, W, W) per layer, filled by the model's inspection hook
    with autocast(ids.device, dtype):
        model(window[None], attn_weights=weights)
    return torch.cat(weights).float().cpu()  # (L, nh, W, W)


def look_inside(gen, text, top=5, end=None):
    """A chargpt Generator and a non-empty text -> Inside (surprise, expectations, and the attention of the
    window that ends just before position `end`, by default the end of the text)."""
    if gen.model.config.arch != "decoder":
        raise ChargptError("look_inside shows decoder-only models; this one is an encoder-decoder")
    end = len(text) if end is None else end
    if not text or not 0 < end <= len(text):
        raise ValueError(f"look_inside needs a non-empty text and 0 < end <= its length (got {end})")
    vocab, device = gen.vocab, gen.device
    ids = torch.tensor(vocab.encode(text, unknown="replace"), dtype=torch.long, device=device)
    logp = next_char_logprobs(gen.model, ids, gen.dtype)  # (N, V): row i predicts character i + 1
    unknown = [i for i, _ in vocab.unknown(text)]
    target = ids[1:].cpu()
    bits = [None] + (-logp[:-1].gather(1, target[:, None])[:, 0] / LN2).tolist()
    for i in unknown:
        bits[i] = None
    reserved = [vocab.stoi[c] for c in gen.reserved() if c in vocab.stoi]  # a labelled run's labels: never written
    shown = logp.index_fill(1, torch.tensor(reserved, dtype=torch.long, device=logp.device), float("-inf")) \
        if reserved else logp
    probs, idx = shown.exp().topk(min(top, len(vocab) - len(reserved)), dim=-1)  # (N, top)
    expected = [[]] + [[(vocab.chars[j], round(p, 4)) for j, p in zip(row_i, row_p)]
                       for row_i, row_p in zip(idx.tolist(), probs.tolist())]
    attention = attention_maps(gen.model, ids[:end], gen.dtype)
    return Inside(text, bits, expected, unknown, attention, end - attention.size(-1))
