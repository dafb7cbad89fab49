"""chargpt report: a run's report card, its figures against independent computations, and chargpt eval --against."""

import bz2
import json
import lzma
import random
import re
import shutil
import zlib

import pytest
from helpers import TINY_RUN_KW, assert_one_line_error, invoke

import chargpt
from chargpt.cli import main
from chargpt.runs.checkpoint import load_model, read_meta
from chargpt.runs.rundir import resolve
from chargpt.tools.evaluate import run_split
from chargpt.tools.report import build_report, measures
from chargpt.tools.report.agreement import compare, reference, windows_of

QUICK = dict(temperatures=(0.8, 1.2), samples=2, chars=40, compare=(), speed=False, log=lambda m: None)


@pytest.fixture
def run(tiny_run, tmp_path):
    """A copy of the shared tiny run (the report is written into the run)."""
    return shutil.copytree(tiny_run, tmp_path / "run")


def test_iid_four_symbols_report_two_bits_a_character_within_the_standard_error(tmp_path):
    """Uniform i.i.d. text over 4 symbols holds exactly 2 bits a character: a model that has learnt it reports that,
    and no general-purpose compressor gets below it."""
    rng = random.Random(0)
    corpus = tmp_path / "abcd.txt"
    corpus.write_text("".join(rng.choice("abcd") for _ in range(20_000)), encoding="utf-8")
    kw = {**TINY_RUN_KW, "verbose": False}
    chargpt.train(data=str(corpus), out_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"), max_iters=200,
                  eval_interval=100, learning_rate=1e-2, seed=1, log=lambda *a: None, **kw)
    c = build_report(tmp_path / "run", **QUICK)["compression"]
    assert c["bpc_se"] > 0 and c["windows"] > 10
    assert abs(c["bpc"] - 2.0) <= 3 * c["bpc_se"] + 0.02, (c["bpc"], c["bpc_se"])
    assert c["bpb"] == pytest.approx(c["bpc"])  # one byte a character
    assert min(x["bpc"] for x in c["compressors"].values()) > 2.0


def test_compressor_figures_equal_an_independent_computation_on_the_validation_bytes(run):
    r = build_report(run, **QUICK)
    model, vocab, meta = load_model(resolve(run))
    ids, split, _ = run_split(meta, vocab, model.config.block_size)
    data = "".join(vocab.decode(p) for p in split.pieces(ids, "val")).encode("utf-8")
    comp = r["compression"]["compressors"]
    assert r["compression"]["bytes"] == len(data)
    assert comp["zlib"]["bytes"] == len(zlib.compress(data, 9))
    assert comp["bz2"]["bytes"] == len(bz2.compress(data, 9))
    assert comp["xz"]["bytes"] == len(lzma.compress(data, preset=9 | lzma.PRESET_EXTREME))
    assert comp["xz"]["bpb"] == pytest.approx(8 * comp["xz"]["bytes"] / len(data))
    assert ("zstd" in comp) == (measures.zstd_compressor() is not None)


def test_standard_error_is_the_ratio_estimators():
    windows = [(2.0, 2), (6.0, 2), (3.0, 2)]  # per-window means 1, 3, 1.5: mean 11/6
    mean, se = measures.ratio_se(windows)
    m = 11 / 6
    assert mean == pytest.approx(m)
    # sqrt(k / (k - 1) x the sum of squared residuals (sum - mean x count)) / all the counts
    assert se == pytest.approx((((2 - 2 * m) ** 2 + (6 - 2 * m) ** 2 + (3 - 2 * m) ** 2) * 3 / 2) ** 0.5 / 6)


def test_distinct_n_and_repetition_on_hand_made_samples():
    samples = [["the", "cat", "the", "cat"], ["the", "dog"]]
    assert measures.distinct_n(samples, 1) == 3 / 6  # the, cat, dog among 6 words
    assert measures.distinct_n(samples, 2) == 3 / 4  # (the cat), (cat the), (the dog); (the cat) twice
    assert measures.distinct_n(samples, 4) == 1.0  # one 4-gram
    assert measures.distinct_n(samples, 5) is None
    assert measures.repetition([["a", "b", "c", "d", "a", "b", "c", "d"]], 4) == pytest.approx(1 - 4 / 5)
    assert measures.tokens("春眠 不覺曉", "character") == list("春眠不覺曉")


