"""Configuration: the single source of every hyperparameter's name, default and help text.

ModelConfig rebuilds the network and is stored in every checkpoint. TrainConfig holds everything about a run;
SampleSettings says how to choose characters. The CLIs generate one flag per field (`n_embd` -> `--n-embd`)
with the `help` metadata as its help line (chargpt/config/flags.py), so a field added here is a documented flag
everywhere.

Defaults: a field's dataclass default is its value on a GPU (the classic 10.7M-parameter Shakespeare model);
PRESETS names starting points over them, "auto" among them, which a run without a GPU starts from (its model sized
at start by chargpt/training/sizing.py): --help shows both defaults where they differ. chargpt/config/settings.py layers
defaults, preset, config file and flags.
PRESETS also holds transformer-base (the 2017 paper's model) and transformer-small (its CPU-sized sibling).
Validation lives here too, once per dataclass; messages name a setting with param() (chargpt/config/flags.py), which
spells it as the user did: `--n-layer` on the command line, `n_layer` from Python. Dictionaries from outside
(checkpoint metadata, keyword arguments, a config file's table) are checked against the fields by one function,
typed_fields.
"""

import difflib
import json
import math
import os
from dataclasses import dataclass, fields, replace
from typing import ClassVar

from chargpt.config.architecture import (
    ACTIVATIONS,
    ARCH_FIELDS,
    ARCHS,
    NORMS,
    POS_EMBS,
    SOFTMAXES,
    check_shortlist,
    validate_arch,
)
from chargpt.config.decoding import check_decoding
from chargpt.config.flags import opt, param
from chargpt.config.presets import AUTO_BUDGET_S, PRESET_ABOUT, PRESETS, UNLIMITED  # noqa: F401 (chargpt.config's)
from chargpt.errors import ConfigError

TASKS = ("text", "pairs")
VAL_SPLITS = ("blocks", "tail")
LABEL_SAMPLING = ("proportional", "balanced")  # --labels: how batches draw labels (chargpt/data/labels.py)
FORMAT_VERSION = 1  # bump when the checkpoint layout changes incompatibly
MAX_INT = 2**63 - 1  # torch's sizes and indices are signed 64-bit
MAX_LAYERS = 10_000  # blocks a side: a safetensors header (100 MB at most) names each tensor, with 2 moments each
MAX_SEED = MAX_INT  # torch seeds are unsigned 64-bit; this leaves room for the per-stream offsets added to the seed
# Where sampling's float32 arithmetic stays finite: past 100 a temperature is all but uniform, a repetition penalty
# all but a ban, and a guidance scale all but the labelled logits' argmax; further, logits overflow to inf and NaN
SAMPLE_SCALE = 100.0
OPTIMIZERS = ("adamw", "muon")
LR_SCHEDULES = ("cosine", "wsd", "inverse-sqrt")
SAVE_STATES = ("eval", "end")
COMPILE_CHOICES = ("auto", "on", "off")
TRACKERS = ("tensorboard", "wandb", "mlflow")  # --log-to: trackers a run also logs to (training/trackers.py)
SIZED = ("n_layer", "n_embd", "n_head", "block_size", "batch_size", "dropout", "max_iters")  # what auto chooses
THREADS_PER_CPU = 4  # --threads above this many per CPU is a typo: torch only slows down, and crashes near 100000


# What a setting defaults to without a GPU, where that is not its dataclass default (the GPU's): --preset auto's
# value, or sized by it at start. --help shows both (flags.flag_specs reads it as the dataclasses' cpu_defaults).
CPU_DEFAULTS = {**{name: f"{value} on CPU" for name, value in PRESETS["auto"].items()},
                **dict.fromkeys(SIZED, "sized by --preset auto on CPU"),
                "max_time": f"{AUTO_BUDGET_S:g} on CPU (--preset auto)"}


def device_preset(device_type):
    """The preset a run without --preset starts from: what suits the device found."""
    return "shakespeare-char" if device_type == "cuda" else "auto"


