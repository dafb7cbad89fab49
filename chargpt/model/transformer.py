"""The network only: the decoder-only character GPT, and the 2017 encoder-decoder built from the same parts.

Shapes used in comments: B batch, T sequence length, C = n_embd, nh heads, hs = C // nh head size,
V vocabulary size, S = keys visible to the current queries (cached positions + T, or the source length).

CharGPT (the default): token embedding + position embedding -> dropout -> n_layer blocks
(x + attn(ln_1(x)), x + mlp(ln_2(x))) -> final LayerNorm -> linear head to V logits.
After GPT-2 (Radford et al. 2019) and nanoGPT's model.py.

EncoderDecoder (--arch encoder-decoder): the Transformer of Vaswani et al. 2017 ("Attention Is All You Need")
at character level, source and target sharing one vocabulary and one embedding. The encoder's blocks attend
bidirectionally over the source (padding masked); the decoder's blocks attend causally over the target, then
to the encoder's output (cross-attention), as in the Annotated Transformer (harvardnlp).

Both are built from the same Attention, MLP and Block; ModelConfig's options choose the 2017 parts for either:
sinusoidal positions, token embeddings scaled by sqrt(C), post-LN, ReLU. The defaults are GPT-2's.
estimated_params counts a config's parameters from its sizes alone, and check_model_fits refuses a model whose
training state cannot fit the device, before anything is allocated.
"""

import functools
import math
from dataclasses import fields, replace

import torch
import torch.nn as nn
from torch.nn import functional as F

from chargpt.config import ModelConfig
from chargpt.config.architecture import describe_model
from chargpt.config.flags import param
from chargpt.errors import ConfigError
from chargpt.model.adaptive import AdaptiveSoftmax, default_shortlist
from chargpt.model.adaptive import weights as adaptive_weights
from chargpt.model.dropout import Dropout
from chargpt.model.loss import head_loss, use_fused


class KVCache:
    """Keys and values of every (decoder) layer for the positions decoded so far, so each new character costs
    one position of work per layer. Allocated once for block_size positions.

    Two ways to fill it: update() (a prefill or a step of any length; the attention then covers the positions so
    far, so shapes change every step) and write() (CharGPT.decode_step: one position at a tensor index, the
    attention over all block_size positions with the unfilled ones masked, so every step has the same shapes and
    one torch.compile'd step serves them all, as in gpt-fast)."""

    def __init__(self, cfg: ModelConfig, batch_size, device="cpu", dtype=torch.float32):
        shape = (batch_size, cfg.n_head, cfg.block_size, cfg.head_size)
        # a tensor per layer, not one (L, ...) tensor: a compiled step then writes each in place (a view of a
        # larger input would be copied whole every step)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]  # (B, nh, block, hs)
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)]
        self.dtype = dtype
        self.pos = 0  # positions filled so far
        self.positions = torch.arange(cfg.block_size, device=device)  # (block_size,): write()'s mask compares

    def write(self, layer, k, v, pos):
        """Store k, v (B, nh, 1, hs) at position pos (a (1,) long tensor); -> this layer's whole cache, keys and
        values (B, nh, block_size, hs) each. The caller advances self.pos."""
        self.k[layer].index_copy_(2, pos, k)
        self.v[layer].index_copy_(2, pos, v)
        return self.k[layer], self.v[layer]

    def update(self, layer, k, v):
        """Store k, v (B, nh, T, hs) at the next positions; return all keys/values so far (B, nh, S, hs)."""
        end = self.pos + k.size(2)
        self.k[layer][:, :, self.pos:end] = k
        self.v[layer][:, :, self.pos:end] = v
        return self.k[layer][:, :, :end], self.v[layer][:, :, :end]

    def rollback(self, pos):
        """Forget the positions from pos on (a speculative draft's rejected characters): zeroed, as in a cache that
        never held them, so the cache is the one plain decoding would have; the next step writes there again."""
        if pos < self.pos:
            for t in (*self.k, *self.v):
                t[:, :, pos:self.pos].zero_()
            self.pos = pos

    def select(self, rows):
        """Keep the batch rows `rows` (N,) in that order (repeats allowed): beam search forks and drops rows."""
        self.k, self.v = [k[rows] for k in self.k], [v[rows] for v in self.v]

    def reset(self):
        self.pos = 0


