"""Loss curves as pictures: metrics.jsonl rows -> a matplotlib figure -> PNG.

    chargpt plot checkpoints/a checkpoints/b -o curves.png --unit bpc     # or --unit bpb: bits per UTF-8 byte
    plot_runs(["checkpoints/a", "checkpoints/b"], "curves.png", unit="bpc")

Validation loss (solid, with a dot per evaluation), train loss at the evaluations (dashed) and the running training
loss logged every few steps (thin, from train_loss.jsonl) against the step, one colour per run, several runs
overlaid; the title names the run, its corpus and its model.
matplotlib is optional (pip install -e ".[plots]"); it is imported only here, with the Agg backend through
matplotlib.figure.Figure (no pyplot, no display, no global state).
"""

import contextlib
import math
import os
from pathlib import Path

from chargpt.errors import ChargptError, DataError
from chargpt.runs import rundir
from chargpt.runs.rundir import LOSSES, METRICS

UNITS = {"nats": ("loss", "loss (nats per character)"), "bpc": ("bpc", "bits per character"),
         "bpb": ("bpb", "bits per byte (UTF-8): compares alphabets")}
CURVES = "curves.png"


def _require_matplotlib():
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ChargptError('plotting needs matplotlib, which is not installed; pip install -e ".[plots]" '
                           '(or pip install matplotlib)') from None
    return Figure


def require_metrics(run):
    """A run directory (or its metrics.jsonl) -> rows sorted by step, the last line kept for a repeated step;
    a line cut short by a kill is skipped. A run that is missing or has no evaluations yet is a DataError (there
    is nothing to draw)."""
    path = Path(run)
    path = path / METRICS if path.is_dir() else path
    if not Path(run).exists():
        raise DataError(f"run not found: {run}; pass run directories (as written by chargpt train)")
    if not path.is_file():
        raise DataError(f"no {METRICS} in {run}; pass a run directory that has trained (chargpt train --out-dir)")
    rows = rundir.read_step_rows(path)
    if not rows:
        raise DataError(f"{path} has no evaluations yet; train for at least one --eval-interval")
    return rows




MAX_DRAWN = 1e100  # a loss past this (a diverged run, near float's end) is left out: matplotlib cannot scale to it


def _value(row, split, unit, per_nat=None):
    """The row's loss for split ('train'/'val') in unit (rows without *_bpc are converted from nats; rows without
    *_bpb, such as the running loss's, by `per_nat`: bits per byte per nat of that split, else None); None for a
    loss that is missing, not a number, or too large to draw."""
    nats = row.get(f"{split}_loss")
    nats = nats if isinstance(nats, (int, float)) and not isinstance(nats, bool) else None
    if unit == "bpc":
        value = row.get(f"{split}_bpc", nats / math.log(2) if nats is not None else None)
    elif unit == "bpb":
        value = row.get(f"{split}_bpb", nats * per_nat if nats is not None and per_nat is not None else None)
    else:
        value = nats
    drawable = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_DRAWN
    return value if drawable else None


def train_per_nat(rows):
    """Bits per byte per nat of training loss, from the last evaluation that recorded both (the training split's
    1 / (ln 2 x UTF-8 bytes per character)), for the running loss; None without one."""
    for r in reversed(rows):
        bpb, nats = _value(r, "train", "bpb"), _value(r, "train", "nats")
        if bpb is not None and nats:
            return bpb / nats
    return None


def read_running(run):
    """A run directory's running training loss rows (train_loss.jsonl), [] where it has none."""
    path = Path(run)
    return rundir.read_step_rows(path / LOSSES) if path.is_dir() else []


def figure(runs, unit="nats", running=None, title=None):
    """{label: rows} -> a matplotlib Figure with train (dashed) and val (solid) curves per run; `running`:
    {label: rows of train_loss.jsonl}, drawn as a thin line of the same colour."""
    if unit not in UNITS:
        raise ChargptError(f"unit must be one of {', '.join(UNITS)} (got {unit!r})")
    fig = _require_matplotlib()(figsize=(8, 5), dpi=100, layout="tight")
    ax = fig.add_subplot()
    for i, (label, rows) in enumerate(runs.items()):
        color = f"C{i % 10}"
        per_nat = train_per_nat(rows)
        dense = [(r["step"], _value(r, "train", unit, per_nat)) for r in (running or {}).get(label, [])
                 if _value(r, "train", unit, per_nat) is not None]
        if dense:
            steps, values = zip(*dense)
            ax.plot(steps, values, "-", color=color, linewidth=0.7, alpha=0.45, label=f"{label} train (running)")
        for split, style in (("train", "--"), ("val", "-")):
            points = [(r["step"], _value(r, split, unit)) for r in rows if _value(r, split, unit) is not None]
            if points:
                steps, values = zip(*points)
                ax.plot(steps, values, style, color=color, marker="." if len(points) < 30 else None,
                        label=f"{label} {split}")
        for k, (name, points) in enumerate(label_curves(rows, unit).items()):  # --labels: dotted, one per label
            ax.plot(*zip(*points), ":", color=color, marker=MARKS[k % len(MARKS)], markersize=3,
                    label=f"{label} val {name}")
    ax.set_xlabel("step")
    ax.set_ylabel(UNITS[unit][1])
    if title:
        ax.set_title(title, fontsize="medium")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    return fig


