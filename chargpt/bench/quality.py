"""The quality benchmark: learning at a fixed time budget, one run per candidate setting
(`python -m chargpt.bench quality`), and the --init-from comparison (`--set NAME=VALUE`: speed.parse_sets)."""

import sys
import tempfile
from pathlib import Path

from chargpt.bench.speed import machine, parse_sets


def quality_run(args, sets):
    """Train with the defaults plus `sets` ({flag: value}) for --max-time seconds -> (full val loss, summary, with
    "model": what was trained, e.g. '3 x 160, context 128, batch 16, dropout 0.1')."""
    from chargpt.runs.checkpoint import read_meta, run_settings
    from chargpt.runs.rundir import resolve
    from chargpt.tools.evaluate import evaluate
    from chargpt.training.trainer import train
    out = tempfile.mkdtemp(prefix="chargpt-quality-")
    # the tail split unless --set says otherwise: tiny Shakespeare's published numbers (and RESULTS.md's) use it
    summary = train(out_dir=out, data=args.data, max_time=args.max_time, sample_chars=0, device=args.device,
                    curves=False, log=lambda msg: None, **{"val_split": "tail", **sets})
    # consecutive windows (stride = context), as for the numbers already in benchmarks/RESULTS.md
    meta = read_meta(resolve(out))[0]
    m, batch = meta["model_config"], run_settings(meta).batch_size
    summary["model"] = f"{m.n_layer} x {m.n_embd}, context {m.block_size}, batch {batch}, dropout {m.dropout:g}"
    val = evaluate(out, stride=m.block_size, device=args.device, progress=False)["loss"]
    return val, summary


def quality(args):
    """Learning at a fixed budget: one run per candidate (the defaults, then each line of --candidates: NAME=VALUE
    pairs over the defaults and --set), each the full validation loss of its best checkpoint, and the loop's
    estimates of the best and the final (a final far above the best: a run that ended overfit). Without a model
    setting the defaults are --preset auto's choice for the budget (chargpt/training/sizing.py)."""
    base = parse_sets(args.set)
    candidates = [""] + (read_candidates(args.candidates) if args.candidates else [])
    rows = [f"quality: --max-time {args.max_time:g} on {args.data or 'the built-in corpus'}"
            + (f", over {' '.join(args.set)}" if args.set else ""), "",
            "| settings | model | steps | ms/step | full val loss | loop estimate: best | final |",
            "|---|---|---|---|---|---|---|"]
    for line in candidates:
        val, summary = quality_run(args, {**base, **parse_sets(line.split())})
        ms = 1e3 * summary["chars_per_step"] / max(summary["chars_per_s"], 1e-9)
        rows.append(f"| {line or '(defaults)'} | {summary['model']} | {summary['step']:,} | {ms:.1f} | {val:.4f} | "
                    f"{summary['best_val_loss']:.4f} | {summary['val_loss']:.4f} |")
        print(rows[-1], file=sys.stderr, flush=True)  # a long search shows each result as it comes
    return "\n".join(rows)


def init_from_quality(base_data, new_data, base_time=120.0, new_time=30.0, device="auto", sets=None, work=None):
    """--init-from at a fixed budget: a base trained base_time seconds on base_data, then new_time seconds on
    new_data from the base and from scratch (the same settings `sets` otherwise) -> a Markdown table of the full
    validation loss on new_data of each (its best checkpoint, consecutive windows as in quality)."""
    from chargpt.runs.checkpoint import read_meta
    from chargpt.runs.rundir import resolve
    from chargpt.tools.evaluate import evaluate
    from chargpt.training.trainer import train
    work, sets = Path(work or tempfile.mkdtemp(prefix="chargpt-init-from-")), sets or {}
    common = dict(sample_chars=0, device=device, curves=False, log=lambda m: print(m, file=sys.stderr), **sets)
    base = train(data=base_data, out_dir=str(work / "base"), max_time=base_time, **common)
    rows = [f"--init-from: a base trained {base_time:g} s on {Path(base_data).name} ({base['step']:,} steps, val "
            f"loss {base['best_val_loss']:.4f}), then {new_time:g} s on {Path(new_data).name}, on {machine()}", "",
            "| start | steps | full val loss on the new text | loop estimate |", "|---|---|---|---|"]
    for name, extra in (("from the base", {"init_from": str(work / "base")}), ("from scratch", {})):
        out = work / name.replace(" ", "-")
        summary = train(data=new_data, out_dir=str(out), max_time=new_time, **common, **extra)
        block = read_meta(resolve(out))[0]["model_config"].block_size
        val = evaluate(out, stride=block, device=device, progress=False)["loss"]
        rows.append(f"| {name} | {summary['step']:,} | {val:.4f} | {summary['best_val_loss']:.4f} |")
    return "\n".join(rows + ["", "(the run from the base predicts over its larger vocabulary: the base's characters "
                                 "and the new text's)"])


def read_candidates(path):
    return [ln.split("#", 1)[0].strip() for ln in Path(path).read_text(encoding="utf-8").splitlines()
            if ln.split("#", 1)[0].strip()]