class Memory:
    """The encoder's output for a batch of sources (B, S, C) with its padding mask (B, S), True on real
    characters (None: no padding). Each decoder layer's cross-attention keys and values are computed from it
    on first use and kept, so decoding costs one encoder pass and one k/v projection per layer per source."""

    def __init__(self, x, mask=None):
        self.x, self.mask, self.kv = x, mask, {}

    def keys_values(self, layer, project):
        if layer not in self.kv:
            self.kv[layer] = project(self.x)
        return self.kv[layer]

    def select(self, rows):
        """A Memory holding the batch rows `rows` (N,): one copy of the source per beam or live row."""
        out = Memory(self.x[rows], None if self.mask is None else self.mask[rows])
        out.kv = {layer: (k[rows], v[rows]) for layer, (k, v) in self.kv.items()}
        return out


def causal_mask(T, S, start, device):
    """(T, S) lower-triangular mask: the query at position start + i sees keys 0 .. start + i.
    Built per call rather than stored, so its size never depends on block_size."""
    return torch.ones(T, S, dtype=torch.bool, device=device).tril(diagonal=start)


@functools.lru_cache(maxsize=16)
def causal_bias(T, S, start, device, dtype):
    """(T, S) additive mask: 0 where the query at position start + i may see the key (keys 0 .. start + i), -inf
    elsewhere. Cached: a training run asks for one shape every step (never written to: baddbmm reads it)."""
    return torch.zeros(T, S, dtype=dtype, device=device).masked_fill(~causal_mask(T, S, start, device), float("-inf"))