def test_self_bleu_on_hand_made_samples():
    pytest.importorskip("sacrebleu")
    # "a b c d" against "a b c e": precisions 3/4, 2/3, 1/2 and 0/1 (exp smoothing: 1 / (2 x 1)), same length
    by_hand = 100 * (3 / 4 * 2 / 3 * 1 / 2 * 1 / 2) ** (1 / 4)
    assert measures.self_bleu(["a b c d", "a b c e"], "word") == pytest.approx(by_hand)
    assert measures.self_bleu(["abcd", "abce"], "character") == pytest.approx(by_hand)
    assert measures.self_bleu(["a b c d", "a b c d", "a b c d"], "word") == pytest.approx(100)
    assert measures.self_bleu(["one"], "word") is None


def test_suggested_temperature_follows_its_rule():
    rows = [{"temperature": 0.5, "copied_fraction": 0.6, "repetition": 0.3},
            {"temperature": 0.8, "copied_fraction": 0.1, "repetition": 0.05},
            {"temperature": 1.2, "copied_fraction": 0.0, "repetition": 0.0}]
    assert measures.suggest_temperature(rows)[0] == 0.8
    worst = [dict(r, copied_fraction=0.9) for r in rows]
    t, why = measures.suggest_temperature(worst)
    assert t == 1.2 and "no temperature" in why


def test_a_model_against_itself_has_no_divergence_and_full_agreement(tiny_run):
    model, vocab, meta = load_model(resolve(tiny_run))
    ids, split, _ = run_split(meta, vocab, model.config.block_size)
    windows = windows_of(split.pieces(ids, "val"), model.config.block_size)
    ref = reference(model, vocab, meta, model.wte.weight.device)
    assert compare(ref, ref, windows) == {"kl": 0.0, "agreement": 1.0, "positions": windows.numel()}
    r = invoke(main, ["eval", "--checkpoint", tiny_run, "--against", tiny_run, "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["kl"] == 0.0 and out["agreement"] == 1.0


@pytest.mark.dtype  # which int8 it is (weight-only with bf16 activations, or dynamic) follows the CPU's kind
def test_int8_against_float32_is_close_but_measured(tiny_run):
    r = invoke(main, ["eval", "--checkpoint", tiny_run, "--against", "int8"])
    assert r.exit_code == 0, r.output
    kl, agree = re.search(r"KL divergence from float32 (\S+) nats/char, top-1 agreement (\S+)%", r.stdout).groups()
    assert 0 <= float(kl) < 0.05 and float(agree) > 80


def test_the_report_is_written_and_its_page_fetches_nothing(run):
    r = invoke(main, ["report", run, "--temperatures", "0.8,1.2", "--samples", "2", "--chars", "40"])
    assert r.exit_code == 0, r.output
    assert r.stdout.split() == [str(run / "report.md"), str(run / "report.html")]
    page = (run / "report.html").read_text(encoding="utf-8")
    md = (run / "report.md").read_text(encoding="utf-8")
    for heading in ("The run", "Compression", "Samples across temperatures", "What precision and exports cost"):
        assert heading in page and f"## {heading}" in md
    assert "Suggested temperature" in md and "zlib" in md and "int8" in md
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]*", "", page)  # the inline curve, whose base64 holds '/'
    assert not re.search(r"https?:|//[a-z]|\bwww\.", text, re.I)  # no address of anything
    assert not re.search(r"<(script|link|iframe|object|embed)\b|@import|url\(", text, re.I)
    for ref in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page):
        assert ref.startswith("data:image/png;base64,"), ref
    assert 'src="data:image/png;base64,' in page or "no loss curve" in page


def test_report_json_holds_every_part(run):
    r = invoke(main, ["report", run, "--temperatures", "1.0", "--samples", "2", "--chars", "30", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert {"run", "compression", "samples", "precision", "took_s"} <= set(out)
    assert "png" not in out["curve"]
    names = [row["name"] for row in out["precision"]["rows"]]
    assert names[:3] == ["float32", "bfloat16", "int8"] and names[-1] == "web page"
    assert out["run"]["alphabet"] == len(read_meta(resolve(run))[0]["vocab"])


def test_bad_runs_are_one_line_errors(tmp_path, tiny_run):
    (tmp_path / "folder").mkdir()
    for args, pattern in ((["report", tmp_path / "missing"], r"run not found: .*missing"),
                          (["report", tmp_path / "folder"], r"not a run directory"),
                          (["report", resolve(tiny_run)], r"not a run directory .*folder"),
                          (["report", tiny_run, "--temperatures", "hot"], r"--temperatures takes numbers"),
                          (["report", tiny_run, "--samples", "1"], r"--samples must be 2"),
                          (["eval", "--checkpoint", tiny_run, "--against", "fp4"], r"not bf16, int8, hf, nor a run")):
        assert_one_line_error(invoke(main, args), pattern)
    assert not list((tmp_path / "folder").iterdir())  # nothing written into what is not a run
