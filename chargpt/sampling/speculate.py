"""Speculative decoding without a second model: drafts from the text so far and from the run's training text, each
checked in one cached forward, with the text exactly that of plain decoding (chargpt/sampling/decode.py).

A decode step of a small model on a CPU is mostly per-call overhead (Python, dozens of small operators), paid once
per forward however many positions it takes; only its matrix products grow with them (on the 2-core EPYC of
benchmarks/RESULTS.md a check of 8 positions of the default 3 x 160 model costs about 1.5 steps, in float32). A
character model is very predictable inside a word, a name or a line it has seen, so a guess at the next few
characters (a draft) is often right, and one forward over the draft gives the model's choice at every drafted
position. Two sources guess, and the one whose match is longer drafts:
    PromptLookup  the longest recent n-gram (3 to 8 characters) that occurred earlier in the text so far, and what
                  followed it there (prompt lookup, as vLLM's and llama.cpp's n-gram drafts);
    CorpusLookup  the longest suffix of the text found in the training text's suffix array (the novelty index,
                  chargpt/tools/novelty) and what most often followed it there (as REST, retrieval-based speculative
                  decoding, drafts from a datastore), a character at a time while its share stays high.
How long a draft is (Meter.draft_chars) weighs what drafts of each length keep lately against what a check of each
length costs here, measured once per model (check_costs): the cost climbs in steps, a matrix kernel's block of rows
at a time, so a draft often grows to the end of a step for nothing.

Exactness. Each drafted position's choice is made exactly as plain decoding makes it: the position's logits go
through the labels' mask, the constraints (steer.logits: bans, forms, penalties) and sample_next (temperature, top-k,
top-p, min-p) with one uniform number from the call's generator, and the character chosen is kept. The draft is kept
while the choices equal it; at the first choice that differs, the choice is kept (it is the sample) and the rest of
the draft is dropped (KVCache.rollback). For a deterministic draft x this is the usual rule (keep x with probability
p(x), else a character from p without x, renormalised), and because each choice uses the uniform plain decoding would
use there, a seed gives the same text with speculation as without it, at every temperature (up to float rounding:
a forward over several positions may round differently from several forwards over one; in bfloat16 it often does).
Without constraints every position's choice is made at once (one sample_next over the check's rows), and the
uniforms drawn for positions past the first dropped character are handed back (the generator's state restored and
advanced by the characters written; by the ones taken, where the consumer closes the steps mid-check), so a
generator shared by later calls goes on as plain decoding's would. The
constraints' state only ever advances by characters kept (steer.chose), so nothing of theirs needs taking back. Where
the window is full, it is rebuilt (as plain decoding rebuilds it) in the same forward that checks the next draft.

Scope: one sample (a batch of one row, no classifier-free guidance); larger batches decode plainly, each row would
keep a different number of characters. auto (Meter) stops drafting while the drafts do not pay (by the clock, against
plain decoding's speed measured in short pauses) and tries again later.
"""

import bisect
import copy
import time
import weakref

import numpy as np
import torch

from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast
from chargpt.sampling.decode import GREEDY_BELOW, masked, sample_next

DRAFT_CHARS = 11  # characters drafted at most (Meter.draft_chars picks how many: check_costs)
SHARE_VERIFIES = 32  # the verifies (about) whose kept shares choose the draft's length
PRIOR_SHARES = (0.6, 0.75)  # the shares of first and later drafted characters kept, before any is checked: about
# what the default CPU run keeps at temperature 0.8 (benchmarks/RESULTS.md)...
PRIOR_WEIGHT = 4  # ...worth this many checks
COST_BUDGET_S = 0.25  # check_costs' rounds after the first timed one stop past this many seconds
PROMPT_NGRAMS = (3, 8)  # n-grams of the text so far that prompt lookup matches, shortest and longest
MATCH_CAP = 32  # characters of the text searched again for a match where it cannot grow (a match grows past it)
SHARE = 0.4  # a corpus draft goes on while its next character followed the match in this share of the corpus
WINDOW = 16  # auto: the verifies (a block of them) whose characters per verify decide whether drafting pays...
# ...by the clock; before plain decoding is timed, at least this many on the mean: measured on a 2-core EPYC
# (benchmarks/RESULTS.md), the default CPU run (3 x 160) wrote 1.35x as fast with drafts as without at 2.5
# characters per verify, a 6 x 384 model 1.12x at 1.8, a 4 x 192 Tang model (its 9,728-character head costs a
# check more per position) 0.73x at 1.4 and 1.0x at 2.8; so drafts break even near 2 for most models, and the bar
# errs high (the clock decides from the first plain measure, 32 characters later)...
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