def sinusoidal_positions(n, d):
    """(n, d) fixed position encodings of Vaswani et al. 2017: PE[p, 2i] = sin(p / 10000^(2i/d)),
    PE[p, 2i+1] = cos(p / 10000^(2i/d)). No parameters; nearby positions get similar vectors."""
    pos = torch.arange(n, dtype=torch.float32)[:, None]  # (n, 1)
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))  # (ceil(d/2),)
    pe = torch.zeros(n, d)
    pe[:, 0::2] = torch.sin(pos * freq)
    pe[:, 1::2] = torch.cos(pos * freq)[:, : d // 2]
    return pe


class Attention(nn.Module):
    """Multi-head scaled dot-product attention, the one implementation behind every use:
    - causal self-attention (CharGPT, the decoder): query i sees keys 0 .. i, and a KVCache continues it;
    - bidirectional self-attention (the encoder, causal=False): every query sees every key;
    - cross-attention (cross=True): queries from x, keys and values from the encoder's Memory;
    and any of them with a padding mask over the keys, key_mask (B, S), True on real characters.
    Two kernels compute the same thing: torch's fused scaled_dot_product_attention and the explicit masked
    softmax below (the reference, kept for tests and for CPU training with dropout)."""

    def __init__(self, cfg: ModelConfig, layer, causal=True, cross=False):
        super().__init__()
        self.layer, self.n_head, self.n_embd, self.dropout = layer, cfg.n_head, cfg.n_embd, cfg.dropout
        self.causal, self.cross = causal and not cross, cross
        if cross:
            self.c_q = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
            self.c_kv = nn.Linear(cfg.n_embd, 2 * cfg.n_embd, bias=cfg.bias)  # k, v of the memory, all heads
        else:
            self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)  # q, k, v for all heads at once
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = Dropout(cfg.dropout)
        self.resid_dropout = Dropout(cfg.dropout)
        self.kernel = "auto"  # "auto" | "fused" | "manual"; set with set_attention

    def heads(self, t):
        B, T, _ = t.size()
        return t.view(B, T, self.n_head, self.n_embd // self.n_head).transpose(1, 2)  # (B, nh, T, hs)

    def forward(self, x, cache=None, key_mask=None, memory=None, attn_weights=None, step=None):
        """step: (pos (1,) long tensor, visible (1, block_size) bool) for CharGPT.decode_step's one position."""
        B, T, C = x.size()
        start = 0
        if step is not None:  # the static decode step: the same shapes at every position
            pos, visible = step
            q, k, v = self.split_heads(self.c_attn(x))  # (B, nh, 1, hs)
            k, v = cache.write(self.layer, k.to(cache.dtype), v.to(cache.dtype), pos)  # (B, nh, block, hs)
            y = F.scaled_dot_product_attention(q.to(k.dtype), k, v, attn_mask=visible)  # unfilled keys masked
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))
        if self.cross:
            q = self.heads(self.c_q(x))  # (B, nh, T, hs)
            k, v = memory.keys_values(self.layer, self.memory_heads)  # (B, nh, S, hs), once per source
            key_mask = memory.mask
        else:
            q, k, v = self.split_heads(self.c_attn(x))  # (B, nh, T, hs)
            if cache is not None:
                start = cache.pos
                k, v = cache.update(self.layer, k.to(cache.dtype), v.to(cache.dtype))  # (B, nh, S, hs)
                q = q.to(k.dtype)
        if attn_weights is None and self.use_fused(q):
            y = self.fused(q, k, v, start, key_mask)
        else:
            y = self.reference(q, k, v, start, key_mask, attn_weights)
        y = y.transpose(1, 2).contiguous().view(B, T, C)  # (B, T, C): heads side by side again
        return self.resid_dropout(self.c_proj(y))

    def split_heads(self, qkv):
        """(B, T, 3C) from c_attn -> q, k, v, each (B, nh, T, hs): views, in one view, permute and unbind."""
        B, T, _ = qkv.size()
        return qkv.view(B, T, 3, self.n_head, self.n_embd // self.n_head).permute(2, 0, 3, 1, 4).unbind(0)

    def memory_heads(self, m):
        """Encoder output (B, S, C) -> this layer's cross-attention keys and values, each (B, nh, S, hs)."""
        k, v = self.c_kv(m).split(self.n_embd, dim=2)
        return self.heads(k), self.heads(v)

    def use_fused(self, q):
        """Whether the fused kernel computes this call, given the queries q (their device and dtype)."""
        if self.kernel != "auto":
            return self.kernel == "fused"
        if q.device.type != "cpu":
            return True
        # On a CPU the explicit softmax below wins in two cases (python -m chargpt.bench, speed table): with
        # attention dropout, where torch's fused kernel falls back to a slow generic path; and in bf16, where its
        # backward is slow (4x128 ctx64 b12 training step 58 ms fused against 35 ms explicit, on an AMX Xeon).
        return not ((self.training and self.dropout > 0) or q.dtype == torch.bfloat16)

    def mask(self, T, S, start, key_mask, device):
        """Where a query may look, broadcastable to (B, nh, T, S); None when it may look everywhere."""
        mask = causal_mask(T, S, start, device) if self.causal else None  # (T, S)
        if key_mask is not None:
            keys = key_mask[:, None, None, :]  # (B, 1, 1, S)
            mask = keys if mask is None else mask & keys
        return mask

    def fused(self, q, k, v, start, key_mask=None):
        T, S = q.size(2), k.size(2)
        p = self.dropout if self.training else 0.0
        if self.causal and key_mask is None:
            if start == 0:  # queries and keys cover the same positions: plain causal
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            if T == 1:  # one new position sees everything cached: no mask needed
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask(T, S, start, key_mask, q.device),
                                              dropout_p=p)

    def reference(self, q, k, v, start, key_mask=None, attn_weights=None):
        """Explicit attention: softmax(q k^T / sqrt(hs)) with the mask (-inf where a query may not look),
        then dropout. attn_weights: a list that receives the weights (B, nh, T, S) before dropout, for
        inspection."""
        B, nh, T, hs = q.shape
        S = k.size(2)
        if self.causal and key_mask is None:  # the common case in one call: scale, q k^T and the mask's -inf added
            # (T, S); compiled, the graph holds it, and the cache would only earn dynamo's warning about it
            bias = (causal_bias.__wrapped__ if torch.compiler.is_compiling() else causal_bias)(T, S, start, q.device,
                                                                                               q.dtype)
            att = torch.baddbmm(bias, q.reshape(B * nh, T, hs), k.reshape(B * nh, S, hs).transpose(1, 2),
                                alpha=1.0 / math.sqrt(hs)).view(B, nh, T, S)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, S)
            mask = self.mask(T, S, start, key_mask, q.device)
            if mask is not None:
                att = att.masked_fill(~mask, float("-inf"))
        att = F.softmax(att, dim=-1)
        if attn_weights is not None:
            attn_weights.append(att.detach())
        att = self.attn_dropout(att)
        return att @ v  # (B, nh, T, hs)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.act = nn.GELU() if cfg.activation == "gelu" else nn.ReLU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.act(self.c_fc(x))))


