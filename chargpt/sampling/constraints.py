"""Constraints on what a sample may write, as masks on the logits and forced characters in the decode loop, and the
scores that say what they cost: --ban, --allow, --form and --acrostic (chargpt/sampling/forms.py), --regex, --grammar
and --json-schema (chargpt/sampling/grammar.py), --repetition-penalty and --no-repeat-ngram (transformers' meaning),
--best-of.

Each control is a small function of (the ids so far, the logits) -> new logits, as transformers' LogitsProcessors
are: repetition_penalty is RepetitionPenaltyLogitsProcessor's arithmetic, NgramBan is NoRepeatNGramLogitsProcessor's
rule kept up to date one character at a time (a dictionary lookup per row, not a pass over the text). A call's
rules are planned once (plan: every error a one-line ConfigError before decoding), and a Steer applies them to one
batch, step by step: sampling.decode calls steer.logits(logits) before choosing and steer.chose(ids) after. With
no rule and no scoring asked for, plan returns None and the decode loop runs exactly as it did without them.

The hard constraints (the form and acrostic, --ban and --allow, --no-repeat-ngram) are masks: the sampler
renormalises over what they allow. What they took away is reported per sample as the mean, over its characters, of
-log P(allowed) under the model's own distribution (temperature 1, before any penalty): 0 when the model wanted
what the form wanted, a few nats when the form fought it. A sample's score is the model's own mean log-probability
per character of the text it wrote (the same number a teacher-forced evaluation of that text gives). This module
prints nothing: sample.py's lines and records of the scores are chargpt/cli/writers.py's.
"""

import math
import re
from dataclasses import dataclass

import torch

from chargpt.config.flags import param
from chargpt.data.tokenizer import codepoints
from chargpt.errors import ConfigError
from chargpt.sampling import forms, grammar

NEAR_DUPLICATE = 0.5  # best-of drops a sample whose 8-character pieces overlap a better one's this much (Jaccard)
SHINGLE = 8
# best-of ranks last a sample that repeats a piece of 1-8 characters holding a letter or ideograph three times in a
# row (處處處, lalala): the model's own log-probability rewards such loops (4 of 20 Tang quatrains kept by mean
# log-prob had one in a newcomer's run, against none of 20 plain samples), and a reader sees them as broken text
REPEATS = re.compile(r"(.{1,8}?)\1\1", re.S)


def repetition_penalty(logits, seen, penalty):
    """transformers' RepetitionPenaltyLogitsProcessor: the logit of every character already in the text (seen (B, V)
    bool, prompt included) is divided by `penalty` if positive, multiplied by it if negative."""
    return torch.where(seen, torch.where(logits < 0, logits * penalty, logits / penalty), logits)


class NgramBan:
    """transformers' NoRepeatNGramLogitsProcessor: a character that would complete an n-gram already in the text
    (prompt included) is banned. The n-grams are kept per row in a dictionary from their first n-1 ids to the ids
    that followed, updated with each new character."""

    def __init__(self, n, context, rows):
        self.n, self.length = n, len(context)
        shared = {}
        for j in range(len(context) - n + 1):
            shared.setdefault(tuple(context[j:j + n - 1]), set()).add(context[j + n - 1])
        self.shared, self.own = shared, [{} for _ in range(rows)]
        self.tails = [list(context[max(0, len(context) - n + 1):]) if n > 1 else [] for _ in range(rows)]

    def banned(self):
        """-> (rows, ids) of the banned characters, for index_put."""
        rows, ids = [], []
        if self.length + 1 < self.n:  # as transformers: nothing until an n-gram can be complete
            return rows, ids
        for r, tail in enumerate(self.tails):
            key = tuple(tail)
            found = self.shared.get(key, set()) | self.own[r].get(key, set())
            rows += [r] * len(found)
            ids += found
        return rows, ids

    def add(self, ids):
        for r, c in enumerate(ids):
            tail = self.tails[r]
            if len(tail) == self.n - 1:  # a new set, not added to: select() lets rows share them
                key = tuple(tail)
                self.own[r][key] = self.own[r].get(key, frozenset()) | {c}
            tail.append(c)
            if len(tail) > self.n - 1:
                del tail[0]
        self.length += 1

    def select(self, rows):
        """Keep the rows `rows` in that order (repeats allowed), as a beam search forks and drops them."""
        self.tails = [list(self.tails[r]) for r in rows]
        self.own = [dict(self.own[r]) for r in rows]


