"""An output layer whose cost follows the characters a text uses: the adaptive softmax (Grave et al. 2017,
"Efficient softmax approximation for GPUs"), for alphabets of thousands of characters (--softmax adaptive).

    head = AdaptiveSoftmax(n_embd, vocab_size, shortlist)   # then head.set_frequencies(counts) on a new run
    logp = head(x)                                          # (..., V) log-probabilities, in vocabulary order
    loss = head.loss(x, targets, loss_mask)                 # the mean cross-entropy, as lm_loss's

Over Chinese the full head is most of a CPU training step: 10,000 characters cost three (B*T, C) x (C, V)
products, while a fifth of the characters make up most of the text (in Tang poems the 1,000 most used cover 85%
of it). Here characters are ranked by how often the training text uses them. The shortlist, the most used, is
scored at the model's full width as by the full head, together with one entry per tail cluster; the rest fall in
clusters each TAIL_GROWTH times larger than the one before and scored through a projection to a TAIL_DIVISOR-th of
the width before. P(character) = P(its cluster) x P(it | cluster): an exact distribution, normalised over the whole
vocabulary, so losses compare with the full head's. Training computes a cluster only for the rows whose target
falls in it. The reference is torch.nn.AdaptiveLogSoftmaxWithLoss; this one keeps the vocabulary's own order (the
ranking is a stored buffer), runs under autocast, honours loss masks and sums in float32.

The ranking is stored as the frequencies themselves (a float32 buffer, as every tensor of a checkpoint is), and
the rank of each character is recomputed from them whenever they are set or loaded, ties by id: the same ranking
on every machine.
"""

import numpy as np
import torch
import torch.nn as nn
from torch.nn import functional as F

from chargpt.model.loss import row_weights

SHORTLIST_SHARE = 0.8  # the shortlist: the most used characters that cover this share of the training text
MIN_SHORTLIST = 64  # (rounded up to a multiple of 64, at least this many)
TAIL_GROWTH = 4  # each tail cluster holds this many times the characters of the one before
TAIL_DIVISOR = 4  # and is scored at this fraction of the width before (at least MIN_TAIL_DIM)
MIN_TAIL_DIM = 8


