"""Dropout whose mask costs little on a CPU.

torch's CPU dropout draws one Mersenne-Twister number per element (bernoulli_), about 8 ns each on a 2-core
Xeon: at the cpu preset's shape (2 x 128, context 128, batch 16) its five masks cost more than the rest of a training
step, so dropout 0.2 took a step from 28 to 60 ms and was priced out of the small-corpus runs that need it most. Here
each 64-bit random number gives eight elements' masks: its eight bytes, each kept when >= round(p * 256). The rate
is p to within 1/512 (0.2 -> 51/256 = 0.1992), and the kept values are scaled by 1 / (1 - that rate), so the
expectation is exact. The numbers come from torch's default generator, like torch's own dropout, so a seed repeats
a run and a resumed run's saved random state continues it.

On other devices torch's kernels (Philox on a GPU) are already cheap, and they are used.
"""

import math

import torch
from torch import nn
from torch.nn import functional as F

LEVELS = 256  # one byte per element


def keep_mask(shape, p, dtype=torch.float32, device=None, generator=None):
    """A mask of `shape` in `dtype`, each element 1 with probability 1 - p quantised to 1/256 and 0 otherwise ->
    (mask, the rate actually dropped). In the tensor's own dtype, so that applying it and its gradient converts
    nothing (a bool mask cost a conversion in the forward and the backward: more than drawing it)."""
    threshold, n = round(p * LEVELS), math.prod(shape)
    words = torch.randint(-2 ** 63, 2 ** 63 - 1, ((n + 7) // 8,), dtype=torch.int64, device=device,
                          generator=generator)
    return words.view(torch.uint8)[:n].view(shape).to(dtype).ge_(threshold), threshold / LEVELS


def dropout(x, p, training=True):
    """F.dropout(x, p, training), its mask drawn a byte an element on a CPU (module docstring)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    keep, rate = keep_mask(x.shape, p, x.dtype, x.device)
    if rate >= 1.0:
        return x * 0.0
    return (x * keep).mul_(1.0 / (1.0 - rate))  # the scale as a number: exact in any dtype's arithmetic


class Dropout(nn.Dropout):
    """nn.Dropout with the cheap CPU mask: a drop-in for every dropout of the models."""

    def forward(self, x):
        return dropout(x, self.p, self.training)
