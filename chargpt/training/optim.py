"""Optimizers: AdamW for everything (the default), or Muon for the weight matrices and AdamW for the rest.

    --optimizer adamw    AdamW on every parameter (decay on matrices and embeddings, not biases or norms)
    --optimizer muon     Muon on the 2-D weight matrices inside the blocks (attention and MLP), AdamW on the
                         embeddings, the head, biases and norms; as in modded-nanoGPT and nanochat

Muon (Keller Jordan, 2024; torch.optim.Muon since torch 2.9) keeps a Nesterov momentum of each matrix's gradient
and replaces it by the nearest semi-orthogonal matrix (five Newton-Schulz iterations) before stepping, so every
direction of the matrix moves at the same rate. Embeddings and the head are lookups rather than transformations of
the residual stream, so they stay with AdamW.

Both optimizers step together as one Optimizers object; each parameter group carries an `lr_scale`, so one
schedule drives them all (group lr = schedule's lr x lr_scale; Muon's scale is --muon-lr / --learning-rate).
The parameters and gradients live in one flat buffer (chargpt/training/flat.py): clipping is one norm and one multiply,
AdamW one fused call per group, zeroing one fill.
"""

import math

import torch

from chargpt.config import TrainConfig
from chargpt.training.flat import FlatAdamW, FlatParams, LowPrecisionCopies


class Optimizers:
    """Several optimizers over disjoint parameters, stepped together. `parts` maps each one's name in
    state.safetensors ('optim' for AdamW, as before Muon existed, so old states still resume; 'muon') to it.
    `flat` (FlatParams) holds every parameter and gradient they step."""

    def __init__(self, parts, flat):
        self.parts, self.flat = parts, flat

    @property
    def param_groups(self):
        return [g for opt in self.parts.values() for g in opt.param_groups]

    def zero_grad(self):
        """Zero the gradients in place (one fill): they stay views of the flat buffer, never None."""
        self.flat.zero_grad()

    def clip_grad_norm_(self, max_norm):
        """Clip the total gradient norm to max_norm (torch.nn.utils.clip_grad_norm_'s rule); -> the norm before."""
        return self.flat.clip_grad_norm_(max_norm)


def is_muon_matrix(name, p):
    """Whether a parameter is one of the 2-D weight matrices inside the blocks (h.* decoder, enc.* encoder)."""
    return p.dim() == 2 and name.startswith(("h.", "enc."))


def split_params(model, weight_decay):
    """-> (Muon's matrices, AdamW's groups: decayed matrices and embeddings; biases and norms without decay).
    Every trainable parameter is in exactly one of them (a tied head is the embedding, counted once)."""
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]  # tied weights appear once
    muon = [p for n, p in named if is_muon_matrix(n, p)]
    rest = [p for n, p in named if not is_muon_matrix(n, p)]
    adamw = [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": weight_decay},
             {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}]
    return muon, adamw


def adamw(groups, flat, first_group, cfg: TrainConfig, device):
    """AdamW over the flat buffer's groups first_group, ... (FlatAdamW), fused where this torch supports it for the
    device (several times faster than the for-loop implementation: 5 ms against 31 ms per step measured for 10.7M
    parameters on CPU)."""
    kw = dict(lr=cfg.learning_rate, betas=(cfg.beta1, cfg.beta2))
    groups = [dict(g, lr_scale=1.0) for g in groups]
    try:
        return FlatAdamW(groups, flat, first_group, fused=device.type in ("cuda", "cpu"), **kw)
    except (RuntimeError, ValueError, TypeError):
        return FlatAdamW(groups, flat, first_group, **kw)


def newton_schulz_dtype(dtype):
    """What Muon's iteration computes in, for a run computing in `dtype`: bfloat16 in a bf16 run (torch.optim.Muon's
    own choice), float32 in any other (float32 means float32 everywhere; float16's narrow range is no place for an
    iteration whose products are only known to stay bounded in exact arithmetic)."""
    return torch.bfloat16 if dtype == torch.bfloat16 else torch.float32


def describe_numerics(dtype, optimizer, copies=False):
    """The start-up line saying what each part of a training step computes in; copies: whether the forward reads
    low_precision_copies of the weights."""
    def name(d):
        return str(d).removeprefix("torch.")
    if dtype == torch.float32:
        step = "forward and backward in float32"
    else:
        scaled = " with loss scaling" if dtype == torch.float16 else ""
        read = f", reading {name(dtype)} copies of the linear weights made once a step" if copies else ""
        step = (f"forward and backward matmuls in {name(dtype)} (autocast{scaled}{read}; the ops autocast keeps in "
                f"float32, such as the loss, stay there)")
    muon = f"; Muon's Newton-Schulz iteration in {name(newton_schulz_dtype(dtype))}" if optimizer == "muon" else ""
    return f"numerics: {step}; weights, gradients and optimizer states in float32{muon}"


def make_optimizer(model, cfg: TrainConfig, device, dtype=torch.float32):
    """-> Optimizers: AdamW alone, or Muon for the matrices + AdamW for the rest (cfg.optimizer); Muon's iteration
    computes in newton_schulz_dtype(dtype), for the run's dtype."""
    if cfg.optimizer == "adamw":
        matrices, rest = [], model.optimizer_groups(cfg.weight_decay)
    else:
        matrices, rest = split_params(model, cfg.weight_decay)
    rest = [g for g in rest if g["params"]]
    # the layout: Muon's matrices (if any), then each AdamW group; every parameter a view of flat's buffers
    flat = FlatParams(([matrices] if matrices else []) + [g["params"] for g in rest])
    parts = {"optim": adamw(rest, flat, 1 if matrices else 0, cfg, device)}
    if matrices:
        parts["muon"] = Muon([{"params": matrices, "lr_scale": cfg.muon_lr / cfg.learning_rate}], lr=cfg.muon_lr,
                             weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum,
                             ns_dtype=newton_schulz_dtype(dtype))
    return Optimizers(parts, flat)


