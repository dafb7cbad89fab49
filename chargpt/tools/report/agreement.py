"""What a precision, an export or another run changes: KL divergence of its next-character distribution from the
float32 model's and top-1 agreement, on the run's validation windows, and how fast it writes.

    chargpt eval --against int8            # bf16, int8, hf (the Hugging Face export) or another run: RUN2
    compare(reference, other, windows)     # -> {"kl": nats per character, "agreement": share, "positions": n}

KL(p || q) = sum_c p(c) (log p(c) - log q(c)) at every position of every window, averaged (llama.cpp's perplexity
--kl-divergence reports the same against the unquantised model): the extra loss, in nats per character, that q costs
on text drawn from p. Top-1 agreement is the share of positions where both put the same character first.
"""

import copy
import time
from pathlib import Path

import numpy as np
import torch

from chargpt.errors import ChargptError
from chargpt.model.quantize import inference_model, uses_dynamic_int8
from chargpt.runs.checkpoint import load_model
from chargpt.runtime import autocast
from chargpt.sampling.engine import Generator

AGREE_WINDOWS = 32  # validation windows compared (of the context's length): 4,096 positions at context 128
AGREE_BATCH = 8  # windows per forward pass
DECODE_CHARS = 200  # characters written (batch 1, timed) for the decode speed
PRECISIONS = ("bf16", "int8", "hf")  # what --against takes besides a run
NAMES = {"bf16": "bfloat16", "int8": "int8", "hf": "Hugging Face export"}
WEB_PAGE_NOTE = ("not measured: the page decodes in JavaScript in a browser (chargpt export --format web); its "
                 "export check compares its logits with chargpt's")


class Candidate:
    """A model to compare with the float32 one: `logits(ids (B, L)) -> (B, L, V) float32`, and `decode(n) -> seconds`
    for writing n characters at batch 1, or None where that is not measured. `what`: how it computes, in words;
    `block_size`: the longest window it reads."""

    def __init__(self, name, what, logits, decode, block_size):
        self.name, self.what, self.logits, self.decode, self.block_size = name, what, logits, decode, block_size


def chargpt_candidate(name, model, vocab, meta, device, dtype, what):
    """A chargpt model (float32, bf16 or int8 weights) computing under `dtype`."""
    @torch.no_grad()
    def logits(ids):
        with autocast(device, dtype):
            return model(ids.to(device))[0].float()

    def decode(n):
        gen = Generator(model, vocab, device, dtype, meta, compile="off", quantized=uses_dynamic_int8(model))
        t0 = time.perf_counter()
        gen.generate("", max_new_tokens=n, temperature=1.0, seed=0)
        return time.perf_counter() - t0
    return Candidate(name, what, logits, decode, model.config.block_size)


def hf_candidate(model, vocab, meta, device):
    """The Hugging Face export (chargpt/tools/export.py), built in memory as the export writes it."""
    from chargpt.tools.export import hf_model
    hf = hf_model(model, vocab, meta).to(device)

    @torch.no_grad()
    def logits(ids):
        return hf(ids.to(device)).logits.float()

    @torch.no_grad()
    def decode(n):
        start = torch.zeros(1, 1, dtype=torch.long, device=device)
        t0 = time.perf_counter()
        hf.generate(start, max_new_tokens=n, min_new_tokens=n, do_sample=True, top_k=0, pad_token_id=0)
        return time.perf_counter() - t0
    return Candidate("Hugging Face export", "transformers' GPT2LMHeadModel, float32; transformers' generate",
                     logits, decode, model.config.block_size)