class Block(nn.Module):
    """One layer: self-attention, [cross-attention to the encoder,] feed-forward. Each is a residual branch
    with its LayerNorm before it (pre-LN, GPT-2: x + f(ln(x))) or after the sum (post-LN, 2017: ln(x + f(x)))."""

    def __init__(self, cfg: ModelConfig, layer, causal=True, cross=False):
        super().__init__()
        self.post = cfg.norm == "post"
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = Attention(cfg, layer, causal=causal)
        if cross:
            self.ln_x = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
            self.cross = Attention(cfg, layer, cross=True)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x, cache=None, key_mask=None, memory=None, attn_weights=None, step=None):
        x = self.residual(x, self.ln_1, lambda h: self.attn(h, cache, key_mask, attn_weights=attn_weights,
                                                             step=step))
        if memory is not None:
            x = self.residual(x, self.ln_x, lambda h: self.cross(h, memory=memory))
        return self.residual(x, self.ln_2, self.mlp)

    def residual(self, x, norm, f):
        return norm(x + f(x)) if self.post else x + f(norm(x))


def lm_loss(logits, targets, loss_mask=None, label_smoothing=0.0):
    """Mean cross-entropy of logits (B, T, V) against targets (B, T) over the counted positions: all, or
    those where loss_mask (B, T) is set (sentence pairs count the target side only)."""
    flat, want = logits.float().view(-1, logits.size(-1)), targets.reshape(-1)
    if loss_mask is None:
        return F.cross_entropy(flat, want, label_smoothing=label_smoothing)
    per = F.cross_entropy(flat, want, reduction="none", label_smoothing=label_smoothing)  # (B*T,)
    counted = loss_mask.reshape(-1).to(per.dtype)
    return (per * counted).sum() / counted.sum().clamp(min=1)


