"""The runs the playground serves: the run directories directly under one folder, chosen by name from a fresh
listing (never a path from a request), described for the run picker, the Runs view and its polled curves."""

import contextlib
import math
from pathlib import Path

from chargpt.errors import ChargptError
from chargpt.runs.info import info_json, run_info
from chargpt.runs.rundir import BEST, LATEST, LOSSES, METRICS, SAMPLES, lock_holder, read_step_rows
from chargpt.textio import escape
from chargpt.tools.report import REPORT_HTML
from chargpt.web.body import RequestError
from chargpt.web.corpora import inside
from chargpt.web.limits import MAX_METRIC_ROWS, MAX_RUNNING_POINTS, MAX_SAMPLE_ROWS, MAX_VOCAB_SENT, VOCAB_PREVIEW

MAX_REPORT_BYTES = 50 * 2**20  # a report card with its plots inline is well under a megabyte


class Runs:
    """The run directories directly under one folder. A name from a request is only looked up in a fresh
    listing of that folder, never joined to a path; a run or file that resolves outside the folder (a symlink
    out of it) is not listed."""

    def __init__(self, root):
        self.root = Path(root).resolve()

    def _inside(self, path):
        return inside(path, self.root)

    def _file(self, run, name):
        path = run / name
        return path if path.is_file() and self._inside(path) else None

    def listing(self):
        """{name: directory} of every run (a directory with a checkpoint) in the folder."""
        with contextlib.suppress(OSError):
            return {d.name: d for d in sorted(self.root.iterdir())
                    if d.is_dir() and self._inside(d) and (self._file(d, BEST) or self._file(d, LATEST))}
        return {}

    def find(self, name):
        """A run name from a request -> its directory, or a 404 that says how to list the runs."""
        run = self.listing().get(name) if isinstance(name, str) else None
        if run is None:
            raise RequestError(404, f"no run named {str(name)[:80]!r} in the served folder; GET /api/runs lists them")
        return run

    def checkpoint(self, name):
        """What sampling loads, as sample.py does: the best checkpoint, else the latest."""
        run = self.find(name)
        return self._file(run, BEST) or self._file(run, LATEST)

    def summaries(self):
        return [{k: v for k, v in self.summary(run).items() if k != "info"} for run in self.listing().values()]

    def summary(self, run, preview=VOCAB_PREVIEW):
        """The facts the run picker shows: chargpt info's description of the run (headers only, no weights)."""
        out = {"name": run.name, "updated": _mtime(*(run / n for n in (LATEST, BEST, METRICS, SAMPLES))),
               "training": lock_holder(run) is not None}  # a training holds the run directory's lock
        try:
            info = run_info(run, preview=preview)
        except ChargptError as e:
            return {**out, "error": str(e)}
        from chargpt.tools.novelty.score import default_min_span
        m, best = info["model_config"], finite(info["best_val_loss"])
        return {**out, "corpus": str(info["corpus"] or run.name), "step": info["steps"],
                "params": info["parameters"], "best_val_loss": best,
                "best_bpc": best / math.log(2) if best is not None else None,
                "best_bpb": finite(info["best_val_bpb"]), "vocab_size": info["vocab_size"],
                "block_size": m["block_size"], "layers": m["n_layer"], "heads": m["n_head"], "width": m["n_embd"],
                "task": info["task"], "arch": info["arch"],
                "labels": info.get("labels"),  # --labels: the names Write's Label picker offers (None: no labels)
                "fim": info.get("fim"),  # --fim: Write offers a box for the text after the gap (suffix)
                "novelty_min_span": default_min_span(info["vocab_size"]),  # Mark copied text's default for it
                "budget": finite(budget_of(info["train_config"])),
                "info": info}

    def details(self, name):
        run = self.find(name)
        summary = self.summary(run, preview=MAX_VOCAB_SENT)  # the whole vocabulary (up to a bound), for its summary
        info = summary.pop("info", None)
        if info is None:
            return summary
        samples = self._file(run, SAMPLES)  # read_step_rows reads any of a run's step-keyed JSON lines
        settings = info_json(info)["train_config"]
        return {**summary, "model_config": info["model_config"], "train_config": finite(unrooted(settings)),
                "saved_at": info["saved_at"], "vocab_preview": escape("".join(info["vocab_chars"][:VOCAB_PREVIEW])),
                "vocab_chars": info["vocab_chars"], "closing_prompt": info["closing_prompt"], "files": info["files"],
                "init_from": finite(unrooted(info.get("init_from"))),  # the run it started from, or None
                "report": self._file(run, REPORT_HTML) is not None,  # `chargpt report` wrote its report card
                "samples": read_step_rows(samples)[-MAX_SAMPLE_ROWS:] if samples else []}

    def report(self, name):
        """The run's report card (RUN/report.html, which `chargpt report` writes: one self-contained page) -> its
        bytes, or a 404 that says how to write one."""
        run = self.find(name)
        path = self._file(run, REPORT_HTML)
        if path is None:
            raise RequestError(404, f"{name} has no report card yet; `chargpt report {name}` in the served folder "
                                    f"writes one")
        if path.stat().st_size > MAX_REPORT_BYTES:
            raise RequestError(413, f"{name}'s report.html is over {MAX_REPORT_BYTES // 2**20} MiB; open it from the "
                                    f"run's folder")
        return path.read_bytes()

    def metrics(self, name):
        """-> (rows, running-loss rows, mtime of the newer of metrics.jsonl and train_loss.jsonl, or None)."""
        run = self.find(name)
        path, losses = self._file(run, METRICS), self._file(run, LOSSES)
        running = read_step_rows(losses) if losses else []
        running = running[::math.ceil(len(running) / MAX_RUNNING_POINTS)] if running else []
        if not path and not losses:
            return [], [], None
        return (read_step_rows(path)[-MAX_METRIC_ROWS:] if path else []), running, _mtime(*filter(None, (path, losses)))


PATH_FIELDS = ("config", "data", "out_dir", "cache_dir", "target_data", "labels", "init_from", "path")


def unrooted(fields):
    """A run's settings (or its lineage) with each file or folder by its last name only (a checkpoint file with its
    run's: base/best.safetensors): the server's own paths (its home, its user name, its disks) are not sent."""
    if not isinstance(fields, dict):
        return fields
    return {k: str(Path(*Path(v).parts[-2 if k == "path" else -1:])) if k in PATH_FIELDS and isinstance(v, str) and v
            else v for k, v in fields.items()}


def _mtime(*paths):
    """The newest modification time among paths that exist (0 if none)."""
    times = [0.0]
    for p in paths:
        with contextlib.suppress(OSError):
            times.append(p.stat().st_mtime)
    return max(times)


def finite(value):
    """Metadata with NaN or infinity (JSON has neither) -> the same with None there."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, type(None))) else None


def budget_of(settings):
    """A run's budget from its TrainConfig (typed where its checkpoint was read; None: a lone model file)."""
    return {"max_iters": settings.max_iters, "max_time": settings.max_time} if settings else \
        {"max_iters": None, "max_time": None}
