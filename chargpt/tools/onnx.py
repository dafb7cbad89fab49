"""Export a run for ONNX Runtime: `chargpt export --format onnx --checkpoint RUN --to DIR`.

    export_onnx("checkpoints/tinyshakespeare", "shakespeare-onnx")     # -> Path("shakespeare-onnx")

The folder holds model.onnx (the decoder with its key/value cache as inputs and outputs), vocab.json (the characters
in id order: any language reads it), config.json (the sizes and the names of the inputs and outputs) and a README.md
with a generate loop. The inputs and outputs are named and shaped as Optimum's GPT-2 decoder with past
(`decoder_model_merged.onnx`): input_ids (B, T), attention_mask (B, P + T) with 1 on real characters,
position_ids (B, T), past_key_values.N.key and .value (B, n_head, P, head_size) for each layer N, the past P
positions; out come logits (B, T, V) and present.N.key / .value (B, n_head, P + T, head_size). A first call passes
a past of length 0. The network is chargpt's own modules (CachedDecoder), traced with torch.onnx's TorchScript
exporter (opset 17: GELU is exported exactly, through Erf).

Before the folder appears, onnxruntime loads it and must give chargpt's logits on a full window, and a cached step
must give what the full window gives; the folder is written as export.py writes a transformers folder (a temporary
folder renamed into place; with --force, only the export's files replaced in an earlier ONNX export).
onnx and onnxruntime are an optional extra (pip install -e ".[onnx]"), imported only here.
"""

import functools
import json
import math
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

from chargpt import __version__
from chargpt.config import ExportSettings, SampleSettings
from chargpt.config.architecture import describe_model
from chargpt.config.flags import param
from chargpt.data.labels import META_KEY as LABELS_KEY
from chargpt.errors import ChargptError, ConfigError
from chargpt.runs.checkpoint import load_model, read_meta
from chargpt.runs.rundir import resolve
from chargpt.tools.export import (
    ADAPTIVE_FIX,
    TERM_SIGNALS,
    Stopped,
    _raise_stopped,
    logits_agree,
    stopped_error,
    write_folder,
)
from chargpt.training.interrupt import handling

FILES = ("model.onnx", "vocab.json", "config.json", "README.md")
OPSET = 17
PROBE_SEED = 0
LOGITS_TOLERANCE = 1e-4  # relative to the largest |logit| (at least 1): both compute in float32


def require_libraries():
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise ChargptError('exporting to ONNX needs onnx and onnxruntime, which are not installed; pip install -e '
                           '".[onnx]" (or pip install onnx onnxruntime)') from None
    return onnx, onnxruntime


def check_exportable(cfg, task, labelled):
    """Refuse, naming the option, what the cached decoder does not compute."""
    why = None
    if cfg.arch != "decoder":
        why = f"{param('arch', cfg.arch)}: the ONNX export is the decoder-only model with its cache"
    elif cfg.softmax != "full":
        why = f"{param('softmax', cfg.softmax)}: the ONNX export's logits come from one output matrix; " + ADAPTIVE_FIX
    elif task != "text":
        why = f"a run trained on sentence pairs ({param('task', task)}) translates; export it with " \
              f"{param('format', 'hf')}"
    elif labelled:
        why = f"a run trained with --labels: export it with {param('format', 'hf')} or {param('format', 'web')}"
    if why:
        raise ConfigError(f"cannot export as ONNX: {why}")


