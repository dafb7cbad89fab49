"""The network only: a decoder-only character GPT.

Shapes used in comments: B batch, T sequence length, C = n_embd, nh heads, hs = C // nh head size,
V vocabulary size, S = cached positions + T (keys visible to the current queries).

token embedding + learned position embedding -> dropout -> n_layer pre-LayerNorm blocks
(x + attn(ln_1(x)), x + mlp(ln_2(x))) -> final LayerNorm -> linear head to V logits.
After GPT-2 (Radford et al. 2019) and nanoGPT's model.py.
"""

import math

import torch
import torch.nn as nn
from torch.nn import functional as F

from .config import ModelConfig


class KVCache:
    """Keys and values of every layer for the positions decoded so far, so each new character costs one
    position of work per layer. Allocated once for block_size positions."""

    def __init__(self, cfg: ModelConfig, batch_size, device="cpu", dtype=torch.float32):
        shape = (cfg.n_layer, batch_size, cfg.n_head, cfg.block_size, cfg.head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (L, B, nh, block_size, hs)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.pos = 0  # positions filled so far

    def update(self, layer, k, v):
        """Store k, v (B, nh, T, hs) at the next positions; return all keys/values so far (B, nh, S, hs)."""
        end = self.pos + k.size(2)
        self.k[layer, :, :, self.pos:end] = k
        self.v[layer, :, :, self.pos:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]

    def reset(self):
        self.pos = 0


def causal_mask(T, S, start, device):
    """(T, S) lower-triangular mask: the query at position start + i sees keys 0 .. start + i.
    Built per call rather than stored, so its size never depends on block_size."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=start)


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer):
        super().__init__()
        self.layer, self.n_head, self.n_embd, self.dropout = layer, cfg.n_head, cfg.n_embd, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.kernel = "auto"  # "auto" | "fused" | "manual"; set with CharGPT.set_attention

    def forward(self, x, cache=None, attn_weights=None):
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        start = 0
        if cache is not None:
            start = cache.pos
            k, v = cache.update(self.layer, k.to(cache.k.dtype), v.to(cache.v.dtype))  # (B, nh, S, hs)
            q = q.to(k.dtype)
        if attn_weights is None and self.use_fused(x):
            y = self.fused(q, k, v, start)
        else:
            y = self.reference(q, k, v, start, attn_weights)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side again
        return self.resid_dropout(self.c_proj(y))

    def use_fused(self, x):
        if self.kernel != "auto":
            return self.kernel == "fused"
        # On CPU, torch's fused kernel only runs without attention dropout; with dropout it falls back to a
        # generic path slower than the explicit softmax below (measured in chargpt.bench).
        return x.device.type != "cpu" or not (self.training and self.dropout > 0)

    def fused(self, q, k, v, start):
        T, S = q.size(2), k.size(2)
        p = self.dropout if self.training else 0.0
        if start == 0:  # queries and keys cover the same positions: plain causal
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        if T == 1:  # one new position sees everything cached: no mask needed
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(T, S, start, q.device), dropout_p=p)

    def reference(self, q, k, v, start, attn_weights=None):
        """Explicit attention: softmax(q k^T / sqrt(hs)) with the lower-triangular mask, then dropout.
        attn_weights: a list that receives the weights (B, nh, T, S) before dropout, for inspection."""
        S = k.size(2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))  # (B, nh, T, S)
        att = att.masked_fill(~causal_mask(q.size(2), S, start, q.device), float("-inf"))
        att = F.softmax(att, dim=-1)
        if attn_weights is not None:
            attn_weights.append(att.detach())
        att = self.attn_dropout(att)
        return att @ v  # (B, nh, T, hs)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg, layer)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, cache=None, attn_weights=None):
        x = x + self.attn(self.ln_1(x), cache, attn_weights)
        return x + self.mlp(self.ln_2(x))


class CharGPT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # learned position embedding
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        self.apply(self._init_weights)
        # GPT-2: scale the init of residual projections by 1/sqrt(2 * n_layer), since each block adds two
        # of them to the residual stream and its variance would otherwise grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def set_attention(self, kernel):
        """'auto' (fastest correct kernel for the device and settings), 'fused' (torch SDPA) or 'manual'."""
        assert kernel in ("auto", "fused", "manual"), kernel
        for block in self.h:
            block.attn.kernel = kernel

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    def forward(self, idx, targets=None, cache=None, attn_weights=None):
        """idx (B, T) ids -> (logits, loss). logits are (B, T, V); loss is the mean cross-entropy against
        targets (B, T), or None. With a KVCache, idx continues the cached text and only the last position's
        logits are computed (B, 1, V): that is all decoding needs. attn_weights: an optional list that
        receives each layer's attention weights (B, nh, T, S), computed on the explicit softmax path."""
        B, T = idx.size()
        start = cache.pos if cache is not None else 0
        if start + T > self.config.block_size:
            raise ValueError(f"cannot forward {start + T} positions: block_size is only {self.config.block_size}")
        pos = torch.arange(start, start + T, dtype=torch.long, device=idx.device)  # (T,)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # (B, T, C)
        for block in self.h:
            x = block(x, cache, attn_weights)
        if cache is not None:
            cache.pos += T
            x = x[:, -1:, :]  # (B, 1, C)
        logits = self.lm_head(self.ln_f(x))  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))
        return logits, loss

    def optimizer_groups(self, weight_decay):
        """AdamW parameter groups: decay weight matrices and embeddings (dim >= 2), not biases or norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