MARKS = "ov^sxd+*"
MAX_LABEL_CURVES = 8


def label_curves(rows, unit):
    """A labelled run's validation loss per label ({label: [(step, value)]}, its first MAX_LABEL_CURVES labels) in
    nats or bits per character; {} for other runs and for bits per byte (not recorded per label)."""
    curves = {}
    for r in rows:
        for name, loss in list((r.get("val_loss_by_label") or {}).items())[:MAX_LABEL_CURVES]:
            if unit != "bpb" and isinstance(loss, (int, float)) and abs(loss) <= MAX_DRAWN:
                curves.setdefault(str(name), []).append((r["step"], loss / math.log(2) if unit == "bpc" else loss))
    return curves


def _run_name(run):
    p = Path(run).resolve()
    return (p.parent if p.name == METRICS else p).name


def labels(runs):
    """Short, distinct legend labels: the run directories' names, or the paths as given where names repeat."""
    names = [_run_name(r) for r in runs]
    return [str(r) if names.count(n) > 1 else n for r, n in zip(runs, names)]


def run_facts(run):
    """(corpus, model description) from the run's newest checkpoint header, or None without one."""
    from chargpt.config.architecture import describe_model
    from chargpt.runs.checkpoint import read_meta
    path = Path(run)
    path = path.parent if path.name == METRICS else path
    for name in (rundir.LATEST, rundir.BEST):
        with contextlib.suppress(ChargptError, OSError):
            meta, shapes = read_meta(path / name)
            params = sum(math.prod(s) for k, s in shapes.items() if not k.startswith(("optim.", "rng.")))
            return meta.get("corpus") or "?", f"{describe_model(meta['model_config'])}, {params / 1e6:.2f}M parameters"
    return None


def title_of(runs):
    """The figure's title: 'RUN: corpus CORPUS, MODEL' for one run; for several, how many (each is named in the
    legend) and their corpus where they share one."""
    facts = [run_facts(r) for r in runs]
    if len(runs) == 1:
        return _run_name(runs[0]) + (f": corpus {facts[0][0]}, {facts[0][1]}" if facts[0] else "")
    corpora = {f[0] for f in facts if f}
    return f"{len(runs)} runs" + (f" on {corpora.pop()}" if len(corpora) == 1 and all(facts) else "")


def plot_runs(runs, out_png, unit="nats"):
    """Draw the curves of one or more runs (directories or metrics.jsonl files) into out_png, written atomically.
    -> the path written."""
    _require_matplotlib()  # before reading anything: the missing extra is the first thing to fix
    if not Path(out_png).name or Path(out_png).is_dir():  # '', '.', a folder: with_name below needs a file name
        raise ChargptError(f"-o {str(out_png)!r} is not a file name; give the PNG file to write, as -o curves.png")
    data = {label: require_metrics(run) for label, run in zip(labels(runs), runs)}
    if unit == "bpb":
        for run, rows in zip(runs, data.values()):
            if not any(_value(r, "val", "bpb") is not None for r in rows):
                raise DataError(f"{run} recorded no bits per byte (runs trained before chargpt recorded it, and "
                                f"sentence-pair runs); plot it with --unit bpc or nats")
    running = {label: read_running(run) for label, run in zip(labels(runs), runs)}
    fig = figure(data, unit, running, title_of(runs))
    out = Path(out_png)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    try:
        fig.savefig(tmp, format="png")
        os.replace(tmp, out)
    except OSError as e:
        raise ChargptError(f"cannot write {out} ({e.strerror}); choose a writable path with -o") from None
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
    return out


def curves_note():
    """What training's start-up says when it will draw no curves.png because matplotlib is missing (once, with the
    install line); None when it is installed."""
    try:
        _require_matplotlib()
    except ChargptError:
        return ('note: no curves.png will be drawn (matplotlib is not installed): pip install -e ".[plots]" to have '
                'it, or --no-curves to say nothing; chargpt serve shows the curves without it')
    return None


def maybe_write_curves(run_dir, log=print):
    """At the end of training: run_dir/curves.png when matplotlib is installed (nothing otherwise: the start-up said
    so, curves_note). A picture that cannot be drawn is a warning, never a failed run. -> the path written, or
    None."""
    try:
        _require_matplotlib()
    except ChargptError:
        return None
    try:
        path = plot_runs([run_dir], Path(run_dir) / CURVES)
    except ChargptError as e:
        log(f"warning: no loss curves drawn: {e}")
        return None
    log(f"loss curves: {path}")
    return path
