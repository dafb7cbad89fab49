"""The output head and its cross-entropy in one step, by row chunks: the full (N, V) logits never exist at once.

    loss = head_loss(hidden, weight, targets, loss_mask=mask, label_smoothing=0.1)   # == lm_loss(hidden @ W.T, ...)

A character-level model over Chinese has V of about 10,000, so its (B*T, V) logits are by far the largest tensor of
a training step: materialised in the autocast dtype, cast to float32, normalised, differentiated and cast back,
several times the memory and most of the time of the whole step. Here the head's matmul, logsumexp (float32), the
loss and the gradient of the logits are computed a chunk of rows at a time, and the chunk's gradient is pushed
straight through the head (into d hidden and d weight) in the forward pass, so backward only scales what is stored.
After Liger Kernel's fused linear cross-entropy (Hsu et al. 2024) and Apple's Cut Cross-Entropy (Wijmans et al.
2024), in plain torch ops so it runs on a CPU and on CUDA alike.

Shapes: N rows (B*T positions), C = n_embd, V vocabulary size, n rows in a chunk.

The loss is exactly the model's lm_loss: the mean cross-entropy over the counted rows (all, or those where
loss_mask is set, divided by the mask's count), with label smoothing as F.cross_entropy defines it and its
ignore_index (-100) honoured. It is a function of local tensors only, so DDP all-reduces the gradients it returns
as any other. Small vocabularies keep the plain path (use_fused): there the logits are small and one big matmul
beats a loop of chunks.
"""

import torch

IGNORE_INDEX = -100  # F.cross_entropy's default: targets equal to it count nothing
# From this vocabulary size up, "auto" fuses. Rough in-process ratios of the head + loss alone (N 2,048, C 128, a
# busy 2-core CPU; python -m chargpt.bench vocab is the measurement): the fused path level at 256 characters, ahead
# from about 512 and far ahead at 10,000; at 65 the logits are tiny. 1,024 leaves a margin, and English (65) keeps
# today's path exactly.
FUSED_MIN_VOCAB = 1024
# Bytes of float32 logits per chunk. On a CPU, a chunk and the head's weight should stay in the (L2/L3) cache
# between its forward and its gradient; on a GPU, chunks only need to be large enough to keep the device busy.
CHUNK_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}
MIN_CHUNK_ROWS = 128  # below this the per-chunk traffic over the whole (V, C) weight and its gradient dominates


def use_fused(kernel, vocab_size):
    """Whether the loss goes through head_loss: kernel "fused", "full" (logits, then lm_loss) or "auto"."""
    if kernel not in ("auto", "fused", "full"):
        raise ValueError(f"loss kernel must be auto, fused or full (got {kernel!r})")
    return kernel == "fused" or (kernel == "auto" and vocab_size >= FUSED_MIN_VOCAB)


