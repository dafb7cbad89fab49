"""python -m chargpt.bench runs end to end: a --quick smoke run of every part of the speed benchmark on a tiny
shape (seconds), writing its table where --write says. Its numbers are not checked: they mean nothing here."""

import os
import subprocess
import sys

from conftest import ROOT


def test_quick_speed_benchmark_prints_every_part_and_writes_results(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "chargpt.bench", "--quick", "--device", "cpu", "--threads", "1",
                        "--write"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    out = r.stdout
    assert out.startswith("machine: ") and "matmul peak float32: " in out
    assert "| 1x16 ctx16 b4 | float32 | manual | for-loop |" in out and "1.00x (baseline) |" in out
    assert "| 1x16 ctx16 b4 | float32 | auto | fused |" in out
    assert "decode 20 chars, batch 1, 1x16 ctx16: cached " in out
    results = (tmp_path / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert "python -m chargpt.bench speed" in results and out.strip() in results
