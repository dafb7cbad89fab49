"""Suggestions as a person types: the k likeliest next characters, and the likeliest whole-word completions.

    gen = chargpt.load("checkpoints/tinyshakespeare")
    found = gen.suggest("To be or not to b", k=5, words=3)
    found.chars   # (("e", 0.93), (" ", 0.02), ...): the next character's probability at temperature 1
    found.words   # (Completion(text="e", word="be", p=0.81), ...): what to add, the whole word, its probability

The next characters are the model's softmax at temperature 1 over the text's last window (the distribution a sample
at temperature 1 draws its next character from), with the run's reserved characters (its labels) never offered.

The completions come from a short search ahead: one prefill of the text into a KV cache, then batched steps, each
feeding the kept partial words (at most WIDTH of them) one character further. For alphabetic text a completion runs
to a word boundary (a space, punctuation, a newline: any character that is not a letter, digit, mark or apostrophe),
and its probability is the product of its characters' probabilities and that of a boundary after them (the word ends
there). A partial word already less likely than the words-th best completion found is dropped: a longer one only
loses probability. For CJK text (its last character, or the likeliest next one, is an ideograph: Chinese has no
spaces to end a word) the completions are runs of 2 to 4 ideographs, ranked per character (as beam search ranks
hypotheses of unequal length; the product alone would always prefer the shortest) and reported with the product of
their characters' probabilities. Every part is bounded: k, the completions asked for, a word's length and the steps.
"""

import collections
import math
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

import torch

from chargpt.errors import ConfigError
from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast

MAX_K = 20  # next characters listed
MAX_WORDS = 10  # completions listed
MAX_TEXT_CHARS = 10_000  # the text checked (the model reads only its last window; the rest is checked for unknowns)
MAX_WORD_CHARS = 20  # characters a word completion may add
CJK_LENGTHS = (2, 3, 4)  # ideographs in a CJK completion
WIDTH = 16  # partial words kept per step: the batch of each step (the step budget is WIDTH x the longest completion)
WORD_MARKS = "'’"  # inside a word (don't, o’er), not a boundary


