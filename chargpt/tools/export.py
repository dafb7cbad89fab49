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
is never written. The folder is written under a temporary name beside --to (.NAME.export<pid>.XXXXXXXX) and renamed
into place; into an existing folder (--force over an earlier export, say a clone of its Hub repository) only the
export's six files are put, each atomically, and every other file and folder there is left as it is. Ctrl-C and
SIGTERM remove the temporary folder; a later export to the same --to removes those of killed processes.

transformers and tokenizers are an optional extra (pip install -e ".[export]"), imported only here, so no other
command pays for importing them.
"""

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError

from chargpt import __version__
from chargpt.config import ExportSettings, SampleSettings
from chargpt.config.architecture import describe_model
from chargpt.config.flags import param
from chargpt.data.fim import FimMarkers
from chargpt.data.labels import LabelSet, rendered, token_strings
from chargpt.data.pairs import END, SEP
from chargpt.errors import ChargptError, ConfigError, Interrupted
from chargpt.platforms import STOP_SIGNALS, lock_folder, pid_alive, replace
from chargpt.runs.checkpoint import load_model, read_meta, run_settings
from chargpt.runs.rundir import remove_stale_temps, resolve
from chargpt.training.interrupt import handling

# nn.Linear keeps (out, in); GPT-2's Conv1D keeps (in, out): these four are transposed on the way out
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
PROBE_SEED = 0  # the ids the export-time check feeds both models
# export-time check: largest |logit difference| allowed, relative to the largest |logit| (at least 1). Both compute
# in float32 and differ at most in the order of additions: with torch 2.13 on a CPU the logits came out bitwise equal,
# from 2 layers x 16 to 6 x 384; the margin is for other kernels and devices.
LOGITS_TOLERANCE = 1e-4
FILES = ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
         "README.md")  # what an export folder holds
# what an export turns into Stopped while it writes: SIGTERM, and Ctrl-Break on Windows (Ctrl-C raises
# KeyboardInterrupt already)
TERM_SIGNALS = tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)


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
# what to do with a run whose output layer is adaptive, for every export that cannot carry it
ADAPTIVE_FIX = ("train it again with --softmax full (--softmax auto, the CPU default, takes the adaptive layer for a "
                "large alphabet on a short budget), or export it as a web page (--format web), which computes it")


def check_exportable(cfg):
    """Refuse, naming the option, a model that GPT2LMHeadModel cannot compute exactly."""
    if cfg.arch != "decoder":
        raise ConfigError(f"{param('arch', cfg.arch)} cannot be exported as GPT-2, which is decoder-only (no "
                          f"encoder, no cross-attention); only {param('arch', 'decoder')} runs export")
    if cfg.norm != "pre":
        raise ConfigError(f"{param('norm', cfg.norm)} cannot be exported as GPT-2, which puts each LayerNorm before "
                          f"its block (pre-LN) and has a final one; only {param('norm', 'pre')} runs export")
    if cfg.softmax != "full":
        raise ConfigError(f"{param('softmax', cfg.softmax)} cannot be exported as GPT-2, whose output layer scores "
                          f"every character in full (no clusters); only {param('softmax', 'full')} runs export: "
                          f"{ADAPTIVE_FIX}")
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


def character_tokenizer(vocab, tokenizers, labels=None):
    """A tokenizers.Tokenizer giving every character chargpt's id: a WordLevel model over the run's characters, a
    pre-tokenizer that makes every code point (newlines and spaces included) its own word, no normalizer (text is
    taken as is), and a Fuse decoder, so decoding joins characters without inserting spaces. A character the run
    never saw becomes chargpt's --unknown replace stand-in (vocab.replacement()), a real vocabulary entry. A run
    trained with --labels: each label's id is the special added token "⟨name⟩" (chargpt.data.labels)."""
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    strings = token_strings(vocab, labels)
    tok = tokenizers.Tokenizer(models.WordLevel({c: i for i, c in enumerate(strings)},
                                                unk_token=vocab.replacement()))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # "." would miss \n
    tok.decoder = decoders.Fuse()
    if labels is not None:  # found whole before the split into characters; their ids are the vocabulary's
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in strings if len(t) > 1])
    return tok