class Transformer(nn.Module):
    """What both architectures share: embeddings, initialisation, kernel choice, optimizer groups."""

    def build_embeddings(self, cfg: ModelConfig):
        self.config = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)  # token embedding
        if cfg.pos_emb == "learned":
            self.wpe = nn.Embedding(cfg.block_size, cfg.n_embd)  # learned position embedding
        else:  # a buffer, not a parameter: rebuilt from the config, never stored in a checkpoint
            self.register_buffer("pe", sinusoidal_positions(cfg.block_size, cfg.n_embd), persistent=False)
        self.drop = Dropout(cfg.dropout)

    def build_head(self, cfg: ModelConfig):
        # post-LN already normalises every block's output, so the paper has no final LayerNorm
        self.ln_f = nn.LayerNorm(cfg.n_embd, bias=cfg.bias) if cfg.norm == "pre" else nn.Identity()
        if cfg.softmax == "adaptive":  # log-probabilities by frequency clusters (chargpt/model/adaptive.py)
            shortlist = cfg.shortlist or default_shortlist(cfg.vocab_size)
            self.lm_head = AdaptiveSoftmax(cfg.n_embd, cfg.vocab_size, shortlist, bias=cfg.bias)
            self.loss_kernel = "auto"
            return
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tie_weights:
            self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017)
        self.loss_kernel = "auto"  # "auto" | "fused" | "full"; set with set_loss

    def head(self, x, targets=None, loss_mask=None, label_smoothing=0.0):
        """decoder_stack's output x (B, T, C) -> (logits (B, T, V), loss or None) against targets (B, T) over the
        positions where loss_mask (B, T) is set (default all). With targets and the fused loss (chargpt.model.loss: the
        default for large vocabularies) or an adaptive softmax, the loss comes without the logits, and logits is
        None; without targets an adaptive softmax's logits are log-probabilities."""
        if targets is not None and isinstance(self.lm_head, AdaptiveSoftmax):
            if label_smoothing:
                raise ConfigError("--label-smoothing needs --softmax full (an adaptive softmax scores the rare "
                                  "characters only for rows whose target is one)")
            return None, self.lm_head.loss(x, targets, loss_mask)
        if targets is not None and use_fused(self.loss_kernel, self.config.vocab_size):
            C = x.size(-1)
            mask = None if loss_mask is None else loss_mask.reshape(-1)
            return None, head_loss(x.reshape(-1, C), self.lm_head.weight, targets.reshape(-1), self.lm_head.bias,
                                   mask, label_smoothing)
        logits = self.lm_head(x)  # (B, T, V)
        return logits, None if targets is None else lm_loss(logits, targets, loss_mask, label_smoothing)

    def init_weights(self, n_residual):
        self.apply(self._init_weights)
        # GPT-2: scale the init of residual projections by 1/sqrt(number of residual branches), since each adds
        # to the residual stream and its variance would otherwise grow with depth.
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(n_residual))
        if self.config.emb_scale:  # fairseq/tensor2tensor: N(0, 1/C) here, so embedding x sqrt(C) is N(0, 1)
            nn.init.normal_(self.wte.weight, mean=0.0, std=self.config.n_embd ** -0.5)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def embed(self, idx, start=0):
        """ids (B, T) at positions start .. start + T - 1 -> (B, T, C)."""
        T = idx.size(1)
        if start + T > self.config.block_size:
            raise ValueError(f"cannot forward {start + T} positions: block_size is only {self.config.block_size}")
        tok = self.wte(idx)  # (B, T, C)
        if self.config.emb_scale:
            tok = tok * math.sqrt(self.config.n_embd)
        if self.config.pos_emb == "learned":
            pos = self.wpe(torch.arange(start, start + T, dtype=torch.long, device=idx.device))  # (T, C)
        else:
            pos = self.pe[start:start + T]  # (T, C)
        return self.drop(tok + pos)

    def decoder_stack(self, idx, cache=None, last=1, **block_kw):
        """ids (B, T) through the embeddings, the decoder blocks (self.h) and the final norm -> (B, T, C). With a
        KVCache, idx continues the cached positions, the cache advances past them, and only the last position
        comes out (B, 1, C): all that decoding needs (last=n: the last n, for checking a speculative draft)."""
        start = cache.pos if cache is not None else 0
        x = self.embed(idx, start)  # (B, T, C)
        for block in self.h:
            x = block(x, cache, **block_kw)
        if cache is not None:
            cache.pos += idx.size(1)
            x = x[:, -last:, :]  # (B, last, C)
        return self.ln_f(x)

    def set_attention(self, kernel):
        """'auto' (fastest correct kernel for the device and settings), 'fused' (torch SDPA) or 'manual'."""
        assert kernel in ("auto", "fused", "manual"), kernel
        for m in self.modules():
            if isinstance(m, Attention):
                m.kernel = kernel

    def set_loss(self, kernel):
        """'auto' (fused from chargpt.model.loss.FUSED_MIN_VOCAB characters up), 'fused' (chargpt.model.loss.head_loss:
        the loss without the full logits) or 'full' (the logits, then lm_loss)."""
        use_fused(kernel, self.config.vocab_size)  # checks the name
        self.loss_kernel = kernel

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights are counted once

    def optimizer_groups(self, weight_decay):
        """AdamW parameter groups: decay weight matrices and embeddings (dim >= 2), not biases or norms."""
        params = [p for p in self.parameters() if p.requires_grad]
        return [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]


