"""Configuration: the single source of every hyperparameter's name, default and help text.

ModelConfig rebuilds the network and is stored in every checkpoint. TrainConfig holds everything about a run.
The CLI generates one flag per field (`n_embd` -> `--n-embd`) with the `help` metadata as its help line,
so a field added here is a documented flag everywhere. Fields whose best value depends on the hardware
take it from PRESETS, resolved once the device is known.
"""

import os
from dataclasses import dataclass, field, fields

from .errors import ConfigError

ARCHS = ("decoder", "encoder-decoder")
POS_EMBS = ("learned", "sinusoidal")
NORMS = ("pre", "post")
ACTIVATIONS = ("gelu", "relu")
# ModelConfig fields added after format 1 was released: a checkpoint without them gets the defaults (the GPT).
ARCH_FIELDS = ("arch", "n_enc_layer", "pos_emb", "emb_scale", "norm", "activation")
UNLIMITED = 10**12  # max_iters when only --max-time bounds a run
FORMAT_VERSION = 1  # bump when the checkpoint layout changes incompatibly


def opt(default, help, **extra):
    """A dataclass field carrying its --help line (and optionally click choices)."""
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class ModelConfig:
    vocab_size: int = opt(65, "number of distinct characters; set from the corpus, not a flag", flag=False)
    block_size: int = opt(256, "context length in characters: the model sees at most this many at once")
    n_layer: int = opt(6, "number of transformer blocks")
    n_head: int = opt(6, "attention heads per block; must divide --n-embd")
    n_embd: int = opt(384, "width of the residual stream (embedding size)")
    dropout: float = opt(0.2, "dropout on attention weights and residual outputs; 0 for small data or short runs")
    bias: bool = opt(True, "bias in Linear and LayerNorm layers, like GPT-2 (--no-bias: a bit faster, often as good)")
    tie_weights: bool = opt(True, "share the token embedding with the output head (fewer parameters)")
    # Architecture options (issue #11). The defaults are the GPT above, bit for bit; the alternatives rebuild the
    # parts of the 2017 Transformer (Vaswani et al., "Attention Is All You Need"). flag=False until training and
    # the checkpoint loaders build them (phase 2): a flag must not be accepted and then ignored.
    arch: str = opt("decoder", "decoder: one causal stack over 'source, separator, target' (GPT); encoder-decoder: "
                               "the 2017 Transformer (source encoder + cross-attending decoder)",
                    choices=ARCHS, flag=False)
    n_enc_layer: int = opt(0, "encoder blocks for --arch encoder-decoder [default: 0, the same as --n-layer]",
                           flag=False)
    pos_emb: str = opt("learned", "positions: learned (an embedding table, GPT) or sinusoidal (fixed sin/cos "
                                  "waves, no parameters, the 2017 paper)", choices=POS_EMBS,
                       flag=False)
    emb_scale: bool = opt(False, "multiply token embeddings by sqrt(--n-embd), as in the 2017 paper", flag=False)
    norm: str = opt("pre", "LayerNorm placement: pre (x + f(norm(x)), GPT-2; trains stably) or post "
                           "(norm(x + f(x)), the 2017 paper; needs warmup)", choices=NORMS, flag=False)
    activation: str = opt("gelu", "feed-forward activation: gelu (GPT) or relu (the 2017 paper)",
                          choices=ACTIVATIONS, flag=False)

    def validate(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{flag(name)} must be at least 1 (got {getattr(self, name)})")
        if self.n_embd % self.n_head:
            fits = [h for h in range(1, min(self.n_embd, 64) + 1) if self.n_embd % h == 0]
            raise ConfigError(f"--n-embd {self.n_embd} is not divisible by --n-head {self.n_head}; "
                              f"pick a head count that divides it, e.g. one of {fits[-6:]}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"--dropout must be in [0, 1) (got {self.dropout})")
        validate_arch(self)
        return self

    @property
    def head_size(self):
        return self.n_embd // self.n_head


@dataclass
class TrainConfig:
    # data
    data: str | None = opt(None, "UTF-8 text file, or a directory of text files (read in sorted order); "
                                 "default: the English help topics that ship with CPython (pydoc_data)")
    out_dir: str | None = opt(None, "run directory for checkpoints and metrics [default: checkpoints/<corpus name>]")
    val_fraction: float = opt(0.1, "fraction of the corpus, taken from its end, used for validation")
    encoding: str = opt("utf-8", "text encoding of the corpus (e.g. latin-1, gbk, utf-16)")
    encoding_errors: str = opt("strict", "undecodable bytes: 'strict' stops with an error, 'replace' uses U+FFFD",
                               choices=("strict", "replace"))
    cache_dir: str | None = opt(None, "where encoded corpora are cached [default: $CHARGPT_CACHE_DIR or "
                                      "~/.cache/chargpt]")
    # optimisation
    batch_size: int = opt(64, "sequences per micro-batch")
    grad_accum: int = opt(1, "micro-batches accumulated per optimizer step")
    max_iters: int = opt(5000, "optimizer steps to train for")
    max_time: float | None = opt(None, "wall-clock budget in seconds of training from this command on (with "
                                       "--resume: more time); the learning-rate schedule is fitted to it and training "
                                       "stops (and saves) when it is spent")
    learning_rate: float = opt(1e-3, "peak learning rate (AdamW)")
    min_lr: float | None = opt(None, "final learning rate of the cosine decay [default: learning rate / 10]")
    warmup_iters: int = opt(100, "steps of linear warmup")
    lr_decay_iters: int | None = opt(None, "step at which the cosine decay reaches --min-lr [default: --max-iters]")
    weight_decay: float = opt(0.1, "AdamW weight decay, on weight matrices and embeddings (not biases or norms)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2 (0.99 suits the small batches of character models)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this value (0 disables)")
    skip_nonfinite: bool = opt(False, "skip steps whose loss is NaN/inf instead of stopping")
    # evaluation and logging
    eval_interval: int = opt(250, "steps between evaluations (and checkpoints)")
    eval_iters: int = opt(20, "batches per split averaged in each evaluation")
    sample_chars: int = opt(300, "characters to sample and print when training ends (0: none)")
    # hardware
    device: str = opt("auto", "auto (CUDA, then Apple MPS, then CPU), cpu, cuda, cuda:N or mps")
    dtype: str = opt("auto", "auto (bfloat16 where the hardware has it, else float32), float32, bfloat16, float16",
                     choices=("auto", "float32", "bfloat16", "float16"))
    compile: bool = opt(False, "wrap the model in torch.compile (helps on CUDA; rarely on CPU)")
    attention: str = opt("auto", "attention kernel: auto picks the fastest for the device; fused (torch SDPA) or "
                                 "manual (explicit masked softmax)", choices=("auto", "fused", "manual"))
    threads: int | None = opt(None, "CPU threads for torch [default: one per CPU core, split between "
                                    "local processes]")
    seed: int = opt(1337, "random seed (model init, batches, dropout)")
    resume: bool = opt(False, "continue the run in --out-dir from its latest state, with its budget; a finished "
                              "run needs a new one (--max-iters or --max-time)")
    label_smoothing: float = opt(0.0, "spread this much of each target's probability over the whole vocabulary "
                                      "in the loss (0.1 in the 2017 paper; 0: plain cross-entropy)",
                                  flag=False)  # a flag once training passes it to the model (phase 2)

    def validate(self):
        positive = ("batch_size", "max_iters", "learning_rate", "eval_interval", "eval_iters", "warmup_iters")
        for name in positive:
            value = getattr(self, name)
            if value < (0 if name == "warmup_iters" else 1e-300):
                raise ConfigError(f"--{flag(name)} must be {'non-negative' if name == 'warmup_iters' else 'positive'}"
                                  f" (got {value})")
        if self.grad_accum < 1:
            raise ConfigError(f"--grad-accum must be at least 1 (got {self.grad_accum})")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"--val-fraction must be between 0 and 1, exclusive (got {self.val_fraction})")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.learning_rate:
            raise ConfigError(f"--min-lr must be between 0 and --learning-rate {self.learning_rate} "
                              f"(got {self.min_lr})")
        if self.lr_decay_iters is not None and self.lr_decay_iters < 1:
            raise ConfigError(f"--lr-decay-iters must be at least 1 (got {self.lr_decay_iters})")
        if self.max_time is not None and self.max_time <= 0:
            raise ConfigError(f"--max-time must be positive seconds (got {self.max_time})")
        for name in ("weight_decay", "grad_clip", "sample_chars"):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must be non-negative (got {getattr(self, name)})")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"--{flag(name)} must be in [0, 1) (got {getattr(self, name)})")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads must be at least 1 (got {self.threads})")
        if not 0.0 <= self.label_smoothing < 1.0:  # also catches NaN
            raise ConfigError(f"--label-smoothing must be in [0, 1) (got {self.label_smoothing})")
        return self