def tokenizer_config(cfg):
    """tokenizer_config.json. No special tokens: the unknown stand-in is an ordinary character of the text, and
    declaring it unk_token would make decode(skip_special_tokens=True), which pipelines use, delete it wherever it
    occurs. clean_up_tokenization_spaces is off: on, it deletes spaces before punctuation (its default has flipped
    between versions). PreTrainedTokenizerFast, the class name transformers 4 and 5 both know."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
            "model_max_length": cfg.block_size}


def default_new_tokens(cfg):
    """Characters a generation writes when the caller names no length: half the context, so that a prompt of up to
    the other half fits (GPT-2 in transformers cannot slide its window past block_size positions as chargpt does)."""
    return max(1, cfg.block_size // 2)


def generation_settings(cfg, task, end_id=None):
    """GenerationConfig keyword arguments: chargpt's sampling defaults (config.SampleSettings) for a text run;
    greedy translation up to the end marker (as chargpt translate) for a pairs run. The length is max_new_tokens
    (default_new_tokens), never max_length: transformers 5 warns that both are set whenever a caller passes
    max_new_tokens (as pipeline users do) to a model whose generation config holds a max_length, and lets
    max_new_tokens win anyway."""
    if task == "pairs":
        return dict(do_sample=False, eos_token_id=end_id, max_new_tokens=default_new_tokens(cfg))
    s = SampleSettings()
    return dict(do_sample=s.temperature > 0, temperature=s.temperature, top_k=s.top_k or 0,  # 0: off (its default
                top_p=s.top_p or 1.0, max_new_tokens=default_new_tokens(cfg))  # is 50)


# --- the model card ---------------------------------------------------------------------------------------------
def model_card(meta, model, name, transformers_version):
    """README.md: what the model is, how well it did, and how to load it."""
    cfg, vocab = model.config, meta["vocab"]
    corpus, chars = meta.get("corpus"), meta.get("corpus_chars")  # untrusted: checked before use
    corpus = corpus[:200] if isinstance(corpus, str) and corpus else "an unnamed corpus"
    size = f"{chars:,} characters" if isinstance(chars, int) and not isinstance(chars, bool) else "size not recorded"
    tcfg = run_settings(meta)
    held = tcfg.val_fraction if tcfg else None
    if isinstance(held, float) and 0 < held < 1:  # as the run split it: pairs at random, text by --val-split
        if meta.get("task") == "pairs":
            size += f", {held:.0%} of the pairs held out for validation, at random"
        elif tcfg.val_split == "tail":
            size += f", the last {held:.0%} held out for validation"
        else:
            size += f", {held:.0%} held out for validation in blocks spread through it"
    loss = meta.get("val_loss")
    loss = f"{loss:.4f} nats per character ({loss / math.log(2):.4f} bits per character)" \
        if isinstance(loss, (int, float)) else "not measured"
    notes = [f"characters outside the {len(vocab)} it knows become {vocab.replacement()!r} (chargpt's "
             f"`--unknown replace`)",
             f"transformers' GPT-2 reads at most {cfg.block_size} positions (prompt + generated; pass "
             f"`max_new_tokens` to choose the length, {default_new_tokens(cfg)} by default); chargpt itself slides its "
             f"window to write longer texts"]
    if cfg.pos_emb == "sinusoidal":
        notes.append("its sinusoidal positions are stored as the fixed `wpe` table (fine-tuning would train them)")
    if cfg.emb_scale:
        notes.append(f"its embedding scale sqrt({cfg.n_embd}) is folded into `wte`")
    if (fim := FimMarkers.from_meta(meta)) is not None:  # --fim: its markers are characters of the vocabulary
        pre, suf, mid, end = (f"U+{ord(c):04X}" for c in fim.chars())
        notes.append(f"it fills in the middle (trained with --fim): the prompt {pre} {suf} SUFFIX {mid} PREFIX "
                     f"(each marker one character) writes what goes between PREFIX and SUFFIX, ended by {end} "
                     f"(pass its id as eos_token_id)")
    if meta["task"] == "pairs":
        usage = (f'ids = tok("Good morning." + "\\u{ord(SEP):04x}", return_tensors="pt").input_ids  # source, then '
                 f"the separator\nout = model.generate(ids)  # greedy, stops at the end marker "
                 f"U+{ord(END):04X}\nprint(tok.decode(out[0, ids.shape[1]:-1]))")
        what = f"translates: the prompt is a source sentence followed by U+{ord(SEP):04X}"
    else:
        prompt = next(p for p in ("ROMEO:", "The", "\n", vocab.chars[0]) if all(c in vocab.stoi for c in p))
        usage = (f"ids = tok({prompt!r}, return_tensors=\"pt\").input_ids\n"
                 f"out = model.generate(ids)  # samples at temperature 0.8, as chargpt does, "
                 f"{default_new_tokens(cfg)} new characters\nprint(tok.decode(out[0]))")
        what = "writes text in the style of its corpus"
        if (labels := LabelSet.from_meta(meta)) is not None:  # --labels: the label token first, then the prompt
            first = next(iter(labels.names))
            usage = usage.replace(f"tok({prompt!r}", f"tok({rendered(first) + prompt!r}")
            what = (f"writes in the style of the label it reads first: {', '.join(map(rendered, labels.names))} "
                    f"(⟨⟩: none)")
            notes.append("each label is one special token of the tokenizer, given before the prompt; chargpt's "
                         "--guidance (classifier-free guidance) has no transformers equivalent")
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
    a folder of other files). A link to a folder is written through; a path inside a file is refused as such."""
    try:
        _check_target(target, checkpoint, force)
    except OSError as e:  # a folder on the way that cannot be read
        raise ChargptError(f"--to {target}: {e.strerror or e}; choose another --to") from None


