"""What a run is, from its files' headers alone: `chargpt info RUN`.

    run_info("checkpoints/shakespeare")          # -> dict (info_json(it) is what `chargpt info --json` prints)
    print(format_info(run_info("checkpoints/shakespeare")))

Only safetensors headers (checkpoint.read_meta) and metrics.jsonl are read, never the weights, so it is instant
even for a large model. The parameter count comes from the tensor shapes in the header.
"""

import math
import textwrap
from dataclasses import asdict
from pathlib import Path

from safetensors import safe_open

from chargpt.config import ModelConfig
from chargpt.config.architecture import describe_model
from chargpt.data.fim import FimMarkers
from chargpt.data.labels import LabelSet
from chargpt.runs.checkpoint import read_meta, run_settings
from chargpt.runs.rundir import LATEST, METRICS, read_step_rows, resolve
from chargpt.textio import escape
from chargpt.training.init_from import describe_lineage, read_lineage

PREVIEW_CHARS = 80
WRAP = 110  # columns of the human format


def _format_version(path):
    with safe_open(str(path), framework="pt") as f:
        return int((f.metadata() or {}).get("format_version", 0))


def _metrics(run_dir):
    return read_step_rows(run_dir / METRICS)


def _number(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def bpb_per_nat(rows):
    """Bits per byte per nat of validation loss: val_bpb / val_loss of the run's last evaluation that recorded both
    (1 / (ln 2 x the validation text's UTF-8 bytes per character), the same at every evaluation); None for runs
    that recorded no bits per byte (pairs runs, runs from before it was recorded)."""
    for r in reversed(rows):
        if _number(r.get("val_bpb")) and _number(r.get("val_loss")) and r["val_loss"] > 0:
            return r["val_bpb"] / r["val_loss"]
    return None


def run_info(path, preview=PREVIEW_CHARS):
    """A run directory (its best checkpoint for the model, its latest for progress) or one checkpoint file ->
    dict of facts about it (the first `preview` vocabulary characters, escaped). `chargpt info` prints it and the
    playground's Runs view shows it."""
    p = Path(path).expanduser()
    ckpt = resolve(p)
    run_dir = p if p.is_dir() else None
    meta, shapes = read_meta(ckpt)
    latest = meta
    if run_dir is not None and (run_dir / LATEST).is_file() and ckpt.name != LATEST:
        latest = read_meta(run_dir / LATEST)[0]
    cfg, tcfg = meta["model_config"], run_settings(latest)
    state = latest.get("run_state") or {}
    step = latest.get("step", 0)
    processes = latest.get("world_size")  # recorded by newer trainers; None: unknown (one process assumed)
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        processes = None  # absent, or not a count (a damaged or hostile file)
    per_step = latest.get("chars_per_step")  # recorded since pairs runs, whose examples vary in length
    if isinstance(per_step, bool) or not isinstance(per_step, (int, float)) or not 0 < per_step < 2**53:
        per_step = tcfg.batch_size * tcfg.grad_accum * cfg.block_size * (processes or 1) if tcfg else 0
    per_step = round(per_step)
    best = latest.get("best_val_loss", meta.get("best_val_loss", meta.get("val_loss")))
    rows = _metrics(run_dir) if run_dir is not None else []
    per_nat = bpb_per_nat(rows)
    files = sorted(run_dir.iterdir()) if run_dir is not None else [ckpt]
    return {
        "path": str(p), "checkpoint": str(ckpt), "format_version": _format_version(ckpt),
        "parameters": sum(math.prod(s) for k, s in shapes.items() if not k.startswith(("optim.", "rng."))),
        "task": meta["task"], "arch": cfg.arch, "model_config": asdict(cfg),
        "train_config": tcfg,  # a TrainConfig, typed where the checkpoint was read (None: a lone model file)
        "vocab_size": len(meta["vocab"]), "vocab_preview": escape("".join(meta["vocab"].chars[:preview])),
        "vocab_chars": meta["vocab"].chars[:preview],  # the same characters, unescaped
        "closing_prompt": latest.get("closing_prompt") if isinstance(latest.get("closing_prompt"), str) else None,
        "corpus": latest.get("corpus"), "steps": step, "checkpoint_step": meta.get("step", 0),
        "best_val_loss": best, "best_val_bpc": best / math.log(2) if isinstance(best, (int, float)) else None,
        "best_val_bpb": best * per_nat if per_nat is not None and _number(best) else None,  # UTF-8 bits per byte
        "training_time_s": state.get("elapsed"), "eval_time_s": state.get("eval_time"),
        "characters_seen": step * per_step if per_step else None, "characters_per_step": per_step or None,
        "processes": processes, "evaluations": len(rows), "saved_at": latest.get("saved_at"),
        "init_from": read_lineage(meta),  # the run it started from (--init-from), or None
        "labels": list(labels.names) if (labels := LabelSet.from_meta(meta)) else None,  # --labels
        "fim": FimMarkers.from_meta(meta) is not None,  # --fim: it fills in the middle (sample.py --suffix)
        "val_loss_by_label": next((r["val_loss_by_label"] for r in reversed(rows)
                                   if isinstance(r.get("val_loss_by_label"), dict)), None),  # the last evaluation's
        "files": {f.name: f.stat().st_size for f in files if f.is_file() and not f.name.startswith(".")},
    }


def _size(n):
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000


def _started_from(line):
    return f"{describe_lineage(line)}; {_count(line.get('added_chars', 0))} characters added to its vocabulary"


def _count(n):
    """A count from a file's metadata: 1,234, or ? when it is not a count."""
    return f"{n:,}" if isinstance(n, int) and not isinstance(n, bool) else "?"


def _duration(seconds):
    if seconds is None:
        return "unknown time"
    h, rest = divmod(seconds, 3600)
    return f"{int(h)} h {rest / 60:.0f} min" if h else f"{seconds / 60:.1f} min" if seconds >= 60 else \
        f"{seconds:.1f} s"


def _labels(info):
    """'a, b (val loss at the last evaluation: a 1.234, b 1.456)'."""
    losses = info.get("val_loss_by_label") or {}
    shown = ", ".join(f"{k} {v:.3f}" for k, v in list(losses.items())[:20] if _number(v))
    return ", ".join(info["labels"][:50]) + (f" (val loss at the last evaluation: {shown})" if shown else "")


def _validates(t):
    """Which text validated, as the run split it (t: run_info's train_config)."""
    fraction = t.val_fraction
    if t.task == "pairs" or t.items:
        return f"{fraction:.0%} of the {'items' if t.items else 'pairs'}, at random, for validation"
    if t.val_split == "tail":
        return f"the last {fraction:.0%} for validation"
    return f"{fraction:.0%} for validation, in blocks spread through it"


def info_json(info):
    """run_info's dict as JSON values: its TrainConfig as a plain dict."""
    return {**info, "train_config": asdict(info["train_config"]) if info["train_config"] else None}


def format_info(info):
    """The dict of run_info() -> aligned lines for people."""
    m, t = info["model_config"], info["train_config"]
    model = (f"{describe_model(ModelConfig(**m))}, "
             f"dropout {m['dropout']:g}{', bias' if m['bias'] else ', no bias'}"
             f"{', tied embeddings' if m['tie_weights'] else ''}: {info['parameters']:,} parameters")
    task = "text: writes text (chargpt sample)" if info["task"] == "text" else \
        "sentence pairs: translates (chargpt translate; sample.py prints the translation of its prompt)"
    training = f"{info['steps']:,} steps in {_duration(info['training_time_s'])}"
    if info["training_time_s"] and info["eval_time_s"] is not None:
        training += f" ({min(1.0, info['eval_time_s'] / max(info['training_time_s'], 1e-9)):.0%} of it evaluating)"
    if info["characters_seen"] is not None:
        n = info["processes"]
        procs = f"on {n} process{'' if n == 1 else 'es'}" if n else "one process assumed"
        training += f"; {info['characters_seen']:,} characters seen ({info['characters_per_step']:,} per step, {procs})"
    bpb = f", {info['best_val_bpb']:.3f} bits/byte" if info.get("best_val_bpb") is not None else ""
    best = "none yet" if info["best_val_loss"] is None else \
        f"{info['best_val_loss']:.4f} nats ({info['best_val_bpc']:.3f} bits/char{bpb})"
    rows = [("run", info["path"]),
            ("checkpoint", f"{Path(info['checkpoint']).name} (step {info['checkpoint_step']:,}, "
                           f"checkpoint format {info['format_version']})"),
            ("task", task),
            ("model", model),
            ("vocabulary", f"{info['vocab_size']:,} characters: \"{info['vocab_preview']}\""
                           + (" ..." if info["vocab_size"] > PREVIEW_CHARS else "")),
            ("training", training),
            ("best val loss", best + (f", {info['evaluations']} evaluations" if info["evaluations"] else "")),
            ("corpus", f"{info['corpus'] or '?'} ({t.data or 'built-in'}, {t.encoding}, "
                       f"{_validates(t)})" if t else info["corpus"] or "unknown"),
            *([("started from", _started_from(info["init_from"]))] if info.get("init_from") else []),
            *([("labels", _labels(info))] if info.get("labels") else []),
            *([("fills in", "the middle: sample.py --prompt BEFORE --suffix AFTER (trained with --fim)")]
              if info.get("fim") else []),
            ("saved", info["saved_at"] or "unknown"),
            ("files", ", ".join(f"{name} {_size(n)}" for name, n in info["files"].items()))]
    width = max(len(k) for k, _ in rows + [("training config", "")])
    # what the files say is shown, never acted on: a hostile checkpoint's corpus name, paths or settings may hold
    # terminal escapes or line breaks (escape is a no-op on text already escaped, such as the vocabulary preview)
    lines = [f"{k:<{width}}  {escape(v, backslashes=False)}" for k, v in rows]
    if t:  # the one long row: wrapped between settings
        settings = " ".join(escape(f"{k}={v}", backslashes=False) for k, v in asdict(t).items())
        lines.append(textwrap.fill(f"{'training config':<{width}}  " + settings,
                                   WRAP, subsequent_indent=" " * (width + 2), break_on_hyphens=False))
    return "\n".join(lines)