def id_chars(ids):
    """Corpus ids (an integer array) -> a str of one character per id whose characters sort as the ids do (the
    surrogates skipped: a str cannot hold them), so the suffix array's searches compare text slices in C, not
    lists of ids in Python."""
    codes = np.asarray(ids).astype("<u4")
    codes += (codes >= SURROGATES).astype("<u4") * 0x800  # 0xD800.. 0xDFFF: 2,048 codes skipped, the order kept
    return codes.tobytes().decode("utf-32-le")


SURROGATES = 0xD800


def id_char(i):
    """One corpus id -> its character in id_chars' text."""
    return chr(i + 0x800 if i >= SURROGATES else i)


class TrainingText:
    """A split of the training text for drafting, made once per model: its text as a str of id characters
    (id_chars: in memory, a byte a character where the ids stay below 256, two below 65,536) and its suffix array
    (a novelty SplitIndex's: where a --val-split blocks stretch ends, a draft may run on into the text after it; it is
    only a draft), and the run's ids -> the corpus's characters (None where the corpus lacks one) and back (-1 where
    the run lacks one)."""

    def __init__(self, text, sa, to_corpus, from_corpus, chunk=1 << 22):
        text = np.asarray(text)
        self.chars = "".join(id_chars(text[i:i + chunk]) for i in range(0, len(text), chunk))
        sa = np.ascontiguousarray(sa)
        native = np.int64 if sa.dtype.itemsize == 8 else np.int32
        # indexed a position at a time: a Python int, fast (a memoryview takes only the machine's own byte order)
        self.sa = memoryview(sa.astype(sa.dtype.newbyteorder("="), copy=False).view(native))
        self.to_corpus = [id_char(int(c)) if c >= 0 else None for c in np.asarray(to_corpus).tolist()]
        self.from_corpus = {id_char(i): int(m) for i, m in enumerate(np.asarray(from_corpus).tolist()) if m >= 0}
        # where each character's suffixes start in the suffix array: a search starts inside its first character's
        # (a few hundred suffixes of a Chinese corpus's millions), in chunks of bounded memory
        counts = np.zeros(len(from_corpus) + 1, np.int64)
        for i in range(0, len(sa), chunk):
            counts += np.bincount(text[sa[i:i + chunk]], minlength=len(counts))[:len(counts)]
        ends = np.cumsum(counts).tolist()
        self.starts = {id_char(i): (lo, hi) for i, (lo, hi) in enumerate(zip([0] + ends, ends)) if hi > lo}
        self.memo = {}  # a search's key -> its result, shared by every sample of the model (CorpusLookup.remember)


