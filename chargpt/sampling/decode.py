"""Decoding: next-character choice (a pure function with an explicit RNG), the decode loop with a KV cache,
and stop strings. The loaded-model object above these (chargpt.load, Generator) is chargpt/sampling/engine.py.

KV cache: the prompt is processed once (prefill), then each new character costs one position per layer. All
samples of a call decode together as one batch (B streams, one forward pass per step).

Long generations: the model has learned absolute positions 0 .. block_size-1, so a cache cannot slide.
When the window is full, the cache is rebuilt (one prefill) from the last `keep` characters (3/4 of
block_size by default) and decoding goes on; one prefill every block_size/4 characters keeps the cost near
one position per character. Within block_size total characters (prompt + generated), cached decoding gives
exactly the characters of the uncached reference (a full forward over the last block_size characters every
step), which is kept for tests and benchmarks. Past that point the two condition on different windows.

Constraints (--ban, --form, --repetition-penalty, ...: chargpt/sampling/constraints.py) reach the loop as one `steer`
object that changes the logits before each choice and records the choice after it; without one the loop is unchanged.
"""

import torch

from chargpt.data.corpus import share_compile_cache
from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast

# A temperature below this is greedy, as vLLM's (_SAMPLING_EPS): the draw is already the argmax far above it, and
# from about 1e-45 down the divisor is 0 in float32 (0 / 0: NaN everywhere, which would pick id 0 every time)
GREEDY_BELOW = 1e-5


def sample_next(logits, generator, temperature=1.0, top_k=None, top_p=None, min_p=None):
    """logits (B, V) -> next ids (B,). Temperature 0 (or below GREEDY_BELOW) is argmax; top_k is clamped to V (0 or
    None: off); top_p keeps the smallest set of most likely characters whose probability reaches top_p (applied after
    top_k; the most likely always stays); min_p then drops the characters less likely than min_p times the most likely
    one (transformers' MinPLogitsWarper; 0 or None: off). Characters at -inf (a constraint's mask) are never picked.
    Randomness comes only from `generator` (a CPU torch.Generator): one uniform number per row, mapped
    through the cumulative distribution, so the same seed gives the same draws on any device (the text is
    the same wherever the logits are)."""
    if temperature < GREEDY_BELOW:
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
        drop[:, 0] = False  # the most likely always stays (a top_p that is 0 in float32 would drop every one)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p.masked_fill(drop, 0.0))
    if min_p:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
    u = torch.rand(probs.size(0), 1, generator=generator).to(probs.device)  # (B, 1), in [0, 1)
    cdf = probs.cumsum(dim=-1)
    cdf = cdf / cdf[:, -1:]  # ends at exactly 1 > u, so a zero-probability character is never picked
    return (cdf <= u).sum(dim=-1)  # (B,): the first index whose cdf exceeds u


class StepRunner:
    """The decode step after the prefill: CharGPT.decode_step, eager or torch.compile'd. Its shapes never change
    (model.KVCache.write), so a compiled step is compiled once for a model, batch size and dtype and serves every
    position and every later call; torch keeps the compiled code in its on-disk cache (data.share_compile_cache:
    TORCHINDUCTOR_CACHE_DIR, by default under chargpt's cache folder), so another process with the same shapes
    loads it instead of compiling again."""

    def __init__(self, model, compiled=False):
        self.model, self.compiled = model, compiled
        if compiled:
            share_compile_cache()
        self.fn = torch.compile(model.decode_step, fullgraph=True, dynamic=False) if compiled else model.decode_step

    def __call__(self, idx, cache):
        """idx (B, 1) at position cache.pos -> logits (B, V); advances the cache."""
        pos = torch.tensor([cache.pos], device=idx.device)  # a tensor: one compiled step for every position
        logits = self.fn(idx, cache, pos)
        cache.pos += 1
        return logits