class CharGPT(Transformer):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.arch != "decoder":
            raise ConfigError(f"CharGPT is the decoder-only model; --arch {cfg.arch} is built by build_model")
        self.build_embeddings(cfg)
        self.h = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.build_head(cfg)
        self.init_weights(2 * cfg.n_layer)

    def forward(self, idx, targets=None, cache=None, loss_mask=None, label_smoothing=0.0, attn_weights=None):
        """idx (B, T) ids -> (logits, loss). logits are (B, T, V); loss is the mean cross-entropy against
        targets (B, T) over the positions where loss_mask (B, T) is set (default all), or None. logits is None
        when the fused loss computed the loss without them (Transformer.head). With a KVCache,
        idx continues the cached text and only the last position's logits are computed (B, 1, V): that is all
        decoding needs. attn_weights: an optional list that receives each layer's attention weights
        (B, nh, T, S), computed on the explicit softmax path."""
        return self.head(self.decoder_stack(idx, cache, attn_weights=attn_weights), targets, loss_mask,
                         label_smoothing)

    def verify(self, idx, cache, last=None):
        """idx (B, T) continuing the cached positions -> logits (B, last, V) at the last `last` of them (default all
        T), in one forward: speculative decoding's check of a drafted text (chargpt/sampling/speculate.py), where
        the first of them may be a window rebuilt from its start (a prefill) and the draft after it. The head runs
        over those positions at once. The cache advances past all T; KVCache.rollback takes back the positions after
        the first character not kept."""
        return self.head(self.decoder_stack(idx, cache, last=last or idx.size(1)))[0]

    def decode_step(self, idx, cache, pos):
        """One new character per row at position pos: idx (B, 1) ids, pos a (1,) long tensor (= cache.pos) ->
        logits (B, V). Every call has the same shapes whatever the position (KVCache.write), so torch.compile
        compiles it once (chargpt/sampling/decode.py's StepRunner). The caller advances cache.pos."""
        tok = self.wte(idx)  # (B, 1, C)
        if self.config.emb_scale:
            tok = tok * math.sqrt(self.config.n_embd)
        x = tok + (self.wpe(pos) if self.config.pos_emb == "learned" else self.pe[pos])  # (B, 1, C)
        visible = (cache.positions <= pos)[None]  # (1, block_size): keys at positions 0 .. pos
        for block in self.h:
            x = block(x, cache, step=(pos, visible))
        return self.lm_head(self.ln_f(x))[:, -1, :]  # (B, V)