@dataclass
class SampleSettings:
    """How to choose characters; the CLI flags and the Generator keywords share these names and defaults."""
    max_new_tokens: int = 500
    temperature: float = 0.8  # 0: greedy (always the most likely character)
    top_k: int | None = None  # None or 0: off
    top_p: float | None = None  # None or 1: off
    stop: tuple = field(default_factory=tuple)  # stop strings, not included in the output

    def __post_init__(self):
        # a lone string would otherwise be read as one stop string per character
        self.stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    def validate(self):
        if not self.temperature >= 0:  # also catches NaN
            raise ConfigError(f"--temperature must be >= 0 (0 means greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"--top-k must be >= 0 (0 disables it), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"--top-p must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ConfigError(f"--max-new-tokens must be >= 0, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError("--stop needs a non-empty string")
        return self


# Hardware-dependent defaults. "cpu" is tuned for a 2-core laptop-class CPU: a small, wide-enough model with no
# dropout that learns fast in a few minutes (see benchmarks/RESULTS.md for the search behind it); "gpu" is the
# classic 10.7M-parameter Shakespeare model (6 x 384, context 256, dropout 0.2).
PRESETS = {
    "cpu": dict(n_layer=2, n_head=4, n_embd=128, block_size=64, dropout=0.0, batch_size=16, max_iters=5000,
                learning_rate=4e-3, warmup_iters=100, eval_interval=250, eval_iters=20),
    "gpu": dict(n_layer=6, n_head=6, n_embd=384, block_size=256, dropout=0.2, batch_size=64, max_iters=5000,
                learning_rate=1e-3, warmup_iters=100, eval_interval=500, eval_iters=50),
}
PRESET_REASONS = {
    "cpu": "no GPU found: the small model that learned most per minute in a search on a 2-core CPU",
    "gpu": "GPU found: the 10.7M-parameter model (6 layers x 384, context 256)",
}


def validate_arch(cfg: ModelConfig):
    """The architecture options (issue #11): names from the untrusted checkpoint metadata are checked here too."""
    for name, allowed in (("arch", ARCHS), ("pos_emb", POS_EMBS), ("norm", NORMS), ("activation", ACTIVATIONS)):
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"--{flag(name)} must be one of {', '.join(allowed)} (got {getattr(cfg, name)!r})")
    if cfg.n_enc_layer < 0:
        raise ConfigError(f"--n-enc-layer must be at least 0 (got {cfg.n_enc_layer})")
    if cfg.n_enc_layer and cfg.arch != "encoder-decoder":
        raise ConfigError(f"--n-enc-layer {cfg.n_enc_layer} needs --arch encoder-decoder (a decoder has no encoder); "
                          f"drop --n-enc-layer or add --arch encoder-decoder")