@torch.inference_mode()
def decode(model, ctx, settings, generator, use_cache=True, keep=None, dtype=torch.float32, runner=None,
           steer=None, pin=0, extra=None, combine=None, never=None):
    """Yield the next ids (B,) one step at a time, continuing ctx (B, T) ids.

    use_cache=False is the reference: a full forward over the last block_size characters every step.
    keep: characters the cache is rebuilt from when the window is full [default: 3/4 of block_size].
    runner: a StepRunner for the steps after each prefill (None: the model's forward, its shapes growing).
    steer: the constraints (constraints.Steer): steer.logits(logits) -> the logits to choose from, and
    steer.chose(ids) after each choice (before it is yielded), which may return the ids to yield and feed instead.
    Labels (chargpt/data/labels.py): the first `pin` ids of every row stay in the window when it slides (the label the
    model reads first); `extra` ((G - 1) B, T), ctx's rows under other labels (the unconditioned one for guidance,
    the other labels of a mix), decodes beside ctx as one batch of G B rows, and `combine` (heads: guided or mixed)
    makes the B rows' logits the choice is made from; `never` (a long tensor of ids) is never chosen."""
    if settings.max_new_tokens == 0:
        return
    block = model.config.block_size
    keep = keep or max(1, (3 * block) // 4)
    if not 0 < keep <= block:
        raise ValueError(f"keep must be in 1 .. block_size ({block}), got {keep}")
    device, rows = ctx.device, ctx.size(0)
    seq = ctx if extra is None else torch.cat([ctx, extra])
    groups = seq.size(0) // rows
    cache = KVCache(model.config, seq.size(0), device=device, dtype=dtype) if use_cache else None

    def forward(window):
        with autocast(device, dtype):
            return model(window, cache=cache)[0][:, -1, :]  # (B, V)

    def last(seq, n):  # the last n positions, the first `pin` kept in front
        if seq.size(1) <= n or not pin:
            return seq[:, max(0, seq.size(1) - n):]
        return torch.cat([seq[:, :pin], seq[:, seq.size(1) - max(0, n - pin):]], dim=1)

    def mixed(logits):  # (G rows, V) -> (rows, V): guided or mixed, and the `never` ids masked
        return masked(logits if combine is None else combine(logits), never)

    logits = forward(last(seq, block))  # prefill (with a cache) or the first full forward
    min_p = getattr(settings, "min_p", None)
    for step in range(settings.max_new_tokens):
        logits = mixed(logits)
        if steer is not None:
            logits = steer.logits(logits)  # (B, V) float: masked, penalised
        nxt = sample_next(logits, generator, settings.temperature, settings.top_k, settings.top_p, min_p)  # (B,)
        if steer is not None:  # a steer may give back other ids to feed (a pattern's end is no character)
            back = steer.chose(nxt)
            nxt = nxt if back is None else back
        yield nxt
        if step + 1 == settings.max_new_tokens:
            return
        fed = nxt if groups == 1 else nxt.repeat(groups)
        seq = torch.cat([last(seq, block - 1), fed[:, None]], dim=1)  # (B, <= block)
        if cache is None:
            logits = forward(seq)  # already trimmed to the last block_size characters
        elif cache.pos < block and runner is not None:
            with autocast(device, dtype):
                logits = runner(fed[:, None], cache)  # one new position per layer, static shapes
        elif cache.pos < block:
            logits = forward(fed[:, None])  # one new position per layer
        else:  # window full: rebuild the cache from the last `keep` characters
            cache.reset()
            logits = forward(last(seq, keep))


def masked(logits, never):
    """logits (B, V) with the `never` ids (a long tensor, or None) at -inf: a labelled run's label characters."""
    return logits if never is None else logits.float().index_fill(1, never, float("-inf"))


def guided(guidance):
    """Classifier-free guidance as a combine: logits (2B, V), the labelled rows then the same under NULL -> (B, V)
    uncond + guidance * (cond - uncond)."""
    def combine(logits):
        cond, free = logits.float().chunk(2)
        return free + guidance * (cond - free)
    return combine


def mixed_labels(weights):
    """A log-linear mix of labels as a combine: logits (G B, V), one group of B rows per label -> (B, V)
    sum_i w_i log_softmax(logits_i) (weights (G,), summing to 1: a product of experts, renormalised by the sampler)."""
    def combine(logits):
        logp = torch.log_softmax(logits.float(), dim=-1).view(len(weights), -1, logits.size(-1))  # (G, B, V)
        return (weights.to(logp.device)[:, None, None] * logp).sum(0)
    return combine


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

    def end(self):
        """The sample ends here (its form is complete): -> the text still held back."""
        out = "" if self.done else self.flush()
        self.done = True
        return out


def through_filters(filters, steps):
    """steps: per decoding step, the (sample index, characters) it produced -> (sample index, text) pieces, each
    sample's cut at its first stop string; characters None end that sample there. Ends as soon as every sample has
    stopped."""
    for chosen in steps:
        for i, chars in chosen:
            piece = filters[i].end() if chars is None else filters[i].feed(chars)
            if piece:
                yield i, piece
        if all(f.done for f in filters):
            return
    for i, f in enumerate(filters):
        piece = f.flush()
        if piece:
            yield i, piece
