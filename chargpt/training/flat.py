"""Flat parameters: every trainable parameter and its gradient as a view into one contiguous buffer, so that the
per-step work over all of them is a few operator calls instead of a few per parameter tensor.

A small model is bound by per-call overhead on a CPU: torch's gradient clipping costs one norm and one multiply per
parameter tensor, and fused AdamW's CPU kernel a handful of calls per tensor (it reads each step counter with
.item()); at 4 x 128 that was 700 of a step's ~2,000 calls. Here, with the parameters laid out group after group,

    FlatParams.clip_grad_norm_   one norm and one multiply over the whole gradient buffer
    FlatParams.zero_grad         one fill (the gradients stay views: autograd adds into them in place)
    FlatAdamW                    torch's AdamW over one slice per group (decayed, not decayed): two tensors

Muon keeps working per matrix: its matrices are views too, updated in place. DDP copies its all-reduced buckets
into the gradient views in place. Checkpoints keep the per-parameter format (FlatAdamW.state_dict slices its
moments per parameter, load_state_dict joins them), so states from before flat buffers resume, and the other
way round.
"""

import torch
from torch.func import functional_call

MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")  # AdamW state with one entry per parameter element


class FlatParams:
    """The parameters of `groups` (lists of parameters, all of one dtype and device) moved into one buffer, group
    after group, each parameter's .data and .grad views of it (data, grad: the two buffers, (n,) each). group(i)
    hands an optimizer that group's slice as one tensor."""

    def __init__(self, groups):
        params = [p for g in groups for p in g]
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter appears twice (a tied weight must be passed once)")
        kinds = {(p.dtype, p.device) for p in params}
        if len(kinds) > 1:
            raise ValueError(f"flat parameters need one dtype and device, got {sorted(map(str, kinds))}")
        dtype, device = kinds.pop() if kinds else (torch.float32, torch.device("cpu"))
        n = sum(p.numel() for p in params)
        self.data = torch.empty(n, dtype=dtype, device=device)  # (n,)
        self.grad = torch.zeros(n, dtype=dtype, device=device)  # (n,)
        self.views, self.spans, off = [], [], 0  # (parameter, its gradient view); (start, end) per group
        for g in groups:
            start = off
            for p in g:
                k = p.numel()
                self.data[off:off + k].copy_(p.detach().reshape(-1))
                p.data = self.data[off:off + k].view_as(p)
                self.views.append((p, self.grad[off:off + k].view_as(p)))
                off += k
            self.spans.append((start, off))
        self.slices = []  # (group slice, its gradient slice), handed to optimizers by group()
        self.attach()

    def attach(self):
        """Make each parameter's .grad its view again (something that set it to None, or to a new tensor, such as
        a foreign zero_grad(set_to_none=True), is undone); costs an identity check per parameter. Done when zeroing,
        before a backward: after one it would drop gradients that autograd put elsewhere."""
        for p, g in self.views + self.slices:
            if p.grad is not g:
                p.grad = g

    def group(self, i):
        """-> group i's 1-D slice of the data buffer, the matching slice of the gradient buffer its .grad."""
        start, end = self.spans[i]
        data, grad = self.data[start:end], self.grad[start:end]
        data.grad = grad
        self.slices.append((data, grad))
        return data

    def zero_grad(self):
        self.attach()
        self.grad.zero_()

    @torch.no_grad()
    def clip_grad_norm_(self, max_norm):
        """Scale the gradients so that their total 2-norm is at most max_norm (torch.nn.utils.clip_grad_norm_'s
        rule: coefficient max_norm / (norm + 1e-6), capped at 1); -> the norm before clipping (a tensor)."""
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm


class FlatAdamW(torch.optim.AdamW):
    """torch's AdamW over FlatParams' group slices (one tensor per group), keeping the per-parameter state format:
    state_dict() and load_state_dict() speak of the parameters in `groups` by index, as torch's AdamW over them
    would, with each moment the parameter's slice of the flat one and each parameter's step its group's."""

    def __init__(self, groups, flat, first_group, **kw):
        """groups: [{'params': [...], **options}], laid out in `flat` as its groups first_group, first_group + 1,
        ..."""
        self.members = [list(g["params"]) for g in groups]  # the per-parameter view of the state
        self.flat = flat
        flat_groups = [dict(g, params=[flat.group(first_group + i)]) for i, g in enumerate(groups)]
        super().__init__(flat_groups, **kw)

    def zero_grad(self, set_to_none=True):
        """All of the flat buffer's gradients, in place: torch's would set the group slices' .grad to None."""
        self.flat.zero_grad()

    def parameters_by_index(self):
        """The parameters the state speaks of, in index order (as torch's AdamW over `groups` numbers them)."""
        return [p for members in self.members for p in members]

    def state_dict(self):
        sd = super().state_dict()
        state, groups, idx = {}, [], 0
        for gi, (group, members) in enumerate(zip(sd["param_groups"], self.members)):
            flat_state, off, ids = sd["state"].get(gi), 0, []
            for p in members:
                k = p.numel()
                if flat_state is not None:
                    state[idx] = {key: value[off:off + k].view_as(p) if key in MOMENTS else value.clone()
                                  for key, value in flat_state.items()}
                ids.append(idx)
                idx, off = idx + 1, off + k
            groups.append(dict(group, params=ids))
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict):
        per_param, groups, flat_state = state_dict["state"], state_dict["param_groups"], {}
        if len(groups) != len(self.members):
            raise ValueError(f"optimizer state has {len(groups)} parameter groups, this optimizer {len(self.members)}")
        for gi, (group, members) in enumerate(zip(groups, self.members)):
            if len(group["params"]) != len(members):
                raise ValueError(f"optimizer state group {gi} has {len(group['params'])} parameters, this optimizer "
                                 f"{len(members)}")
            states = [per_param.get(i) for i in group["params"]]
            if all(s is None for s in states):
                continue
            if any(s is None for s in states):
                raise ValueError(f"optimizer state group {gi} has state for some of its parameters only")
            first = states[0]
            flat_state[gi] = {key: torch.cat([s[key].reshape(-1) for s in states]) if key in MOMENTS
                              else torch.as_tensor(value).reshape(()).clone() for key, value in first.items()}
        super().load_state_dict({"state": flat_state,
                                 "param_groups": [dict(g, params=[gi]) for gi, g in enumerate(groups)]})



class LowPrecisionCopies:
    """bf16 copies of the weights that autocast would cast every step, kept in one buffer beside the flat one:
    refreshed by one copy per optimizer step, their gradients added into the flat buffer by one add.

    Under autocast each nn.Linear casts its weight and bias to bf16 in the forward and their gradients back to
    float32 in the backward: four operators per tensor, twice. Here the training forward runs with the copies in
    their place (torch.func.functional_call; autocast leaves tensors already in bf16 alone), so the computation is
    autocast's to the bit: the same bf16 rounding of the weights, the same bf16 gradients, summed into the float32
    gradients after each micro-batch (grads_to_flat) as autocast's casts would sum them. Everything else (the
    embedding lookup, LayerNorm, the loss) sees the float32 weights, as under autocast."""

    def __init__(self, model, flat, dtype):
        self.flat = flat
        self.data = torch.empty_like(flat.data, dtype=dtype)  # (n,): a copy of every weight, for simplicity
        self.grad = torch.zeros_like(flat.data, dtype=dtype)
        base, size = flat.data.data_ptr(), flat.data.element_size()
        self.params = {}  # 'lm_head.weight' -> its bf16 copy (a leaf whose .grad is a view of self.grad)
        from chargpt.model.loss import use_fused
        fused_head = use_fused(getattr(model, "loss_kernel", "full"), model.config.vocab_size)
        for module_name, module in model.named_modules():
            if not isinstance(module, torch.nn.Linear) or fused_head and module_name == "lm_head":
                continue  # the fused loss casts the head itself, and keeps its gradient in float32
            for name in ("weight", "bias"):
                p = getattr(module, name)
                if p is None or not p.requires_grad:
                    continue
                off = (p.data_ptr() - base) // size
                copy = self.data[off:off + p.numel()].view_as(p).requires_grad_()
                copy.grad = self.grad[off:off + p.numel()].view_as(p)
                self.params[f"{module_name}.{name}" if module_name else name] = copy

    @torch.no_grad()
    def refresh(self):
        """Copy the weights into the copies afresh: one copy of the whole buffer, done once per optimizer step
        (before its first micro-batch), so that they can never be stale, whatever changed the weights (torch's
        fused AdamW does not even bump version counters)."""
        self.data.copy_(self.flat.data)

    def forward(self, model, kwargs):
        """model(**kwargs) with the copies in the linear weights' place (after refresh())."""
        return functional_call(model, self.params, (), kwargs, tie_weights=False)

    @torch.no_grad()
    def grads_to_flat(self):
        """After a backward: add the copies' gradients into the float32 ones, and zero them."""
        self.flat.grad.add_(self.grad)
        self.grad.zero_()
