"""Save and load self-contained runs, with no pickle anywhere.

A checkpoint is a safetensors file: weights (state.safetensors: also optimizer state and random states) plus
JSON metadata (config, vocabulary, step, losses). Where these files live, and how they are written safely,
is rundir.py's business. Metadata is validated on load; tensor names and shapes are checked against the
config before anything is read, so a crafted header cannot make the loader allocate more than the file holds.
The metadata also carries a sha256 of the tensor data, checked on load together with dtypes and
finiteness: safetensors validates only the header, so a flipped byte in the data would otherwise load silently.
"""

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from chargpt.config import FORMAT_VERSION, TASKS, ModelConfig, TrainConfig, model_config_from_dict, typed_fields
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, CheckpointError, ConfigError
from chargpt.model.transformer import build_model
from chargpt.runs.rundir import BEST, LATEST, STATE, resolve, write_atomic

FORMAT_NAME = "chargpt"
# What chargpt writes for weights and optimizer state. Anything else (bool, int, float64, complex) means a damaged
# or foreign file, which load_state_dict would otherwise cast silently into the float32 parameters.
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Buffers rebuilt from the config rather than stored (sinusoidal positions: block_size x n_embd) may hold at most
# this many elements, or 4x the elements the file stores: a crafted block_size cannot make a loader allocate more.
FREE_BUFFER_ELEMENTS = 1 << 24
# Tensors of state.safetensors besides the weights: optimizer state as '<optimizer>.<parameter index>.<key>' (AdamW's
# under 'optim.', as before Muon existed; Muon's under 'muon.') and random-generator states under 'rng.'.
OPTIMIZER_PREFIXES = ("optim.", "muon.")
STATE_PREFIXES = (*OPTIMIZER_PREFIXES, "rng.")
PARAM_SHAPED = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer")  # per-parameter optimizer state


def unwrap(model):
    """The plain model inside DDP and/or torch.compile wrappers (saved without '_orig_mod.' prefixes)."""
    model = getattr(model, "module", model)
    return getattr(model, "_orig_mod", model)


def _weights(model):
    """The state dict to store: a tied head is stored once (as the embedding)."""
    model = unwrap(model)
    sd = model.state_dict()
    if model.config.tie_weights:
        sd.pop("lm_head.weight")
    return sd


def model_tensors(model, prefix=""):
    """The weights as CPU tensors of their own, ready for safetensors (which refuses tensors sharing memory: in
    training every parameter is a view of one flat buffer, chargpt/training/flat.py)."""
    return {prefix + k: own_copy(v) for k, v in _weights(model).items()}


def own_copy(t):
    """A contiguous CPU copy of t that shares memory with nothing."""
    return torch.as_tensor(t).detach().to("cpu", copy=True).contiguous()


def write_safetensors(path, tensors, meta):
    """Atomically write tensors + {'format', 'format_version', 'chargpt': JSON} to path."""
    path = Path(path)
    header = {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION),
              "chargpt": json.dumps(meta, ensure_ascii=False)}
    try:
        write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=header))
    except Exception as e:  # OSError, or safetensors' own error wrapping one (disk full)
        kept = f"the previous {path.name} is intact" if path.exists() else "no earlier checkpoint existed"
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0][:200]
        raise CheckpointError(f"could not write {path} ({reason}); {kept}; free disk space or choose a "
                              f"writable --out-dir") from None


def tensor_checksum(tensors):
    """'sha256:<hex>' over every tensor in name order: its name, dtype and shape, then its bytes (little-endian,
    as safetensors stores them). Costs about 50 ms for the 41 MiB of a 10M-parameter model's weights (~0.8 GB/s on
    one CPU core), about 40% of that save's time; a load pays it once more to verify."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        h.update(f"{name}|{str(t.dtype)[6:]}|{list(t.shape)}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy())  # the raw bytes, without a copy
    return "sha256:" + h.hexdigest()


PATHS = ("data", "target_data", "cache_dir", "init_from")  # saved absolute, compared as files: a run's files are
# read again from any folder
# What a run saved before a setting existed trained with, where that is not the setting's default today: runs from
# before --val-split validated on the tail, runs from before Muon used AdamW. saved_train_config applies them.
BEFORE_THE_SETTING = {"val_split": "tail", "optimizer": "adamw"}


def saved_train_config(d):
    """A checkpoint's train config (untrusted JSON) -> TrainConfig, checked and migrated once, where it is read: a
    field it lacks is what the run trained with (BEFORE_THE_SETTING, else the default), so no reader restates an old
    run's defaults. Not validated as a new run's settings: an old run's values stay loadable."""
    return TrainConfig(**{**BEFORE_THE_SETTING, **typed_fields(TrainConfig, d, "train config")})


