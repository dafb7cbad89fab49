"""python -m chargpt.bench runs end to end: --quick smoke runs of every part of the speed benchmark, the profile,
the quality search and the side-by-side against nanoGPT (with a stand-in for nanoGPT's train.py), on tiny shapes
in seconds, writing their tables where --write says. Their numbers are not checked: they mean nothing here."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import ROOT

from chargpt.bench import write_results
from chargpt.runtime import cpu_has_native_bf16

KIND = "CPU with native bf16" if cpu_has_native_bf16() else "CPU without native bf16"


def bench(*args, cwd, timeout=180):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "chargpt.bench", *map(str, args), "--device", "cpu", "--threads", "1"],
                       capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert not re.search(r"USDT|STAGE:|profiler_start|profiler_stop", r.stderr), r.stderr  # torch.profiler's C++ lines
    return r.stdout


@pytest.mark.dtype  # its rows and its machine kind follow the CPU's kind
def test_quick_speed_benchmark_prints_every_part_and_writes_results(tmp_path, tiny_run):
    out = bench("--quick", "--checkpoint", tiny_run, "--write", cwd=tmp_path)
    assert out.startswith("machine: ") and f"\nkind: {KIND}\n" in out
    # no figure it did not measure: no matmul peak from a 64 x 64 matmul, so no MFU (it once read 5123%)
    assert "matmul peak: not measured with --quick" in out and "GFLOP/s" not in out
    rows = [line.split("|") for line in out.splitlines() if line.startswith("| 1x16 ctx16 b4 |") and "AdamW" in line
            or "Muon" in line]
    assert rows and all(cells[7].strip() == "-" for cells in rows)  # the MFU column
    assert "| 1x16 ctx16 b4 | float32 | manual | AdamW for-loop |" in out and "1.00x (baseline) |" in out
    assert "| 1x16 ctx16 b4 | float32 | auto | AdamW fused, per tensor |" in out  # torch's, as before flat buffers
    assert "| 1x16 ctx16 b4 | float32 | fused | AdamW fused, flat |" in out
    assert "| 1x16 ctx16 b4 | float32 | manual | AdamW fused, flat |" in out
    assert "| 1x16 ctx16 b4 | float32 | auto | Muon + AdamW, flat |" in out
    bf16_row = "| 1x16 ctx16 b4 | bfloat16 | fused | AdamW fused, flat |"
    assert (bf16_row in out) == cpu_has_native_bf16()  # rows that apply
    assert "compile: skipped with --quick" in out
    assert "decode 20 chars, batch 1, 1x16 ctx16" in out and "| float32 | " in out and "| int8 | " in out
    static = next(line for line in out.splitlines() if line.startswith("| float32, static, eager |")).split("|")
    assert float(static[2].replace(",", "")) > 0 and abs(float(static[6])) < 1e-3  # the step's loss: the forward's
    int8 = next(line for line in out.splitlines() if line.startswith("| int8 |")).split("|")
    assert float(int8[4]) > 0 and int8[5].strip().startswith(("+", "-"))  # val loss, and its change against float32
    results = (tmp_path / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
    assert f"## Machine kind: {KIND}\n" in results and "python -m chargpt.bench --quick" in results
    assert out.strip() in results


def test_results_keep_one_section_per_machine_kind(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Benchmark results\n\nintro\n\n## Machine kind: CPU without native bf16\n\nold\n", "utf-8")
    write_results("table A", "CPU with native bf16", "run a", path)
    write_results("table B", "CPU without native bf16", "run b", path)
    write_results("table C", "CPU with native bf16", "run c", path)
    text = path.read_text(encoding="utf-8")
    without, with_bf16 = text.index("## Machine kind: CPU without"), text.index("## Machine kind: CPU with native")
    assert text.count("## Machine kind:") == 2 and text.startswith("# Benchmark results\n\nintro")
    assert without < text.index("old") < text.index("table B") < with_bf16 < text.index("table A") < \
        text.index("table C")


def test_profile_lists_the_loop_phases_and_the_top_operators(tmp_path, corpus):
    out = bench("profile", "--quick", "--data", corpus, "--top", "5", cwd=tmp_path)
    assert out.startswith("profile: 20 training steps after 5 of warm-up, --n-layer 1")
    calls = re.search(r"aten calls per training step: ([\d,]+) ", out)
    assert calls and int(calls.group(1).replace(",", "")) > 100  # counted, not timed
    for phase in ("2 forward and backward", "2a batch", "3 agree", "4 optimizer step", "5 progress"):
        assert f"| {phase} | " in out
    ops = [line for line in out.splitlines() if line.startswith("| aten::")]
    assert 1 <= len(ops) <= 5


def test_quality_runs_every_candidate(tmp_path, corpus):
    (tmp_path / "candidates.txt").write_text("optimizer=muon  # Muon for the matrices\n\nlr-schedule=wsd\n")
    tiny = ["--set", "n-layer=1", "--set", "n-embd=16", "--set", "n-head=2", "--set", "block-size=16",
            "--set", "batch-size=4", "--set", "eval-iters=2", "--set", "threads=1", "--set", "dtype=float32"]
    out = bench("quality", "--data", corpus, "--max-time", "1", *tiny, "--candidates", "candidates.txt",
                cwd=tmp_path)
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| settings")]
    assert [r.split(" | ")[0] for r in rows] == ["| (defaults)", "| optimizer=muon", "| lr-schedule=wsd"]


def test_side_by_side_with_nanogpt_prepares_its_data_and_reads_its_step_times(tmp_path, corpus):
    """A stand-in for a nanoGPT checkout: its train.py checks the files nanoGPT's would read and prints iteration
    lines as nanoGPT's does."""
    fake = tmp_path / "nanoGPT"
    (fake / "config").mkdir(parents=True)
    (fake / "config" / "train_shakespeare_char.py").write_text("dataset = 'shakespeare_char'\n")
    (fake / "data" / "shakespeare_char").mkdir(parents=True)
    (fake / "data" / "shakespeare_char" / "prepare.py").write_text(textwrap.dedent("""
        # as nanoGPT's: reads input.txt beside it (downloading it only if missing), writes the three files
        import os
        assert os.path.exists("input.txt"), "would download"
        text = open("input.txt").read()
        for name in ("train.bin", "val.bin", "meta.pkl"):
            open(name, "w").write(text)
    """))
    (fake / "train.py").write_text(textwrap.dedent("""
        import os, sys
        data = os.path.join("data", "shakespeare_char")
        assert all(os.path.getsize(os.path.join(data, f)) > 0 for f in ("train.bin", "val.bin", "meta.pkl"))
        args = dict(a[2:].split("=", 1) for a in sys.argv[2:])
        assert args["device"] == "cpu" and args["n_layer"] == "4" and args["block_size"] == "64"
        for i in range(int(args["max_iters"]) + 1):
            print(f"iter {i}: loss 4.0000, time {100.0 if i < 10 else 50.0:.2f}ms, mfu -100.00%")
    """))
    out = bench("--only", "--nanogpt", fake, "--data", corpus, "--quick", cwd=tmp_path, timeout=300)
    assert "against nanoGPT's train.py" in out and "4x128 ctx64 b12, 20 steps" in out
    assert "| nanoGPT train.py | float32 | 50.0 | 1.00x |" in out
    assert "| chargpt train.py | float32 | " in out and "| chargpt train.py | auto | " in out
    assert sorted(os.listdir(fake / "data" / "shakespeare_char")) == ["prepare.py"]  # prepared in a temporary copy


POEMS = ("帝京篇十首 一\n太宗皇帝\n秦川雄帝宅，函谷壯皇居。\n綺殿千尋起，離宮百雉餘。\n\n"
         "題\n作者\n何如肆轍跡？萬里賞瑤池。\n新樂府\t美撥亂，陳王業也\n一，二，三。\n")


def test_tang_poems_become_couplet_pairs(tmp_path):
    from chargpt.bench.pairs import couplets
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
