"""Export a run for llama.cpp and Ollama: `chargpt export --format gguf --to FILE.gguf [--precision f16|q8_0]`.

    export_gguf("checkpoints/tinyshakespeare", "shakespeare.gguf")   # -> Path("shakespeare.gguf")
    # and shakespeare.Modelfile beside it: ollama create shakespeare -f shakespeare.Modelfile

The file is written with the `gguf` package (the format's own library) as llama.cpp's `gpt2` architecture, which is
chargpt's decoder: learned positions, pre-LN blocks with biases, fused q/k/v, a 4x GELU feed-forward, a final
LayerNorm and an output matrix. nn.Linear keeps (out, in), which is ggml's {in, out}: no weight is transposed. A
--no-bias run gets zero biases (llama.cpp requires them), sinusoidal positions become the position table, and an
--emb-scale run gets sqrt(C) folded into the token embedding.

The vocabulary (ggufread.tokenize does what llama.cpp does with it) is llama.cpp's byte-level BPE (tokenizer model
`gpt2`): each character is one token whose text is its UTF-8 bytes in GPT-2's byte alphabet, and the merges join
the bytes of one character and nothing else (a merge's left side always starts with a UTF-8 lead byte and its right
side is a continuation byte, so no merge can reach across two characters). So llama.cpp cuts any text into chargpt's
ids, one per character, and adds no space. A character the model never saw is no token and llama.cpp leaves it out,
as chargpt's --unknown skip does. Two tokens follow the characters, so they never collide with one: <|endoftext|>
(the end of text, which llama.cpp stops at) and <unk>. Both read as chargpt's stand-in for unknown characters, and
their output rows are the mean of the characters' rows: their logit is the mean of the characters' logits, below
the best character's, so greedy decoding never writes them.

What llama.cpp's `gpt2` cannot compute is refused by name: the encoder-decoder, post-LN, the adaptive softmax, ReLU
(its graph always applies GELU), a run trained on sentence pairs or with --labels. Forms and the other constraints
are sampling, not the model: they stay with sample.py. llama.cpp computes GELU with the tanh approximation (chargpt
uses the exact erf one), which the check below measures. Before the file appears it is read back with gguf's reader
and run through llama.cpp's arithmetic in numpy (ggufread.forward), against chargpt's logits on a full window.
It is written under a temporary name beside --to and renamed into place, as the web export does.
"""

import math
import os
from pathlib import Path

import numpy as np
import torch

from chargpt import __version__
from chargpt.config import ExportSettings, SampleSettings
from chargpt.config.architecture import describe_model
from chargpt.config.flags import param
from chargpt.data.labels import META_KEY as LABELS_KEY
from chargpt.errors import ChargptError, ConfigError
from chargpt.runs.checkpoint import load_model, read_meta
from chargpt.runs.rundir import BEST, LATEST, resolve
from chargpt.tools.export import (
    ADAPTIVE_FIX,
    TERM_SIGNALS,
    Stopped,
    _raise_stopped,
    logits_agree,
    stopped_error,
)
from chargpt.tools.ggufread import byte_level, forward, read_gguf, tokenize
from chargpt.tools.webpage import write_files
from chargpt.training.interrupt import handling

EOS, UNK = "<|endoftext|>", "<unk>"  # appended after the characters' ids
NEVER = "Ã A"  # a merge no valid UTF-8 text reaches (a lead byte before an ASCII letter): llama.cpp needs one merge
MODELFILE_HEAD = "# Ollama Modelfile written by chargpt export"
PROBE_SEED = 0
# Largest |logit difference| between llama.cpp's arithmetic (numpy, from the file) and chargpt's, relative to the
# largest |logit| (at least 1), for each precision. f32 differs by the GELU alone (tanh approximation from a float16
# table against the exact one): under 2e-3 from 2 x 32 to 6 x 384 on random and trained weights; f16 and q8_0 add
# their rounding. The margins catch a misplaced tensor, which moves logits by whole units.
LOGITS_TOLERANCE = {"f32": 0.02, "f16": 0.05, "q8_0": 0.1}
Q8_BLOCK = 32  # q8_0 quantises rows in blocks of 32: a tensor whose rows are not a multiple stays f16


