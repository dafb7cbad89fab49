"""Export a run to Hugging Face transformers: `chargpt export --checkpoint RUN --to DIR`.

    export("checkpoints/tinyshakespeare", "shakespeare-hf")     # -> Path("shakespeare-hf")

    from transformers import AutoModelForCausalLM, AutoTokenizer
    model, tok = AutoModelForCausalLM.from_pretrained("shakespeare-hf"), AutoTokenizer.from_pretrained("shakespeare-hf")

The folder holds a stock GPT2LMHeadModel (config.json, model.safetensors, generation_config.json), the character
tokenizer (tokenizer.json, tokenizer_config.json) and a README.md model card; nothing needs trust_remote_code, so
the Hub, pipelines and converters that start from a transformers folder take it. chargpt's decoder is GPT-2's
network, so the export maps names, as nanoGPT's GPT.from_pretrained does the other way: Linear weights
(out, in) become Conv1D weights (in, out); a --no-bias run gets zero biases (GPT-2 always has them); sinusoidal
positions become a fixed wpe table; an untied --emb-scale run gets the sqrt(C) folded into its embedding. What GPT-2
cannot compute (the encoder-decoder, post-LN, a scaled embedding shared with the head) is refused by name.

Before the folder appears, transformers loads it back and its logits are compared with chargpt's on a full context
of ids, and the tokenizer must give every character chargpt's id: an export that would not behave as the run does
is never written. The folder is written under a temporary name beside --to and renamed into place.

transformers and tokenizers are an optional extra (pip install -e ".[export]"), imported only here, so no other
command pays for importing them.
"""

import contextlib
import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from . import __version__
from .checkpoint import load_model, read_meta
from .config import EXPORT_FORMATS, ExportSettings, SampleSettings, describe_model, run_val_split
from .errors import ChargptError, ConfigError
from .flags import param
from .pairs import END, SEP
from .rundir import resolve

# nn.Linear keeps (out, in); GPT-2's Conv1D keeps (in, out): these four are transposed on the way out
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PROBE_SEED = 0  # the ids the export-time check feeds both models
# export-time check: largest |logit difference| allowed, relative to the largest |logit| (at least 1). Both compute
# in float32 and differ at most in the order of additions: with torch 2.13 on a CPU the logits came out bitwise equal,
# from 2 layers x 16 to 6 x 384; the margin is for other kernels and devices.
LOGITS_TOLERANCE = 1e-4
FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "README.md")  # what an export folder holds


def require_libraries():
    """-> (transformers, tokenizers), or the one-line error saying how to install them."""
    try:
        import tokenizers
        import transformers
    except ImportError:
        raise ChargptError('exporting needs transformers and tokenizers, which are not installed; pip install -e '
                           '".[export]" (or pip install transformers tokenizers)') from None
    return transformers, tokenizers


# --- what GPT-2 can express ------------------------------------------------------------------------------------
def check_exportable(cfg):
    """Refuse, naming the option, a model that GPT2LMHeadModel cannot compute exactly."""
    if cfg.arch != "decoder":
        raise ConfigError(f"{param('arch', cfg.arch)} cannot be exported as GPT-2, which is decoder-only (no "
                          f"encoder, no cross-attention); only {param('arch', 'decoder')} runs export")
    if cfg.norm != "pre":
        raise ConfigError(f"{param('norm', cfg.norm)} cannot be exported as GPT-2, which puts each LayerNorm before "
                          f"its block (pre-LN) and has a final one; only {param('norm', 'pre')} runs export")
    if cfg.emb_scale and cfg.tie_weights:
        raise ConfigError(f"{param('emb_scale')} with tied embeddings cannot be exported as GPT-2: it would have to "
                          f"scale the token embedding by sqrt({cfg.n_embd}) but not the output head that shares it "
                          f"(a run trained with untied embeddings exports, the scale folded into its embedding)")


def gpt2_config(model, task, end_id=None):
    """GPT2Config keyword arguments for chargpt's decoder `model`."""
    cfg = model.config
    return dict(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.n_embd, n_layer=cfg.n_layer,
        n_ctx=cfg.block_size,  # not read by transformers, but by llama.cpp's converter (OpenAI's GPT-2 config has it)
        n_head=cfg.n_head, n_inner=4 * cfg.n_embd,
        activation_function=cfg.activation,  # "gelu" is torch's exact erf GELU, as chargpt's nn.GELU(); not gelu_new
        layer_norm_epsilon=model.h[0].ln_1.eps, tie_word_embeddings=cfg.tie_weights,
        resid_pdrop=cfg.dropout, embd_pdrop=cfg.dropout, attn_pdrop=cfg.dropout,  # what it trained with
        bos_token_id=None, eos_token_id=end_id if task == "pairs" else None, pad_token_id=None,
        architectures=["GPT2LMHeadModel"])