@dataclass
class Rules:
    """One call's constraints, in ids: allowed (V,) bool or None (--ban, --allow), penalty, ngram, program
    (forms.Program or None), pattern (grammar.Pattern or None: --regex, --grammar, --json-schema)."""
    vocab_size: int
    allowed: torch.Tensor | None
    penalty: float | None
    ngram: int | None
    program: forms.Program | None
    pattern: grammar.Pattern | None = None

    def steer(self, context, rows, budget, device):
        return Steer(self, context, rows, budget, device)


def given(settings):
    """Whether SampleSettings ask for a constraint or best-of: a run that reports scores. Each control's off value
    (penalty 1, n-gram 0, an empty --ban) counts as not given (an empty --allow, --form or --acrostic is
    refused where the settings are made)."""
    s = settings
    return bool(s.ban or s.allow or s.form or s.acrostic or s.repetition_penalty not in (None, 1.0)
                or s.no_repeat_ngram or s.best_of or grammar.given(s))


def plan(settings, vocab, context, score=False, reserved=""):
    """SampleSettings + the vocabulary + the text before the sample -> Rules, or None when nothing constrains the
    sample and no score is wanted (the decode loop then runs exactly as without this module). reserved: characters no
    sample may write (a labelled run's label characters, a FIM run's markers: the decode loop masks them), so none of
    --allow, --form or
    --acrostic may ask for one, and what --ban and --allow leave must hold another. Every setting the vocabulary
    cannot satisfy is a one-line ConfigError here, before any decoding."""
    s = settings
    if not (given(s) or score):
        return None
    for name in ("allow", "form", "acrostic"):
        clash = next((c for c in getattr(s, name) or "" if c in reserved), None)
        if clash is not None:
            raise ConfigError(f"{param(name)} holds U+{ord(clash):04X}, a private-use character this run reserves "
                              f"(a label's, or a fill-in-the-middle marker), which a sample never writes; remove it "
                              f"(a label is chosen with {param('label')})")
    allowed = ~_mask(vocab, reserved)
    if s.allow:
        allowed &= _mask(vocab, s.allow)
        if not allowed.any():
            raise ConfigError(f"{param('allow')}: none of its characters is in this model's vocabulary")
    if s.ban:
        allowed &= ~_mask(vocab, s.ban)
    if not allowed.any():
        raise ConfigError(f"{param('ban')} and {param('allow')} leave no character this model writes" +
                          (" (its reserved characters, labels' or markers, are never written)" if reserved else ""))
    program = forms.compile_form(s.form, s.acrostic, vocab, allowed, context)
    found = grammar.given(s)
    pattern = grammar.compile_pattern(*found, vocab, allowed) if found else None
    penalty = s.repetition_penalty if s.repetition_penalty != 1.0 else None
    return Rules(len(vocab), None if allowed.all() else allowed, penalty, s.no_repeat_ngram or None, program, pattern)


def _mask(vocab, chars):
    """The vocabulary's ids among `chars` as a (V,) bool mask (characters it lacks are left out)."""
    ids, known = vocab.lookup(codepoints(chars))
    mask = torch.zeros(len(vocab), dtype=torch.bool)
    mask[torch.from_numpy(ids[known].astype("int64"))] = True
    return mask