def absolute_paths(train_config):
    """A TrainConfig as a dict, its corpus and cache paths absolute (as a checkpoint stores them: `chargpt eval`
    finds the corpus from any folder; checkpoints written before keep their paths as typed)."""
    return {k: str(Path(v).resolve()) if k in PATHS and isinstance(v, str) else v for k, v in train_config.items()}


def checkpoint_meta(model, vocab, train_config: TrainConfig | None = None, **extra):
    """The JSON metadata: configs (the train config's paths absolute: `chargpt eval` finds the corpus from any
    folder), vocabulary, and the task the model was trained for: 'text', or 'pairs' with the two marker characters of
    its examples (`source SEP target END`), so every loader prompts it the same way. read_meta reads it back."""
    cfg = unwrap(model).config
    task = train_config.task if train_config is not None else "text"
    markers = {"pair_markers": {"sep": SEP, "end": END}} if task == "pairs" else {}
    saved = absolute_paths(asdict(train_config)) if train_config is not None else None
    return {"model_config": vars(cfg).copy(), "vocab": "".join(vocab.chars), "train_config": saved,
            "task": task, **markers, "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S"), **extra}


def save_model(path, model, vocab, train_config=None, weights=None, **extra):
    """A shareable checkpoint: weights + metadata. `weights` (from model_tensors) saves a second device copy."""
    weights = weights or model_tensors(model)
    meta = checkpoint_meta(model, vocab, train_config, checksum=tensor_checksum(weights), **extra)
    write_safetensors(path, weights, meta)


def optimizer_parts(optimizer):
    """{name in the state file: torch optimizer}: an optim.Optimizers, or one optimizer (stored as AdamW's 'optim')."""
    return getattr(optimizer, "parts", None) or {"optim": optimizer}


def save_state(path, model, optimizer, rng, vocab, train_config, weights=None, **extra):
    """Everything to resume exactly: weights, optimizer state (by optimizer and parameter index), RNG states."""
    weights = weights or model_tensors(model)
    tensors = {"model." + k: v for k, v in weights.items()}
    for name, part in optimizer_parts(optimizer).items():
        for idx, state in part.state_dict()["state"].items():
            for key, value in state.items():
                tensors[f"{name}.{idx}.{key}"] = own_copy(value)  # FlatAdamW's moments are slices of one
    for name, value in rng.items():
        tensors[f"rng.{name}"] = value.contiguous()
    meta = checkpoint_meta(model, vocab, train_config, checksum=tensor_checksum(tensors), **extra)
    write_safetensors(path, tensors, meta)