def gpt2_tensors(model, want):
    """chargpt's weights under GPT2LMHeadModel's names; `want` {name: shape} is the GPT-2 state dict to fill.
    Biases chargpt has not (--no-bias) are zeros, which add nothing."""
    cfg, sd = model.config, model.state_dict()
    wte = sd["wte.weight"] * math.sqrt(cfg.n_embd) if cfg.emb_scale else sd["wte.weight"]  # (V, C); untied only
    out = {"transformer.wte.weight": wte,
           "transformer.wpe.weight": sd["wpe.weight"] if cfg.pos_emb == "learned" else model.pe,  # (block_size, C)
           "lm_head.weight": sd["lm_head.weight"]}  # the same tensor as wte when tied
    for name, t in sd.items():
        if name.startswith(("h.", "ln_f.")):
            out["transformer." + name] = t.t() if name.endswith(CONV1D) else t
    missing = {k: torch.zeros(shape) for k, shape in want.items() if k not in out and k.endswith(".bias")}
    out = {k: v.detach().float().contiguous() for k, v in {**out, **missing}.items()}
    wrong = sorted(set(out) ^ set(want)) or [k for k in want if tuple(out[k].shape) != tuple(want[k])]
    if wrong:  # a GPT-2 whose layout this table does not know (another transformers version?)
        raise ChargptError(f"cannot map chargpt's weights onto this transformers' GPT-2 ({wrong[:3]}); "
                           f"report it with your transformers version")
    return out


def character_tokenizer(vocab, tokenizers):
    """A tokenizers.Tokenizer giving every character chargpt's id: a WordLevel model over the run's characters, a
    pre-tokenizer that makes every code point (newlines and spaces included) its own word, no normalizer (text is
    taken as is), and a Fuse decoder, so decoding joins characters without inserting spaces. A character the run
    never saw becomes chargpt's --unknown replace stand-in (vocab.replacement()), a real vocabulary entry."""
    from tokenizers import Regex, decoders, models, pre_tokenizers
    tok = tokenizers.Tokenizer(models.WordLevel({c: i for i, c in enumerate(vocab.chars)},
                                                unk_token=vocab.replacement()))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # "." would miss \n
    tok.decoder = decoders.Fuse()
    return tok