def _check_target(target, checkpoint, force):
    if target.is_symlink() and not target.exists():
        raise ChargptError(f"--to {target} is a symbolic link to {os.readlink(target)}, which does not exist; create "
                           f"that folder, or choose another --to")
    if not target.exists():
        above = next(p for p in target.parents if p.exists())  # a relative --to ends in ".", which exists
        if not above.is_dir():
            raise ChargptError(f"--to {target}: {above} is a file, not a folder; choose a --to that is not inside a "
                               f"file")
        return
    if not target.is_dir():
        raise ChargptError(f"--to {target} is a file, not a folder; choose a folder name")
    if any(target.iterdir()) and not force:
        raise ChargptError(f"--to {target} exists and is not empty; choose a new folder, or pass --force to "
                           f"replace it")
    if Path(checkpoint).resolve().is_relative_to(target.resolve()):
        raise ChargptError(f"--to {target} holds the checkpoint being exported; choose another folder")
    marks = ("config.json", "model.safetensors", "tokenizer.json")  # what every export writes; a config.json alone
    lacks = [m for m in marks if not (target / m).is_file()]  # is not one
    if any(target.iterdir()) and lacks:
        raise ChargptError(f"--to {target} is not an earlier export (it lacks {', '.join(lacks)}), and --force "
                           f"replaces only an export's files; choose a new folder")
    folders = [name for name in FILES if (target / name).is_dir()]
    if folders:
        raise ChargptError(f"--to {target} has a folder {folders[0]}, where the export writes a file; choose "
                           f"another --to")


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


def hf_model(model, vocab, meta):
    """chargpt's decoder `model` as the GPT2LMHeadModel an export writes, in memory (what chargpt report measures)."""
    transformers, _ = require_libraries()
    check_exportable(model.config)
    task = meta["task"]
    end_id = vocab.stoi.get(END) if task == "pairs" else None
    hf_config = transformers.GPT2Config(**gpt2_config(model, task, end_id))
    with torch.device("meta"):  # only the names and shapes: nothing is allocated or initialised
        want = {k: tuple(v.shape) for k, v in transformers.GPT2LMHeadModel(hf_config).state_dict().items()}
    hf = transformers.GPT2LMHeadModel(hf_config)
    hf.load_state_dict(gpt2_tensors(model, want), strict=True)
    hf.generation_config = transformers.GenerationConfig(**generation_settings(model.config, task, end_id))
    return hf.eval()


def write_hf(model, vocab, meta, folder, name):
    """Fill `folder` with the transformers files of chargpt's decoder `model`."""
    transformers, tokenizers = require_libraries()
    hf = hf_model(model, vocab, meta)
    hf.save_pretrained(folder)  # model.safetensors (the default since transformers 4.35), config.json
    try:
        character_tokenizer(vocab, tokenizers, LabelSet.from_meta(meta)).save(str(folder / "tokenizer.json"))
    except Exception as e:  # tokenizers reports a failed write as a bare Exception: "No space left on device (os
        raise OSError(str(e)) from None  # error 28)"
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(model.config), indent=2) + "\n")
    card = model_card(meta, model, name, transformers.__version__)
    (folder / "README.md").write_text(card, encoding="utf-8")