def orthogonalize(g, coefficients, steps, eps, dtype):
    """The Newton-Schulz iteration of torch.optim.Muon (a quintic that pushes every singular value of g towards 1),
    computed in `dtype`: g (A, B) -> about U V^T where g = U S V^T. g may also be a stack (N, A, B) of matrices of
    one shape, each orthogonalised on its own in one batched matmul per product."""
    a, b, c = coefficients
    tall = g.size(-2) > g.size(-1)
    x = g.to(dtype, copy=True)
    if tall:
        x = x.mT  # (small, large): the Gram matrix below is the small one
    x.div_(x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps))  # spectral norm <= Frobenius norm <= 1
    mul = torch.addmm if x.dim() == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = mul(x, mul(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def orthogonalize_all(updates, coefficients, steps, eps, dtype):
    """Each update matrix orthogonalised, matrices of one shape together: a model's layers repeat the same few
    shapes, so this is a few batched iterations instead of one per matrix (at 6x384, 4 instead of 24; per-call
    overhead dominates the small matrices of a CPU-sized model). -> the results, in the order given."""
    by_shape = {}
    for i, u in enumerate(updates):
        by_shape.setdefault(tuple(u.shape), []).append(i)
    out = [None] * len(updates)
    for idx in by_shape.values():
        if len(idx) == 1:  # alone: the very operations of torch.optim.Muon, so its results match bit for bit
            out[idx[0]] = orthogonalize(updates[idx[0]], coefficients, steps, eps, dtype)
            continue
        for i, o in zip(idx, orthogonalize(torch.stack([updates[i] for i in idx]), coefficients, steps, eps, dtype)):
            out[i] = o
    return out


class Muon(torch.optim.Muon):
    """torch.optim.Muon (same hyperparameters, state and update) with the Newton-Schulz iteration in `ns_dtype`,
    batched over matrices of one shape. torch always runs it in bf16; here it follows the run's dtype
    (newton_schulz_dtype), so --dtype float32 means float32 everywhere, and an auto run on a CPU without native
    bf16 (which emulates bf16 matmuls at about 1 GFLOP/s, 100x slower than fp32) runs it in float32."""

    def __init__(self, params, ns_dtype=torch.bfloat16, **kw):
        super().__init__(params, **kw)
        self.ns_dtype = ns_dtype
        # fp16 loss scaling: GradScaler.step then hands this optimizer its scale and inf flag as tensors
        # (self.grad_scale, self.found_inf) instead of reading the flag on the host (.item(): a GPU sync every step)
        self._step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None):
        grad_scale = getattr(self, "grad_scale", None)  # set by GradScaler.step: gradients are still scaled by it
        found_inf = getattr(self, "found_inf", None)  # set by GradScaler.step: > 0 means skip this step
        for group in self.param_groups:
            params, grads, bufs = [], [], []
            self._init_group(group, params, grads, bufs)
            if grad_scale is not None:
                grads = [g / grad_scale for g in grads]
            if found_inf is not None:
                self._step_unless_inf(group, params, grads, bufs, found_inf == 0)
                continue
            lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            updates = []
            for grad, buf in zip(grads, bufs):
                buf.lerp_(grad, 1 - momentum)
                updates.append(grad.lerp(buf, momentum) if group["nesterov"] else buf)
            updates = orthogonalize_all(updates, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                        self.ns_dtype)
            for p, update in zip(params, updates):
                p.mul_(1 - lr * decay)
                p.add_(update, alpha=-lr * math.sqrt(max(1, p.size(0) / p.size(1))))  # Keller's shape scaling
        return None

    def _step_unless_inf(self, group, params, grads, bufs, finite):
        """The step above, taken only where `finite` (a 0-dim bool tensor) holds, decided on the device: the
        momentum and the weights keep their old values otherwise (torch.where, as fused AdamW skips)."""
        lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
        updates, new_bufs = [], []
        for grad, buf in zip(grads, bufs):
            new = buf.lerp(grad, 1 - momentum)
            new_bufs.append(new)
            updates.append(grad.lerp(new, momentum) if group["nesterov"] else new)
        updates = orthogonalize_all(updates, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
        for p, buf, new, update in zip(params, bufs, new_bufs, updates):
            buf.copy_(torch.where(finite, new, buf))
            stepped = (p * (1 - lr * decay)).add_(update, alpha=-lr * math.sqrt(max(1, p.size(0) / p.size(1))))
            p.copy_(torch.where(finite, stepped, p))


def low_precision_copies(model, optimizer, device, dtype, wrapped):
    """bf16 copies of the weights for the training forward (flat.LowPrecisionCopies: autocast's numbers without
    its casts every step), or None: on a CPU in bf16, where the casts are a fifth of a small model's operator calls,
    and not under torch.compile or DDP (wrapped), which see the model's own parameters."""
    if device.type != "cpu" or dtype != torch.bfloat16 or wrapped:
        return None
    return LowPrecisionCopies(model, optimizer.flat, dtype)