def candidate(kind, model, vocab, meta, device):
    """'bf16', 'int8', 'hf' or a run (directory or checkpoint) -> Candidate. Refused with one line where it cannot
    run here (int8 on a GPU, the export without transformers or for a model GPT-2 cannot express)."""
    if kind == "bf16":
        m, dtype, what = inference_model(copy.deepcopy(model), device, "bfloat16")
        return chargpt_candidate("bfloat16", m, vocab, meta, device, dtype, what)
    if kind == "int8":
        m, dtype, what = inference_model(model, device, "float32", "int8")  # a quantised copy
        return chargpt_candidate("int8", m, vocab, meta, device, dtype, what)
    if kind == "hf":
        return hf_candidate(model, vocab, meta, device)
    if not Path(kind).expanduser().exists():
        raise ChargptError(f"--against {kind}: not bf16, int8, hf, nor a run (no such file or folder); name one of "
                           f"them")
    other, other_vocab, other_meta = load_model(kind, device)
    if other_vocab != vocab:
        raise ChargptError(f"{kind} has another vocabulary ({len(other_vocab):,} characters against "
                           f"{len(vocab):,}), so their next-character distributions do not compare; compare runs "
                           f"trained on the same text")
    if other_meta["task"] != "text":
        raise ChargptError(f"{kind} was trained on sentence pairs; --against compares text models")
    return chargpt_candidate(str(kind), other, vocab, other_meta, device, torch.float32, "float32")


def reference(model, vocab, meta, device):
    return chargpt_candidate("float32", model, vocab, meta, device, torch.float32, "float32 (the reference)")


def windows_of(pieces, length, most=AGREE_WINDOWS):
    """Validation pieces (id arrays) -> (n, L) int64: up to `most` windows of L = min(length, the longest piece)
    characters, none crossing a piece's end, spread evenly over all there are."""
    length = min(length, max((len(p) for p in pieces), default=0))
    if length < 1:
        raise ChargptError("the validation text is empty, so there is nothing to compare on")
    starts = [(k, s) for k, p in enumerate(pieces) for s in range(0, len(p) - length + 1, length)]
    chosen = np.linspace(0, len(starts) - 1, min(most, len(starts))).round().astype(int)
    rows = [np.asarray(pieces[k][s:s + length], dtype=np.int64) for k, s in (starts[i] for i in chosen)]
    return torch.from_numpy(np.stack(rows))


@torch.no_grad()
def compare(ref, other, windows, batch=AGREE_BATCH):
    """Candidate `other` against `ref` on (n, L) windows -> {"kl": mean KL(ref || other) in nats per character,
    "agreement": share of positions with the same most likely character, "positions": positions compared}."""
    kl = agree = 0.0
    for i in range(0, len(windows), batch):
        ids = windows[i:i + batch]
        logp = torch.log_softmax(ref.logits(ids), -1).cpu()  # (B, L, V)
        logq = torch.log_softmax(other.logits(ids), -1).cpu()
        kl += (logp.exp() * (logp - logq)).sum(-1).double().sum().item()
        agree += (logp.argmax(-1) == logq.argmax(-1)).sum().item()
    n = windows.numel()
    return {"kl": max(0.0, kl / n), "agreement": agree / n, "positions": n}


def decode_speed(cand, n=DECODE_CHARS):
    """Characters a second `cand` writes at batch 1 (a short first call warms it up), or None where not measured."""
    if cand.decode is None:
        return None
    cand.decode(2)
    return n / cand.decode(n)


def against(model, vocab, meta, device, kinds, pieces, speed=True, strict=True, log=lambda m: None):
    """The float32 model against each of `kinds` (PRECISIONS or runs) on the validation `pieces` -> [row]: name,
    what, kl, agreement, positions, chars_per_s (None: speed=False). A kind that cannot run here is the error it
    raises, or with strict=False a row with a `note` instead."""
    ref = reference(model, vocab, meta, device)
    n = min(DECODE_CHARS, model.config.block_size - 1)  # the export's context bounds what it writes at once
    rows = [{"name": "float32", "what": ref.what, "kl": 0.0, "agreement": 1.0,
             "positions": windows_of(pieces, ref.block_size).numel(),
             "chars_per_s": decode_speed(ref, n) if speed else None}]
    for kind in kinds:
        try:
            cand = candidate(kind, model, vocab, meta, device)
        except ChargptError as e:
            if strict:
                raise
            rows.append({"name": NAMES.get(kind, kind), "note": f"not measured: {e}"})
            continue
        log(f"comparing {cand.name} with float32")
        windows = windows_of(pieces, min(ref.block_size, cand.block_size))
        rows.append({"name": cand.name, "what": cand.what, **compare(ref, cand, windows),
                     "chars_per_s": decode_speed(cand, n) if speed else None})
    return rows