def read_meta(path):
    """Open a checkpoint's header only; validate it. -> (meta dict, {tensor name: shape}). Its model_config is a
    ModelConfig, its vocab a Vocab, its train_config a TrainConfig migrated from older runs (or None: a checkpoint
    saved without one)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"{path} is not a checkpoint file (not a regular file); pass a .safetensors file")
    try:
        with safe_open(str(path), framework="pt") as f:
            header = f.metadata() or {}
            shapes = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint (truncated or not one: "
                              f"{str(e).splitlines()[0][:120]}); re-train or re-copy it") from None
    if header.get("format") != FORMAT_NAME:
        raise CheckpointError(f"{path} is a safetensors file but not a chargpt checkpoint (no chargpt metadata)")
    try:
        version = int(header.get("format_version", ""))
    except ValueError:
        raise CheckpointError(f"{path} has a corrupted format version; re-train or re-copy it") from None
    if version > FORMAT_VERSION:
        raise CheckpointError(f"{path} was written by a newer chargpt (checkpoint format {version}; this one reads "
                              f"up to {FORMAT_VERSION}); update chargpt to load it")
    try:
        meta = json.loads(header.get("chargpt", ""))
        if not isinstance(meta, dict):
            raise ValueError("not an object")
        meta["model_config"] = model_config_from_dict(meta.get("model_config"))
        vocab = meta.get("vocab")
        if not isinstance(vocab, str):
            raise ValueError("vocabulary missing")
        meta["vocab"] = Vocab(vocab)
        if len(meta["vocab"]) != meta["model_config"].vocab_size:
            raise ValueError("vocabulary size disagrees with the model config")
        step = meta.get("step", 0)
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError("step is not a non-negative integer")
        if meta.get("train_config") is not None:
            meta["train_config"] = saved_train_config(meta["train_config"])
        if meta.get("run_state") is not None and not isinstance(meta["run_state"], dict):
            raise ValueError("run state is not an object")
        checksum = meta.get("checksum")  # absent in files from before checksums: those load unverified
        if checksum is not None and not (isinstance(checksum, str) and checksum.startswith("sha256:")):
            raise ValueError("checksum is not a sha256")
        _check_task(meta)
    except (ValueError, ConfigError, ChargptError) as e:
        raise CheckpointError(f"{path} has missing or corrupted metadata ({e}); re-train or re-copy it") from None
    return meta, shapes


def run_settings(meta, assumed=False):
    """A checkpoint's training settings (read_meta's metadata), as read_meta typed and migrated them: a TrainConfig,
    or None for a checkpoint saved without one (from Python, or an export's). assumed=True: such a checkpoint gets
    what the oldest runs trained with (config.BEFORE_THE_SETTING) instead of None, for readers that need a split."""
    settings = meta.get("train_config")
    return settings if settings is not None or not assumed else TrainConfig(**BEFORE_THE_SETTING)


def _check_task(meta):
    """meta['task']: 'text' (also for files from before tasks were recorded) or 'pairs', whose markers must be the
    ones this chargpt writes and be in the vocabulary."""
    meta.setdefault("task", "text")
    if meta["task"] not in TASKS:
        raise ValueError(f"unknown task {meta['task']!r:.40}")
    if meta["task"] == "text":
        if meta["model_config"].arch != "decoder":
            raise ValueError("an encoder-decoder needs the pairs task")
        return
    if meta.get("pair_markers") != {"sep": SEP, "end": END}:
        raise ValueError(f"pair markers are not U+{ord(SEP):04X} and U+{ord(END):04X} (another chargpt version?)")
    if SEP not in meta["vocab"].stoi or END not in meta["vocab"].stoi:
        raise ValueError("the pair markers are missing from the vocabulary")


def expected_shapes(cfg: ModelConfig, prefix=""):
    """Tensor names and shapes the config implies, computed on the meta device (allocates nothing)."""
    with torch.device("meta"):
        model = build_model(cfg)
    return {prefix + k: tuple(v.shape) for k, v in _weights(model).items()}


def _check_shapes(path, cfg, shapes, prefix):
    # First the sizes that cost memory or time to build, against the tensors actually in the file (whose
    # extent safetensors has checked against the file size): a crafted config such as block_size 10**9 or
    # n_layer 10**6 is rejected here, before even a meta-device model is built from it.
    # Sinusoidal positions are not stored, so their context is checked against the size of what is.
    wte, wpe = shapes.get(prefix + "wte.weight"), shapes.get(prefix + "wpe.weight")
    stored = sum(math.prod(s) for s in shapes.values())
    positions_ok = wpe == (cfg.block_size, cfg.n_embd) if cfg.pos_emb == "learned" else \
        wpe is None and cfg.block_size * cfg.n_embd <= max(FREE_BUFFER_ELEMENTS, 4 * stored)
    if wte != (cfg.vocab_size, cfg.n_embd) or not positions_ok or max(cfg.n_layer, cfg.n_enc_layer) > len(shapes):
        raise CheckpointError(f"{path}: its model config (vocab {cfg.vocab_size}, context {cfg.block_size}, "
                              f"{cfg.n_layer} layers x {cfg.n_embd}) does not match the tensors stored with it; "
                              f"the file is corrupted or was tampered with")
    want = expected_shapes(cfg, prefix)
    have = {k: v for k, v in shapes.items() if k.startswith(prefix)} if prefix else \
        {k: v for k, v in shapes.items() if not k.startswith(STATE_PREFIXES)}
    if want != have:
        wrong = sorted(set(want) ^ set(have)) or sorted(k for k in want if want[k] != have[k])
        raise CheckpointError(f"{path}: tensors do not match the model config stored with them ({wrong[:3]}); "
                              f"the file is corrupted")


def _read_tensors(path, meta, shapes):
    """Every tensor in the file, refused unless each has a dtype chargpt writes, the data matches the checksum
    saved with it, and every value is finite. Names and shapes have been checked before this reads anything."""
    with safe_open(str(path), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in shapes}
    fix = _recovery_hint(path)
    for name, t in tensors.items():
        if not name.startswith("rng.") and t.dtype not in FLOAT_DTYPES:  # random-generator states are bytes
            raise CheckpointError(f"{path}: tensor {name} is {str(t.dtype)[6:]}, not a type chargpt writes "
                                  f"(float32, bfloat16 or float16); the file is corrupted or not chargpt's; {fix}")
    if meta.get("checksum") is not None and tensor_checksum(tensors) != meta["checksum"]:
        raise CheckpointError(f"{path} is corrupted (checksum mismatch: its tensor data changed after it was "
                              f"saved); {fix}")
    bad = next((k for k, t in tensors.items() if t.is_floating_point() and not torch.isfinite(t).all()), None)
    if bad:
        raise CheckpointError(f"{path} holds non-finite values (nan or inf) in {bad}; the file is corrupted; {fix}")
    return tensors


def _recovery_hint(path):
    other = {BEST: LATEST, LATEST: BEST}.get(Path(path).name)
    if other:
        return f"re-copy it, or use {other} from the same run"
    if Path(path).name == STATE:
        return f"re-copy it ({BEST} and {LATEST} of the run still load for sampling)"
    return "re-copy it, or use another checkpoint of the run"


def load_model(path, device="cpu"):
    """Checkpoint file or run directory -> (model in eval mode: CharGPT or EncoderDecoder, as its config says;
    Vocab; meta). Rebuilt from the file alone."""
    path = resolve(path)
    meta, shapes = read_meta(path)
    prefix = "model." if any(k.startswith("model.") for k in shapes) else ""
    cfg = meta["model_config"]
    _check_shapes(path, cfg, shapes, prefix)
    model = build_model(cfg)
    tensors = _read_tensors(path, meta, shapes)  # all of them: the checksum covers the whole file
    weights = [k for k in tensors if k.startswith(prefix) and not k.startswith(STATE_PREFIXES)]
    sd = {k[len(prefix):]: tensors[k] for k in weights}
    if cfg.tie_weights:
        sd["lm_head.weight"] = sd["wte.weight"]
    model.load_state_dict(sd, strict=True)
    model.to(device).eval()
    return model, meta["vocab"], meta


def load_state(path, model, optimizer):
    """Restore weights and optimizer state from state.safetensors into model/optimizer (built from the same
    config and optimizer choice); -> (meta, rng dict). Every tensor's name and shape is checked before anything
    is read."""
    meta, shapes = read_meta(path)
    target = unwrap(model)
    _check_shapes(path, target.config, shapes, "model.")
    parts = optimizer_parts(optimizer)
    params = {name: part.parameters_by_index() if hasattr(part, "parameters_by_index")  # flat.FlatAdamW
              else [p for g in part.param_groups for p in g["params"]] for name, part in parts.items()}
    optim = {}  # tensor name -> (optimizer name, parameter index, state key)
    for k, shape in shapes.items():
        if k.startswith(OPTIMIZER_PREFIXES):
            name, idx, key = (k.split(".", 2) + ["", ""])[:3]
            if name not in parts:
                raise CheckpointError(f"{path}: holds {name} optimizer state, which this run's optimizer has not; "
                                      f"resume with the optimizer the run was trained with (--optimizer)")
            mine = params[name]
            ok = idx.isdigit() and int(idx) < len(mine) and (
                shape == tuple(mine[int(idx)].shape) if key in PARAM_SHAPED else key == "step" and shape in ((), (1,)))
            if not ok:
                raise CheckpointError(f"{path}: optimizer state {k} {list(shape)} does not match the model; "
                                      f"the file is corrupted")
            optim[k] = (name, int(idx), key)
        elif k.startswith("rng.") and len(shape) != 1:
            raise CheckpointError(f"{path}: random-generator state {k} is malformed; the file is corrupted")
        elif not k.startswith(("model.", "rng.")):
            raise CheckpointError(f"{path}: unexpected tensor {k}; not a chargpt training state")
    tensors = _read_tensors(path, meta, shapes)
    sd = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    state = {name: {} for name in parts}
    for k, (name, idx, key) in optim.items():
        state[name].setdefault(idx, {})[key] = tensors[k]
    rng = {k[len("rng."):]: v for k, v in tensors.items() if k.startswith("rng.")}
    cpu_rng_bytes = torch.get_rng_state().numel()  # the CPU generators ("torch", "data") have this exact size
    if any(v.dtype != torch.uint8 or k.rsplit(".", 1)[-1] in ("torch", "data") and v.numel() != cpu_rng_bytes
           for k, v in rng.items()):
        raise CheckpointError(f"{path}: random-generator state is malformed; the file is corrupted")
    if target.config.tie_weights:
        sd["lm_head.weight"] = sd["wte.weight"]
    target.load_state_dict(sd, strict=True)
    for name, part in parts.items():
        opt_sd = part.state_dict()
        opt_sd["state"] = state[name]
        part.load_state_dict(opt_sd)
    return meta, rng
