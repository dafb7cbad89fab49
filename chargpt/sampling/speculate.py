"""Speculative decoding without a second model: drafts from the text so far and from the run's training text, each
checked in one cached forward, with the text exactly that of plain decoding (chargpt/sampling/decode.py).

A decode step on a CPU is bound by reading the weights and by per-call overhead: a forward over 8 positions costs
little more than over one. A character model is very predictable inside a word, a name or a line it has seen, so a
guess at the next few characters (a draft) is often right, and one forward over the draft gives the model's choice at
every drafted position. Two sources guess, and the one whose match is longer drafts:
    PromptLookup  the longest recent n-gram (3 to 8 characters) that occurred earlier in the text so far, and what
                  followed it there (prompt lookup, as vLLM's and llama.cpp's n-gram drafts);
    CorpusLookup  the longest suffix of the text found in the training text's suffix array (the novelty index,
                  chargpt/tools/novelty) and what most often followed it there (as REST, retrieval-based speculative
                  decoding, drafts from a datastore), a character at a time while its share stays high.

Exactness. Each drafted position's choice is made exactly as plain decoding makes it: the position's logits go
through the labels' mask, the constraints (steer.logits: bans, forms, penalties) and sample_next (temperature, top-k,
top-p, min-p) with one uniform number from the call's generator, and the character chosen is kept. The draft is kept
while the choices equal it; at the first choice that differs, the choice is kept (it is the sample) and the rest of
the draft is dropped (KVCache.rollback). For a deterministic draft x this is the usual rule (keep x with probability
p(x), else a character from p without x, renormalised), and because each choice uses the uniform plain decoding would
use there, a seed gives the same text with speculation as without it, at every temperature (up to float rounding:
a forward over several positions may round differently from several forwards over one). The constraints' state only
ever advances by characters kept (steer.chose), so nothing of theirs needs taking back.

Scope: one sample (a batch of one row, no classifier-free guidance); larger batches decode plainly, each row would
keep a different number of characters. auto (Meter) stops drafting while the drafts do not pay (fewer than
MIN_CHARS_PER_VERIFY characters written per verify over the last WINDOW verifies) and tries again later.
"""

import bisect
import time
from collections import deque

import numpy as np
import torch

from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast
from chargpt.sampling.decode import sample_next

DRAFT_CHARS = 8  # characters drafted at most: a verify over 9 positions costs about one step on a CPU
PROMPT_NGRAMS = (3, 8)  # n-grams of the text so far that prompt lookup matches, shortest and longest
MATCH_CAP = 32  # characters of the text searched again for a match where it cannot grow (a match grows past it)
SHARE = 0.4  # a corpus draft goes on while its next character followed the match in this share of the corpus
SAMPLED = 32  # occurrences of a match read to find the most frequent next character (evenly spaced)
WINDOW = 16  # auto: the verifies (a block of them) whose characters per verify decide whether drafting pays...
# ...at least this many on the mean: measured on a 2-core EPYC (benchmarks/RESULTS.md), the default CPU run (3 x 160)
# wrote 1.1x as fast with drafts as without at 2.5-2.7 characters per verify and 1.4x at 3.3, a 4 x 192 Tang model
# 0.8x at 1.4; so drafts about break even near 2.2...
MIN_CHARS_PER_VERIFY = 2.3
LOOKBACK = 4096  # characters of the text so far that prompt lookup searches (at least; at most twice as many)
PAUSE = 64  # ...else no drafts for this many characters, twice as many each time it does not pay (and half as
# many again after each block that pays)
PROBE = 32  # auto: characters written without drafts to time plain decoding, before judging drafts by the clock...
REPROBE = 8  # ...and again after this many blocks that paid
MEMO = 1 << 17  # searches of the training text remembered per model (TrainingText.memo): a text revisits the same
# contexts (a word's start, a line's end) all the time, and a search costs tens of microseconds where a decode step
# of a small model costs a few hundred; cleared when full, so memory stays bounded (tens of MB at most)