class CorpusLookup:
    """Drafts from the training text: the longest suffix of the text so far that occurs in it (kept up to date a
    character at a time: the suffix array interval [lo, hi) of the suffixes that start with it), and what followed
    it there most often, character by character while that character's share of the occurrences is at least SHARE.
    While drafting pauses (add with live=False) it only keeps the last characters, and finds its match again when
    drafting resumes. Text here is id_chars' str: a slice of the training text is a str slice."""

    def __init__(self, corpus, ids):
        self.text, self.sa, self.n, self.starts = corpus.chars, corpus.sa, len(corpus.chars), corpus.starts
        self.memo = corpus.memo
        self.to_corpus, self.from_corpus = corpus.to_corpus, corpus.from_corpus
        self.recent = ""  # the text's last characters (at most MATCH_CAP), since the last one the corpus lacks
        self.depth, self.lo, self.hi = 0, 0, len(self.sa)  # the match's length and its interval
        for c in ids[-MATCH_CAP:]:
            self._remember_char(c)
        self._find_again()

    def _remember_char(self, c):
        ch = self.to_corpus[c]
        self.recent = "" if ch is None else (self.recent + ch)[-MATCH_CAP:]  # nothing matches across a character
        return ch  # the corpus lacks

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
        text, sa = self.text, self.sa

        def char(i):  # "" past the text's end: below every character, as the suffix array sorts a suffix that ends
            p = sa[i] + depth
            return text[p:p + 1]
        first = bisect.bisect_left(range(lo, hi), c, key=char) + lo
        return first, bisect.bisect_right(range(first, hi), c, key=char) + first

    def _find(self, pattern):
        """The interval of the suffixes that start with `pattern` (a str), by two binary searches among the
        suffixes starting with its first character (a suffix shorter than the pattern sorts first, as in the suffix
        array)."""
        m, text, sa = len(pattern), self.text, self.sa
        lo, hi = self.starts.get(pattern[0], (0, 0))

        def head(i):
            s = sa[i]
            return text[s:s + m]
        first = bisect.bisect_left(range(lo, hi), pattern, key=head) + lo
        return first, bisect.bisect_right(range(first, hi), pattern, key=head) + first

    def _find_again(self, longest=MATCH_CAP):
        """The longest suffix of the recent characters (at most `longest`) that occurs, by a binary search over its
        length (a suffix that occurs has every shorter one occur): a few searches, only where the match could not
        grow."""
        recent = self.recent[max(0, len(self.recent) - longest):] if longest else ""  # (a match may be longer)
        self.depth, (self.lo, self.hi) = self.remember(self._longest, recent)

    def _longest(self, recent):
        """-> (the length of the longest suffix of `recent` (a str) that occurs, its interval)."""
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
        ch = self._remember_char(c)
        if not live:
            self.depth = None  # found again when drafting resumes
            return
        if self.depth is None or ch is None:
            self._find_again()
            return
        lo, hi = self.starts.get(ch, (0, 0)) if not self.depth else self._narrow(self.lo, self.hi, self.depth, ch)
        if hi > lo:
            self.depth, self.lo, self.hi = self.depth + 1, lo, hi
        else:  # the match with c does not occur: the longest suffix that does, shorter than that
            self._find_again(self.depth)

    def propose(self, k):
        """-> (the length of the match, up to k drafted ids)."""
        if self.depth is None:
            self._find_again()
        depth, lo, hi, chars = self.depth, self.lo, self.hi, ""
        while depth and len(chars) < k and hi > lo:
            if hi - lo == 1:  # one occurrence: what follows it
                s = self.sa[lo] + depth
                chars += self.text[s:s + k - len(chars)]
                break
            found = self.remember(self._most_often, lo, hi, depth)
            if found is None:
                break
            c, lo, hi = found
            chars += c
            depth += 1
        out = []
        for ch in chars:
            c = self.from_corpus.get(ch)
            if c is None:
                break  # a character this model lacks ends the draft
            out.append(c)
        return self.depth, out

    def _most_often(self, lo, hi, depth):
        """-> (the character at `depth` of the most suffixes of [lo, hi), the interval of those), or None where
        none has a share of SHARE (or that character is past the text's end). The suffixes are sorted by that
        character, so one with a share of SHARE fills a stretch at least `step` long, which holds one of the
        suffixes lo, lo + step, lo + 2 step, ...: those few are the candidates, each counted exactly."""
        text, sa, step = self.text, self.sa, max(1, int(SHARE * (hi - lo)))
        best = None
        for i in range(lo, hi, step):
            p = sa[i] + depth
            c = text[p:p + 1]
            if c and (best is None or c != best[0]):
                first, last = self._narrow(lo, hi, depth, c)
                if best is None or last - first > best[2] - best[1]:
                    best = (c, first, last)
        return best if best is not None and best[2] - best[1] >= SHARE * (hi - lo) else None


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
        self.block, self.block_s, self.block_chars = [], 0.0, 0  # since auto last judged: chars per verify, time
        self.paused_s, self.paused_chars = 0.0, 0  # the pause under way, timed
        self.plain = None  # seconds a character takes without drafts, measured in the last pause
        self.paying = 0  # blocks that paid since the plain speed was measured
        self.then = None  # the clock at the last round's end (None: a call starts; its first round is not timed)
        self.verifies = self.drafted = self.kept = self.chars = 0
        self.reached = [0.0] * (DRAFT_CHARS + 1)  # per drafted position (1 ..): checks that reached it (the ones
        self.held = [0.0] * (DRAFT_CHARS + 1)  # before it kept), and that kept it; counts decayed as they come
        self.costs = None  # seconds a check of 1 .. DRAFT_CHARS + 1 positions takes here (check_costs)
        self.overhead = 0.0  # seconds a round takes besides its check (choices, drafts, the characters' way out)

    def next_call(self):
        """A Meter for the Generator's next call: its own counts and clock, and what this one learned of whether
        drafting pays (a pause under way, the next pause's length, the plain speed, the kept shares, the costs) to
        go on from, so each call does not pay again for the verifies that show drafts do not pay for this model. Its
        own object: calls that decode at once (a server's requests) each time and count their own rounds."""
        meter = copy.copy(self)
        meter.block = list(self.block)
        meter.reached, meter.held = list(self.reached), list(self.held)
        meter.verifies = meter.drafted = meter.kept = meter.chars = 0
        meter.then = None
        return meter

    def record(self, drafted, kept, last=False, rebuilt=False):
        """A round: `drafted` characters drafted, `kept` of them kept (and one more chosen by the model, unless the
        call's last character was a kept one: last=True); rebuilt: its check also rebuilt the window."""
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
        if took is not None and self.costs and drafted < len(self.costs) and not rebuilt:  # a round's seconds...
            besides = max(0.0, took - self.costs[drafted])  # ...besides its check (one that rebuilt costs more)
            self.overhead += (besides - self.overhead) / SHARE_VERIFIES
        self.verifies, self.drafted, self.kept = self.verifies + 1, self.drafted + drafted, self.kept + kept
        decay = 1 - 1 / SHARE_VERIFIES
        for i in range(1, min(drafted, kept + 1, DRAFT_CHARS) + 1):
            self.reached[i] = self.reached[i] * decay + 1
            self.held[i] = self.held[i] * decay + (i <= kept)
        self.block.append(kept + 1)
        if not self.always and len(self.block) == WINDOW:  # judged a block at a time, not at every verify: a
            # window sliding over a text that pays dips below the bar now and then, and paused it for good
            if not self._pays():
                self._pause(self.wait)
                self.wait *= 2
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
        """How many characters to draft (1 .. most): the length whose round writes the most characters a second,
        by the characters a draft of that length is expected to keep (each drafted position's share kept lately,
        where the one before it was: Meter.kept_shares) and the seconds its round takes: its check (self.costs,
        measured by check_costs: on a CPU the cost climbs in steps, a matrix kernel's block of rows at a time) and
        the rest of a round (self.overhead, measured as rounds go)."""
        if most < 1:
            return 0
        shares = self.kept_shares()
        costs = self.costs or [1 + t / 4 for t in range(DRAFT_CHARS + 1)]  # unmeasured: a position a quarter step
        best, best_rate, written, chance = 0, 0.0, 1.0, 1.0
        for d in range(1, min(most, len(costs) - 1, DRAFT_CHARS) + 1):
            chance *= shares[d]  # that the first d drafted characters are all kept
            written += chance  # characters a round with a d-character draft writes, on the mean
            if written / (costs[d] + self.overhead) > best_rate:
                best, best_rate = d, written / (costs[d] + self.overhead)
        return best

    def kept_shares(self):
        """-> per drafted position (1 .. DRAFT_CHARS; [0] unused), the share of the checks reaching it that kept it,
        over about the last SHARE_VERIFIES that reached it, from a prior worth PRIOR_WEIGHT checks (PRIOR_SHARES:
        the first position's, every later one's)."""
        first, later = PRIOR_SHARES
        return [(held + PRIOR_WEIGHT * (first if i == 1 else later)) / (reached + PRIOR_WEIGHT)
                for i, (held, reached) in enumerate(zip(self.held, self.reached))]

    def stats(self):
        """What the call's drafts did: verifies, characters drafted, kept, and written in all."""
        return {"verifies": self.verifies, "drafted": self.drafted, "kept": self.kept, "chars": self.chars}