class CachedDecoder(nn.Module):
    """chargpt's decoder over explicit past keys and values, Optimum's GPT-2 layout: (input_ids (B, T),
    attention_mask (B, P + T), position_ids (B, T), then each layer's past key and value (B, nh, P, hs)) ->
    (logits (B, T, V), then each layer's present key and value (B, nh, P + T, hs))."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, position_ids, *past):
        m, cfg = self.model, self.model.config
        x = m.wte(input_ids)  # (B, T, C)
        if cfg.emb_scale:
            x = x * math.sqrt(cfg.n_embd)
        x = x + (m.wpe(position_ids) if cfg.pos_emb == "learned" else m.pe[position_ids])
        T, P = input_ids.size(1), past[0].size(2)
        query_pos = torch.arange(T, device=x.device)[:, None] + P  # (T, 1)
        causal = torch.arange(P + T, device=x.device)[None, :] <= query_pos  # (T, P + T)
        visible = causal[None, None] & attention_mask.bool()[:, None, None, :]  # (B, 1, T, P + T)
        presents = []

        def attend(attn, h, past_k, past_v):  # h (B, T, C) -> (B, T, C); keeps this layer's keys and values
            q, k, v = attn.split_heads(attn.c_attn(h))  # (B, nh, T, hs)
            k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)  # (B, nh, P + T, hs)
            presents.extend([k, v])
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))  # (B, nh, T, P + T)
            att = att.masked_fill(~visible, torch.finfo(att.dtype).min).softmax(-1)  # min, not -inf: a padded row
            return attn.c_proj((att @ v).transpose(1, 2).reshape(h.shape))  # stays finite

        for i, block in enumerate(m.h):  # pre-LN or post-LN, as Block.residual says
            x = block.residual(x, block.ln_1, functools.partial(attend, block.attn, past_k=past[2 * i],
                                                                past_v=past[2 * i + 1]))
            x = block.residual(x, block.ln_2, block.mlp)
        return (m.lm_head(m.ln_f(x)), *presents)


def io_names(n_layer):
    """-> (input names, output names) in the order CachedDecoder takes and returns them."""
    kv = [f"{{}}.{i}.{w}" for i in range(n_layer) for w in ("key", "value")]
    return (["input_ids", "attention_mask", "position_ids", *(n.format("past_key_values") for n in kv)],
            ["logits", *(n.format("present") for n in kv)])


def export_graph(model, path):
    """Trace CachedDecoder to `path`, every length dynamic."""
    cfg = model.config
    inputs, outputs = io_names(cfg.n_layer)
    B, T, P = 1, 2, 3  # any sizes: all are dynamic
    past = [torch.zeros(B, cfg.n_head, P, cfg.head_size) for _ in range(2 * cfg.n_layer)]
    args = (torch.zeros(B, T, dtype=torch.long), torch.ones(B, P + T, dtype=torch.long),
            torch.arange(P, P + T)[None], *past)
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "total_sequence"},
            "position_ids": {0: "batch", 1: "sequence"}, "logits": {0: "batch", 1: "sequence"}}
    axes.update({n: {0: "batch", 2: "past_sequence"} for n in inputs[3:]})
    axes.update({n: {0: "batch", 2: "total_sequence"} for n in outputs[1:]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice, and tracer notes
        torch.onnx.export(CachedDecoder(model).eval(), args, str(path), input_names=inputs, output_names=outputs,
                          dynamic_axes=axes, opset_version=OPSET, dynamo=False)


class Session:
    """An onnxruntime session on an exported folder, with the cached generate loop an app would write."""

    def __init__(self, folder):
        import onnxruntime
        folder = Path(folder)
        self.config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        self.chars = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))["chars"]
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        self.session = onnxruntime.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])

    def empty(self, batch=1):
        c = self.config
        return [np.zeros((batch, c["n_head"], 0, c["head_size"]), np.float32) for _ in range(2 * c["n_layer"])]

    def step(self, ids, past):
        """ids (B, T) continuing `past` -> (logits (B, T, V), present)."""
        ids = np.asarray(ids, dtype=np.int64)
        P, T = past[0].shape[2], ids.shape[1]
        feed = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], P + T), np.int64),
                "position_ids": np.broadcast_to(np.arange(P, P + T, dtype=np.int64), ids.shape).copy()}
        inputs, _ = io_names(self.config["n_layer"])
        feed.update(zip(inputs[3:], past))
        out = self.session.run(None, feed)
        return out[0], out[1:]

    def greedy(self, prompt, n):
        """The n most likely characters after prompt, one at a time through the cache; when the window is full the
        cache is rebuilt from the last 3/4 of it, as sample.py does (learned positions cannot slide)."""
        block = self.config["block_size"]
        keep = max(1, 3 * block // 4)
        seq = [self.stoi[c] for c in prompt][-block:]
        logits, past = self.step([seq], self.empty())
        out = []
        for _ in range(n):
            nxt = int(np.argmax(logits[0, -1]))
            out.append(self.chars[nxt])
            seq = seq[-(block - 1):] + [nxt]
            if past[0].shape[2] < block:
                logits, past = self.step([[nxt]], past)
            else:
                logits, past = self.step([seq[-keep:]], self.empty())
        return "".join(out)


def readme(name, cfg, vocab):
    inputs, outputs = io_names(cfg.n_layer)
    return f"""# {name}