@dataclass(frozen=True)
class Query:
    """What to suggest for: the text typed so far, how many next characters (k) and completions (words), and for a
    run trained with --labels the label to suggest in (None: unconditioned). Checked here, once."""
    text: str = ""
    k: int = 5
    words: int = 3
    label: str | None = None

    def __post_init__(self):
        if not isinstance(self.text, str):
            raise ConfigError(f"the text to suggest for must be a string, got {type(self.text).__name__}")
        if len(self.text) > MAX_TEXT_CHARS:
            raise ConfigError(f"the text to suggest for is {len(self.text):,} characters; the limit is "
                              f"{MAX_TEXT_CHARS:,} (the model reads only its last window: send the end)")
        for name, high, low in (("k", MAX_K, 1), ("words", MAX_WORDS, 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ConfigError(f"{name} must be a whole number from {low} to {high}, got {value!r:.20}")
        if self.label is not None and not isinstance(self.label, str):
            raise ConfigError(f"label must be a string or None, got {type(self.label).__name__}")


@dataclass(frozen=True)
class Completion:
    """One completion: the characters to add to the text, the whole word they finish (the typed part and them), and
    its probability."""
    text: str
    word: str
    p: float


@dataclass(frozen=True)
class Suggestions:
    """chars: ((character, probability), ...), likeliest first; words: Completion, ..., best first; kind: 'words'
    (to a word boundary) or 'cjk' (2 to 4 ideographs)."""
    chars: tuple
    words: tuple
    kind: str

    def to_json(self):
        return {"chars": [{"char": c, "p": p} for c, p in self.chars],
                "words": [{"text": w.text, "word": w.word, "p": w.p} for w in self.words], "kind": self.kind}


def is_ideograph(c):
    return unicodedata.name(c, "").startswith(("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH"))


def is_word_char(c):
    """A character inside an alphabetic word: a letter, digit or mark that is not an ideograph, or an apostrophe."""
    return c in WORD_MARKS or (c.isalnum() or unicodedata.category(c).startswith("M")) and not is_ideograph(c)


@lru_cache(maxsize=8)
def char_classes(chars):
    """A vocabulary's characters (one string) -> (word characters, ideographs): (V,) bool tensors, made once per
    vocabulary (a Chinese run has 10,000 characters to look up)."""
    return (torch.tensor([is_word_char(c) for c in chars], dtype=torch.bool),
            torch.tensor([is_ideograph(c) for c in chars], dtype=torch.bool))


def is_cjk(text, likeliest):
    """Whether to complete with ideographs: the text ends with one, or ends outside a word (or is empty) and the
    likeliest next character is one."""
    if text and is_ideograph(text[-1]):
        return True
    return not (text and is_word_char(text[-1])) and bool(likeliest) and is_ideograph(likeliest)


def partial_word(text, cjk):
    """The word the text ends inside (typed so far): its trailing word characters (ideographs, for CJK)."""
    inside = is_ideograph if cjk else is_word_char
    n = len(text)
    while n and inside(text[n - 1]):
        n -= 1
    return text[n:]


def suggest(model, chars, ids, query, *, text="", head=(), never=(), dtype=torch.float32, run=None):
    """The suggestions after `ids` (the text's ids, as the model reads them) -> Suggestions.

    chars: the vocabulary's characters (id -> character); text: the text as typed (its end decides the kind and the
    partial word); head: ids the model reads first and that stay in its window (a label run's label); never: ids
    never offered (a label run's label characters); run: how the forward steps are run, steps -> steps (a
    threads.ThreadTuner's run: each step at the thread count measured fastest here); None: as they come."""
    steps = _steps(model, chars, ids, query, text, list(head), never, dtype)
    return collections.deque((run or iter)(steps), maxlen=1)[0]  # None after each forward; the suggestions last


@torch.no_grad()
def _steps(model, chars, ids, query, text, head, never, dtype):
    """suggest() one forward at a time: yields None after each (a prefill, a batched step), then the Suggestions."""
    device, block = next(model.parameters()).device, model.config.block_size
    vocab_chars = "".join(chars)
    word_ok, ideograph = (m.to(device) for m in char_classes(vocab_chars))
    blocked = torch.zeros(len(chars), dtype=torch.bool, device=device)
    if len(never):
        blocked[torch.as_tensor(list(never), device=device)] = True
    ids = list(ids)

    def window(n):  # the last n ids of the text, the head kept first
        return head + ids[max(0, len(ids) - max(0, n - len(head))):]

    def forward(idx, cache):  # (B, T) -> log-probabilities (B, V) of the next character, never-ids at -inf
        with autocast(device, dtype):
            logits = model(idx, cache=cache)[0][:, -1, :].float()
        return torch.log_softmax(logits.masked_fill(blocked, float("-inf")), dim=-1)

    full = window(block)
    cache = KVCache(model.config, 1, device=device, dtype=dtype)
    logp = forward(torch.tensor([full], device=device), cache)  # (1, V)
    yield None
    top = logp[0].exp().topk(min(query.k, len(chars)))
    found = tuple((chars[i], p) for p, i in zip(top.values.tolist(), top.indices.tolist()) if p > 0)
    cjk = is_cjk(text, found[0][0] if found else "")
    if not query.words:
        yield Suggestions(found, (), "cjk" if cjk else "words")
        return
    # at most half the window ahead, so that the search still reads the text (a 16-character window: 8 ahead)
    steps = min(max(CJK_LENGTHS) if cjk else MAX_WORD_CHARS, max(1, (block - len(head)) // 2))
    if len(full) + steps > block:  # no room ahead in the window: the search reads a shorter end of the text
        cache = KVCache(model.config, 1, device=device, dtype=dtype)
        logp = forward(torch.tensor([window(block - steps)], device=device), cache)
        yield None
    typed = partial_word(text, cjk)
    search = _ideographs if cjk else _words
    words = yield from search(lambda idx: forward(idx, cache), cache, logp, ideograph if cjk else word_ok, blocked,
                              steps, query.words)
    added = ["".join(chars[i] for i in w) for w, _ in words]
    yield Suggestions(found, tuple(Completion(a, typed + a, p) for a, (_, p) in zip(added, words)),
                      "cjk" if cjk else "words")


def _words(step, cache, logp, inside, blocked, steps, n):
    """Alphabetic completions (a generator: None after each step) -> [(ids, probability)] of the n likeliest words
    ended by a boundary. A word's score
    is its log-probability with the boundary's; partial words below the n-th score found are dropped."""
    ends = ~inside & ~blocked  # a boundary: any character that is not a word character (the reserved ones aside)
    live, done, scores = [[]], [], [0.0]  # live[r]: the ids of cache row r's partial word, scores[r] its log-prob
    for t in range(steps + 1):
        if t:  # a word of at least one character may end here
            end = torch.logsumexp(logp.masked_fill(~ends, float("-inf")), dim=-1).tolist()
            done += [(s + e, w) for s, e, w in zip(scores, end, live) if e > float("-inf")]
            done = sorted(done, key=lambda d: -d[0])[:n]
        if t == steps:
            break
        total = torch.tensor(scores, device=logp.device)[:, None] + logp.masked_fill(~inside, float("-inf"))
        best = total.flatten().topk(min(WIDTH, total.numel()))
        floor = done[-1][0] if len(done) == n else float("-inf")  # longer words only lose probability
        keep = [(s, divmod(i, logp.size(1))) for s, i in zip(best.values.tolist(), best.indices.tolist()) if s > floor]
        if not keep:
            break
        scores = [s for s, _ in keep]
        live, logp = _advance(step, cache, live, [ri for _, ri in keep], logp.device)
        yield None
    return [(w, math.exp(s)) for s, w in done]


def _ideographs(step, cache, logp, inside, blocked, steps, n):
    """CJK completions (a generator: None after each step) -> [(ids, probability)] of the n best runs of 2 to 4
    ideographs by log-probability per character (their probability: the product of their characters')."""
    live, done, scores = [[]], [], [0.0]
    for t in range(steps + 1):
        if t in CJK_LENGTHS:
            done += [(s / t, s, w) for s, w in zip(scores, live)]
        if t == steps:
            break
        total = torch.tensor(scores, device=logp.device)[:, None] + logp.masked_fill(~inside | blocked, float("-inf"))
        best = total.flatten().topk(min(WIDTH, total.numel()))
        keep = [(s, divmod(i, logp.size(1))) for s, i in zip(best.values.tolist(), best.indices.tolist())
                if s > float("-inf")]
        if not keep:
            break
        scores = [s for s, _ in keep]
        live, logp = _advance(step, cache, live, [ri for _, ri in keep], logp.device)
        yield None
    done.sort(key=lambda d: -d[0])
    return [(w, math.exp(s)) for _, s, w in done[:n]]


def _advance(step, cache, live, picks, device):
    """Continue the partial words: picks [(row, id)] -> (the new partial words, their next log-probabilities (N, V)),
    the cache's rows forked to them and one batched step."""
    rows = [r for r, _ in picks]
    if rows != list(range(len(live))):
        cache.select(torch.tensor(rows, device=device))
    nxt = torch.tensor([[i] for _, i in picks], device=device)  # (N, 1)
    return [live[r] + [i] for r, i in picks], step(nxt)