class Steer:
    """The rules applied to one batch of `rows` samples continuing `context` (a list of ids), for at most `budget`
    characters. logits(logits (B, V)) -> the logits to sample from; chose(ids (B,)) records the choice and -> the ids
    to feed the model. ended_now: the rows whose form or pattern ended with the last choice; stuck_now: the rows that
    end before this step's choice, which is not written (nothing was left to write, or a pattern's end was chosen:
    `ended` says why, by row, when it is early). scores() -> (log-probability of each chosen character, probability
    the constraints removed, in nats; each (steps, B), the latter None without a hard constraint).

    Under a pattern (grammar.Pattern) the logits gain a column, id V: the sample's end, allowed where the pattern
    accepts the text so far, with the model's probability of every character the pattern does not allow next
    (chargpt/sampling/grammar.py says why); a row that chooses it ends there, the end not written."""

    def __init__(self, rules, context, rows, budget, device):
        self.rules, self.budget, self.ended_now = rules, budget, []
        self.allowed = None if rules.allowed is None else rules.allowed.to(device)
        self.walk = forms.FormWalk(rules.program, rows, budget) if rules.program else None
        self.table = rules.program.table.to(device) if rules.program else None
        self.ngrams = NgramBan(rules.ngram, context, rows) if rules.ngram else None
        self.matchers = rules.pattern.matchers(rows) if rules.pattern else None
        self.seen = None
        if rules.penalty is not None:  # (B, V): the characters in the text so far, prompt included
            self.seen = torch.zeros(rows, rules.vocab_size, dtype=torch.bool, device=device)
            self.seen[:, torch.tensor(sorted(set(context)), dtype=torch.long, device=device)] = True
        self.hard = rules.allowed is not None or rules.program is not None or rules.ngram is not None or \
            rules.pattern is not None
        self.logp, self.removed, self.step_logp = [], [], None
        self.stuck_now, self.ended = [], {}  # rows that end before this step's character; row -> why it ended early

    def logits(self, logits):
        self.stuck_now = []
        raw = logits.float()
        B, V = raw.shape
        allowed = None
        if self.walk is not None:
            first, second = (torch.tensor(rows, device=raw.device) for rows in self.walk.masks())
            allowed = self.table[first] | self.table[second]  # (B, V)
        elif self.allowed is not None:
            allowed = self.allowed.expand(B, V)
        if self.ngrams is not None:
            rows, ids = self.ngrams.banned()
            if rows:
                base = allowed if allowed is not None else torch.ones(B, V, dtype=torch.bool, device=raw.device)
                hard = base.clone()
                hard[torch.tensor(rows, device=raw.device), torch.tensor(ids, device=raw.device)] = False
                # a row left with nothing: under a form, its fixed character (or slot) wins over the n-gram rule;
                # without one the sample ends here, said as such (sampling on would break the rule it was given)
                left = hard.any(dim=-1, keepdim=True)
                allowed = torch.where(left, hard, base)
                if self.walk is None and not bool(left.all()):
                    self._stuck((~left[:, 0]).nonzero()[:, 0].tolist(),
                                f"{param('no_repeat_ngram', self.rules.ngram)} left nothing to write")
        fits = may_end = None
        if self.matchers is not None:
            fits, may_end = (t.to(raw.device) for t in self.matchers.mask())  # (B, V), (B,)
            base = allowed if allowed is not None else torch.ones(B, V, dtype=torch.bool, device=raw.device)
            both = base & fits
            left = both.any(dim=-1) | may_end
            if not bool(left.all()):  # the pattern needs what the other rules (or the labels) leave out
                self._stuck((~left).nonzero()[:, 0].tolist(), f"the {self.rules.pattern.words()} needed a character "
                                                               f"the other constraints leave out here")
            allowed = torch.where(left[:, None], both, base)
        self.step_logp = torch.log_softmax(raw, dim=-1)  # (B, V): the model's own distribution
        out = raw if self.seen is None else repetition_penalty(raw, self.seen, self.rules.penalty)
        if allowed is not None:
            kept = torch.logsumexp(self.step_logp.masked_fill(~allowed, float("-inf")), dim=-1)
        if fits is not None:  # the end (id V): the mass of what the pattern does not allow next, where it may end
            end_logp = self._end(self.step_logp, fits, may_end)
            self.step_logp = torch.cat([self.step_logp, end_logp[:, None]], dim=1)
            self.removed.append(-torch.logaddexp(kept, end_logp))
            return torch.cat([out.masked_fill(~allowed, float("-inf")), self._end(out, fits, may_end)[:, None]], dim=1)
        if allowed is not None:
            self.removed.append(-kept)
        elif self.hard:  # no mask at this step (an n-gram rule before any n-gram repeats)
            self.removed.append(torch.zeros(B, device=raw.device))
        return out if allowed is None else out.masked_fill(~allowed, float("-inf"))

    @staticmethod
    def _end(logits, fits, may_end):
        """(B,) the end's logit: logsumexp of the logits the pattern does not allow next, -inf where it may not end."""
        rest = torch.logsumexp(logits.masked_fill(fits, float("-inf")), dim=-1)
        return torch.where(may_end, rest, torch.full_like(rest, float("-inf")))

    def _stuck(self, rows, why):
        """These rows end before this step's character (not written), for this reason."""
        rows = [r for r in rows if r not in self.ended]
        self.stuck_now += rows
        self.ended.update(dict.fromkeys(rows, why))
        if self.matchers is not None:
            for r in rows:
                self.matchers.stop(r)

    def chose(self, nxt):
        self.logp.append(self.step_logp.gather(1, nxt[:, None])[:, 0])
        if self.matchers is not None:  # a row that chose the end (id V) ends here; the model is fed a character
            ends = nxt == self.rules.vocab_size
            ids = nxt.tolist()
            self.stuck_now += [r for r, c in enumerate(ids) if c == self.rules.vocab_size and r not in self.stuck_now]
            complete, refused = self.matchers.advance(ids)
            for r, error in refused.items():  # not written
                self.stuck_now.append(r)
                self.ended[r] = f"the {self.rules.pattern.words()} refused its character: {error}"
            nxt = nxt.masked_fill(ends, 0)
        if self.seen is not None:
            self.seen[torch.arange(nxt.size(0), device=nxt.device), nxt] = True
        ids = nxt.tolist() if self.ngrams is not None or self.walk is not None else None
        if self.ngrams is not None:
            self.ngrams.add(ids)
        self.ended_now = self.walk.advance(ids) if self.walk is not None else []
        if self.matchers is not None:
            self.ended_now = sorted(set(self.ended_now) | set(complete))
        return nxt

    def select(self, rows):
        """Keep the rows `rows` (a list) in that order, repeats allowed: a beam search (chargpt/sampling/beam.py)
        forks hypotheses and drops others. A pattern's matchers cannot be forked (SampleSettings refuses --beam with
        one); the per-step scores start again (the beam keeps its own)."""
        if self.walk is not None:
            w = self.walk
            w.e, w.o, w.n, w.ended = ([v[r] for r in rows] for v in (w.e, w.o, w.n, w.ended))
        if self.ngrams is not None:
            self.ngrams.select(rows)
        index = torch.tensor(rows, dtype=torch.long)
        if self.seen is not None:
            self.seen = self.seen[index.to(self.seen.device)]
        if self.step_logp is not None:
            self.step_logp = self.step_logp[index.to(self.step_logp.device)]
        self.logp, self.removed, self.stuck_now, self.ended = [], [], [], {}

    def ended_of(self, texts):
        """Why each sample ended early, by row (`ended`), and under a pattern each sample whose text the pattern does
        not accept whole: --max-new-tokens or a stop string came first."""
        ended = dict(self.ended)
        pattern = self.rules.pattern
        for r, text in enumerate(texts if pattern is not None else ()):
            if r not in ended and not pattern.complete(text):
                ended[r] = (f"{param('max_new_tokens', self.budget)} came" if len(text) >= self.budget else
                            "a stop string cut it") + f" before the {pattern.words()} was complete"
        return ended

    def scores(self):
        if not self.logp:
            return None, None
        return torch.stack(self.logp).cpu(), torch.stack(self.removed).cpu() if self.hard else None