@dataclass
class ModelConfig:
    vocab_size: int = opt(65, "number of distinct characters; set from the corpus, not a flag", flag=False)
    block_size: int = opt(256, "context length in characters: the model sees at most this many at once")
    n_layer: int = opt(6, "number of transformer blocks")
    n_head: int = opt(6, "attention heads per block; must divide --n-embd")
    n_embd: int = opt(384, "width of the residual stream (embedding size)")
    dropout: float = opt(0.2, "dropout on embeddings, attention weights and residual outputs: what keeps a "
                                 "small text from being learned by heart (auto: 0.2 where the budget would, else 0)")
    bias: bool = opt(True, "bias in Linear and LayerNorm layers, like GPT-2 (--no-bias: a bit faster, often as good)")
    tie_weights: bool = opt(True, "share the token embedding with the output head (fewer parameters)")
    # Architecture options. The defaults are the GPT above, bit for bit; the alternatives rebuild the
    # parts of the 2017 Transformer (Vaswani et al., "Attention Is All You Need") for either architecture.
    arch: str = opt("decoder", "decoder: one causal stack over 'source, separator, target' (GPT); encoder-decoder: "
                               "the 2017 Transformer (source encoder + cross-attending decoder; needs --task pairs)",
                    choices=ARCHS)
    n_enc_layer: int = opt(0, "encoder blocks for --arch encoder-decoder [default: 0, the same as --n-layer]")
    pos_emb: str = opt("learned", "positions: learned (an embedding table, GPT) or sinusoidal (fixed sin/cos "
                                  "waves, no parameters, the 2017 paper)", choices=POS_EMBS)
    emb_scale: bool = opt(False, "multiply token embeddings by sqrt(--n-embd), as in the 2017 paper")
    norm: str = opt("pre", "LayerNorm placement: pre (x + f(norm(x)), GPT-2; trains stably) or post "
                           "(norm(x + f(x)), the 2017 paper; needs warmup)", choices=NORMS)
    activation: str = opt("gelu", "feed-forward activation: gelu (GPT) or relu (the 2017 paper)",
                          choices=ACTIVATIONS)
    softmax: str = opt("full", "output layer: full (one score per character), adaptive (the most used characters "
                               "scored in full, the rare ones in smaller clusters: a faster step over thousands of "
                               "characters; docs/training.md) or auto: adaptive for a new run over a large alphabet "
                               "on a CPU with a short budget, where it measured better, else full",
                       choices=SOFTMAXES)
    shortlist: int = opt(0, "characters --softmax adaptive scores in full [default: 0, the most used ones that "
                            "cover 80% of the training text]")
    cpu_defaults: ClassVar[dict] = CPU_DEFAULTS

    def __post_init__(self):
        if self.softmax == "adaptive":  # its layers have no (V, C) matrix to share with the embedding; said once
            self.tie_weights = False    # here, where the config is made, so that validate() only checks

    def validate(self):
        check_numbers(self)
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                what = "the vocabulary size" if name == "vocab_size" else param(name)
                raise ConfigError(f"{what} must be at least 1 (got {getattr(self, name)})")
        for name in ("n_layer", "n_enc_layer"):
            if getattr(self, name) > MAX_LAYERS:
                raise ConfigError(f"{param(name)} {getattr(self, name):,} is more layers than a checkpoint holds (at "
                                  f"most {MAX_LAYERS:,}: its header, 100 MB at most, lists every tensor); lower "
                                  f"{param(name)}")
        if self.n_embd % self.n_head:
            fits = [h for h in range(1, min(self.n_embd, 64) + 1) if self.n_embd % h == 0]
            raise ConfigError(f"{param('n_embd', self.n_embd)} is not divisible by {param('n_head', self.n_head)}; "
                              f"pick a head count that divides it, e.g. one of {fits[-6:]}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"{param('dropout')} must be in [0, 1) (got {self.dropout})")
        validate_arch(self)
        return self

    def with_vocabulary(self, size):
        """The model for a corpus of `size` characters, checked once against it: a run's model settings are checked
        (validate) before its corpus is read, with room for any vocabulary; only what the vocabulary decides is
        checked here."""
        cfg = replace(self, vocab_size=size)
        if size < 1:
            raise ConfigError(f"the vocabulary size must be at least 1 (got {size})")
        if cfg.softmax == "adaptive":
            check_shortlist(cfg)
        return cfg

    @property
    def head_size(self):
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class TrainConfig:
    # where the settings come from (chargpt/config/settings.py): defaults <- preset <- config file <- flags
    preset: str | None = opt(None, "named settings to start from (listed below, with their sizes); flags and "
                                   "--config override it [default: auto, or shakespeare-char on a CUDA GPU]",
                             choices=tuple(PRESETS))
    config: str | None = opt(None, "TOML file of settings, its keys the flag names (n-layer = 4); it overrides "
                                   "--preset, and flags override it. A run directory's config.toml repeats that run")
    # data
    data: str | None = opt(None, "UTF-8 text file, or a directory of text files (read in sorted order) "
                                 "[default: the English help topics that ship with CPython (pydoc_data)]")
    out_dir: str | None = opt(None, "run directory for checkpoints and metrics [default: checkpoints/<corpus name>]")
    val_fraction: float = opt(0.1, "fraction of the corpus used for validation (where it comes from: --val-split)")
    val_split: str = opt("blocks", "which text validates: blocks (blocks of about 4,000 characters cut at line ends, "
                                   "evenly spread through the corpus: every 10th at --val-fraction 0.1) or tail (the "
                                   "last --val-fraction, as tiny Shakespeare's published numbers use); text only: "
                                   "pairs are always split at random", choices=VAL_SPLITS)
    encoding: str = opt("utf-8", "text encoding of the corpus (e.g. latin-1, gbk, utf-16)")
    encoding_errors: str = opt("strict", "undecodable bytes: 'strict' stops with an error, 'replace' uses U+FFFD",
                               choices=("strict", "replace"))
    cache_dir: str | None = opt(None, "where encoded corpora are cached [default: $CHARGPT_CACHE_DIR or "
                                      "~/.cache/chargpt]")
    task: str = opt("text", "text: learn to continue text; pairs: learn to translate, from --data lines "
                            "source<TAB>target (or --data SOURCES --target-data TARGETS, aligned line by line)",
                    choices=TASKS)
    target_data: str | None = opt(None, "with --task pairs: a file of targets, line N translating line N of --data "
                                        "[default: none, --data holds source<TAB>target lines]")
    items: bool = opt(False, "the corpus is a list, one item a line (blank lines dropped): validation holds out whole "
                             "items, and samples are items, one a line (sample.py --num-samples N writes N)")
    labels: str | None = opt(None, "label --data FOLDER's texts by subfolder (folders), file name (files) or a TSV "
                                   "of file<TAB>label (MANIFEST.tsv); sample.py --label NAME [default: none]")
    label_dropout: float = opt(0.15, "with --labels: the share of training windows that read no label (unconditioned)")
    label_sampling: str = opt("proportional", "with --labels: draw labels proportional to their characters, or "
                                              "balanced (equally often)", choices=LABEL_SAMPLING)
    # optimisation
    batch_size: int = opt(64, "sequences per micro-batch")
    grad_accum: int = opt(1, "micro-batches accumulated per optimizer step")
    max_iters: int = opt(5000, "optimizer steps to train for")
    max_time: float | None = opt(None, "wall-clock budget in seconds of training from this command on (with "
                                       "--resume: more time); the learning-rate schedule is fitted to it and training "
                                       "stops (and saves) when it is spent")
    learning_rate: float = opt(1e-3, "peak learning rate (AdamW)")
    min_lr: float | None = opt(None, "final learning rate of the decay [default: learning rate / 10]")
    warmup_iters: int = opt(100, "steps of linear warmup (with --max-time and none given: 5% of the budget, at most "
                                 "this many steps)")
    lr_decay_iters: int | None = opt(None, "step at which the decay reaches --min-lr [default: --max-iters]")
    weight_decay: float = opt(0.1, "AdamW weight decay, on weight matrices and embeddings (not biases or norms)")
    beta1: float = opt(0.9, "AdamW beta1")
    beta2: float = opt(0.99, "AdamW beta2 (0.99 suits the small batches of character models)")
    grad_clip: float = opt(1.0, "clip the global gradient norm to this value (0 disables)")
    optimizer: str = opt("adamw", "adamw: AdamW for every parameter; muon: Muon (Newton-Schulz-orthogonalised "
                                  "momentum, as in modded-nanoGPT) for the 2-D weight matrices inside the blocks, "
                                  "AdamW for embeddings, head, biases and norms", choices=OPTIMIZERS)
    muon_lr: float = opt(0.02, "peak learning rate of the Muon matrices (--optimizer muon); the schedule scales it "
                               "as it scales --learning-rate")
    muon_momentum: float = opt(0.95, "Muon's (Nesterov) momentum")
    lr_schedule: str = opt("cosine", "after the warmup: cosine decays to --min-lr over the budget; wsd "
                                     "(warmup-stable-decay) stays at the peak, then decays linearly to --min-lr over "
                                     "the last --decay-fraction of the budget; inverse-sqrt: learning rate x "
                                     "sqrt(--warmup-iters / step), as in the 2017 paper (no end: --min-lr and "
                                     "--lr-decay-iters do not apply)", choices=LR_SCHEDULES)
    decay_fraction: float = opt(0.4, "--lr-schedule wsd: the share of the budget, at its end, spent decaying")
    skip_nonfinite: bool = opt(False, "skip steps whose loss is NaN/inf instead of stopping")
    # evaluation and logging
    eval_interval: int = opt(500, "steps between evaluations (and checkpoints)")
    eval_iters: int = opt(50, "batches per split averaged in each evaluation (with --max-time and none given: fewer "
                              "where evaluating would cost over a tenth of the budget)")
    patience: int = opt(0, "stop early after this many evaluations in a row without a new best validation loss "
                           "(0: never)")
    sample_chars: int = opt(300, "characters in each sample training shows: when it ends (0: none) and every "
                                 "--sample-every steps (with --task pairs, any other value shows a few "
                                 "translations at the end)")
    sample_every: int = opt(0, "show a short sample every this many steps, from a fixed seed, and append it to "
                               "samples.jsonl in the run directory, to watch the model learn (0: off)")
    sample_prompt: str | None = opt(None, "text the samples during and after training start from [default: a "
                                          "newline, as sample.py]")
    verbose: bool = opt(False, "show every start-up line here (where each setting came from, the device and numerics, "
                               "the batch, the split, the evaluation cadence); they are always in the run's "
                               "train.log")
    curves: bool = opt(True, "draw the loss curves into curves.png in the run directory when training ends (with "
                             "matplotlib installed; --no-curves for many short runs, where each costs a moment)")
    log_to: str | None = opt(None, "also log the run to these experiment trackers, comma-separated: tensorboard, "
                                   "wandb, mlflow; each writes inside the run directory (W&B offline unless "
                                   "WANDB_MODE is set; MLflow to $MLFLOW_TRACKING_URI if set) [default: none]")
    eval_pairs: int = opt(100, "with --task pairs: validation pairs translated greedily at each evaluation, for "
                               "exact match and chrF (0: none)")
    save_state: str = opt("eval", "when state.safetensors and latest.safetensors are written: eval (at every "
                                  "evaluation, so a crash loses at most one interval) or end (when training stops, "
                                  "also on Ctrl-C; best.safetensors is still written whenever validation improves)",
                          choices=SAVE_STATES)
    # hardware
    device: str = opt("auto", "auto (CUDA, then Apple MPS, then CPU), cpu, cuda, cuda:N or mps")
    dtype: str = opt("auto", "auto (bfloat16 where the hardware has it natively, else float32; CHARGPT_CPU_BF16=0|1 "
                             "overrides a CPU's detection), float32 (everything in float32, Muon's iteration "
                             "included), bfloat16 or float16 (the forward and backward matmuls under autocast, "
                             "float16 with loss scaling; Muon's iteration in bfloat16 in a bfloat16 run, else "
                             "float32); weights, gradients and optimizer states are float32 always; the start-up "
                             "line 'numerics:' says which",
                     choices=("auto", "float32", "bfloat16", "float16"))
    compile: str | bool = opt("auto", "torch.compile the model: auto where it measurably wins (CUDA: yes; CPU: bf16 "
                                      "runs of --max-time 1800 or more; the rule is runtime.pick_compile, printed at "
                                      "start), on, off; --compile alone "
                                      "means on, --no-compile off", choices=COMPILE_CHOICES, switch=("on", "off"))
    attention: str = opt("auto", "attention kernel: auto picks the fastest for the device; fused (torch SDPA) or "
                                 "manual (explicit masked softmax)", choices=("auto", "fused", "manual"))
    threads: int | None = opt(None, f"CPU threads for torch, at most {THREADS_PER_CPU} per CPU [default: one per "
                                    f"CPU core, split between local processes]")
    seed: int = opt(1337, "random seed (model init, batches, dropout), 0 to 2**63 - 1")
    resume: bool = opt(False, "continue the run in --out-dir from its latest state, with its budget; a finished "
                              "run needs a new one (--max-iters or --max-time)")
    init_from: str | None = opt(None, "start a new run from a trained one: a run directory (its best weights) or a "
                                      "checkpoint file (RUN/latest.safetensors for its latest); its architecture, "
                                      "--data's new characters added to its vocabulary, a fresh optimizer, schedule "
                                      "and budget [default: none, random weights]")
    label_smoothing: float = opt(0.0, "spread this much of each target's probability over the whole vocabulary "
                                      "in the training loss (0.1 in the 2017 paper; 0: plain cross-entropy); the "
                                      "losses reported are plain cross-entropy either way")
    # fill in the middle (chargpt/data/fim.py)
    fim: float = opt(0.0, "lay out this share of training windows prefix-suffix-middle with private marker characters, "
                          "so that sample.py --suffix TEXT writes what goes between --prompt and TEXT (0.5 is usual; "
                          "0: off)")
    cpu_defaults: ClassVar[dict] = CPU_DEFAULTS

    def __post_init__(self):
        if isinstance(self.compile, bool):  # compile=True from Python, and checkpoints from before auto|on|off
            object.__setattr__(self, "compile", "on" if self.compile else "off")

    def validate(self):
        check_seed(self.seed)  # its own range, said more precisely than check_numbers would
        check_numbers(self)
        check_paths(vars(self))
        for name in ("batch_size", "max_iters", "learning_rate", "eval_interval", "eval_iters"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{param(name)} must be positive (got {getattr(self, name)})")
        for name in ("warmup_iters", "weight_decay", "grad_clip", "sample_chars", "patience", "sample_every",
                     "eval_pairs"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{param(name)} must be non-negative (got {getattr(self, name)})")
        if self.grad_accum < 1:
            raise ConfigError(f"{param('grad_accum')} must be at least 1 (got {self.grad_accum})")
        if not 0.0 < self.val_fraction < 1.0:
            raise ConfigError(f"{param('val_fraction')} must be between 0 and 1, exclusive (got {self.val_fraction})")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.learning_rate:
            raise ConfigError(f"{param('min_lr')} must be between 0 and {param('learning_rate', self.learning_rate)} "
                              f"(got {self.min_lr})")
        if self.lr_decay_iters is not None and self.lr_decay_iters < 1:
            raise ConfigError(f"{param('lr_decay_iters')} must be at least 1 (got {self.lr_decay_iters})")
        if self.max_time is not None and self.max_time <= 0:
            raise ConfigError(f"{param('max_time')} must be positive seconds (got {self.max_time})")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{param(name)} must be in [0, 1) (got {getattr(self, name)})")
        if self.sample_every and not self.sample_chars:
            raise ConfigError(f"{param('sample_every')} needs {param('sample_chars')} above 0 (the length of each "
                              f"sample); drop {param('sample_chars', 0)}")
        check_preset(self.preset)
        if not self.muon_lr > 0:
            raise ConfigError(f"{param('muon_lr')} must be positive (got {self.muon_lr})")
        if not 0 <= self.muon_momentum < 1:
            raise ConfigError(f"{param('muon_momentum')} must be in [0, 1) (got {self.muon_momentum})")
        if not 0 < self.decay_fraction <= 1:
            raise ConfigError(f"{param('decay_fraction')} must be in (0, 1] (got {self.decay_fraction})")
        for name, allowed in (("optimizer", OPTIMIZERS), ("lr_schedule", LR_SCHEDULES), ("save_state", SAVE_STATES),
                              ("compile", COMPILE_CHOICES), ("task", TASKS),
                              ("val_split", VAL_SPLITS), ("label_sampling", LABEL_SAMPLING)):  # the CLI checks these
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{param(name)} must be one of {', '.join(allowed)} (got {getattr(self, name)!r})")
        if not 0.0 <= self.label_smoothing < 1.0:  # also catches NaN
            raise ConfigError(f"{param('label_smoothing')} must be in [0, 1) (got {self.label_smoothing})")
        if self.target_data is not None and self.task != "pairs":
            raise ConfigError(f"{param('target_data')} is for sentence pairs; add {param('task', 'pairs')}")
        check_trackers(self.log_to)
        return self


@dataclass(frozen=True)
class SampleSettings:
    """How to choose characters; sample.py's flags and the Generator keywords share these names and defaults.
    Checked once, when made (a bad value is a one-line ConfigError there), and never changed after: a call's whole
    options, with the number of samples and the seed, are chargpt.sampling.options.SampleOptions."""
    max_new_tokens: int = opt(500, "characters to generate")
    temperature: float = opt(0.8, "randomness: below 1 safer, above 1 wilder; 0 always picks the most likely "
                                  "character (greedy)")
    top_k: int | None = opt(None, "sample only from the k most likely characters (clamped to the vocabulary; "
                                  "0: off) [default: off]")
    top_p: float | None = opt(None, "nucleus sampling: the smallest set of characters whose probability reaches p, "
                                    "in (0, 1] (1: off) [default: off]")
    stop: tuple = opt((), "stop a sample when it writes this string (not included); \\n and \\t mean newline and "
                          "tab, so --stop '\\n\\n' stops at a blank line; repeatable [default: none]", multiple=True)
    # Constraints and scores (chargpt/sampling/constraints.py, chargpt/sampling/forms.py): masks on the logits, forced
    # characters.
    min_p: float | None = opt(None, "drop characters less likely than p times the most likely one, in [0, 1] (after "
                                    "--top-k and --top-p; 0: off) [default: off]")
    repetition_penalty: float | None = opt(None, "divide the (positive) logit of every character already in the text, "
                                                 "prompt included, by F (multiply a negative one), as transformers' "
                                                 "repetition_penalty; 1: off [default: off]")
    no_repeat_ngram: int | None = opt(None, "never write an N-character sequence that is already in the text, prompt "
                                            "included, as transformers' no_repeat_ngram_size (0: off) [default: off]")
    ban: str | None = opt(None, "never write these characters (--ban eE: a lipogram without e; \\n is a line "
                                "break) [default: none]")
    allow: str | None = opt(None, "write only these characters (a form's fixed ones must be among them) "
                                  "[default: all]")
    form: str | None = opt(None, "the shape the sample must take: a pattern (_ one letter or ideograph, * free text "
                                 "on its line until the next fixed text, at most 100 characters; \\_ \\* \\\\ \\n "
                                 "escapes; anything else is written as given) or a named form (--forms lists them) "
                                 "[default: none]")
    acrostic: str | None = opt(None, "start successive lines with these characters (lines of the --form; without "
                                     "one, the lines the model writes: the sample ends with the last) [default: none]")
    # Patterns (chargpt/sampling/grammar.py, through llguidance: pip install -e ".[grammar]"); one at a time
    regex: str | None = opt(None, "the sample must match this regular expression whole (Rust's regex syntax, as "
                                  "llguidance reads it; the prompt is not part of the match): it ends where the text "
                                  "is complete and the model would write something the expression does not allow "
                                  "next [default: none]")
    grammar: str | None = opt(None, "the sample must follow this Lark grammar (llguidance's dialect): on the command "
                                    "line the FILE that holds it, from Python its text [default: none]")
    json_schema: str | None = opt(None, "the sample must be one JSON value valid under this JSON schema: on the "
                                        "command line the FILE that holds it, from Python its text (or a dict) "
                                        "[default: none]")
    best_of: int | None = opt(None, "write N samples (one batch), drop those that copy the training text (a span of "
                                    "--min-span or more) or repeat a better one, and keep the best --num-samples by "
                                    "the model's own mean log-probability per character [default: off]")
    label: str | None = opt(None, "a run trained with --labels: write in this label's style, or in a mix of labels' "
                                  "styles, a:0.7,b:0.3 (weights positive, normalised to sum 1; the next-character "
                                  "log-probabilities are mixed log-linearly) [default: none]")
    guidance: float | None = opt(None, "with --label: classifier-free guidance F >= 1, logits = uncond + F x (cond - "
                                       "uncond), two forward passes a character; 1: plain --label [default: 1]")
    # Beam search (chargpt/sampling/beam.py, with translation's search); checked in chargpt/config/decoding.py
    beam: int | None = opt(None, "write the likeliest continuation found by a beam search keeping N hypotheses (1: "
                                 "greedy): deterministic, so --temperature, --top-k, --top-p and --min-p do not apply; "
                                 "--num-samples returns the best beams [default: off]")
    length_penalty: float = opt(1.0, "with --beam and --stop: a finished hypothesis scores its log-probability / "
                                     "length ** ALPHA (0: the total, which favours short texts; 1: per character)")
    # fill in the middle (chargpt/sampling/infill.py): a run trained with --fim
    suffix: str | None = opt(None, "a run trained with --fim: the text after the gap; the sample is what goes between "
                                   "--prompt and it, ending where the model closes the middle; \\n and \\t mean "
                                   "newline and tab, as in --prompt [default: none]")

    def __post_init__(self):
        # a lone string would otherwise be read as one stop string per character
        object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if isinstance(self.json_schema, dict):  # json_schema={...} from Python: kept as its JSON text
            object.__setattr__(self, "json_schema", json.dumps(self.json_schema, ensure_ascii=False))
        self.validate()

    def validate(self):
        """Run by construction; -> self."""
        typed_fields(SampleSettings, vars(self), "sampling settings")
        check_numbers(self)
        if not self.temperature >= 0:
            raise ConfigError(f"{param('temperature')} must be >= 0 (0 means greedy), got {self.temperature}")
        if self.temperature > SAMPLE_SCALE:
            raise ConfigError(f"{param('temperature')} must be at most {SAMPLE_SCALE:g}, got {self.temperature}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"{param('top_k')} must be >= 0 (0 disables it), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"{param('top_p')} must be in (0, 1] (1 disables it), got {self.top_p}")
        if self.max_new_tokens < 0:
            raise ConfigError(f"{param('max_new_tokens')} must be >= 0, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ConfigError(f"{param('stop')} needs a non-empty string")
        if self.min_p is not None and not 0 <= self.min_p <= 1:
            raise ConfigError(f"{param('min_p')} must be in [0, 1] (0 disables it), got {self.min_p}")
        if self.repetition_penalty is not None and not 1 / SAMPLE_SCALE <= self.repetition_penalty <= SAMPLE_SCALE:
            raise ConfigError(f"{param('repetition_penalty')} must be from {1 / SAMPLE_SCALE:g} to {SAMPLE_SCALE:g} (1 "
                              f"disables it; above 1 repeats less), got {self.repetition_penalty}")
        if self.no_repeat_ngram is not None and self.no_repeat_ngram < 0:
            raise ConfigError(f"{param('no_repeat_ngram')} must be >= 0 (0 disables it), got {self.no_repeat_ngram}")
        guided = self.guidance is not None and (self.label or self.guidance == 1)
        if self.guidance is not None and not (guided and 1 <= self.guidance <= SAMPLE_SCALE):
            raise ConfigError(f"{param('guidance')} must be >= 1 (at most {SAMPLE_SCALE:g}) and steers towards a "
                              f"--label (got {self.guidance})")
        if self.best_of is not None and self.best_of < 1:
            raise ConfigError(f"{param('best_of')} must be >= 1, got {self.best_of}")
        for name, what in (("allow", "the characters to write"), ("form", "a pattern or a form's name"),
                           ("acrostic", "the characters that start the lines")):
            if getattr(self, name) == "":  # empty is not "off": --allow "" would allow nothing
                raise ConfigError(f"{param(name)} is empty; give it {what}, or leave it out")
        if self.form:
            from chargpt.sampling.forms import parse
            parse(self.form)  # the pattern's own syntax; what the vocabulary allows is checked at decoding
        patterns = [name for name in ("regex", "grammar", "json_schema") if getattr(self, name) is not None]
        if len(patterns) > 1:
            raise ConfigError(f"{param(patterns[0])} and {param(patterns[1])} both give the sample a pattern; give one")
        if patterns:
            from chargpt.sampling.grammar import check
            check(patterns[0], getattr(self, patterns[0]))  # its syntax; the vocabulary's part is checked at decoding
        object.__setattr__(self, "label_mix", check_decoding(self))  # --label typed once: a LabelMix, or None
        return self


EXPORT_FORMATS = ("hf", "web", "gguf", "onnx")
WEB_WEIGHTS = ("float32", "int8")  # chargpt/tools/webpage/pack.py
GGUF_PRECISIONS = ("f32", "f16", "q8_0")  # chargpt/tools/gguf.py


@dataclass
class ExportSettings:
    """What `chargpt export` writes, and where (chargpt/tools/export.py; --format web: chargpt/tools/webpage/; gguf:
    chargpt/tools/gguf.py; onnx: chargpt/tools/onnx.py)."""
    to: str | None = opt(None, "folder to write the export to; created, and it must not exist or be empty, unless "
                               "--force (--format web: the .html file to write; gguf: the .gguf file) [required]")
    format: str = opt("hf", "hf: a Hugging Face transformers folder (GPT2LMHeadModel, tokenizer.json, "
                            "generation_config.json, README.md model card) that AutoModelForCausalLM.from_pretrained "
                            "loads without custom code; web: one self-contained .html page that writes with the model "
                            "in any browser, offline; gguf: one .gguf file for llama.cpp and Ollama (GPT-2, with an "
                            "Ollama Modelfile beside it); onnx: a folder with the decoder and its KV cache for ONNX "
                            "Runtime, and the vocabulary as JSON", choices=EXPORT_FORMATS)
    force: bool = opt(False, "write into a --to folder that is not empty: the export's own files (written and checked "
                             "in full first) replace an earlier export's; every other file stays (--format web: "
                             "replace an earlier web export's page)")
    web_weights: str = opt("float32", "--format web: the page's weights, float32 (as trained) or int8 (a quarter of "
                                      "the bytes; its cost in loss is printed)", choices=WEB_WEIGHTS)
    precision: str = opt("f32", "--format gguf: the weight matrices as f32 (as trained), f16 (half the bytes) or "
                                "q8_0 (llama.cpp's 8-bit blocks, about a quarter)", choices=GGUF_PRECISIONS)

    def __post_init__(self):  # checked once, here: every export function and the CLI make one
        for name, allowed in (("format", EXPORT_FORMATS), ("web_weights", WEB_WEIGHTS),
                              ("precision", GGUF_PRECISIONS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{param(name)} must be one of {', '.join(allowed)} (got {getattr(self, name)!r})")
        if not self.to:
            what = {"web": "the .html file to write", "gguf": "the .gguf file to write"}.get(
                self.format, "the folder to write the export to")
            raise ConfigError(f"{param('to')} is required: {what}")


def check_numbers(config):
    """Every number in a config must be one torch can take. NaN never compares, so it would slip past every range
    check after this (a NaN --max-time never stops, a NaN --grad-clip disables clipping), and inf means nothing
    either; an integer past 64 bits overflows inside torch."""
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{param(f.name)} must be a finite number (got {value})")
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise ConfigError(f"{param(f.name)} is too large (got {value:.3g}; at most 2**63 - 1)")


def check_paths(settings):
    """Path settings must not be empty strings: Path("") is the current folder, which is never what was meant."""
    defaults = {"data": "the built-in corpus", "out_dir": "checkpoints/<corpus name>", "cache_dir": "the default",
                "config": "no config file", "init_from": "random weights (a run from scratch)",
                "target_data": "none (--data then holds source<TAB>target lines)"}
    for name, default in defaults.items():
        if settings.get(name) == "":
            raise ConfigError(f"{param(name)} is an empty path; give a path, or leave it out for {default}")


def check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{param('seed')} must be a whole number from 0 to {MAX_SEED} (2**63 - 1), "
                          f"got {seed!r:.40}")
    return seed


def tracker_names(value):
    """--log-to's value -> the trackers it names, in order, each once ('none', or nothing: none)."""
    names = [name.strip().lower() for name in (value or "").split(",") if name.strip()]
    return () if names == ["none"] else tuple(dict.fromkeys(names))


def check_trackers(value):
    for name in tracker_names(value):
        if name == "none":  # alone it is no tracker (tracker_names); beside trackers it contradicts them
            raise ConfigError(f"{param('log_to')}: none (no tracker) cannot be combined with trackers; give it alone")
        if name not in TRACKERS:
            close = difflib.get_close_matches(name, TRACKERS, n=1)
            raise ConfigError(f"{param('log_to')}: no tracker named {name!r}" + (f" (did you mean {close[0]}?)"
                              if close else "") + f"; name one or more of {', '.join(TRACKERS)}, comma-separated")


def check_preset(name):
    if name is not None and name not in PRESETS:
        close = difflib.get_close_matches(str(name), PRESETS, n=1)
        raise ConfigError(f"{param('preset')} {name!r:.40} is not a preset; "
                          + (f"did you mean {close[0]!r}? " if close else "") + f"the presets: {', '.join(PRESETS)}")


def check_task(arch, cfg: TrainConfig):
    """What the model is trained on must suit its architecture: an encoder-decoder needs a source to encode."""
    if arch == "encoder-decoder" and cfg.task != "pairs":
        raise ConfigError(f"{param('arch', 'encoder-decoder')} translates a source into a target: it needs "
                          f"{param('task', 'pairs')} and {param('data')} with source<TAB>target lines")


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
    check_paths(train)  # before anything reads them (an empty --out-dir would otherwise mean "not given")
    return model, train


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


def typed_fields(cls, d, what, wrong_type=None):
    """The one check of a dictionary from outside (checkpoint metadata, keyword arguments, a config file's table)
    against dataclass fields: -> the fields of `cls` (a dataclass, or a tuple of them) present in `d`, each of the
    type its annotation allows: `int`, `float` (an int too), `bool` (never a number), `str` (a path too, as its
    string), or one of those `| None`. Unknown keys are left out: the caller decides about them. A value of another
    type is a ConfigError, worded `{what}: 'n_layer' has the wrong type (str: '2')`, or by `wrong_type(name, value,
    want)`, `want` the type asked for (the first the annotation allows)."""
    if not isinstance(d, dict):
        raise ConfigError(f"{what} is not an object")
    kw = {}
    for f in (f for c in (cls if isinstance(cls, tuple) else (cls,)) for f in fields(c)):
        if f.name not in d:
            continue
        value, allowed = d[f.name], getattr(f.type, "__args__", None) or (f.type,)
        if str in allowed and isinstance(value, os.PathLike):  # data=Path(...) from Python
            value = os.fspath(value)
        if not any(_has_type(value, t) for t in allowed):
            raise ConfigError(wrong_type(f.name, value, _TYPES.get(allowed[0], allowed[0])) if wrong_type else
                              f"{what}: {f.name!r} has the wrong type ({type(value).__name__}: {value!r:.40})")
        kw[f.name] = value
    return kw


_TYPES = {"int": int, "float": float, "bool": bool, "str": str}  # annotations written as strings


def _has_type(value, t):
    t = _TYPES.get(t, t)
    if t is type(None):
        return value is None
    if isinstance(value, bool):  # bool is an int subclass; never accept it for a number
        return t is bool
    if t is float:
        return isinstance(value, (int, float))
    return isinstance(t, type) and isinstance(value, t)
