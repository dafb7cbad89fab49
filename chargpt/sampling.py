"""Decoding: next-character choice (a pure function with an explicit RNG), the decode loop with a KV cache,
stop strings, and the small Python API.

    import chargpt
    gen = chargpt.load("checkpoints/tinyshakespeare")
    print(gen.generate("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1)[0])

KV cache: the prompt is processed once (prefill), then each new character costs one position per layer. All
samples of a call decode together as one batch (B streams, one forward pass per step).

Long generations: the model has learned absolute positions 0 .. block_size-1, so a cache cannot slide.
When the window is full, the cache is rebuilt (one prefill) from the last `keep` characters (3/4 of
block_size by default) and decoding goes on; one prefill every block_size/4 characters keeps the cost near
one position per character. Within block_size total characters (prompt + generated), cached decoding gives
exactly the characters of the uncached reference (a full forward over the last block_size characters every
step), which is kept for tests and benchmarks. Past that point the two condition on different windows.
"""


import torch

from .config import SampleSettings, check_sample_options, param
from .errors import ChargptError
from .model import KVCache
from .runtime import autocast
from .tokenizer import describe_chars


def sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None):
    """logits (B, V) -> next ids (B,). Temperature 0 is argmax; top_k is clamped to V (0 or None: off); top_p
    keeps the smallest set of most likely characters whose probability reaches top_p (applied after top_k).
    Randomness comes only from `generator` (a CPU torch.Generator): one uniform number per row, mapped
    through the cumulative distribution, so the same seed gives the same draws on any device (the text is
    the same wherever the logits are)."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float()
    logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature  # max first: no inf - inf at tiny T
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]  # (B, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)  # (B, V)
    if top_p is not None and top_p < 1:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        drop = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p  # mass before this one already reached top_p
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    u = torch.rand(probs.size(0), 1, generator=generator).to(probs.device)  # (B, 1), in [0, 1)
    cdf = probs.cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]  # ends at exactly 1 > u, so a zero-probability character is never picked
    return (cdf <= u).sum(dim=-1)  # (B,): the first index whose cdf exceeds u


@torch.no_grad()
def decode(model, ctx, settings, generator, use_cache=True, keep=None, dtype=torch.float32):
    """Yield the next ids (B,) one step at a time, continuing ctx (B, T) ids.

    use_cache=False is the reference: a full forward over the last block_size characters every step.
    keep: characters the cache is rebuilt from when the window is full [default: 3/4 of block_size]."""
    if settings.max_new_tokens == 0:
        return
    block = model.config.block_size
    keep = keep or max(1, (3 * block) // 4)
    if not 0 < keep <= block:
        raise ValueError(f"keep must be in 1 .. block_size ({block}), got {keep}")
    device = ctx.device
    cache = KVCache(model.config, ctx.size(0), device=device, dtype=dtype) if use_cache else None
    seq = ctx

    def forward(window):
        with autocast(device, dtype):
            return model(window, cache=cache)[0][:, -1, :]  # (B, V)

    logits = forward(seq[:, -block:])  # prefill (with a cache) or the first full forward
    for step in range(settings.max_new_tokens):
        nxt = sample_next(logits, generator, settings.temperature, settings.top_k, settings.top_p)  # (B,)
        yield nxt
        if step + 1 == settings.max_new_tokens:
            return
        seq = torch.cat([seq[:, max(0, seq.size(1) - block + 1):], nxt[:, None]], dim=1)  # (B, <= block)
        if cache is None:
            logits = forward(seq)  # already trimmed to the last block_size characters
        elif cache.pos < block:
            logits = forward(nxt[:, None])  # one new position per layer
        else:  # window full: rebuild the cache from the last `keep` characters
            cache.reset()
            logits = forward(seq[:, -keep:])


class StopFilter:
    """Cuts one stream at the first stop string it produces; the stop string may begin inside the prompt
    (but must end in generated text). Text is released only once it can no longer be the start of a stop
    string, so nothing released ever needs taking back. Work per character is bounded by the longest stop
    string, however long the generation."""

    def __init__(self, prompt, stops):
        self.stops = tuple(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.before = prompt[-self.hold:] if self.hold else ""  # released context a stop string may begin in
        self.pending, self.done = "", False  # generated text not yet released

    def feed(self, chars):
        """Add generated characters; -> the newly releasable text."""
        if self.done:
            return ""
        checked = len(self.pending)
        self.pending += chars
        cut = self._first_stop(checked) if self.stops else None
        if cut is not None:
            self.done = True
            self.pending = self.pending[:cut]
            return self.flush()
        release = len(self.pending) - self.hold
        if release <= 0:
            return ""
        out, self.pending = self.pending[:release], self.pending[release:]
        self.before = (self.before + out)[-self.hold:] if self.hold else ""
        return out

    def _first_stop(self, checked):
        """Where to cut `pending` for the stop string that completes first after its first `checked`
        characters (the longest one if several complete together), or None."""
        window = self.before + self.pending
        first = None  # (end, start) in window
        for s in self.stops:
            i = window.find(s, max(0, len(self.before) + checked + 1 - len(s)))  # must end in new text
            if i >= 0 and (first is None or (i + len(s), i) < first):
                first = (i + len(s), i)
        return None if first is None else max(0, first[1] - len(self.before))

    def flush(self):
        out, self.pending = self.pending, ""
        return out


def _through_filters(filters, steps):
    """steps: per decoding step, the (sample index, characters) it produced -> (sample index, text) pieces, each
    sample's cut at its first stop string; ends as soon as every sample has stopped."""
    for chosen in steps:
        for i, chars in chosen:
            piece = filters[i].feed(chars)
            if piece:
                yield i, piece
        if all(f.done for f in filters):
            return
    for i, f in enumerate(filters):
        piece = f.flush()
        if piece:
            yield i, piece