class PromptLookup:
    """Drafts from the text so far: the longest of its last n characters (n from PROMPT_NGRAMS, longest first) that
    occurred earlier in it, and the characters that followed their latest earlier occurrence."""

    def __init__(self, ids, ngrams=PROMPT_NGRAMS):
        self.low, self.high = ngrams
        self.text, self.seen = [], {}  # n-gram -> where the character after its latest occurrence is
        for c in ids[-LOOKBACK:]:
            self._add(c)

    def add(self, c, live=True):  # (it keeps up while drafting pauses: a dictionary entry or two a character)
        if len(self.text) >= 2 * LOOKBACK:  # bounded memory however long the sample: again from the last LOOKBACK
            kept, self.text, self.seen = self.text[-LOOKBACK:], [], {}
            for k in kept:
                self._add(k)
        self._add(c)

    def _add(self, c):
        text = self.text
        text.append(c)
        i = len(text) - 1  # the n-grams ending just before c: c follows them
        for n in range(self.low, min(self.high, i) + 1):
            self.seen[tuple(text[i - n:i])] = i

    def propose(self, k):
        """-> (the length of the match, up to k drafted ids)."""
        text, end = self.text, len(self.text)
        for n in range(min(self.high, end), self.low - 1, -1):
            at = self.seen.get(tuple(text[end - n:]))
            if at is not None:  # past the text's end, the draft repeats with the period the match implies
                draft = text[at:at + k]
                while len(draft) < k:
                    draft.append(draft[len(draft) - (end - at)])
                return n, draft
        return 0, []


class TrainingText:
    """A split of the training text for drafting, made once per model: ids and suffix array (a novelty
    SplitIndex's: where a --val-split blocks stretch ends, a draft may run on into the text after it; it is only a
    draft), and the run's ids -> the corpus's (-1 where the corpus lacks one) and back."""

    def __init__(self, text, sa, to_corpus, from_corpus, chunk=1 << 22):
        self.text, self.sa = np.asarray(text), np.asarray(sa)  # a memmap as a plain view: faster to index
        self.to_corpus, self.from_corpus = np.asarray(to_corpus), np.asarray(from_corpus)
        # where each character's suffixes start in the suffix array: a search starts inside its first character's
        # (a few hundred suffixes of a Chinese corpus's millions), in chunks of bounded memory
        counts = np.zeros(len(self.from_corpus) + 1, np.int64)
        for i in range(0, len(self.sa), chunk):
            counts += np.bincount(self.text[self.sa[i:i + chunk]], minlength=len(counts))[:len(counts)]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).tolist()
        self.memo = {}  # a search's key -> its result, shared by every sample of the model (CorpusLookup.remember)