class EncoderDecoder(Transformer):
    """The 2017 Transformer: encode(src) once, then decode(tgt, memory) — the whole target for training, or
    one character at a time with a KVCache (decoder self-attention) while the Memory keeps the cross-attention
    keys and values. n_layer counts decoder blocks; n_enc_layer encoder blocks (0: as many)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.build_embeddings(cfg)
        n_enc = cfg.n_enc_layer or cfg.n_layer
        self.enc = nn.ModuleList(Block(cfg, i, causal=False) for i in range(n_enc))
        self.enc_ln = nn.LayerNorm(cfg.n_embd, bias=cfg.bias) if cfg.norm == "pre" else nn.Identity()
        self.h = nn.ModuleList(Block(cfg, i, cross=True) for i in range(cfg.n_layer))
        self.build_head(cfg)
        self.init_weights(2 * n_enc + 3 * cfg.n_layer)  # residual branches from the source to the output

    def encode(self, src, src_mask=None):
        """src (B, S) ids, src_mask (B, S) True on real characters (None: no padding) -> Memory."""
        x = self.embed(src)  # (B, S, C)
        for block in self.enc:
            x = block(x, key_mask=src_mask)
        return Memory(self.enc_ln(x), src_mask)

    def decode(self, tgt, memory, cache=None):
        """tgt (B, T) target ids so far (starting with the separator) -> logits (B, T, V), or (B, 1, V) for
        the last position with a KVCache (tgt then continues the cached positions)."""
        return self.lm_head(self.decoder_stack(tgt, cache, memory=memory))

    def forward(self, src, tgt, targets=None, src_mask=None, loss_mask=None, label_smoothing=0.0):
        """-> (logits (B, T, V) or None, loss or None); targets (B, T) are tgt shifted by one (the loss and the
        logits as CharGPT's)."""
        x = self.decoder_stack(tgt, memory=self.encode(src, src_mask))  # (B, T, C)
        return self.head(x, targets, loss_mask, label_smoothing)


def build_model(cfg: ModelConfig):
    """The network that cfg.arch names: the one builder every loader and trainer calls."""
    return EncoderDecoder(cfg) if cfg.arch == "encoder-decoder" else CharGPT(cfg)


# --- sizes from the config alone: what a model costs before anything is allocated -----------------------------------
SIZE_FLAGS = ("n_layer", "n_enc_layer", "n_embd", "block_size")  # the settings that make a model large
TRAIN_BYTES_PER_PARAM = 16  # float32 weights and gradients, and AdamW's two moments: 4 x 4 bytes


def estimated_params(cfg: ModelConfig):
    """Parameters of the model `cfg` builds, from its sizes alone (within a few per cent: biases and norms are
    counted as 13 vectors a block), so that an impossible size is refused before anything is allocated. Per block:
    attention 4 d^2 and a 4x feed-forward 8 d^2; a decoder block of the encoder-decoder cross-attends (4 d^2 more)."""
    d, cross = cfg.n_embd, cfg.arch == "encoder-decoder"
    block = 12 * d * d + 13 * d
    blocks = cfg.n_layer * (block + (4 * d * d + 6 * d if cross else 0))
    if cross:
        blocks += (cfg.n_enc_layer or cfg.n_layer) * block
    positions = cfg.block_size * d if cfg.pos_emb == "learned" else 0
    if cfg.softmax == "adaptive":  # the head's own layers (their biases left out)
        head = adaptive_weights(d, cfg.vocab_size, cfg.shortlist or default_shortlist(cfg.vocab_size))
        return blocks + cfg.vocab_size * d + head + positions
    return blocks + cfg.vocab_size * d * (1 if cfg.tie_weights else 2) + positions


def check_model_fits(cfg: ModelConfig, memory_bytes, where, source=lambda name: None):
    """Refuse a model whose training state (weights, gradients, AdamW moments) alone exceeds `memory_bytes` (the
    device's memory, `where`), naming the size setting that matters most (the one whose default would shrink the
    model most) and, when source(name) gives one, the file that set it. Activations come on top: a model that
    passes may still run out of memory, and is then told so."""
    need = estimated_params(cfg) * TRAIN_BYTES_PER_PARAM
    if memory_bytes is None or need <= memory_bytes:
        return
    defaults = {f.name: f.default for f in fields(ModelConfig)}
    defaults["n_enc_layer"] = cfg.n_layer  # its default, 0, means "as many as --n-layer"

    def shrunk(name):
        return estimated_params(replace(cfg, **{name: min(getattr(cfg, name), defaults[name])}))

    worst = min((name for name in SIZE_FLAGS if getattr(cfg, name)), key=shrunk)
    origin = f" in {source(worst)}" if source(worst) else ""
    raise ConfigError(f"a model of {describe_model(cfg)} has about {estimated_params(cfg):.3g} parameters: training "
                      f"it needs at least {need / 1e9:,.4g} GB, and {where} has {memory_bytes / 1e9:,.1f} GB; lower "
                      f"{param(worst)} (now {getattr(cfg, worst):,}{origin})")