@torch.no_grad()
def verify(folder, model, vocab, labels=None):
    """Load `folder` as a user would and check it computes chargpt's logits and ids; raise if not."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    text = "".join(token_strings(vocab, labels))
    every = list(range(len(vocab)))
    if tok(text, verbose=False)["input_ids"] != every or tok.decode(every) != text:  # verbose: text > block_size
        raise ChargptError("the exported tokenizer does not give every character chargpt's id; nothing was written; "
                           "report it with your tokenizers version")
    g = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(len(vocab), (1, model.config.block_size), generator=g)  # (1, T): every position
    want = model(ids)[0].float().numpy()  # (1, T, V)
    return logits_agree(hf(ids).logits.float().numpy(), want, LOGITS_TOLERANCE, "the exported model's logits",
                        "your transformers version")


def logits_agree(got, want, tolerance, whose, versions):
    """An export's check: its logits `got` against chargpt's `want` (numpy arrays), the largest difference at most
    `tolerance` x the largest |logit| (at least 1) -> that difference; else the one-line error (nothing is written)
    naming `whose` logits and what to report (`versions`)."""
    import numpy as np
    diff, scale = float(np.abs(got - want).max()), max(1.0, float(np.abs(want).max()))
    if not diff <= tolerance * scale:
        raise ChargptError(f"{whose} differ from chargpt's by {diff:.2g} (allowed {tolerance * scale:.2g}); nothing "
                           f"was written; report it with {versions}")
    return diff


class Stopped(BaseException):
    """SIGTERM (or Ctrl-Break) during an export, raised by its handler: a BaseException, as Ctrl-C's
    KeyboardInterrupt is, so that nothing on the way catches it and the temporary folder is removed. `done`: it came
    while the files were being renamed into place, which finished first."""

    def __init__(self, signum, done=False):
        super().__init__(signum)
        self.signum, self.done = signum, done


def _raise_stopped(signum, frame):
    raise Stopped(signum)


def stopped_error(e: Stopped, target, what="export"):
    """A Stopped export -> the one-line Interrupted that says whether `target` was written or left as it was."""
    where = f"after the {what} was written to {target}" if e.done else \
        f"before the {what} was written; {target} was not changed"
    return Interrupted(f"{signal.Signals(e.signum).name}: stopped {where}", e.signum)


@contextlib.contextmanager
def locked(folder):
    """An exclusive lock on `folder` while the export writes into it, or the one-line error that another export
    holds it (platforms.lock_folder: none where the system or the filesystem has no such lock)."""
    with lock_folder(folder) as held:
        if not held:
            raise ChargptError(f"--to {folder} is being written by another export; wait for it to finish, or "
                               f"choose another --to")
        yield


def _plain_mode(full):
    """The permissions a plain mkdir (full 0o777) or open() (0o666) would give: `full` less the umask."""
    mask = os.umask(0)
    os.umask(mask)
    return full & ~mask


def _share(folder):
    """Give `folder` and its files the permissions of plain mkdir and open(): mkdtemp makes the folder private, and
    safetensors writes model.safetensors 0600, which would leave a shared export unreadable to others."""
    os.chmod(folder, _plain_mode(0o777))
    for p in folder.iterdir():
        if p.is_file() and not p.is_symlink():
            os.chmod(p, _plain_mode(0o666))


def _fsync(path):
    """Flush a file, or a folder's entries, to disk (a folder that cannot be opened or flushed is let be)."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sync_folder(folder):
    """Flush every file of `folder`, and the folder itself, to disk."""
    for p in folder.iterdir():
        with open(p, "rb+") as f:
            os.fsync(f.fileno())
    _fsync(folder)


def remove_stale_exports(target):
    """Delete the temporary folders (.NAME.export<pid>.XXXXXXXX) of exports to target whose process is gone: killed
    with -9, or a power loss. Those of running processes, this one included, are left alone."""
    named = re.compile(rf"\.{re.escape(target.name)}\.export(\d{{1,9}})\.[^.]+")
    for p in target.parent.iterdir():
        m = named.fullmatch(p.name)
        if m and int(m[1]) != os.getpid() and not pid_alive(int(m[1])) and p.is_dir() and not p.is_symlink():
            shutil.rmtree(p, ignore_errors=True)


def make_folders(folder, created):
    """mkdir -p `folder`, appending each folder it makes to `created`, outermost first."""
    for p in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        try:
            p.mkdir()
        except FileExistsError:  # made meanwhile by someone else: not ours to remove
            continue
        created.append(p)


