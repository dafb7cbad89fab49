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


POEMS = ("帝京篇十首 一\n太宗皇帝\n秦川雄帝宅，函谷壯皇居。\n綺殿千尋起，離宮百雉餘。\n\n"
         "題\n作者\n何如肆轍跡？萬里賞瑤池。\n新樂府\t美撥亂，陳王業也\n一，二，三。\n")


def test_tang_poems_become_couplet_pairs(tmp_path):
    from chargpt.bench import couplets
    (tmp_path / "poems.txt").write_text(POEMS, encoding="utf-8")
    assert couplets(tmp_path / "poems.txt", tmp_path / "c.tsv") == 3  # titles, authors, odd lines skipped
    want = ["秦川雄帝宅\t函谷壯皇居", "綺殿千尋起\t離宮百雉餘", "何如肆轍跡\t萬里賞瑤池"]
    assert (tmp_path / "c.tsv").read_text(encoding="utf-8").splitlines() == want


def test_pairs_benchmark_runs_both_architectures(tmp_path, capsys):
    from chargpt.bench import main
    (tmp_path / "poems.txt").write_text((POEMS.split("\n\n")[0] + "\n") * 40, encoding="utf-8")
    main(["pairs", "--data", str(tmp_path / "poems.txt"), "--max-time", "0.2", "--device", "cpu", "--threads", "1",
          "--eval-pairs", "4", "--out-dir", str(tmp_path / "runs"), "--set", "batch-size=4", "--set", "n-embd=16"])
    out = capsys.readouterr().out
    assert "80 couplets of poems.txt" in out and "| model | parameters | steps | train chars/s |" in out
    assert "| decoder-only 5 x 16 |" in out and "| encoder-decoder 2+2 x 16 |" in out