def flag(name):
    return name.replace("_", "-")


def field_names(cls):
    return [f.name for f in fields(cls)]


def split_overrides(overrides):
    """Split a flat {name: value} dict into (model fields, train fields); unknown names are an error."""
    model_names, train_names = set(field_names(ModelConfig)), set(field_names(TrainConfig))
    unknown = set(overrides) - model_names - train_names
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
    model = typed_fields(ModelConfig, {k: v for k, v in overrides.items() if k in model_names}, "settings")
    train = typed_fields(TrainConfig, {k: v for k, v in overrides.items() if k in train_names}, "settings")
    return model, train


def build_configs(preset, overrides, vocab_size):
    """Dataclass defaults <- preset <- explicit overrides; returns validated (ModelConfig, TrainConfig)."""
    values = {**PRESETS[preset], **overrides}
    if overrides.get("max_time") and "max_iters" not in overrides:
        values["max_iters"] = UNLIMITED  # a time budget alone decides when to stop
    model_kw, train_kw = split_overrides(values)
    mcfg = ModelConfig(**{**model_kw, "vocab_size": vocab_size}).validate()
    tcfg = TrainConfig(**train_kw).validate()
    return mcfg, tcfg


def model_config_from_dict(d):
    """Rebuild a ModelConfig from checkpoint metadata, checking names, types and ranges (metadata is untrusted)."""
    kw = typed_fields(ModelConfig, d, "model config")
    missing = set(field_names(ModelConfig)) - set(kw) - set(ARCH_FIELDS)
    if missing:
        raise ConfigError(f"model config is missing {sorted(missing)}")
    huge = [k for k, v in kw.items() if isinstance(v, int) and v > 2**31]
    if huge:
        raise ConfigError(f"model config field {huge[0]!r} is implausibly large")
    return ModelConfig(**kw).validate()


def typed_fields(cls, d, what):
    """The fields of dataclass `cls` present in the untrusted dict `d`, each checked against its annotation
    (`int`, `float`, `bool`, `str`, or one of those `| None`). Unknown keys are dropped."""
    if not isinstance(d, dict):
        raise ConfigError(f"{what} is not an object")
    kw = {}
    for f in fields(cls):
        if f.name not in d:
            continue
        allowed = getattr(f.type, "__args__", None) or (f.type,)
        if str in allowed and isinstance(d[f.name], os.PathLike):  # data=Path(...) from Python
            d = {**d, f.name: os.fspath(d[f.name])}
        if not any(_has_type(d[f.name], t) for t in allowed):
            raise ConfigError(f"{what}: {f.name!r} has the wrong type ({type(d[f.name]).__name__}: {d[f.name]!r:.40})")
        kw[f.name] = d[f.name]
    return kw


def _has_type(value, t):
    t = {"int": int, "float": float, "bool": bool, "str": str}.get(t, t)  # string annotations
    if t is type(None):
        return value is None
    if isinstance(value, bool):  # bool is an int subclass; never accept it for a number
        return t is bool
    if t is float:
        return isinstance(value, (int, float))
    return isinstance(t, type) and isinstance(value, t)
