"""The output head and its cross-entropy in one step, by row chunks: the full (N, V) logits never exist at once.

    loss = head_loss(hidden, weight, targets, loss_mask=mask, label_smoothing=0.1)   # == lm_loss(hidden @ W.T, ...)

A character-level model over Chinese has V of about 10,000, so its (B*T, V) logits are by far the largest tensor of
a training step: materialised in the autocast dtype, cast to float32, normalised, differentiated and cast back,
several times the memory and most of the time of the whole step. Here the head's matmul, logsumexp (float32), the
loss and the gradient of the logits are computed a chunk of rows at a time, and the chunk's gradient is pushed
straight through the head (into d hidden and d weight) in the forward pass, so backward only scales what is stored.
After Liger Kernel's fused linear cross-entropy (Hsu et al. 2024) and Apple's Cut Cross-Entropy (Wijmans et al.
2024), in plain torch ops so it runs on a CPU and on CUDA alike.

Shapes: N rows (B*T positions), C = n_embd, V vocabulary size, n rows in a chunk, G rows in a group of chunks.

The loss is exactly the model's lm_loss: the mean cross-entropy over the counted rows (all, or those where
loss_mask is set, divided by the mask's count), with label smoothing as F.cross_entropy defines it and its
ignore_index (-100) honoured. It is a function of local tensors only, so DDP all-reduces the gradients it returns
as any other. Small vocabularies keep the plain path (use_fused): there the logits are small and one big matmul
beats a loop of chunks.
"""

import torch

IGNORE_INDEX = -100  # F.cross_entropy's default: targets equal to it count nothing
# From this vocabulary size up, "auto" fuses. Rough in-process ratios of the head + loss alone (N 2,048, C 128, a
# busy 2-core CPU; python -m chargpt.bench --only vocab is the measurement): the fused path level at 256
# characters, ahead from about 512 and far ahead at 10,000; at 65 the logits are tiny. 1,024 leaves a margin, and
# English (65) keeps today's path exactly. On a GPU it is not yet measured: scripts/gpu_check.sh's fused_loss part
# times both paths at 2,000 and 10,000 characters.
FUSED_MIN_VOCAB = 1024
# Two sizes, both in rows of logits. A chunk is where the softmax is computed: CHUNK_BYTES of float32 logits, on a
# CPU small enough to stay in the (L2/L3) cache from the matmul through the softmax to its gradient. A group is what
# one pair of gradient matmuls covers (d hidden = g @ W, d weight += g.T @ h): its gradients wait in a GROUP_BYTES
# buffer in the matmuls' dtype. Accumulating d weight (V, C) in float32 after every small chunk (a cast and an add
# of the whole V x C) measured as costly as the chunk's own matmuls, so groups are larger; on a GPU both are large.
CHUNK_BYTES = {"cpu": 4 << 20, "cuda": 256 << 20}
GROUP_BYTES = {"cpu": 32 << 20, "cuda": 256 << 20}
MIN_CHUNK_ROWS = 128  # a matmul over fewer rows is inefficient, and each chunk reads the whole (V, C) weight


def use_fused(kernel, vocab_size):
    """Whether the loss goes through head_loss: kernel "fused", "full" (logits, then lm_loss) or "auto"."""
    if kernel not in ("auto", "fused", "full"):
        raise ValueError(f"loss kernel must be auto, fused or full (got {kernel!r})")
    return kernel == "fused" or (kernel == "auto" and vocab_size >= FUSED_MIN_VOCAB)


def chunk_rows(n_rows, vocab_size, device_type, budget=CHUNK_BYTES, elem=4):
    """Rows per chunk (or group, with GROUP_BYTES and the matmuls' element size): the budget's bytes of logits, at
    least MIN_CHUNK_ROWS, a multiple of 16, at most n_rows."""
    rows = budget.get(device_type, budget["cuda"]) // (elem * vocab_size)
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