class CorpusLookup:
    """Drafts from the training text: the longest suffix of the text so far that occurs in it (kept up to date a
    character at a time: the suffix array interval [lo, hi) of the suffixes that start with it), and what followed
    it there most often, character by character while that character's share of the occurrences is at least SHARE.
    While drafting pauses (add with live=False) it only keeps the last characters, and finds its match again when
    drafting resumes."""

    def __init__(self, corpus, ids):
        self.text, self.sa, self.n, self.starts = corpus.text, corpus.sa, len(corpus.text), corpus.starts
        self.memo = corpus.memo
        self.to_corpus, self.from_corpus = corpus.to_corpus, corpus.from_corpus
        self.recent = deque(maxlen=MATCH_CAP)  # the text's last characters, in corpus ids
        self.depth, self.lo, self.hi = 0, 0, len(self.sa)  # the match's length and its interval
        for c in ids[-MATCH_CAP:]:
            self.recent.append(int(self.to_corpus[c]))
        self._find_again()

    def _char(self, i, depth):
        """The character at `depth` of the i-th suffix, -1 past the text's end (below every character, as sorted)."""
        p = int(self.sa[i]) + depth
        return int(self.text[p]) if p < self.n else -1

    def remember(self, search, *args):
        """search(*args) once per search and arguments, its result kept in the model's memo (bounded: MEMO
        entries)."""
        key = (search.__name__, *args)
        found = self.memo.get(key)
        if found is None:
            if len(self.memo) >= MEMO:
                self.memo.clear()
            found = self.memo[key] = search(*args)
        return found

    def _narrow(self, lo, hi, depth, c):
        """Within [lo, hi), whose suffixes agree on their first `depth` characters (so sorted by the next), the
        interval of those whose character at `depth` is c."""
        return self.remember(self._narrowed, lo, hi, depth, c)

    def _narrowed(self, lo, hi, depth, c):
        def char(i):
            return self._char(i, depth)
        first = bisect.bisect_left(range(lo, hi), c, key=char) + lo
        return first, bisect.bisect_right(range(first, hi), c, key=char) + first

    def _find(self, pattern):
        """The interval of the suffixes that start with `pattern` (a list of corpus ids), by two binary searches
        among the suffixes starting with its first character (a suffix shorter than the pattern sorts first, as in
        the suffix array)."""
        m, text, sa = len(pattern), self.text, self.sa
        lo, hi = self.starts[pattern[0]], self.starts[pattern[0] + 1]

        def head(i):
            s = int(sa[i])
            return text[s:s + m].tolist()
        first = bisect.bisect_left(range(lo, hi), pattern, key=head) + lo
        return first, bisect.bisect_right(range(first, hi), pattern, key=head) + first

    def _find_again(self, longest=MATCH_CAP):
        """The longest suffix of the recent characters (at most `longest`) that occurs, by a binary search over its
        length (a suffix that occurs has every shorter one occur): a few searches, only where the match could not
        grow."""
        recent = tuple(self.recent)[-longest:] if longest else ()
        self.depth, (self.lo, self.hi) = self.remember(self._longest, recent)

    def _longest(self, recent):
        """-> (the length of the longest suffix of `recent` (a tuple) that occurs, its interval)."""
        recent = list(recent)
        unknown = [i for i, c in enumerate(recent) if c < 0]
        if unknown:
            recent = recent[unknown[-1] + 1:]  # nothing matches across a character the corpus lacks
        short, long, found = 0, len(recent), (0, len(self.sa))  # the longest found, the longest possible
        while short < long:
            mid = (short + long + 1) // 2
            interval = self._find(recent[len(recent) - mid:])
            if interval[1] > interval[0]:
                short, found = mid, interval
            else:
                long = mid - 1
        return short, found

    def add(self, c, live=True):
        c = int(self.to_corpus[c])
        self.recent.append(c)
        if not live:
            self.depth = None  # found again when drafting resumes
            return
        if self.depth is None or c < 0:
            self._find_again()
            return
        lo, hi = (self.starts[c], self.starts[c + 1]) if not self.depth else \
            self._narrow(self.lo, self.hi, self.depth, c)
        if hi > lo:
            self.depth, self.lo, self.hi = self.depth + 1, lo, hi
        else:  # the match with c does not occur: the longest suffix that does, shorter than that
            self._find_again(self.depth)

    def propose(self, k):
        """-> (the length of the match, up to k drafted ids)."""
        if self.depth is None:
            self._find_again()
        depth, lo, hi, out = self.depth, self.lo, self.hi, []
        while depth and len(out) < k and hi > lo:
            if hi - lo == 1:  # one occurrence: what follows it
                s = int(self.sa[lo]) + depth
                out += [int(self.from_corpus[c]) for c in self.text[s:s + k - len(out)].tolist()]
                break
            c = self.remember(self._most_often, lo, hi, depth)
            if c < 0:
                break
            out.append(int(self.from_corpus[c]))
            lo, hi = self._narrow(lo, hi, depth, c)
            depth += 1
        if -1 in out:
            out = out[:out.index(-1)]  # a character this model lacks ends the draft
        return self.depth, out


    def _most_often(self, lo, hi, depth):
        """The character at `depth` of most of the suffixes [lo, hi) (of SAMPLED of them, evenly spaced), or -1
        where none has a share of SHARE or past the text's end."""
        rows = np.arange(lo, hi) if hi - lo <= SAMPLED else np.linspace(lo, hi - 1, SAMPLED).astype(np.int64)
        at = self.sa[rows].astype(np.int64) + depth
        chars = self.text[np.minimum(at, self.n - 1)].astype(np.int64)
        chars[at >= self.n] = -1
        values, counts = np.unique(chars, return_counts=True)
        best = int(counts.argmax())
        return int(values[best]) if counts[best] >= SHARE * len(rows) else -1