def require_gguf():
    try:
        import gguf
    except ImportError:
        raise ChargptError('exporting to GGUF needs the gguf package, which is not installed; pip install -e '
                           '".[gguf]" (or pip install gguf)') from None
    return gguf


def check_exportable(cfg, task, labelled):
    """Refuse, naming the option, what llama.cpp's gpt2 graph does not compute."""
    why = None
    if cfg.arch != "decoder":
        why = f"{param('arch', cfg.arch)}: llama.cpp's gpt2 is decoder-only (no encoder, no cross-attention)"
    elif cfg.norm != "pre":
        why = f"{param('norm', cfg.norm)}: llama.cpp's gpt2 puts each LayerNorm before its block (pre-LN)"
    elif cfg.softmax != "full":
        why = (f"{param('softmax', cfg.softmax)}: llama.cpp's gpt2 scores every character with one output matrix; "
               + ADAPTIVE_FIX)
    elif cfg.activation != "gelu":
        why = f"{param('activation', cfg.activation)}: llama.cpp's gpt2 always applies GELU"
    elif task != "text":
        why = f"a run trained on sentence pairs ({param('task', task)}) translates; export it with " \
              f"{param('format', 'hf')}"
    elif labelled:
        why = "a run trained with --labels: GGUF has no place for its labels or their guidance; export it with " \
              f"{param('format', 'hf')} or {param('format', 'web')}"
    if why:
        raise ConfigError(f"cannot export as GGUF: {why}")


def vocabulary(vocab):
    """-> (tokens, token types, merges, eos id, unk id): llama.cpp's byte-level BPE giving each character
    chargpt's id, and the two appended tokens."""
    tokens = [byte_level(c) for c in vocab.chars] + [EOS, UNK]
    types = [1] * len(vocab) + [3, 2]  # gguf.TokenType: NORMAL, CONTROL, UNKNOWN
    merges = []
    for token in tokens[:len(vocab)]:
        for i in range(1, len(token)):  # the bytes of one character joined left to right
            merge = f"{token[:i]} {token[i]}"
            if merge not in merges:
                merges.append(merge)
    return tokens, types, merges or [NEVER], len(vocab), len(vocab) + 1


def gguf_tensors(model, vocab):
    """{llama.cpp gpt2 tensor name: float32 array (out, in)} for chargpt's decoder `model`."""
    cfg, sd = model.config, {k: v.detach().float() for k, v in model.state_dict().items()}
    C = cfg.n_embd
    zeros = torch.zeros
    wte = sd["wte.weight"] * math.sqrt(C) if cfg.emb_scale else sd["wte.weight"]  # (V, C)
    standin = wte[vocab.stoi[vocab.replacement()]]
    head = sd["lm_head.weight"]  # (V, C); stored apart even when tied: the appended rows differ
    out = {"token_embd.weight": torch.cat([wte, standin.expand(2, C)]),
           "position_embd.weight": sd["wpe.weight"] if cfg.pos_emb == "learned" else model.pe,
           "output_norm.weight": sd["ln_f.weight"], "output_norm.bias": sd.get("ln_f.bias", zeros(C)),
           "output.weight": torch.cat([head, head.mean(0).expand(2, C)])}
    names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(cfg.n_layer):
        for ours, theirs in names.items():
            weight = sd[f"h.{i}.{ours}.weight"]
            out[f"blk.{i}.{theirs}.weight"] = weight
            out[f"blk.{i}.{theirs}.bias"] = sd.get(f"h.{i}.{ours}.bias", zeros(weight.shape[0]))
    return {k: v.contiguous().numpy().astype(np.float32) for k, v in out.items()}


