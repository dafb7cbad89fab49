"""When a run evaluates itself, and the evaluation: the mean loss over fixed batches of each split.

A run with a --max-time budget does not know how many steps it will take, so a step interval from a preset
(--eval-interval 250) gives a fast machine many evaluations and a slow one two or three: a three-point validation
curve. Unless --eval-interval is given, such a run evaluates instead whenever 1/EVALS_PER_BUDGET of its time budget
has passed since the last evaluation (and at step 0 and the end), so every budget gets a real curve and no two
evaluations fall a few steps apart; where the first evaluation shows that so many would cost more than a tenth of
the budget (a large alphabet on a slow CPU), fewer, on fewer batches (training/budget.py). Only the agreed clock
decides (RunState.elapsed, the same on every rank), so all ranks evaluate at the same step. Evaluations use their
own random stream and no dropout: when they happen never changes the training itself.
"""

import math

import torch

from chargpt.config import UNLIMITED, TrainConfig
from chargpt.errors import ChargptError
from chargpt.runtime import autocast, stream_seed
from chargpt.tools.evaluate import utf8_bytes, utf8_lengths

EVALS_PER_BUDGET = 20  # evaluations over a time budget (with the first and the last: about 21)
# A small text passed over many times between two evaluations can be memorised between them: at 600 s a 20,000-
# character text (2 x 128, 30 s between evaluations: about 100 passes) had its best checkpoint at step 0. So a run
# also evaluates every this many passes over its training text, as often as evaluation's share of the budget allows.
PASSES_PER_EVAL = 10
LN2 = math.log(2)


def eval_period(cfg: TrainConfig, interval_chosen=False):
    """Seconds of training between evaluations for a time budget, or None (evaluate by steps alone): with
    --max-time, unless --eval-interval was chosen (by a flag or a config file; a preset's or the default is not)."""
    if not cfg.max_time or interval_chosen:
        return None
    return cfg.max_time / EVALS_PER_BUDGET


def eval_steps(cfg: TrainConfig, period, budget_step=0):
    """With a time budget (`period` not None) that a step cap may end first (--preset auto caps the passes over a
    small corpus; --max-iters beside --max-time): also every 1/EVALS_PER_BUDGET of the steps from `budget_step`, so
    such a run evaluates, saves and checks --patience through the budget it actually uses. None: no such cap."""
    if period is None or cfg.max_iters >= UNLIMITED:
        return None
    return max(1, math.ceil((cfg.max_iters - budget_step) / EVALS_PER_BUDGET))


def pass_steps(period, train_chars, chars_per_step):
    """With a time budget (`period` not None): the steps of PASSES_PER_EVAL passes over the training text (the
    Validator evaluates after them once evaluation's share of the budget allows: EvalFit sets its gap). None:
    by the clock or the step cap alone."""
    if period is None or not train_chars or not chars_per_step:
        return None
    return max(1, math.ceil(PASSES_PER_EVAL * train_chars / chars_per_step))


def time_to_evaluate(elapsed, last_eval_elapsed, period):
    """Whether `period` seconds of training passed since the last evaluation (never with period None)."""
    return period is not None and elapsed - last_eval_elapsed >= period


def model_inputs(batch):
    """A batch as the model's keyword arguments: text batches come as (x, y), pairs batches as a dict already."""
    return batch if isinstance(batch, dict) else {"idx": batch[0], "targets": batch[1]}