class Drafts:
    """The draft sources of one sample: each learns every character written (add; live=False while drafting
    pauses) and proposes a draft; the one whose match is longer drafts (the longer draft on a tie)."""

    def __init__(self, sources):
        self.sources = list(sources)

    def add(self, c, live=True):
        for source in self.sources:
            source.add(c, live)

    def propose(self, k):
        if k < 1:
            return []
        return max((source.propose(k) for source in self.sources), key=lambda m: (m[0], len(m[1])), default=(0, []))[1]


class Meter:
    """How well drafting pays: counts of verifies, drafted and kept characters in one call; `on` says whether to
    draft. always=True (--speculate on) drafts throughout. Else (auto) drafting is judged a block of WINDOW verifies
    at a time, by the clock: the seconds a character took while drafting against the seconds it took without drafts,
    measured in a short pause (PROBE characters) before the first judgement and again every REPROBE blocks; where
    drafting was slower it pauses for PAUSE characters (twice as long each time it is slower again, half as long
    again after each block that pays). Before the first plain measure, and where no clock is kept, a block writing
    fewer than MIN_CHARS_PER_VERIFY characters per verify does not pay."""

    def __init__(self, always=False, clock=time.perf_counter):
        self.always, self.on, self.pause, self.wait, self.clock = always, True, 0, PAUSE, clock
        self.recent = deque(maxlen=WINDOW)
        self.block, self.block_s, self.block_chars = [], 0.0, 0  # since auto last judged: chars per verify, time
        self.paused_s, self.paused_chars, self.probing = 0.0, 0, False  # the pause under way, timed
        self.plain = None  # seconds a character takes without drafts, measured in the last pause
        self.paying = 0  # blocks that paid since the plain speed was measured
        self.then = None  # the clock at the last round's end (None: a call starts; its first round is not timed)
        self.verifies = self.drafted = self.kept = self.chars = 0

    def next_call(self):
        """The same Meter for the Generator's next call: its counts start again, what it learned of whether
        drafting pays (a pause under way, the next pause's length, the plain speed) goes on, so each call does not
        pay again for the verifies that show drafts do not pay for this model."""
        self.verifies = self.drafted = self.kept = self.chars = 0
        self.then = None
        return self

    def record(self, drafted, kept, last=False):
        """A round: `drafted` characters drafted, `kept` of them kept (and one more chosen by the model, unless the
        call's last character was a kept one: last=True)."""
        now = self.clock()
        took, self.then = (now - self.then if self.then is not None else None), now
        chars = kept + (not last)
        self.chars += chars
        if not self.on:  # paused: plain steps, timed
            if took is not None:
                self.paused_s, self.paused_chars = self.paused_s + took, self.paused_chars + chars
            self.pause -= 1
            if self.pause <= 0:
                self.on = True
                if self.paused_chars >= PROBE // 2:
                    self.plain = self.paused_s / self.paused_chars
                    self.paying = 0
            return
        if took is not None:
            self.block_s, self.block_chars = self.block_s + took, self.block_chars + chars
        if not drafted:
            return
        self.verifies, self.drafted, self.kept = self.verifies + 1, self.drafted + drafted, self.kept + kept
        self.recent.append(kept + 1)
        self.block.append(kept + 1)
        if not self.always and len(self.block) == WINDOW:  # judged a block at a time, not at every verify: a
            # window sliding over a text that pays dips below the bar now and then, and paused it for good
            if not self._pays():
                self._pause(self.wait)
                self.wait *= 2
                self.recent.clear()
            else:  # a block that pays shortens the next pause again
                self.wait = max(PAUSE, self.wait // 2)
                self.paying += 1
                if self.plain is None and self.block_chars or self.paying >= REPROBE:
                    self._pause(PROBE)  # the plain speed, measured (again: the machine's load changes)
            self.block, self.block_s, self.block_chars = [], 0.0, 0

    def _pays(self):
        if self.plain is None or not self.block_chars:
            return sum(self.block) >= MIN_CHARS_PER_VERIFY * WINDOW
        return self.block_s / self.block_chars < self.plain

    def _pause(self, chars):
        self.on, self.pause, self.paused_s, self.paused_chars = False, chars, 0.0, 0

    def draft_chars(self, most):
        """How many characters to draft: twice the mean kept per verify lately, plus 2, up to `most` (a draft
        the model seldom keeps costs positions of the verify for nothing)."""
        if not self.recent:
            return most
        return max(2, min(most, round(2 * (sum(self.recent) / len(self.recent) - 1)) + 2))

    def stats(self):
        """What the call's drafts did: verifies, characters drafted, kept, and written in all."""
        return {"verifies": self.verifies, "drafted": self.drafted, "kept": self.kept, "chars": self.chars}


@torch.inference_mode()
def decode_speculative(model, ctx, settings, generator, drafts, meter=None, keep=None, dtype=torch.float32,
                       runner=None, steer=None, pin=0, never=None, draft_chars=DRAFT_CHARS):
    """sampling.decode for one row (ctx (1, T)), checking drafts: yields the next ids (1,) one character at a time,
    the same characters decode yields (see the module's note). drafts: a Drafts; meter: a Meter (its counts are
    kept there); keep, dtype, runner, steer, pin, never: as decode's (a step with no draft is decode's step)."""
    if settings.max_new_tokens == 0:
        return
    if ctx.size(0) != 1:
        raise ValueError(f"speculative decoding writes one sample at a time, got {ctx.size(0)} rows")
    meter = meter or Meter()
    block = model.config.block_size
    keep = keep or max(1, (3 * block) // 4)
    if not 0 < keep <= block:
        raise ValueError(f"keep must be in 1 .. block_size ({block}), got {keep}")
    device = ctx.device
    cache = KVCache(model.config, 1, device=device, dtype=dtype)
    text = ctx[0].tolist()  # every id so far: the window is rebuilt from its end (and its first `pin`)

    def last(n):
        window = text[-n:] if len(text) <= n or not pin else text[:pin] + text[len(text) - max(0, n - pin):]
        return torch.tensor([window], dtype=torch.long, device=device)

    def forward(window):  # (1, T) -> the last position's logits (1, 1, V), as decode's forward
        with autocast(device, dtype):
            return model(window, cache=cache)[0]

    min_p = getattr(settings, "min_p", None)
    rows, draft, left = forward(last(block)), [], settings.max_new_tokens  # the prefill
    while True:
        start = cache.pos - rows.size(1)  # where the first of the fed characters is
        j = 0
        for j in range(rows.size(1)):
            logits = rows[:, j].float()
            if never is not None:
                logits = logits.index_fill(1, never, float("-inf"))
            if steer is not None:
                logits = steer.logits(logits)
            nxt = sample_next(logits, generator, settings.temperature, settings.top_k, settings.top_p, min_p)
            if steer is not None:
                steer.chose(nxt)
            c = int(nxt[0])
            text.append(c)
            if len(text) > 4 * block + pin:  # bounded: the window needs the first `pin` and the last block
                del text[pin:len(text) - block]
            drafts.add(c, meter.on)
            yield nxt
            left -= 1
            if not left:  # the call's last round: counted as it ends
                matched = j < len(draft) and c == draft[j]
                meter.record(len(draft), j + matched, last=matched)
                return
            if j == len(draft) or c != draft[j]:
                break
        meter.record(len(draft), j)
        cache.rollback(start + j + 1)  # the positions of the dropped draft characters
        room = block - cache.pos
        if room <= 0:  # window full: rebuilt from the last `keep` characters, as decode does
            cache.reset()
            rows, draft = forward(last(keep)), []
            continue
        draft = drafts.propose(min(meter.draft_chars(draft_chars), room - 1, left - 1)) if meter.on else []
        fed = torch.tensor([[c, *draft]], dtype=torch.long, device=device)
        if draft:
            with autocast(device, dtype):
                rows = model.verify(fed, cache)  # (1, 1 + len(draft), V)
        elif runner is not None:
            with autocast(device, dtype):
                rows = runner(fed, cache)[:, None]  # decode's compiled step
        else:
            rows = forward(fed)
