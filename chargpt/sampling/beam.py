"""Beam search for text (sample.py --beam N): the likeliest continuation of --max-new-tokens characters, or one that
ends at a --stop string, under the same constraints, labels and mixes as sampling. The search itself is translation's
(chargpt.sampling.translate.beam_hypotheses); this module gives it a step callback over a CharGPT:

    step(prev, rows) -> logits (N, V + 1) of the next character for N hypotheses, column V being END

rows (N,) says which row of the previous call each hypothesis continues (a beam forks a row into several and drops
others), prev (N,) the character each just took. The callback moves everything kept per row along with them: the KV
cache, the ids in the window, the constraints' state (constraints.Steer.select) and the text a stop string is looked
for in. END has probability 0, except for a hypothesis that is complete (it wrote a stop string, its form ended, or
its constraints leave nothing to write), for which it is certain: that hypothesis is then finished, at no cost.

    from chargpt.sampling.beam import TextSteps
"""

import torch

from chargpt.model.transformer import KVCache
from chargpt.runtime import autocast
from chargpt.sampling.decode import masked


class TextSteps:
    """Step callback for a CharGPT continuing ctx (G, T): one row per head (a label, its NULL for guidance, the labels
    of a mix), combined by `combine` ((G N, V) -> (N, V); None for one head). pin: ids kept first in the window when
    it slides (the label); never: ids never written (the label characters); steer: a constraints.Steer made for one
    row, or None; stops: the stop strings, looked for in `before` (the prompt's text) and what each hypothesis wrote;
    chars: the vocabulary's characters."""

    def __init__(self, model, ctx, *, combine=None, pin=0, never=None, steer=None, stops=(), before="", chars=(),
                 dtype=torch.float32, keep=None):
        self.model, self.ctx, self.combine, self.pin, self.never = model, ctx, combine, pin, never
        self.steer, self.stops, self.chars, self.dtype = steer, tuple(stops), chars, dtype
        self.device, self.groups, self.block = ctx.device, ctx.size(0), model.config.block_size
        self.keep = keep or max(1, (3 * self.block) // 4)  # as sampling.decode: the window rebuilt when full
        self.hold = max((len(s) for s in self.stops), default=0)
        self.tails = [before[len(before) - self.hold:] if self.hold else ""]  # per row: the text a stop may end in
        self.cache = KVCache(model.config, self.groups, self.device, dtype)
        self.seq = ctx
        self.stopped = [False]

    def __call__(self, prev, rows):
        rows = rows.to(self.device)
        n_prev = self.seq.size(0) // self.groups
        index = torch.cat([g * n_prev + rows for g in range(self.groups)])  # each head's rows, in the same order
        if prev is None:
            logits = self._forward(self.ctx)[index]  # prefill once, then fork
            self.cache.select(index)
            self.seq = self.ctx[index]
        else:
            prev = prev.to(self.device)
            self.cache.select(index)
            fed = prev.repeat(self.groups)
            self.seq = torch.cat([self._last(self.seq[index], self.block - 1), fed[:, None]], dim=1)
            if self.cache.pos < self.block:
                logits = self._forward(fed[:, None])
            else:  # window full: rebuild the cache from the last `keep` characters, as sampling does
                self.cache.reset()
                logits = self._forward(self._last(self.seq, self.keep))
        logits = masked(logits.float() if self.combine is None else self.combine(logits), self.never)  # (N, V)
        rows, ids = rows.tolist(), None if prev is None else prev.tolist()
        if self.steer is not None:
            self.steer.select(rows)
            if ids is not None:
                self.steer.chose(prev)
            logits = self.steer.logits(logits)
        self._follow(rows, ids)
        done = torch.tensor(self.stopped, device=logits.device) | ~torch.isfinite(logits).any(dim=-1)
        if self.steer is not None:  # its form is complete, or its n-gram rule left nothing to write
            if self.steer.walk is not None:
                done |= torch.tensor(self.steer.walk.ended, device=logits.device)
            done[self.steer.stuck_now] = True
        end = torch.where(done, 0.0, float("-inf"))[:, None]  # (N, 1)
        return torch.cat([logits.masked_fill(done[:, None], float("-inf")), end], dim=1)  # (N, V + 1)

    def _forward(self, window):
        with autocast(self.device, self.dtype):
            return self.model(window, cache=self.cache)[0][:, -1]  # (G N, V)

    def _last(self, seq, n):
        """The last n positions of every row, the first `pin` kept in front (sampling.decode's rule)."""
        if seq.size(1) <= n or not self.pin:
            return seq[:, max(0, seq.size(1) - n):]
        return torch.cat([seq[:, :self.pin], seq[:, seq.size(1) - max(0, n - self.pin):]], dim=1)

    def _follow(self, rows, ids):
        """Each hypothesis's text tail and whether it has written a stop string (a stop string's text is in the
        hypothesis; the caller cuts it, as sampling's StopFilter does)."""
        if not self.hold:
            self.stopped = [False] * len(rows)
            return
        tails, stopped = [self.tails[r] for r in rows], [self.stopped[r] for r in rows]
        if ids is not None:
            tails = [(t + self.chars[c])[-self.hold:] for t, c in zip(tails, ids)]
            stopped = [s or any(t.endswith(x) for x in self.stops) for s, t in zip(stopped, tails)]
        self.tails, self.stopped = tails, stopped