# --- what a sample reports, and best-of -----------------------------------------------------------------------
@dataclass
class Sample:
    """One sample and its scores. logprob: the model's mean log-probability per character of the text (nats; None
    for an empty text or when not scored); removed: the mean nats per character the constraints took away (None
    without a hard constraint); row: its row in the decoded batch; dropped: why best-of ranked it after the others
    ('copied' from the training text, 'repetitive' (REPEATS) or 'near-duplicate' of a better sample), else None;
    copied: the novelty
    summary best-of checked, if any."""
    text: str
    logprob: float | None = None
    removed: float | None = None
    row: int = 0
    dropped: str | None = None
    copied: dict | None = None
    ended: str | None = None

    def record(self, best_of=None):
        """The `score` object of a --json record (and of the playground's done event): JSON numbers only, a score
        that is not finite (no allowed character had any probability) is null."""
        out = {"logprob": _round(self.logprob), "chars": len(self.text)}
        if self.removed is not None:
            out["removed"] = _round(self.removed)
        if self.ended:
            out["ended"] = self.ended
        if best_of:
            out.update(best_of=best_of, row=self.row, dropped=self.dropped)
        return out


def _round(x):
    return None if x is None or not math.isfinite(x) else round(x, 4)


def samples_of(texts, logp, removed, ended=None):
    """The texts of a batch and its step scores ((steps, B) each, or None) -> Samples; a text's scores are those of
    its own characters (a stop string or the form's end cut it). ended: row -> why it ended early (Steer.ended)."""
    out = []
    for i, t in enumerate(texts):
        n = len(t)
        out.append(Sample(t, logp[:n, i].mean().item() if logp is not None and n else None,
                          removed[:n, i].mean().item() if removed is not None and n else None, row=i,
                          ended=(ended or {}).get(i)))
    return out