A character-level GPT exported by chargpt {__version__} for ONNX Runtime: {describe_model(cfg)}, {len(vocab)}
characters (one id each, in the order of `vocab.json`'s `chars`).

- inputs: {', '.join(inputs[:4])}, ... ({len(inputs)} in all)
- outputs: {', '.join(outputs[:3])}, ... ({len(outputs)} in all)
- past and present keys and values: (batch, {cfg.n_head} heads, positions, {cfg.head_size}); start with 0 positions
- positions 0 .. {cfg.block_size - 1} only: when the window is full, start again (empty past) from the last
  {max(1, 3 * cfg.block_size // 4)} characters, as chargpt does

```python
from chargpt.tools.onnx import Session       # or the same loop in any language: see chargpt's docs/export.md
print(Session("{name}").greedy("{vocab.chars[0]}", 200))
```
"""


def write_onnx(model, vocab, folder, name):
    export_graph(model, folder / "model.onnx")
    cfg = model.config
    inputs, outputs = io_names(cfg.n_layer)
    s = SampleSettings()
    (folder / "vocab.json").write_text(json.dumps({"chars": vocab.chars, "unknown": vocab.replacement()},
                                                  ensure_ascii=False) + "\n", encoding="utf-8")
    config = {"format": "chargpt-onnx", "chargpt": __version__, "vocab_size": cfg.vocab_size,
              "block_size": cfg.block_size, "n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
              "head_size": cfg.head_size, "inputs": inputs, "outputs": outputs, "opset": OPSET,
              "sampling": {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p}}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "README.md").write_text(readme(name, cfg, vocab), encoding="utf-8")


@torch.no_grad()
def verify(folder, model):
    """onnxruntime on the written folder against chargpt: a full window at once, then its last position again as
    one cached step; -> the largest logit difference (raises past LOGITS_TOLERANCE)."""
    cfg = model.config
    session = Session(folder)
    g = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(cfg.vocab_size, (2, cfg.block_size), generator=g)  # (B, T): every position
    want = model(ids)[0].numpy()  # (B, T, V)
    got, _ = session.step(ids[:, :-1].numpy(), session.empty(2))
    last, _ = session.step(ids[:, -1:].numpy(), session.step(ids[:, :-1].numpy(), session.empty(2))[1])
    return logits_agree(np.concatenate([got, last], axis=1), want, LOGITS_TOLERANCE, "onnxruntime's logits",
                        "your torch and onnxruntime versions")


def is_export(folder):
    """Whether `folder` holds an earlier ONNX export (its model.onnx, and a config.json saying so)."""
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        return (folder / "model.onnx").is_file() and isinstance(config, dict) and config.get("format") == "chargpt-onnx"
    except (OSError, ValueError):
        return False


def check_target(target, checkpoint, force):
    """--to must be a new or empty folder, or with --force an earlier ONNX export."""
    try:
        if not target.exists():
            above = next(p for p in target.parents if p.exists())
            if not above.is_dir():
                raise ChargptError(f"--to {target}: {above} is a file, not a folder; choose a --to that is not "
                                   f"inside a file")
            return
        if not target.is_dir():
            raise ChargptError(f"--to {target} is a file, not a folder; choose a folder name")
        full = any(target.iterdir())
    except OSError as e:
        raise ChargptError(f"--to {target}: {e.strerror or e}; choose another --to") from None
    if full and not force:
        raise ChargptError(f"--to {target} exists and is not empty; choose a new folder, or pass --force to replace "
                           f"an earlier ONNX export")
    if full and (not is_export(target) or Path(checkpoint).resolve().is_relative_to(target.resolve())):
        raise ChargptError(f"--to {target} is not an earlier ONNX export, and --force replaces only those; choose a "
                           f"new folder")


def export_onnx(checkpoint, to, force=False, log=print):
    """Checkpoint file or run directory -> the folder `to` for ONNX Runtime; -> its Path."""
    settings = ExportSettings(to=to, format="onnx", force=force)  # checked as it is made
    target = Path(settings.to).expanduser()
    path = resolve(checkpoint)
    check_target(target, path, settings.force)
    header, _ = read_meta(path)  # the header alone: what cannot be exported is refused before anything heavy
    check_exportable(header["model_config"], header.get("task", "text"), header.get(LABELS_KEY) is not None)
    require_libraries()
    model, vocab, meta = load_model(path, "cpu")
    model.float().eval()

    def fill(folder):
        write_onnx(model, vocab, folder, target.name)
        return verify(folder, model)

    with handling(TERM_SIGNALS, _raise_stopped):
        try:
            diff = write_folder(target, fill, lambda: check_target(target, path, settings.force), FILES)
        except Stopped as e:
            raise stopped_error(e, target) from None
    log(f"exported {path} ({describe_model(model.config)}, {len(vocab)} characters) to {target}; onnxruntime "
        f"reproduces its logits, cached and not (largest difference {diff:.1g})")
    return target