def stored(gguf, array, precision):
    """-> (the array as written, its ggml type or None for the numpy dtype's): vectors stay f32, as llama.cpp's
    converter keeps them; matrices take the precision."""
    if array.ndim == 1 or precision == "f32":
        return array, None
    if precision == "q8_0" and array.shape[-1] % Q8_BLOCK == 0:
        q = gguf.GGMLQuantizationType.Q8_0
        return gguf.quants.quantize(array, q), q
    return array.astype(np.float16), None


def written(gguf, array, precision):
    """What llama.cpp will read back for `array` written at `precision` (float32)."""
    data, qtype = stored(gguf, array, precision)
    return gguf.quants.dequantize(data, qtype).reshape(array.shape) if qtype else data.astype(np.float32)


def write_gguf(path, model, vocab, meta, name, precision):
    gguf = require_gguf()
    cfg = model.config
    tokens, types, merges, eos, unk = vocabulary(vocab)
    w = gguf.GGUFWriter(path, "gpt2")
    w.add_name(name[:200])
    corpus = meta.get("corpus")
    w.add_description(f"A character-level GPT trained with chargpt {__version__}"
                      + (f" on {corpus[:200]}" if isinstance(corpus, str) and corpus else ""))
    w.add_context_length(cfg.block_size)
    w.add_embedding_length(cfg.n_embd)
    w.add_feed_forward_length(4 * cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_head_count(cfg.n_head)
    w.add_layer_norm_eps(model.h[0].ln_1.eps)
    w.add_file_type({"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
                     "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[precision])
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(eos)
    w.add_unk_token_id(unk)
    w.add_add_bos_token(False)
    w.add_add_eos_token(False)
    w.add_string("chargpt.version", __version__)  # what --force knows an earlier export by
    w.add_uint32("chargpt.characters", len(vocab))
    for tensor, array in gguf_tensors(model, vocab).items():
        data, qtype = stored(gguf, array, precision)
        w.add_tensor(tensor, data, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@torch.no_grad()
def check_gguf(path, model, vocab, precision):
    """Read `path` back: its tensors must be what was meant, every character must tokenize to its id, and llama.cpp's
    arithmetic on its tensors must give chargpt's logits on a full window; -> the largest logit difference."""
    gguf = require_gguf()
    meta, tensors = read_gguf(path)
    want = gguf_tensors(model, vocab)
    wrong = sorted(set(want) ^ set(tensors)) or \
        [k for k in want if not np.array_equal(tensors[k], written(gguf, want[k], precision))]
    text = "".join(vocab.chars)
    if wrong or tokenize(meta, text) != list(range(len(vocab))):
        raise ChargptError(f"the GGUF file read back differs from what was written ({(wrong or ['tokens'])[0]}); "
                           f"nothing was written; report it with your gguf version")
    g = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(len(vocab), (1, model.config.block_size), generator=g)
    got = forward(meta, tensors, ids[0].numpy())[:, :len(vocab)]
    return logits_agree(got, model(ids)[0][0].numpy(), LOGITS_TOLERANCE[precision],
                        "the logits of llama.cpp's arithmetic on the GGUF file", "your gguf version")


def modelfile(target, cfg, vocab):
    """The Ollama Modelfile beside the .gguf: the raw prompt (no chat template), the window as the context, half of
    it written by default (llama.cpp cannot slide learned positions), and chargpt's sampling: temperature 0.8, every
    character (top_k the whole vocabulary, top_p 1), no repeat penalty (Ollama's default is 1.1)."""
    s = SampleSettings()
    return (f"{MODELFILE_HEAD} for {target.name}: ollama create {target.stem} -f {target.stem}.Modelfile\n"
            f"FROM ./{target.name}\n"
            f'TEMPLATE """{{{{ .Prompt }}}}"""\n'
            f"PARAMETER num_ctx {cfg.block_size}\n"
            f"PARAMETER num_predict {max(1, cfg.block_size // 2)}\n"
            f"PARAMETER temperature {s.temperature}\n"
            f"PARAMETER top_k {len(vocab) + 2}\n"
            f"PARAMETER top_p 1.0\n"
            f"PARAMETER min_p 0.0\n"
            f"PARAMETER repeat_penalty 1.0\n"
            f'PARAMETER stop "{EOS}"\n')


def is_ours(path, kind):
    """Whether `path` is a file an earlier GGUF export wrote (kind "gguf": it carries chargpt.version; "modelfile":
    it starts with MODELFILE_HEAD)."""
    try:
        with open(path, "rb") as f:
            head = f.read(len(MODELFILE_HEAD.encode()))
        if kind == "modelfile":
            return head == MODELFILE_HEAD.encode()
        if head[:4] != b"GGUF":
            return False
        from gguf import GGUFReader
        return "chargpt.version" in GGUFReader(path).fields
    except (OSError, ValueError, ImportError):
        return False


def check_target(target, companion, checkpoint, force):
    """--to must be a .gguf file that does not exist (nor its Modelfile), or with --force ones an earlier GGUF export
    wrote."""
    try:
        if target.is_dir():
            raise ChargptError(f"--to {target} is a folder; name the file to write, e.g. {target / 'model.gguf'}")
        if target.suffix.lower() != ".gguf":
            raise ChargptError(f"--to {target}: a GGUF export is one .gguf file; give a name ending in .gguf")
        above = next(p for p in target.parents if p.exists())
        if not above.is_dir():
            raise ChargptError(f"--to {target}: {above} is a file, not a folder; choose a --to that is not inside a "
                               f"file")
        present = [p for p in (target, companion) if os.path.lexists(p)]
    except OSError as e:
        raise ChargptError(f"--to {target}: {e.strerror or e}; choose another --to") from None
    if present and not force:
        raise ChargptError(f"--to {present[0]} exists; pass --force to replace it, or choose another --to")
    for p, kind in ((target, "gguf"), (companion, "modelfile")):
        if p in present and (Path(checkpoint).resolve() == p.resolve() or not is_ours(p, kind)):
            raise ChargptError(f"{p} is not a file an earlier GGUF export wrote, and --force replaces only those; "
                               f"choose another --to")


def export_gguf(checkpoint, to, force=False, precision="f32", log=print):
    """Checkpoint file or run directory -> the GGUF file `to` and its Modelfile beside it; -> the file's Path."""
    settings = ExportSettings(to=to, format="gguf", force=force, precision=precision)  # checked as it is made
    target = Path(settings.to).expanduser()
    if target.is_symlink() and target.exists():
        target = Path(os.path.realpath(target))  # written through: the link stays
    companion = target.with_suffix(".Modelfile")
    path = resolve(checkpoint)
    check_target(target, companion, path, settings.force)
    header, _ = read_meta(path)  # the header alone: what cannot be exported is refused before anything heavy
    check_exportable(header["model_config"], header.get("task", "text"), header.get(LABELS_KEY) is not None)
    require_gguf()
    model, vocab, meta = load_model(path, "cpu")
    model.float().eval()
    name = path.resolve().parent.name if path.name in (BEST, LATEST) else path.stem  # the run's, or the file's
    with handling(TERM_SIGNALS, _raise_stopped):
        try:
            text = modelfile(target, model.config, vocab)
            diff = write_files([(target, lambda tmp: write_gguf(tmp, model, vocab, meta, name, settings.precision)),
                                (companion, lambda tmp: tmp.write_text(text, encoding="utf-8"))],
                               lambda tmp: check_gguf(tmp, model, vocab, settings.precision), settings.force)
        except Stopped as e:
            raise stopped_error(e, target, "GGUF file") from None
    size = target.stat().st_size
    log(f"exported {path} ({describe_model(model.config)}, {len(vocab)} characters, {settings.precision}) to "
        f"{target}, {size / 1e6:,.1f} MB, and {companion.name} for Ollama; llama.cpp's arithmetic on the file gives "
        f"chargpt's logits within {diff:.1g}")
    return target