class Generator:
    """A loaded model and its vocabulary, ready to write text. Build it with chargpt.load(path).

    A model trained on sentence pairs (task 'pairs', either architecture) answers a prompt with its translation:
    the prompt is the source, and the text written is the target alone (see stream)."""

    def __init__(self, model, vocab, device, dtype=torch.float32, meta=None):
        from .checkpoint import unwrap  # decode with the plain module: no DDP sync, no recompiles per length
        self.model, self.vocab, self.device, self.dtype = unwrap(model).eval(), vocab, torch.device(device), dtype
        self.meta = meta or {}
        self.task = self.meta.get("task", "text")
        self.precision = str(dtype).removeprefix("torch.")  # what the model computes in, in words (load says more)

    def start_text(self):
        """What an empty prompt conditions on: a newline (as if a new paragraph started), else a space."""
        for c in ("\n", " "):
            if c in self.vocab.stoi:
                return c
        return self.vocab.chars[0]

    def prompt_text(self, prompt, unknown="error"):
        """The prompt as the model will see it after the unknown-character policy: 'error' raises naming
        each unknown character and its position, 'skip' drops them, 'replace' maps them to the first of
        U+FFFD, '?' or a space that the vocabulary has (else its first character)."""
        return self.vocab.decode(self.vocab.encode(prompt, unknown=unknown))

    def unknown_warning(self, prompt, unknown):
        """One line for stderr saying what 'skip' or 'replace' did to the prompt, or '' if nothing."""
        found = self.vocab.unknown(prompt)
        if not found or unknown == "error":
            return ""
        what = "dropped" if unknown == "skip" else f"replaced with {self.vocab.replacement()!r}"
        return f"{len(found)} prompt character(s) the model never saw were {what}: {describe_chars(found)}"

    def stream(self, prompt="", *, max_new_tokens=SampleSettings.max_new_tokens,
               temperature=SampleSettings.temperature, top_k=None, top_p=None, stop=(), num_samples=1, seed=None,
               unknown="error", use_cache=True):
        """Yield (sample index, text) pieces as they are decoded; the options are sample.py's flags. All
        samples decode together in one batch, so `seed` with the same `num_samples` reproduces them. For a
        pairs model the prompt is a source and the pieces are its translation (see _stream_pairs)."""
        settings = SampleSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                                  stop=stop).validate()
        check_sample_options(num_samples, seed)
        prompt_seen = self.prompt_text(prompt, unknown)
        generator = torch.Generator()  # its own RNG: sampling never touches torch's global one
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(seed)
        if self.task == "pairs":
            yield from self._stream_pairs(prompt_seen, settings, num_samples, generator, use_cache)
            return
        ids = self.vocab.encode(prompt_seen or self.start_text())
        ctx = torch.tensor([ids] * num_samples, dtype=torch.long, device=self.device)  # (B, T)
        filters = [StopFilter(prompt_seen, settings.stop) for _ in range(num_samples)]
        steps = decode(self.model, ctx, settings, generator, use_cache=use_cache, dtype=self.dtype)
        yield from _through_filters(filters, ([(i, self.vocab.chars[c]) for i, c in enumerate(nxt.tolist())]
                                              for nxt in steps))

    def _stream_pairs(self, source, settings, num_samples, generator, use_cache):
        """A pairs model continues `source SEP` (or encodes the source) and stops at the end marker: the pieces are
        the target alone, decoded as `chargpt translate` does (its greedy or sampled search, one character per
        step), at most the context's worth or max_new_tokens."""
        from .pairs import END, SEP
        from .translate import iter_sample_search, make_steps, source_ids
        if not source:
            raise ChargptError(f"this model was trained on sentence pairs: its prompt is the sentence to translate; "
                               f"give {param('prompt')} some text")
        ids = source_ids(self.model, self.vocab, [source], name="the prompt")
        step, room = make_steps(self.model, self.vocab, ids * num_samples, use_cache, self.dtype)
        filters = [StopFilter("", settings.stop) for _ in range(num_samples)]
        found = iter_sample_search(step, num_samples, self.vocab.stoi[END], min(room, settings.max_new_tokens),
                                   generator, settings.temperature, settings.top_k, settings.top_p)
        yield from _through_filters(filters, ([(i, self.vocab.chars[tok].replace(SEP, "")) for i, tok in chosen]
                                              for chosen in (found if settings.max_new_tokens else ())))

    def translate(self, sources, **options):
        """Source strings -> their translations, for a pairs model; options as chargpt.translate.translate
        (beam, alpha, temperature, top_k, top_p, generator, unknown, batch_size, max_len, use_cache)."""
        from .translate import translate
        if self.task != "pairs":
            raise ChargptError("this model was trained on plain text, not sentence pairs, so it does not translate; "
                               "write with it instead (sample.py), or train one with --task pairs")
        return translate(self.model, self.vocab, list(sources), dtype=self.dtype, **options)

    def generate(self, prompt="", **options):
        """-> list of the generated texts (prompt not included), one per sample. Options as for stream()."""
        out = [""] * options.get("num_samples", 1)
        for i, piece in self.stream(prompt, **options):
            out[i] += piece
        return out


def load(path, device="auto", dtype="auto", quantize=None):
    """Checkpoint file or run directory -> Generator. dtype: auto (bf16 where the device computes it natively,
    else float32: runtime.pick_decode_dtype), float32 or bfloat16; quantize='int8': int8 weights for decoding on
    a CPU (chargpt.quantize)."""
    from .checkpoint import load_model
    from .quantize import check_precision, inference_model
    from .runtime import pick_device
    device = pick_device(device)
    check_precision(device, dtype, quantize)  # a bad choice fails before the checkpoint is read
    model, vocab, meta = load_model(path, device)
    model, torch_dtype, precision = inference_model(model, device, dtype, quantize)
    gen = Generator(model, vocab, device, torch_dtype, meta)
    gen.precision = precision
    return gen
