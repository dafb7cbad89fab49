"""The architecture options of ModelConfig (the GPT's defaults and the 2017 Transformer's parts, the output layer)
and their checks, which also guard the untrusted metadata of a checkpoint."""

from chargpt.config.flags import flag
from chargpt.errors import ConfigError

ARCHS = ("decoder", "encoder-decoder")
POS_EMBS = ("learned", "sinusoidal")
NORMS = ("pre", "post")
ACTIVATIONS = ("gelu", "relu")
SOFTMAXES = ("full", "adaptive", "auto")  # auto: a setting only, which a run resolves at start (training/start.py)
# ModelConfig fields added after format 1 was released: a checkpoint without them gets the defaults (the GPT).
ARCH_FIELDS = ("arch", "n_enc_layer", "pos_emb", "emb_scale", "norm", "activation", "softmax", "shortlist")


def check_shortlist(cfg):
    """--softmax adaptive against the vocabulary: what only the corpus's characters decide."""
    if cfg.vocab_size < 2:
        raise ConfigError("--softmax adaptive needs a corpus of at least 2 distinct characters")
    if cfg.shortlist < 0:  # said alone: before the corpus is read, the vocabulary is every code point
        raise ConfigError(f"--shortlist must be 0 or more (got {cfg.shortlist:,}); 0 picks it from the text")
    if not cfg.shortlist < cfg.vocab_size:
        raise ConfigError(f"--shortlist must be at least 0 and below the vocabulary's {cfg.vocab_size:,} "
                          f"characters (got {cfg.shortlist:,}); 0 picks it from the text")


def validate_arch(cfg):
    """The architecture options: names from the untrusted checkpoint metadata are checked here too."""
    for name, allowed in (("arch", ARCHS), ("pos_emb", POS_EMBS), ("norm", NORMS), ("activation", ACTIVATIONS),
                          ("softmax", SOFTMAXES)):
        if getattr(cfg, name) not in allowed:
            raise ConfigError(f"--{flag(name)} must be one of {', '.join(allowed)} (got {getattr(cfg, name)!r})")
    if cfg.n_enc_layer < 0:
        raise ConfigError(f"--n-enc-layer must be at least 0 (got {cfg.n_enc_layer})")
    if cfg.softmax == "adaptive":
        if cfg.arch != "decoder":
            raise ConfigError("--softmax adaptive is for the decoder-only model (text); the encoder-decoder keeps "
                              "--softmax full")
        check_shortlist(cfg)
    elif cfg.shortlist:
        raise ConfigError(f"--shortlist {cfg.shortlist} needs --softmax adaptive")
    if cfg.n_enc_layer and cfg.arch != "encoder-decoder":
        raise ConfigError(f"--n-enc-layer {cfg.n_enc_layer} needs --arch encoder-decoder (a decoder has no encoder); "
                          f"drop --n-enc-layer or add --arch encoder-decoder")


def describe_model(cfg):
    """'encoder-decoder, 2+2 layers x 128 wide, 4 heads, context 64, sinusoidal positions, post-LN, ReLU'."""
    layers = f"{cfg.n_enc_layer or cfg.n_layer}+{cfg.n_layer} layers" if cfg.arch == "encoder-decoder" else \
        f"{cfg.n_layer} layers"
    options = [name for name, on in (("sinusoidal positions", cfg.pos_emb == "sinusoidal"),
                                     ("embeddings x sqrt(width)", cfg.emb_scale), ("post-LN", cfg.norm == "post"),
                                     ("ReLU", cfg.activation == "relu"),
                                     (f"adaptive softmax (shortlist {cfg.shortlist:,})", cfg.softmax == "adaptive"))
               if on]
    return ", ".join([(f"{cfg.arch}, " if cfg.arch != "decoder" else "") + f"{layers} x {cfg.n_embd} wide",
                      f"{cfg.n_head} heads", f"context {cfg.block_size}", *options])