def tokenizer_config(cfg):
    """tokenizer_config.json. No special tokens: the unknown stand-in is an ordinary character of the text, and
    declaring it unk_token would make decode(skip_special_tokens=True), which pipelines use, delete it wherever it
    occurs. clean_up_tokenization_spaces is off: on, it deletes spaces before punctuation (its default has flipped
    between versions). PreTrainedTokenizerFast, the class name transformers 4 and 5 both know."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "model_max_length": cfg.block_size}


def generation_settings(cfg, task, end_id=None):
    """GenerationConfig keyword arguments: chargpt's sampling defaults (config.SampleSettings) for a text run;
    greedy translation up to the end marker (as chargpt translate) for a pairs run. GPT-2 in transformers cannot
    slide its window past block_size positions as chargpt does, so a generation is capped at block_size in all."""
    if task == "pairs":
        return dict(do_sample=False, eos_token_id=end_id, max_length=cfg.block_size)
    s = SampleSettings()
    return dict(do_sample=s.temperature > 0, temperature=s.temperature, top_k=s.top_k or 0,  # 0: off (its default
                top_p=s.top_p or 1.0, max_length=cfg.block_size)  # is 50)


# --- the model card ---------------------------------------------------------------------------------------------
def model_card(meta, model, name, transformers_version):
    """README.md: what the model is, how well it did, and how to load it."""
    cfg, vocab = model.config, meta["vocab"]
    corpus, chars = meta.get("corpus"), meta.get("corpus_chars")  # untrusted: checked before use
    corpus = corpus[:200] if isinstance(corpus, str) and corpus else "an unnamed corpus"
    size = f"{chars:,} characters" if isinstance(chars, int) and not isinstance(chars, bool) else "size not recorded"
    tcfg = meta.get("train_config") or {}
    held = tcfg.get("val_fraction")
    if isinstance(held, float) and 0 < held < 1:  # as the run split it: pairs at random, text by --val-split
        if meta.get("task") == "pairs":
            size += f", {held:.0%} of the pairs held out for validation, at random"
        elif run_val_split(tcfg) == "tail":
            size += f", the last {held:.0%} held out for validation"
        else:
            size += f", {held:.0%} held out for validation in blocks spread through it"
    loss = meta.get("val_loss")
    loss = f"{loss:.4f} nats per character ({loss / math.log(2):.4f} bits per character)" \
        if isinstance(loss, (int, float)) else "not measured"
    notes = [f"characters outside the {len(vocab)} it knows become {vocab.replacement()!r} (chargpt's "
             f"`--unknown replace`)",
             f"transformers' GPT-2 reads at most {cfg.block_size} positions (prompt + generated); chargpt itself "
             f"slides its window to write longer texts"]
    if cfg.pos_emb == "sinusoidal":
        notes.append("its sinusoidal positions are stored as the fixed `wpe` table (fine-tuning would train them)")
    if cfg.emb_scale:
        notes.append(f"its embedding scale sqrt({cfg.n_embd}) is folded into `wte`")
    if meta["task"] == "pairs":
        usage = (f'ids = tok("Good morning." + "\\u{ord(SEP):04x}", return_tensors="pt").input_ids  # source, then '
                 f"the separator\nout = model.generate(ids)  # greedy, stops at the end marker "
                 f"U+{ord(END):04X}\nprint(tok.decode(out[0, ids.shape[1]:-1]))")
        what = f"translates: the prompt is a source sentence followed by U+{ord(SEP):04X}"
    else:
        prompt = next(p for p in ("ROMEO:", "The", "\n", vocab.chars[0]) if all(c in vocab.stoi for c in p))
        usage = (f"ids = tok({prompt!r}, return_tensors=\"pt\").input_ids\n"
                 f"out = model.generate(ids)  # samples at temperature 0.8, as chargpt does, up to {cfg.block_size} "
                 f"characters in all\nprint(tok.decode(out[0]))")
        what = "writes text in the style of its corpus"
    steps = meta.get("step", 0)
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [chargpt, gpt2, character-level]
---

# {name}

A character-level GPT trained with chargpt {__version__} on **{corpus}** ({size}); it {what}.
Exported by `chargpt export` as a stock `GPT2LMHeadModel` with a character tokenizer: no custom code.

| | |
|---|---|
| model | {describe_model(cfg)}; {model.num_params():,} parameters; {'tied' if cfg.tie_weights else 'untied'} \
embeddings; {'biases' if cfg.bias else 'no biases (exported as zeros)'} |
| vocabulary | {len(vocab):,} characters, one token each, ids as in chargpt |
| training | {steps:,} steps |
| validation loss | {loss} |
| exported with | transformers {transformers_version} |

## Load it

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model, tok = AutoModelForCausalLM.from_pretrained("{name}"), AutoTokenizer.from_pretrained("{name}")
{usage}
```

Notes: {"; ".join(notes)}.
"""


# --- writing the folder -----------------------------------------------------------------------------------------
def check_target(target, checkpoint, force):
    """--to must be a new or empty folder, or with --force an earlier export (never the run being exported, nor
    a folder of other files)."""
    if target.exists() and not target.is_dir():
        raise ChargptError(f"--to {target} is a file, not a folder; choose a folder name")
    if target.is_dir() and any(target.iterdir()) and not force:
        raise ChargptError(f"--to {target} exists and is not empty; choose a new folder, or pass --force to "
                           f"replace it")
    if target.is_dir() and Path(checkpoint).resolve().is_relative_to(target.resolve()):
        raise ChargptError(f"--to {target} holds the checkpoint being exported; choose another folder")
    marks = ("config.json", "model.safetensors", "tokenizer.json")  # what every export writes; a config.json alone
    if target.is_dir() and any(target.iterdir()) and not all((target / m).is_file() for m in marks):  # is not one
        raise ChargptError(f"--to {target} is not an earlier export (it lacks {', '.join(marks)}), and --force "
                           f"replaces only those; choose a new folder")


@contextlib.contextmanager
def quiet(transformers):
    """Without transformers' progress bars (one per file written or read) for the block; as it was after."""
    was = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            transformers.utils.logging.enable_progress_bar()