COSTS = weakref.WeakKeyDictionary()  # model -> {(device, dtype, threads, most): check_costs' list}


def measured_costs(model, device, dtype, most):
    """check_costs, measured once per model, device, dtype and thread count (kept while the model lives)."""
    key = (str(device), dtype, torch.get_num_threads(), most)
    known = COSTS.setdefault(model, {})
    if key not in known:
        known[key] = check_costs(model, device, dtype, most)
    return known[key]


@torch.inference_mode()
def check_costs(model, device, dtype=torch.float32, most=DRAFT_CHARS, repeats=3, budget_s=COST_BUDGET_S):
    """-> the seconds one forward over 1, 2 .. most + 1 new positions (a draft's check) takes here, the fastest of
    `repeats` each (fewer past budget_s, at least one): a few dozen forwards, once per model. On a CPU the cost of a
    check does not grow smoothly with its positions: a matrix kernel takes rows a block at a time (measured on a
    2-core EPYC, 5 to 8 rows cost what 5 cost, 9 to 12 what 9 cost), so a draft one character longer may cost
    nothing or a block more."""
    block = model.config.block_size
    most = max(0, min(most, block - 2))
    cache = KVCache(model.config, 1, device=device, dtype=dtype)
    ids = torch.zeros(1, block, dtype=torch.long, device=device)
    with autocast(device, dtype):
        model(ids[:, :block - most - 1], cache=cache)  # a context, as a sample's
        start, costs, began = cache.pos, [float("inf")] * (most + 1), time.perf_counter()
        for r in range(repeats + 1):  # round after round over the lengths, so a moment's load does not skew one;
            if r > 1 and time.perf_counter() - began > budget_s:
                break  # (a large model's check takes long enough to time once)
            for t in range(1, most + 2):  # the first round untimed: a new shape's first call sets up its kernels
                t0 = time.perf_counter()
                model.verify(ids[:, :t], cache)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # the forward's own time, not its launch
                if r:
                    costs[t - 1] = min(costs[t - 1], time.perf_counter() - t0)
                cache.rollback(start)
    return costs  # costs[d]: a check of d + 1 positions (a d-character draft)


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
    if settings.max_new_tokens > 1:
        meter.costs = measured_costs(model, ctx.device, dtype, draft_chars)
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

    def choose(rows, draft):  # the choices at every fed position at once, where no constraint steers them
        logits = masked(rows[0].float(), never)  # (T, V)
        state = generator.get_state()
        chosen = sample_next(logits, generator, settings.temperature, settings.top_k, settings.top_p, min_p)
        ids = chosen.tolist()
        written = next((i + 1 for i, (a, b) in enumerate(zip(ids, draft)) if a != b), len(ids))
        if written < len(ids):  # the generator as plain decoding leaves it: one uniform per character written
            hand_back(state, written)
        return chosen, state, written  # (and the state before, the uniforms drawn since)

    def hand_back(state, used):  # the generator at `state`, advanced by the uniforms of `used` characters
        generator.set_state(state)
        if settings.temperature >= GREEDY_BELOW:
            torch.rand(used, 1, generator=generator)

    def one(logits):  # a position's choice under the constraints, as decode makes it
        logits = masked(logits.float(), never)
        nxt = sample_next(steer.logits(logits), generator, settings.temperature, settings.top_k, settings.top_p,
                          min_p)
        back = steer.chose(nxt)  # the ids to yield and feed instead (a pattern's end is no character)
        return nxt if back is None else back

    min_p = getattr(settings, "min_p", None)
    rows, draft, left, rebuilt = forward(last(block)), [], settings.max_new_tokens, True  # the prefill
    while True:
        start = cache.pos - rows.size(1)  # where the first of the fed characters is
        chosen, state, drawn = choose(rows, draft) if steer is None else (None, None, 0)
        j = 0
        for j in range(rows.size(1)):
            nxt = chosen[j:j + 1] if chosen is not None else one(rows[:, j])
            c = int(nxt[0])
            text.append(c)
            if len(text) > 4 * block + pin:  # bounded: the window needs the first `pin` and the last block
                del text[pin:len(text) - block]
            drafts.add(c, meter.on)
            try:
                yield nxt
            except GeneratorExit:  # the consumer stops here (a stop string): the uniforms of the characters after
                if j + 1 < drawn:  # this one, drawn with it, handed back (unless the generator has drawn since:
                    now = generator.get_state()  # closed late, by the garbage collector, after later calls)
                    hand_back(state, drawn)
                    if torch.equal(generator.get_state(), now):
                        hand_back(state, j + 1)
                    else:
                        generator.set_state(now)
                raise
            left -= 1
            if not left:  # the call's last round: counted as it ends
                matched = j < len(draft) and c == draft[j]
                meter.record(len(draft), j + matched, last=matched)
                return
            if j == len(draft) or c != draft[j]:
                break
        meter.record(len(draft), j, rebuilt=rebuilt)
        cache.rollback(start + j + 1)  # the positions of the dropped draft characters
        room, window = block - cache.pos, [c]
        if room <= 0:  # window full: rebuilt from the last `keep` characters, as decode does, in the same forward
            cache.reset()  # as the next draft's check
            window = last(keep)[0].tolist()  # keep characters, or the pinned start where that is longer
            room = block - len(window) + 1
        draft = drafts.propose(meter.draft_chars(min(draft_chars, room - 1, left - 1))) if meter.on else []
        fed, rebuilt = torch.tensor([window + draft], dtype=torch.long, device=device), len(window) > 1
        if draft:
            with autocast(device, dtype):
                rows = model.verify(fed, cache, last=1 + len(draft))  # (1, 1 + len(draft), V)
        elif runner is not None and len(window) == 1:
            with autocast(device, dtype):
                rows = runner(fed, cache)[:, None]  # decode's compiled step
        else:
            rows = forward(fed)