def shingles(text):
    return {text[i:i + SHINGLE] for i in range(max(1, len(text) - SHINGLE + 1))}


def repetitive(text):
    """Whether text loops: a piece of 1-8 characters with a letter or ideograph in it, three times in a row (not
    '...', nor a code line's indentation)."""
    return any(any(c.isalpha() for c in m.group(1)) for m in REPEATS.finditer(text))


def rank(samples, keep, copies=None):
    """best-of: the samples best first by the model's own mean log-probability per character; a sample that copies
    the training text (copies(text) -> a novelty Report with a copied span of at least its min_span), that loops
    (repetitive) or whose 8-character pieces overlap a better kept one's by NEAR_DUPLICATE or more ranks after all
    the others (marked `dropped`). -> the first `keep`."""
    order = sorted(samples, key=lambda s: -float("inf") if s.logprob is None else -s.logprob)
    kept, dropped, pieces = [], [], []
    for s in order:
        if copies is not None and s.text:
            report = copies(s.text)
            s.copied = report.summary()
            if s.copied["longest"] >= report.min_span:
                s.dropped = "copied"
        if s.dropped is None and repetitive(s.text):
            s.dropped = "repetitive"
        if s.dropped is None:
            mine = shingles(s.text)
            if any(len(mine & p) >= NEAR_DUPLICATE * len(mine | p) for p in pieces):
                s.dropped = "near-duplicate"
            else:
                pieces.append(mine)
        (kept if s.dropped is None else dropped).append(s)
        if len(kept) == keep:
            break
    return (kept + dropped)[:keep]