@torch.no_grad()
def estimate_loss(model, batches, cfg: TrainConfig, device, dtype, dist, check_stop=lambda: None, iters=None):
    """Mean loss over `iters` batches per split (None: cfg.eval_iters): plain cross-entropy (no label smoothing),
    the number to compare. The batches come from a generator seeded the same way at every evaluation, so successive
    numbers compare the model, not the luck of the draw. check_stop() is called before each batch (it raises to
    abandon the evaluation)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "eval", dist.rank))
        losses = torch.zeros(iters or cfg.eval_iters, device=device)
        for k in range(iters or cfg.eval_iters):
            check_stop()
            batch = model_inputs(batches.get(split, gen))
            with autocast(device, dtype):
                _, loss = model(**batch)
            losses[k] = loss
        mean = losses.mean()
        if dist.enabled:
            torch.distributed.all_reduce(mean)
            mean /= dist.world_size
        out[split] = mean.item()  # note: a host sync, once per split per evaluation
    model.train()
    return out


class Validator:
    """Decides when to evaluate (every cfg.eval_interval steps; or by the clock, every `period` seconds, and then
    also every `steps` steps where a step cap may end the run first, and every `passes` steps (PASSES_PER_EVAL
    passes over the text) once `min_gap` seconds passed: see above) and evaluates: the plain model (no DDP sync is
    needed under no_grad, and torch.compile would recompile for eval mode) on the run's batches. The task's scores
    (translations of a pairs run) are the loop's to ask for, on rank 0."""

    def __init__(self, cfg: TrainConfig, state, period, steps, model, batches, device, dtype, dist, fit=None,
                 passes=None):
        self.cfg, self.state, self.period, self.steps, self.fit = cfg, state, period, steps, fit  # fit: EvalFit
        self.passes, self.min_gap = passes, 0.0  # min_gap: EvalFit's, from the first evaluation's cost
        self.last_eval_at, self.last_eval_step = state.elapsed, state.step
        self.model, self.batches, self.device, self.dtype, self.dist = model, batches, device, dtype, dist

    def due(self, step, elapsed):
        """Whether an evaluation falls at `step` (from step 0; `elapsed`: the agreed clock)."""
        if self.period is None:
            return step % self.cfg.eval_interval == 0
        since = step - self.last_eval_step
        return (step == 0 or time_to_evaluate(elapsed, self.last_eval_at, self.period)
                or (self.steps is not None and since >= self.steps)
                or (self.passes is not None and since >= self.passes and elapsed - self.last_eval_at >= self.min_gap))

    def evaluate(self, step, lr, check_stop):
        """-> {"train": loss, "val": loss}; weights that evaluate to a non-finite loss stop the run (they are never
        saved). check_stop() raises to abandon the evaluation. The session's first evaluation, timed, fits the
        cadence of a time budget to evaluation's share of it (self.fit)."""
        def measure(iters):  # -> seconds an evaluation on `iters` batches a split takes
            t0 = self.fit.clock()
            estimate_loss(self.model, self.batches, self.cfg, self.device, self.dtype, self.dist, check_stop, iters)
            return self.fit.clock() - t0
        ran = self.fit.first_iters(self, measure) if self.fit is not None else self.iters
        t0 = self.fit.clock() if self.fit is not None else None
        losses = estimate_loss(self.model, self.batches, self.cfg, self.device, self.dtype, self.dist, check_stop,
                               ran)
        if not all(math.isfinite(v) for v in losses.values()):
            raise ChargptError(
                f"evaluation loss became {losses['val']} at step {step} (learning rate {lr:.2e}): training "
                f"diverged, most likely because the learning rate is too high; lower --learning-rate. The last "
                f"good checkpoint in {self.cfg.out_dir} is kept.")
        if self.fit is not None:
            fit, self.fit = self.fit, None  # once
            fit.refit(fit.clock() - t0, self, ran)
        return losses

    @property
    def iters(self):
        """Batches a split: --eval-iters, or what a time budget's first evaluation fitted (the run's state)."""
        return self.state.eval_iters or self.cfg.eval_iters

    def evaluated(self, step, elapsed):
        """An evaluation at `step`, the agreed clock after it: the next one counts from here."""
        self.last_eval_step, self.last_eval_at = step, elapsed


def per_byte(corpus, batches):
    """{"train": b, "val": b}: the mean UTF-8 bytes of the characters each split of a text run holds (what its
    evaluations score, from random windows of that split); {} for a pairs run (its loss counts end markers, which
    are not text). Loss in bits over this is bits per byte, which unlike bits per character compares runs across
    alphabets (an English letter is a byte, a Chinese character three). Start-up counts it once (Run.bytes_per_char)."""
    split = getattr(batches, "split", None)
    if split is None or not hasattr(batches, "ids"):
        return {}
    lengths, out = utf8_lengths(corpus.vocab), {}
    for name in ("train", "val"):
        pieces = split.pieces(batches.ids, name)
        chars = sum(len(p) for p in pieces)
        out[name] = sum(utf8_bytes(p, lengths) for p in pieces) / chars if chars else None
    return out


def _bpb(losses, bytes_per_char, split):
    b = (bytes_per_char or {}).get(split)
    return losses[split] / LN2 / b if b else None


def eval_record(step, losses, lr, elapsed, scores, bytes_per_char=None):
    """The "eval" record (metrics.jsonl): losses in nats, bits per character and, given the splits' UTF-8 bytes
    per character (per_byte), bits per byte."""
    bpb = {split: _bpb(losses, bytes_per_char, split) for split in ("train", "val")}
    bpb = {f"{split}_bpb": round(v, 6) for split, v in bpb.items() if v is not None}
    return {"step": step, "train_loss": round(losses["train"], 6), "val_loss": round(losses["val"], 6),
            "train_bpc": round(losses["train"] / LN2, 6), "val_bpc": round(losses["val"] / LN2, 6), **bpb,
            "lr": lr, "elapsed_s": round(elapsed, 2), **scores}


def eval_line(step, losses, improved, scores, n_pairs=0, bytes_per_char=None):
    """The log line of an evaluation."""
    def units(split):
        bpb = _bpb(losses, bytes_per_char, split)
        return f"{losses[split] / LN2:.3f} bpc" + (f", {bpb:.3f} bpb" if bpb is not None else "")
    return (f"step {step:>6}: train {losses['train']:.4f} nats ({units('train')}), "
            f"val {losses['val']:.4f} nats ({units('val')})" + (" *" if improved else "")
            + (f"; exact match {scores['exact_match']:.1%}" if "exact_match" in scores else "")
            + (f", chrF {scores['chrf']:.1f}" if scores.get("chrf") is not None else "")
            + (f" ({n_pairs} val pairs, greedy)" if "exact_match" in scores else "")
            + by_label(scores.get("val_loss_by_label")))


def by_label(losses, shown=6):
    """'; val by label: a 1.23, b 1.45' (--labels: chargpt/data/labels.py), or ''."""
    if not losses:
        return ""
    items = [f"{name} {loss:.3f}" for name, loss in losses.items()]
    return "; val by label: " + ", ".join(items[:shown]) + (f" and {len(items) - shown} more" if len(items) > shown
                                                            else "")