def char_counts(ids, vocab_size, chunk=1 << 24):
    """How often each id occurs in `ids` (a sequence, e.g. a corpus's memory map), a chunk at a time -> (V,) int64.
    The whole corpus is counted: the ranking only decides which characters are scored at which width (it is no
    part of any loss), and the count needs no split."""
    counts = np.zeros(vocab_size, dtype=np.int64)
    for start in range(0, len(ids), chunk):
        counts += np.bincount(np.asarray(ids[start:start + chunk]), minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(counts)


def shortlist_for(counts, share=SHORTLIST_SHARE):
    """The shortlist's size for a text whose characters are used `counts` (V,) times: the most used that cover
    `share` of it, a multiple of 64, at least MIN_SHORTLIST, and below V (at least one character in a tail)."""
    counts = torch.as_tensor(counts, dtype=torch.float64)
    covered = counts.sort(descending=True).values.cumsum(0) / counts.sum().clamp(min=1)
    return _rounded(int((covered < share).sum()) + 1, counts.numel())


def default_shortlist(vocab_size, share=SHORTLIST_SHARE):
    """The shortlist for a text that uses every character alike (a model built without its text's counts)."""
    return _rounded(int(share * vocab_size) + 1, vocab_size)


def _rounded(n, vocab_size):
    return max(1, min(vocab_size - 1, max(MIN_SHORTLIST, -(-n // 64) * 64)))


def cutoffs(vocab_size, shortlist):
    """Rank boundaries [shortlist, ..., vocab_size]: the shortlist, then clusters TAIL_GROWTH times larger each."""
    out, end = [shortlist], shortlist
    while end < vocab_size:
        end = min(vocab_size, end * TAIL_GROWTH)
        if vocab_size - end < shortlist:  # a last cluster smaller than the shortlist joins the one before
            end = vocab_size
        out.append(end)
    return out


def tail_dims(n_embd, vocab_size, shortlist):
    """[(width, characters)] of each tail cluster."""
    bounds = cutoffs(vocab_size, shortlist)
    return [(max(MIN_TAIL_DIM, n_embd // TAIL_DIVISOR ** (i + 1)), hi - lo)
            for i, (lo, hi) in enumerate(zip(bounds, bounds[1:]))]


def weights(n_embd, vocab_size, shortlist):
    """The layers' weights (biases left out), from the sizes alone."""
    dims = tail_dims(n_embd, vocab_size, shortlist)
    return n_embd * (shortlist + len(dims)) + sum(d * (n_embd + size) for d, size in dims)


class AdaptiveSoftmax(nn.Module):
    """The head (module docstring). Shapes: N rows, C = n_embd, V vocabulary, s shortlist, k tail clusters."""

    def __init__(self, n_embd, vocab_size, shortlist, bias=True):
        super().__init__()
        if not 0 < shortlist < vocab_size:
            raise ValueError(f"an adaptive softmax needs 0 < shortlist < vocabulary ({shortlist}, {vocab_size})")
        self.cutoffs = cutoffs(vocab_size, shortlist)
        dims = tail_dims(n_embd, vocab_size, shortlist)
        self.head = nn.Linear(n_embd, shortlist + len(dims), bias=bias)  # the shortlist's logits, one per cluster
        self.tails = nn.ModuleList(nn.Sequential(nn.Linear(n_embd, d, bias=False), nn.Linear(d, size, bias=bias))
                                   for d, size in dims)
        self.register_buffer("frequency", torch.zeros(vocab_size))  # (V,) the training text's use of each id
        self.register_buffer("rank", torch.arange(vocab_size), persistent=False)  # (V,) id -> rank
        self.register_buffer("bounds", torch.tensor(self.cutoffs), persistent=False)  # on the device, made once
        self.register_load_state_dict_post_hook(lambda module, keys: module.rerank())

    def set_frequencies(self, counts):
        """Rank the vocabulary by counts (V,): how often the training text uses each character."""
        with torch.no_grad():
            self.frequency.copy_(torch.as_tensor(counts, dtype=torch.float32))
        self.rerank()

    def rerank(self):
        order = torch.sort(-self.frequency, stable=True).indices  # rank -> id, most used first, ties by id
        if order.device.type != "meta":
            self.rank[order] = torch.arange(order.numel(), device=order.device)

    def forward(self, x):
        """x (..., C) -> log-probabilities (..., V) in vocabulary order (float32): what sampling reads as logits."""
        s = self.cutoffs[0]
        head = F.log_softmax(self.head(x).float(), dim=-1)  # (..., s + k)
        parts = [head[..., :s]] + [F.log_softmax(tail(x).float(), dim=-1) + head[..., s + i, None]
                                   for i, tail in enumerate(self.tails)]
        return torch.cat(parts, dim=-1).index_select(-1, self.rank)  # by rank -> by id

    def loss(self, x, targets, loss_mask=None):
        """The mean cross-entropy of x (..., C) against targets (...) over the counted positions (all, or where
        loss_mask is set; targets of -100 count nothing): lm_loss's definition, without the (N, V) logits."""
        x = x.reshape(-1, x.size(-1))
        w, inv = row_weights(targets.reshape(-1), loss_mask)
        r = self.rank[targets.reshape(-1).clamp(min=0)]  # (N,) each target's rank
        s = self.cutoffs[0]
        head = F.log_softmax(self.head(x).float(), dim=-1)  # (N, s + k)
        cluster = torch.bucketize(r, self.bounds, right=True)  # 0: the shortlist
        logp = head.gather(1, torch.where(cluster == 0, r, s + cluster - 1)[:, None]).squeeze(1)  # (N,)
        for i, tail in enumerate(self.tails):  # each cluster for the rows whose target is in it
            # (with none, on no rows: every parameter is still in the graph, as DDP expects of each step)
            rows = ((cluster == i + 1) & (w > 0)).nonzero().squeeze(1)  # (n,)
            within = F.log_softmax(tail(x[rows]).float(), dim=-1)  # (n, cluster size)
            logp = logp.index_add(0, rows, within.gather(1, (r[rows] - self.cutoffs[i])[:, None]).squeeze(1))
        return -(logp * w).sum() * inv
