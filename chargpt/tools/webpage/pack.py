"""The model as the page holds it: one byte string of weights and a JSON description of where each tensor lies.

    blob, tensors = pack_weights(model, "int8")      # bytes, {name: {"dtype", "shape", "offset"[, "scale"]}}
    reference = dequantized(model, blob, tensors)     # the CharGPT those bytes describe: what the page must compute

Tensors keep chargpt's state-dict names (the head is absent when tied: the page reuses the token embedding), and
the position table is "wpe.weight" whether it was learned or is chargpt's sinusoidal table (stored whole, as the
Hugging Face export does). float32: little-endian, as they are. int8: every matrix (the Linear weights and both
embeddings) symmetric per row, round(w / s) in -127 .. 127 with s = max|row| / 127 as float32, one scale per output
row (per token and per position for the embeddings); LayerNorms and biases stay float32. Each tensor starts at a
multiple of 4 bytes, so the page reads it through a typed-array view without copying.
"""

import copy
import math

import numpy as np
import torch


def page_tensors(model):
    """{name: float32 tensor} the page needs, in the order they are stored."""
    cfg, sd = model.config, model.state_dict()
    out = {"wte.weight": sd["wte.weight"], "wpe.weight": sd["wpe.weight"] if cfg.pos_emb == "learned" else model.pe}
    if cfg.softmax == "adaptive":  # its layers and the text's counts, from which the page ranks the characters
        out.update((k, v) for k, v in sd.items() if k.startswith("lm_head."))
    elif not cfg.tie_weights:
        out["lm_head.weight"] = sd["lm_head.weight"]
    out.update((k, v) for k, v in sd.items() if k.startswith(("h.", "ln_f.")))
    return {k: v.detach().float().cpu().contiguous() for k, v in out.items()}


def quantize_rows(w):
    """(rows, cols) float32 -> (int8 values, float32 scale per row): symmetric, the largest |value| of a row -> 127."""
    scale = (w.abs().amax(dim=1) / 127).clamp(min=1e-12)  # (rows,); an all-zero row keeps a harmless scale
    return torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8), scale


def pack_weights(model, weights="float32"):
    """-> (blob bytes, {name: {"dtype", "shape", "offset"[, "scale"]}}): offsets in bytes into blob."""
    parts, table, size = [], {}, 0

    def put(array):
        nonlocal size
        data = np.ascontiguousarray(array).tobytes()
        pad = -len(data) % 4
        parts.append(data + b"\0" * pad)
        at, size = size, size + len(data) + pad
        return at

    for name, t in page_tensors(model).items():
        entry = {"shape": list(t.shape)}
        if weights == "int8" and t.dim() == 2:
            q, scale = quantize_rows(t)
            entry.update(dtype="int8", offset=put(q.numpy()), scale=put(scale.numpy().astype("<f4")))
        else:
            entry.update(dtype="float32", offset=put(t.numpy().astype("<f4")))
        table[name] = entry
    return b"".join(parts), table


def read_weights(blob, tensors):
    """The inverse of pack_weights: -> {name: float32 tensor}, int8 ones dequantized (q x scale, in float32)."""
    out = {}
    for name, t in tensors.items():
        n = math.prod(t["shape"])
        if t["dtype"] == "int8":
            q = np.frombuffer(blob, np.int8, n, t["offset"]).reshape(t["shape"])
            scale = np.frombuffer(blob, "<f4", t["shape"][0], t["scale"])
            out[name] = torch.from_numpy(q.astype(np.float32) * scale[:, None])
        else:
            out[name] = torch.from_numpy(np.frombuffer(blob, "<f4", n, t["offset"]).astype(np.float32)
                                         .reshape(t["shape"]))
    return out


@torch.no_grad()
def dequantized(model, blob, tensors):
    """A float32 copy of `model` holding the weights as the page has them (int8 ones dequantized): the model the
    page must compute, and whose loss int8 is charged."""
    ref = copy.deepcopy(model).float().eval()
    sd = ref.state_dict(keep_vars=True)
    for name, t in read_weights(blob, tensors).items():
        target = ref.pe if name == "wpe.weight" and ref.config.pos_emb != "learned" else sd[name]
        target.copy_(t)  # a tied head is the token embedding's Parameter: set with it
    return ref