def claim(tmp, target):
    """Rename the finished folder `tmp` to the new folder `target`. A rename onto a folder that is not empty fails:
    of two exports racing for one new --to, the second fails here and changes nothing."""
    try:
        os.rename(tmp, target)
    except OSError:
        if not os.path.lexists(target):
            raise
        raise ChargptError(f"--to {target} was created by another program while this export ran (another export to "
                           f"it?); nothing was changed there; choose another --to, or pass --force to replace it") \
            from None


def put_files(tmp, target, recheck, files=FILES):
    """Write the finished export's files (in `tmp`) over those of the existing folder `target`: each is copied to a
    temporary name in target (with our pid) and flushed, then all are renamed over the old ones in one go, during
    which signals wait. Every other file and folder of target stays as it is. A lock on target keeps two exports
    from mixing their files; `recheck()` checks target again under it."""
    parts = {name: target / f".{name}.tmp{os.getpid()}" for name in files}
    caught = []
    with locked(target):
        recheck()
        remove_stale_temps(target, tuple(f".{name}.tmp*" for name in files))  # of killed exports
        try:
            for name, part in parts.items():
                shutil.copyfile(tmp / name, part)
                _fsync(part)
            with handling(STOP_SIGNALS, lambda signum, frame: caught.append(signum)):
                for done, (name, part) in enumerate(parts.items()):
                    try:
                        replace(part, target / name)
                    except OSError as e:
                        if not done:
                            raise
                        raise ChargptError(f"could not write {target} ({e.strerror}) after {done} of the export's "
                                           f"{len(files)} files were replaced; export again, or choose another --to") \
                            from None
            _fsync(target)
        finally:
            for part in parts.values():
                with contextlib.suppress(OSError):
                    part.unlink(missing_ok=True)
    if caught:
        raise Stopped(caught[0], done=True)


def write_error(target, e):
    """The one line for an OSError (or safetensors' or tokenizers' error) while writing target."""
    reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
    full = getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or \
        any(s in reason for s in ("No space left", "os error 28", "Disk quota", "StorageFull"))
    fix = "free disk space or choose another --to" if full else "choose another --to"
    return f"could not write {target} ({reason}); nothing was changed there; {fix}"


def write_folder(target, fill, recheck=lambda: None, files=FILES):
    """`fill(folder)` writes a temporary folder beside target (.NAME.export<pid>.XXXXXXXX), which is flushed to disk
    and then becomes target: renamed to it if target is new, or its files put into target (put_files) if target
    is a folder already; -> what fill returned. On any failure, Ctrl-C and SIGTERM included, the temporary folder
    and the folders made for it are removed and target is as it was; a failed write (disk full, no permission) is a
    one-line error. Leftovers of killed exports to target are removed first."""
    existed = os.path.lexists(target)
    tmp, created, done = None, [], False
    try:
        make_folders(target.parent, created)
        remove_stale_exports(target)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.export{os.getpid()}.", dir=target.parent))
        result = fill(tmp)
        _share(tmp)  # an export is meant to be shared: readable as the user's other files are
        _sync_folder(tmp)
        if existed:
            put_files(tmp, target, recheck, files)
        else:
            claim(tmp, target)
        done = True
        return result
    except (OSError, SafetensorError) as e:
        raise ChargptError(write_error(target, e)) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        for folder in reversed(created if not done else []):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only an empty one


def export(checkpoint, to=None, format="hf", force=False, log=print):
    """Checkpoint file or run directory -> the folder `to`, as `format` (hf: transformers); -> its Path."""
    settings = ExportSettings(to=to, format=format, force=force)  # checked as it is made
    if settings.format != "hf":  # the other formats' modules build on this one
        where = {"web": "webpage.export_web", "gguf": "gguf.export_gguf", "onnx": "onnx.export_onnx"}[settings.format]
        raise ConfigError(f"export() writes {param('format', 'hf')}; {param('format', settings.format)} is "
                          f"chargpt.tools.{where} (chargpt export dispatches to it)")
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
        return verify(folder, model, vocab, LabelSet.from_meta(meta))

    with quiet(transformers), handling(TERM_SIGNALS, _raise_stopped):
        try:
            diff = write_folder(target, fill, lambda: check_target(target, path, settings.force))
        except Stopped as e:
            raise stopped_error(e, target) from None
    log(f"exported {path} ({describe_model(model.config)}, {len(vocab)} characters) to {target}; transformers "
        f"reproduces its logits (largest difference {diff:.1g})")
    return target