def write_hf(model, vocab, meta, folder, name):
    """Fill `folder` with the transformers files of chargpt's decoder `model`."""
    transformers, tokenizers = require_libraries()
    task = meta["task"]
    end_id = vocab.stoi.get(END) if task == "pairs" else None
    hf_config = transformers.GPT2Config(**gpt2_config(model, task, end_id))
    with torch.device("meta"):  # only the names and shapes: nothing is allocated or initialised
        want = {k: tuple(v.shape) for k, v in transformers.GPT2LMHeadModel(hf_config).state_dict().items()}
    hf = transformers.GPT2LMHeadModel(hf_config)
    hf.load_state_dict(gpt2_tensors(model, want), strict=True)
    hf.generation_config = transformers.GenerationConfig(**generation_settings(model.config, task, end_id))
    hf.save_pretrained(folder)  # model.safetensors (the default since transformers 4.35), config.json
    character_tokenizer(vocab, tokenizers).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model.config), indent=2) + "\n")
    card = model_card(meta, model, name, transformers.__version__)
    (folder / "README.md").write_text(card, encoding="utf-8")


@torch.no_grad()
def verify(folder, model, vocab):
    """Load `folder` as a user would and check it computes chargpt's logits and ids; raise if not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    text = "".join(vocab.chars)
    every = list(range(len(vocab)))
    if tok(text, verbose=False)["input_ids"] != every or tok.decode(every) != text:  # verbose: text > block_size
        raise ChargptError("the exported tokenizer does not give every character chargpt's id; nothing was written; "
                           "report it with your tokenizers version")
    g = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(len(vocab), (1, model.config.block_size), generator=g)  # (1, T): every position
    want = model(ids)[0].float()  # (1, T, V)
    got = hf(ids).logits.float()
    diff, scale = (got - want).abs().max().item(), max(1.0, want.abs().max().item())
    if not diff <= LOGITS_TOLERANCE * scale:
        raise ChargptError(f"the exported model's logits differ from chargpt's by {diff:.2g} (allowed "
                           f"{LOGITS_TOLERANCE * scale:.2g}); nothing was written; report it with your transformers "
                           f"version")
    return diff


def _dir_mode():
    mask = os.umask(0)
    os.umask(mask)
    return 0o777 & ~mask


def _sync_folder(folder):
    """Flush every file of `folder`, and the folder itself, to disk."""
    for p in folder.iterdir():
        with open(p, "rb+") as f:
            os.fsync(f.fileno())
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _swap_in(tmp, target):
    """Rename the finished folder `tmp` to `target`; an existing target (empty, or --force) is moved aside first
    and deleted only once the new folder is in place (put back if the rename fails)."""
    if not target.exists():
        os.rename(tmp, target)
        return
    old = target.with_name(f".{target.name}.old{os.getpid()}")
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def write_folder(target, fill):
    """`fill(folder)` writes a temporary folder beside target, which is flushed to disk and renamed to target;
    -> what fill returned. On any failure, Ctrl-C included, the temporary folder is removed and target is as it
    was; a failed write (disk full, no permission) is a one-line error."""
    tmp = None
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.export", dir=target.parent))
        os.chmod(tmp, _dir_mode())  # mkdtemp makes it private; an export is meant to be shared
        result = fill(tmp)
        _sync_folder(tmp)
        _swap_in(tmp, target)
        return result
    except (OSError, SafetensorError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
        raise ChargptError(f"could not write {target} ({reason}); nothing was changed there; free disk space or "
                           f"choose another --to") from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def export(checkpoint, to=None, format="hf", force=False, log=print):
    """Checkpoint file or run directory -> the folder `to`, as `format` (hf: transformers); -> its Path."""
    settings = ExportSettings(to=to, format=format, force=force)
    if not settings.to:
        raise ConfigError(f"{param('to')} is required: the folder to write the export to")
    if settings.format not in EXPORT_FORMATS:
        raise ConfigError(f"{param('format')} must be one of {', '.join(EXPORT_FORMATS)} (got {settings.format!r})")
    target = Path(settings.to).expanduser()
    path = resolve(checkpoint)
    check_target(target, path, settings.force)
    header, _ = read_meta(path)  # the header alone: what cannot be exported is refused before anything heavy
    check_exportable(header["model_config"])
    transformers, _ = require_libraries()
    model, vocab, meta = load_model(path, "cpu")
    model.float().eval()

    def fill(folder):
        write_hf(model, vocab, meta, folder, target.name)
        return verify(folder, model, vocab)

    with quiet(transformers):
        diff = write_folder(target, fill)
    log(f"exported {path} ({describe_model(model.config)}, {len(vocab)} characters) to {target}; transformers "
        f"reproduces its logits (largest difference {diff:.1g})")
    return target
