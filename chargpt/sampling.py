"""Decoding: next-character choice (a pure function with an explicit RNG), the decode loop with a KV cache,
stop strings, and the small Python API.

    import chargpt
    gen = chargpt.load("checkpoints/tinyshakespeare")
    print(gen.generate("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1)[0])

Long generations: the model has learned absolute positions 0 .. block_size-1, so a cache cannot slide.
When the window is full, the cache is rebuilt (one prefill) from the last `keep` characters (3/4 of
block_size by default) and decoding goes on; one prefill every block_size/4 characters keeps the cost near
one position per character. Within block_size total characters, cached decoding is exactly the uncached
reference (full forward over the window every step), which is kept for tests and benchmarks.
"""

from dataclasses import asdict, dataclass, field

import torch

from .errors import ChargptError
from .model import KVCache
from .runtime import autocast


@dataclass
class SampleSettings:
    max_new_tokens: int = 500
    temperature: float = 0.8
    top_k: int | None = None
    top_p: float | None = None
    stop: tuple = field(default_factory=tuple)

    def validate(self):
        if self.temperature < 0:
            raise ChargptError(f"--temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ChargptError(f"--top-k must be >= 0 (0 or none disables it), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ChargptError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ChargptError(f"--max-new-tokens must be >= 0, got {self.max_new_tokens}")
        if any(not s for s in self.stop):
            raise ChargptError("--stop needs a non-empty string")
        return self


def sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None):
    """logits (B, V) -> next ids (B,). Temperature 0 is argmax; top_k is clamped to V; top_p keeps the
    smallest set of most likely characters whose probability reaches top_p. Randomness comes only from
    `generator` (a CPU torch.Generator): one uniform number per row, mapped through the cumulative
    distribution, so the same seed gives the same text on any device."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p is not None and top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p  # mass before this one already reached top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    u = torch.rand(probs.size(0), 1, generator=generator).to(probs.device)  # (B, 1)
    cdf = probs.cumsum(dim=-1)
    ids = (cdf <= u * cdf[:, -1:]).sum(dim=-1)
    return ids.clamp_(max=probs.size(-1) - 1)


@torch.no_grad()
def decode(model, ctx, settings, generator, use_cache=True, keep=None, dtype=torch.float32):
    """Yield the next ids (B,) one step at a time, continuing ctx (B, T) ids.

    use_cache=False is the reference: a full forward over the last block_size characters every step."""
    block = model.config.block_size
    keep = keep or max(1, (3 * block) // 4)
    device = ctx.device
    cache = KVCache(model.config, ctx.size(0), device=device, dtype=dtype) if use_cache else None
    seq = ctx

    def forward(window):
        with autocast(device, dtype):
            return model(window, cache=cache)[0][:, -1, :]  # (B, V)

    logits = forward(seq[:, -block:])
    for step in range(settings.max_new_tokens):
        nxt = sample_next(logits, generator, settings.temperature, settings.top_k, settings.top_p)  # (B,)
        yield nxt
        if step + 1 == settings.max_new_tokens:
            return
        seq = torch.cat([seq, nxt[:, None]], dim=1)
        if cache is None:
            logits = forward(seq[:, -block:])
        elif cache.pos < block:
            logits = forward(nxt[:, None])
        else:  # window full: rebuild the cache from the last `keep` characters
            cache.reset()
            logits = forward(seq[:, -keep:])


class StopFilter:
    """Cuts one stream at the first stop string, which may begin inside the prompt. Text is released only
    once it can no longer be the start of a stop string, so nothing printed ever needs taking back."""

    def __init__(self, prompt, stops):
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.prompt_tail = prompt[-self.hold:] if self.hold else ""
        self.text, self.released, self.done = "", 0, False

    def feed(self, chars):
        """Add generated characters; -> the newly releasable text."""
        if self.done:
            return ""
        self.text += chars
        if self.stops:
            window = self.prompt_tail + self.text
            hits = [window.find(s) for s in self.stops]
            hits = [h for h in hits if h >= 0]
            if hits:
                self.done = True
                self.text = self.text[:max(0, min(hits) - len(self.prompt_tail))]
                return self.flush()
        end = max(self.released, len(self.text) - self.hold)
        out, self.released = self.text[self.released:end], end
        return out

    def flush(self):
        out, self.released = self.text[self.released:], len(self.text)
        return out


class Generator:
    """A loaded model and its vocabulary, ready to write text. Build it with chargpt.load(path)."""

    def __init__(self, model, vocab, device, dtype=torch.float32, meta=None):
        self.model, self.vocab, self.device, self.dtype, self.meta = model.eval(), vocab, device, dtype, meta or {}

    def start_text(self):
        """What an empty prompt conditions on: a newline (as if a new paragraph started), else a space."""
        for c in ("\n", " "):
            if c in self.vocab.stoi:
                return c
        return self.vocab.chars[0]

    def prompt_text(self, prompt, unknown="error"):
        """The prompt as the model will see it (after the unknown-character policy); raises for 'error'."""
        return self.vocab.decode(self.vocab.encode(prompt, unknown=unknown))

    def stream(self, prompt="", num_samples=1, seed=None, unknown="error", use_cache=True, **settings):
        """Yield (sample index, text) pieces as they are decoded. All samples decode together in one batch."""
        settings = SampleSettings(**settings).validate()
        prompt_seen = self.prompt_text(prompt, unknown)
        ids = self.vocab.encode(prompt_seen or self.start_text())
        generator = torch.Generator().manual_seed(seed if seed is not None else torch.seed() % 2**63)
        ctx = torch.tensor([ids] * num_samples, dtype=torch.long, device=self.device)  # (B, T)
        filters = [StopFilter(prompt_seen, settings.stop) for _ in range(num_samples)]
        for nxt in decode(self.model, ctx, settings, generator, use_cache=use_cache, dtype=self.dtype):
            for i, c in enumerate(nxt.tolist()):
                piece = filters[i].feed(self.vocab.chars[c])
                if piece:
                    yield i, piece
            if all(f.done for f in filters):
                return
        for i, f in enumerate(filters):
            piece = f.flush()
            if piece:
                yield i, piece

    def generate(self, prompt="", num_samples=1, **kw):
        """-> list of the generated texts (prompt not included), one per sample."""
        out = [""] * num_samples
        for i, piece in self.stream(prompt, num_samples=num_samples, **kw):
            out[i] += piece
        return out

    def settings_dict(self, **settings):
        return asdict(SampleSettings(**settings))


def load(path, device="auto", dtype="auto"):
    """Checkpoint file or run directory -> Generator."""
    from .checkpoint import load_model
    from .runtime import pick_device
    device = pick_device(device)
    # bf16 decoding only on CUDA: on CPU the per-step work is tiny and fp32 keeps results exact
    torch_dtype = torch.bfloat16 if dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported() \
        else {"auto": torch.float32, "float32": torch.float32, "bfloat16": torch.bfloat16}.get(dtype)
    if torch_dtype is None:
        raise ChargptError(f"--dtype for sampling must be auto, float32 or bfloat16 (got {dtype!r})")
    model, vocab, meta = load_model(path, device)
    return Generator(model, vocab, device, torch_dtype, meta)
