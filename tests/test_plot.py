"""Loss curves: metrics.jsonl -> PNG, several runs overlaid; a clear message where matplotlib is missing."""

import json
import math
import os
import shutil
import struct
import sys

import pytest
from click.testing import CliRunner
from helpers import run_chargpt

from chargpt.cli import plot_cli
from chargpt.errors import ChargptError
from chargpt.runs.plot import figure, maybe_write_curves, plot_runs, require_metrics

try:
    import matplotlib  # noqa: F401
    HAVE_MPL = True
except ImportError:
    HAVE_MPL = False
# CI installs the plots extra, so there a missing matplotlib is a failure, not a skip
needs_mpl = pytest.mark.skipif(not HAVE_MPL and not os.environ.get("CI"), reason="matplotlib not installed")


def png_size(path):
    """(width, height) from the PNG signature and IHDR chunk; fails on anything that is not a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", "not a PNG"
    return struct.unpack(">II", data[16:24])


def write_metrics(run, rows, tail=""):
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + tail, encoding="utf-8")


def rows(losses):
    return [{"step": 10 * i, "train_loss": t, "val_loss": v, "train_bpc": t / math.log(2), "val_bpc": v / math.log(2)}
            for i, (t, v) in enumerate(losses)]


@needs_mpl
def test_plot_two_runs_is_a_valid_png(tiny_run, tmp_path):
    other = tmp_path / "other"
    write_metrics(other, rows([(4.0, 4.1), (3.0, 3.2), (2.5, 2.8)]))
    out = plot_runs([tiny_run, other], tmp_path / "curves.png", unit="bpc")
    width, height = png_size(out)
    assert (width, height) == (800, 500)
    from matplotlib.image import imread
    assert imread(out).shape[:2] == (500, 800)  # matplotlib reads it back
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


@needs_mpl
def test_figure_draws_train_and_val_per_run_in_the_unit_asked():
    data = {"a": rows([(4.0, 4.2), (3.0, 3.1)]), "b": rows([(2.0, 2.5)])}
    for unit, scale in (("nats", 1.0), ("bpc", 1 / math.log(2))):
        lines = {ln.get_label(): ln for ln in figure(data, unit).axes[0].lines}
        assert set(lines) == {"a train", "a val", "b train", "b val"}
        assert list(lines["a val"].get_xdata()) == [0, 10]
        assert list(lines["a val"].get_ydata()) == pytest.approx([4.2 * scale, 3.1 * scale])
        assert lines["a train"].get_color() == lines["a val"].get_color() != lines["b val"].get_color()


def test_metrics_rows_skip_cut_lines_and_keep_the_last_of_a_step(tmp_path):
    write_metrics(tmp_path / "r", rows([(4.0, 4.1), (3.0, 3.0)]) + [{"step": 10, "train_loss": 2.9, "val_loss": 2.95}],
                  tail='{"step": 20, "train_lo')  # killed mid-line
    got = require_metrics(tmp_path / "r")
    assert [r["step"] for r in got] == [0, 10] and got[1]["val_loss"] == 2.95


@needs_mpl
def test_curves_at_the_end_of_training(tiny_run, tmp_path):
    run = shutil.copytree(tiny_run, tmp_path / "run")
    said = []
    assert maybe_write_curves(run, said.append) == run / "curves.png"
    assert png_size(run / "curves.png")[0] > 0 and "curves.png" in said[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert maybe_write_curves(empty, said.append) is None and "warning: no loss curves" in said[-1]


def test_without_matplotlib_a_one_line_fix(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    with pytest.raises(ChargptError, match=r'pip install -e "\.\[plots\]"'):
        plot_runs([tiny_run], tmp_path / "c.png")
    r = CliRunner().invoke(plot_cli, [str(tiny_run)])
    assert r.exit_code == 1 and r.stderr.strip().count("\n") == 0 and 'pip install -e ".[plots]"' in r.stderr
    run = shutil.copytree(tiny_run, tmp_path / "run")
    (run / "curves.png").unlink(missing_ok=True)  # drawn when tiny_run was trained, where matplotlib is installed
    assert maybe_write_curves(run, print) is None and not (run / "curves.png").exists()  # training just goes on


@needs_mpl
def test_plot_command(tiny_run, tmp_path):
    r = run_chargpt("plot", tiny_run, "-o", tmp_path / "c.png", "--unit", "bpc")
    assert r.returncode == 0, r.stderr
    assert png_size(tmp_path / "c.png") and "wrote" in r.stderr


@needs_mpl
@pytest.mark.parametrize("args,needle", [
    (["missing"], "run not found: missing"),
    (["empty"], "no metrics.jsonl in empty"),
    (["RUN", "-o", "no/such/dir/c.png"], "cannot write no/such/dir/c.png"),
    (["RUN", "--unit", "furlongs"], "Invalid value for '--unit'"),
    ([], "no trained run under checkpoints/"),
])
def test_plot_bad_input_is_one_line(tiny_run, tmp_path, args, needle):
    (tmp_path / "empty").mkdir()
    r = CliRunner().invoke(plot_cli, [str(tiny_run) if a == "RUN" else a for a in args])
    assert r.exit_code in (1, 2) and needle in r.stderr, r.stderr
    if r.exit_code == 1:  # ours (2 is click's own usage error, which prints usage lines first)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ")


@needs_mpl
def test_curves_are_titled_with_run_corpus_and_model_and_show_the_running_loss(tiny_run, tmp_path):
    from chargpt.runs.plot import read_running, title_of
    title = title_of([tiny_run])
    assert title.startswith("run: corpus corpus, 1 layers x 16 wide, 2 heads, context 16")  # run, corpus, model
    running = read_running(tiny_run)  # logged every 10 steps: denser than the evaluations
    assert [r["step"] for r in running] == [1, 11]
    fig = figure({"run": require_metrics(tiny_run)}, "nats", {"run": running}, title)
    ax = fig.axes[0]
    assert ax.get_title() == title
    lines = {ln.get_label(): ln for ln in ax.lines}
    assert list(lines["run train (running)"].get_xdata()) == [1, 11]
    assert lines["run train (running)"].get_color() == lines["run val"].get_color()
    other = tmp_path / "other"
    write_metrics(other, rows([(4.0, 4.1)]))
    assert title_of([tiny_run, other]) == "2 runs"


def test_training_without_matplotlib_says_so_once_at_start(corpus, monkeypatch):
    """No curves.png without matplotlib: the start-up says it in one note, with the install line (in the lines a
    person reads by default too), rather than nothing."""
    from chargpt.training.describe import brief_lines, start_lines
    from chargpt.training.start import start_run
    kw = dict(data=str(corpus), device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4,
              eval_iters=1, threads=1, dtype="float32", sample_chars=0, max_iters=2)

    def notes(**extra):
        run = start_run({**kw, "out_dir": f"run{len(extra)}", **extra}, log=lambda m: None)
        try:
            full = start_lines(run)
            return [line for line in full if "curves.png" in line], \
                [line for line in brief_lines(run, full) if "curves.png" in line]
        finally:
            run.release()

    if HAVE_MPL:
        assert notes() == ([], [])  # installed: nothing to say
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    full, brief = notes()
    assert len(full) == 1 and full == brief and full[0].startswith("note: no curves.png will be drawn")
    assert 'pip install -e ".[plots]"' in full[0] and "--no-curves" in full[0]
    assert notes(curves=False) == ([], [])  # --no-curves: none asked for, nothing to say