def head_loss(hidden, weight, targets, bias=None, loss_mask=None, label_smoothing=0.0, chunk=None, group=None):
    """hidden (N, C), weight (V, C), bias (V,) or None, targets (N,) ids, loss_mask (N,) or None -> the mean
    cross-entropy of the logits hidden @ weight.T + bias (a float32 scalar), computed chunk by chunk (chunk, group:
    rows per chunk and per group; default chunk_rows). Differentiable in hidden, weight and bias; under no_grad it
    only computes the loss."""
    N, V = hidden.size(0), weight.size(0)
    device = hidden.device.type
    dtype = compute_dtype(device, hidden.dtype)
    w, inv = row_weights(targets, loss_mask)
    targets = targets.clamp(min=0)  # ignored rows have weight 0; any valid id stands in for the gather
    if device == "cpu" and loss_mask is not None and not torch.compiler.is_compiling():
        # rows that count nothing (the source side of sentence pairs) cost nothing. Not on a GPU, where the host
        # sync that finding them needs would cost more than the rows, nor under torch.compile, where a row count
        # that changes every batch would recompile. The count (inv) stays the whole mask's.
        keep = w.nonzero().squeeze(1)  # (M,)
        if keep.numel() < N:
            hidden, targets, w = hidden[keep], targets[keep], w[keep]  # indexing's backward puts 0 elsewhere
    M = hidden.size(0)
    if loss_mask is not None and torch.compiler.is_compiling():
        # Sentence pairs (the only callers with a mask) come in batches of varying length, and the loop's row counts
        # are Python ints: traced, they would specialise the graph to each length, recompiling per length up to
        # torch's limit (8) and then running the whole forward eagerly. So all rows are one chunk here (chunk None:
        # no row count in Python), and the graph turns dynamic at the second length (tests/test_gpu_paths.py); its
        # logits are whole, in memory at once, as on the plain path.
        chunk = group = None
    else:
        chunk = chunk or chunk_rows(M, V, device)
        group = -(-(group or chunk_rows(M, V, device, GROUP_BYTES, dtype.itemsize)) // chunk) * chunk  # whole chunks
    tensors = (hidden, weight) + (() if bias is None else (bias,))
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return LinearCrossEntropy.apply(hidden, weight, bias, targets, w, inv, label_smoothing, chunk, group, dtype)
    return chunked(hidden, weight, bias, targets, w, label_smoothing, chunk, group, dtype, (False,) * 3)[0] * inv


def plan(n_rows, chunk, group):
    """The loop's slices: [(a group's rows, its part of the group buffer, [(a chunk's rows, its part of the group
    buffer), ...]), ...]. chunk None: all rows as one chunk, without a row count in Python (see head_loss)."""
    if chunk is None:
        return [(slice(None), slice(None), [(slice(None), slice(None))])]
    out = []
    for g0 in range(0, n_rows, group):
        g1 = min(g0 + group, n_rows)
        chunks = [(slice(a, min(a + chunk, g1)), slice(a - g0, min(a + chunk, g1) - g0)) for a in range(g0, g1, chunk)]
        out.append((slice(g0, g1), slice(0, g1 - g0), chunks))
    return out


def chunked(hidden, weight, bias, targets, w, eps, chunk, group, dtype, grads):
    """The loop. -> (sum_i w_i * loss_i (float32 scalar), d hidden (N, C) float32, d weight (V, C) float32,
    d bias (V,) float32), the gradients of that sum (not yet divided by the count), each None unless `grads`
    (three bools: hidden, weight, bias) asks for it. Matmuls in `dtype`, everything per element in float32.
    chunk, group: rows per chunk and per group, or None for all rows in one."""
    N, C = hidden.shape
    V = weight.size(0)
    need_h, need_w, need_b = grads
    need_g = need_h or need_w or need_b
    f32, dev = torch.float32, hidden.device
    with torch.autocast(dev.type, enabled=False):  # the casts are explicit, each done once
        h_all, W = hidden.to(dtype), weight.to(dtype)  # (N, C), (V, C)
        b = None if bias is None else bias.to(dtype)
        total = torch.zeros((), dtype=f32, device=dev)
        dh = torch.empty(N, C, dtype=f32, device=dev) if need_h else None
        dW = torch.zeros(V, C, dtype=f32, device=dev) if need_w else None
        db = torch.zeros(V, dtype=f32, device=dev) if need_b and bias is not None else None
        buffer_rows = N if group is None else min(group, N)
        gbuf = torch.empty(buffer_rows, V, dtype=dtype, device=dev) if need_g else None  # a group's d logits
        for rows, in_group, chunks in plan(N, chunk, group):
            for here, in_buf in chunks:
                h, t, wr = h_all[here], targets[here][:, None], w[here]  # (n, C), (n, 1), (n,)
                out = gbuf[in_buf] if need_g and dtype == f32 else None  # float32: all in place there
                z = torch.mm(h, W.t(), out=out) if b is None else torch.addmm(b, h, W.t(), out=out)  # (n, V)
                # the loss terms read z in its own dtype (exact values; sums accumulate in float32)
                per = -(1.0 - eps) * z.gather(1, t).squeeze(1).float()  # (n,) -> each row's cross-entropy, below
                if eps:  # label smoothing: eps of the target is spread uniformly, -eps * mean_j z_j
                    per -= (eps / V) * z.sum(dim=1, dtype=f32)
                # logsumexp by hand, in place on the float32 copy (on z itself in float32: the logits are no
                # longer needed), whose exp is then the softmax's numerator. (A mixed bf16 - float32 subtraction
                # instead of the copy measured several times slower on a CPU.)
                zf = z.float()  # (n, V)
                m = zf.amax(dim=1, keepdim=True)  # (n, 1)
                e = zf.sub_(m).exp_()  # (n, V) exp(z - max)
                s = e.sum(dim=1)  # (n,)
                total += ((per + m.squeeze(1) + s.log()) * wr).sum()
                if not need_g:
                    continue
                # d loss_i / d z_ij = (softmax_ij - (1 - eps) [j = t_i] - eps / V) * w_i, written in one pass over e
                # straight into the group's buffer in the matmuls' dtype (one rounding, as the plain path's
                # backward): the target's term goes into e first, e_t - (1 - eps) s_i, before the division by s_i
                e.scatter_add_(1, t, ((eps - 1.0) * s)[:, None])
                scale, dst = (wr / s)[:, None], gbuf[in_buf]  # (n, 1), (n, V)
                if eps:
                    torch.addcmul((wr * (-eps / V))[:, None], e, scale, out=dst)
                else:
                    torch.mul(e, scale, out=dst)
                if db is not None:
                    db += dst.sum(dim=0, dtype=f32)
            gg = gbuf[in_group] if need_g else None  # (G, V)
            if need_h:
                dh[rows] = gg @ W  # (G, C)
            if need_w:
                if dtype == f32:
                    dW.addmm_(gg.t(), h_all[rows])  # (V, C), in place
                else:
                    dW += gg.t() @ h_all[rows]  # accumulated in float32
    return total, dh, dW, db


class LinearCrossEntropy(torch.autograd.Function):
    """head_loss with its gradient: forward computes the loss and, chunk by chunk, d hidden, d weight and d bias;
    backward scales them by the incoming gradient (1, or the fp16 loss scale)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, w, inv, eps, chunk, group, dtype):
        grads = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], bias is not None and ctx.needs_input_grad[2])
        total, dh, dW, db = chunked(hidden, weight, bias, targets, w, eps, chunk, group, dtype, grads)
        # divided by the count once, in float32 at the end: no host sync, and the half-dtype buffer holds
        # softmax-sized values, not ones divided by thousands of rows (float16 would flush them to zero)
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
        return (*out, None, None, None, None, None, None, None)