def chunk_rows(n_rows, vocab_size, device_type):
    """Rows per chunk: CHUNK_BYTES of float32 logits, at least MIN_CHUNK_ROWS, a multiple of 16, at most n_rows."""
    rows = CHUNK_BYTES.get(device_type, CHUNK_BYTES["cuda"]) // (4 * vocab_size)
    return max(1, min(n_rows, max(MIN_CHUNK_ROWS, rows // 16 * 16)))


def row_weights(targets, loss_mask=None, ignore_index=IGNORE_INDEX):
    """targets (N,), loss_mask (N,) or None -> (w (N,) float32, 1 / count): loss = sum_i w_i * loss_i / count,
    the mean lm_loss takes (F.cross_entropy's mean over targets not ignored, or the mask's count, at least 1)."""
    w = (targets != ignore_index).float()  # (N,)
    if loss_mask is None:
        return w, 1.0 / w.sum()  # all ignored: nan, as F.cross_entropy's mean of nothing
    w = w * loss_mask.reshape(-1).float()
    return w, 1.0 / loss_mask.float().sum().clamp(min=1)


def compute_dtype(device_type, dtype):
    """The dtype the head's matmuls run in: autocast's where it is on (the plain path's F.linear would use it)."""
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return dtype


def head_loss(hidden, weight, targets, bias=None, loss_mask=None, label_smoothing=0.0, chunk=None):
    """hidden (N, C), weight (V, C), bias (V,) or None, targets (N,) ids, loss_mask (N,) or None -> the mean
    cross-entropy of the logits hidden @ weight.T + bias (a float32 scalar), computed chunk by chunk (chunk: rows
    per chunk; default chunk_rows). Differentiable in hidden, weight and bias; under no_grad it only computes."""
    N, V = hidden.size(0), weight.size(0)
    dtype = compute_dtype(hidden.device.type, hidden.dtype)
    w, inv = row_weights(targets, loss_mask)
    targets = targets.clamp(min=0)  # ignored rows have weight 0; any valid id stands in for the gather
    if hidden.device.type == "cpu" and loss_mask is not None:
        # rows that count nothing (the source side of sentence pairs) cost nothing; on a GPU the host sync that
        # finding them needs would cost more than the rows. The count (inv) stays the whole mask's.
        keep = w.nonzero().squeeze(1)  # (M,)
        if keep.numel() < N:
            hidden, targets, w = hidden[keep], targets[keep], w[keep]  # indexing's backward puts 0 elsewhere
    chunk = chunk or chunk_rows(hidden.size(0), V, hidden.device.type)
    tensors = (hidden, weight) + (() if bias is None else (bias,))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return LinearCrossEntropy.apply(hidden, weight, bias, targets, w, inv, label_smoothing, chunk, dtype)
    return chunked(hidden, weight, bias, targets, w, label_smoothing, chunk, dtype, (False, False, False))[0] * inv


def chunked(hidden, weight, bias, targets, w, eps, chunk, dtype, grads):
    """The loop. -> (sum_i w_i * loss_i (float32 scalar), d hidden (N, C) float32, d weight (V, C) float32,
    d bias (V,) float32), the gradients of that sum (not yet divided by the count), each None unless `grads`
    (three bools: hidden, weight, bias) asks for it. Matmuls in `dtype`, everything per element in float32."""
    N, C = hidden.shape
    V = weight.size(0)
    need_h, need_w, need_b = grads
    with torch.autocast(hidden.device.type, enabled=False):  # the casts are explicit, each done once
        h_all, W = hidden.to(dtype), weight.to(dtype)  # (N, C), (V, C)
        b = None if bias is None else bias.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        dh = torch.empty(N, C, dtype=torch.float32, device=hidden.device) if need_h else None
        dW = torch.zeros(V, C, dtype=torch.float32, device=hidden.device) if need_w else None
        db = torch.zeros(V, dtype=torch.float32, device=hidden.device) if need_b and bias is not None else None
        for a in range(0, N, chunk):
            h, t, wr = h_all[a:a + chunk], targets[a:a + chunk, None], w[a:a + chunk]  # (n, C), (n, 1), (n,)
            z = h @ W.t() if b is None else torch.addmm(b, h, W.t())  # (n, V) logits of this chunk
            # the loss terms read z in its own dtype (exact values; sums accumulate in float32)
            per = -(1.0 - eps) * z.gather(1, t).squeeze(1).float()  # (n,) -> each row's cross-entropy, below
            if eps:  # label smoothing: eps of the target is spread uniformly, -eps * mean_j z_j
                per -= (eps / V) * z.sum(dim=1, dtype=torch.float32)
            # logsumexp by hand: torch.logsumexp would make more (n, V) passes and temporaries. The subtraction
            # is the cast to float32 (in place when z is float32 already: the logits are no longer needed).
            m = z.amax(dim=1, keepdim=True).float()  # (n, 1)
            e = (z.sub_(m) if z.dtype == torch.float32 else z - m).exp_()  # (n, V) float32 exp(z - max)
            s = e.sum(dim=1)  # (n,)
            per += m.squeeze(1) + s.log()
            total += (per * wr).sum()
            if not (need_h or need_w or need_b):
                continue
            # d loss_i / d z_ij = softmax_ij - (1 - eps) [j = t_i] - eps / V, times the row's weight
            g = e.mul_((wr / s)[:, None])  # (n, V) softmax times weight
            if eps:
                g.sub_((wr * (eps / V))[:, None])
            g.scatter_add_(1, t, (wr * (eps - 1.0))[:, None])
            gc = g.to(dtype)  # (n, V): the matmuls' dtype, as the plain path's backward (g itself in float32)
            if need_h:
                dh[a:a + chunk] = gc @ W  # (n, C)
            if need_w:
                if gc.dtype == torch.float32:
                    dW.addmm_(gc.t(), h)  # (V, C), in place
                else:
                    dW += gc.t() @ h  # accumulated in float32
            if db is not None:
                db += g.sum(dim=0)
    return total, dh, dW, db


class LinearCrossEntropy(torch.autograd.Function):
    """head_loss with its gradient: forward computes the loss and, chunk by chunk, d hidden, d weight and d bias;
    backward scales them by the incoming gradient (1, or the fp16 loss scale)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, w, inv, eps, chunk, dtype):
        grads = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        total, dh, dW, db = chunked(hidden, weight, bias, targets, w, eps, chunk, dtype, grads)
        # divided by the count once at the end: no host sync, and no tiny per-row values in a half dtype
        for g in (dh, dW, db):
            if g is not None:
                g.mul_(inv)
        ctx.save_for_backward(*(g if g is not None else torch.empty(0) for g in (dh, dW, db)))
        ctx.has = tuple(g is not None for g in (dh, dW, db))
        ctx.dtypes = (hidden.dtype, weight.dtype, None if bias is None else bias.dtype)
        return total * inv

    @staticmethod
    def backward(ctx, grad):
        out = [(g * grad).to(dt) if has else None for g, has, dt in zip(ctx.saved_tensors, ctx.has, ctx.dtypes)]
        return (*out, None, None, None, None, None, None)
