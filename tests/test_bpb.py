"""Bits per byte: the loss in bits over the UTF-8 bytes of the characters scored, beside nats and bits per character
(which compare runs of one alphabet only). Checked against the bytes counted here, on a corpus of one-byte (ASCII),
two-byte (é) and three-byte (Chinese) characters, in the training log and metrics, eval, info, plots and the
playground's run summary."""

import json
import math

import pytest

import chargpt
from chargpt.data.corpus import encode_corpus, split_of
from chargpt.runs.checkpoint import read_meta
from chargpt.runs.info import format_info, run_info
from chargpt.tools.evaluate import evaluate, format_result, utf8_bytes, utf8_lengths
from chargpt.training.validate import eval_line, eval_record

LINES = ["To be, or not to be: that is the question {i}.", "Café crème, s'il vous plaît {i}.",
         "床前明月光，疑是地上霜 {i}。"]
TEXT = "".join(LINES[i % 3].format(i=i) + "\n" for i in range(240))


@pytest.fixture(scope="module")
def mixed_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("bpb")
    (root / "corpus.txt").write_text(TEXT, encoding="utf-8")
    said = []
    chargpt.train(data=str(root / "corpus.txt"), out_dir=str(root / "run"), cache_dir=str(root / "cache"),
                  max_iters=6, eval_interval=3, device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16,
                  batch_size=4, eval_iters=2, dropout=0.0, threads=1, sample_chars=0, dtype="float32",
                  curves=False, log=said.append)
    return root, said


def split_bytes(root, name):
    """UTF-8 bytes per character of the run's `name` split, counted from the characters themselves."""
    corpus = encode_corpus(str(root / "corpus.txt"), cache_dir=str(root / "cache"), log=lambda m: None)
    split = split_of(corpus.ids(), corpus.vocab, 0.1, 16, "blocks")
    text = "".join(corpus.vocab.decode(p) for p in split.pieces(corpus.ids(), name))
    return len(text.encode("utf-8")) / len(text)


def test_training_records_and_logs_bits_per_byte(mixed_run):
    root, said = mixed_run
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    per_char = {name: split_bytes(root, name) for name in ("train", "val")}
    assert 1.2 < per_char["val"] < 2.5  # the mix: bits per byte really differ from bits per character here
    for r in rows:
        for name in ("train", "val"):
            assert r[f"{name}_bpb"] == pytest.approx(r[f"{name}_loss"] / math.log(2) / per_char[name], rel=1e-5)
            assert r[f"{name}_bpb"] < r[f"{name}_bpc"]
    line = next(m for m in said if m.startswith("step      6:"))
    assert f"{rows[-1]['val_bpc']:.3f} bpc, {rows[-1]['val_bpb']:.3f} bpb)" in line


def test_eval_line_and_record_without_bytes_are_as_before():
    losses = {"train": 1.0, "val": 2.0}
    assert "train_bpb" not in eval_record(1, losses, 1e-3, 1.0, {})  # a pairs run: no bits per byte
    assert "bpb" not in eval_line(1, losses, True, {})
    record = eval_record(1, losses, 1e-3, 1.0, {}, {"train": 1.0, "val": 2.0})
    assert record["val_bpb"] == round(2.0 / math.log(2) / 2.0, 6) and record["train_bpb"] == record["train_bpc"]


def test_eval_reports_bits_per_byte_of_the_characters_scored(mixed_run, tmp_path):
    root, _ = mixed_run
    text = "Café crème 床前明月光 {braces: unknown}\n"  # '{', '}' and a few letters are not in the vocabulary
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    r = evaluate(root / "run", tmp_path / "t.txt", device="cpu", progress=False)
    known = read_meta(root / "run" / "best.safetensors")[0]["vocab"].stoi
    scored = [c for c in text[1:] if c in known]  # unknown characters are not scored, and their bytes not counted
    assert "{" not in known and r["unknown"] >= 2
    assert r["scored"] == len(scored) and r["bytes"] == len("".join(scored).encode("utf-8"))
    assert r["bpb"] == pytest.approx(r["bpc"] * r["scored"] / r["bytes"])
    assert f"{r['bpb']:.4f} bits/byte over their {r['bytes']:,} UTF-8 bytes" in format_result(r)
    own = evaluate(root / "run", device="cpu", progress=False)  # the run's validation split
    assert own["bytes"] / own["scored"] == pytest.approx(split_bytes(root, "val"), rel=0.01)


def test_utf8_bytes_counts_in_chunks_and_skips_unknown(monkeypatch):
    from chargpt.data.tokenizer import Vocab
    from chargpt.tools import evaluate as ev
    vocab = Vocab.from_text("aé床😀")
    ids = vocab.encode("aé床😀" * 5)
    lengths = utf8_lengths(vocab)
    assert list(lengths) == [len(c.encode()) for c in vocab.chars]
    monkeypatch.setattr(ev, "BYTES_CHUNK", 3)
    assert utf8_bytes(ids, lengths) == 10 * 5
    known = [i % 4 != 0 for i in range(len(ids))]
    assert utf8_bytes(ids, lengths, known) == sum(len(c.encode()) for i, c in enumerate("aé床😀" * 5) if known[i])


def test_info_plot_and_the_playground_show_bits_per_byte(mixed_run, tmp_path):
    root, _ = mixed_run
    info = run_info(root / "run")
    assert info["best_val_bpb"] == pytest.approx(info["best_val_loss"] / math.log(2) / split_bytes(root, "val"),
                                                 rel=1e-4)
    assert f"{info['best_val_bpb']:.3f} bits/byte" in format_info(info)
    pytest.importorskip("matplotlib")
    from chargpt.runs.plot import figure, plot_runs, read_running, require_metrics
    rows = require_metrics(root / "run")
    lines = {ln.get_label(): ln for ln in figure({"run": rows}, "bpb", {"run": read_running(root / "run")})
             .axes[0].lines}
    assert list(lines["run val"].get_ydata()) == pytest.approx([r["val_bpb"] for r in rows])
    assert "run train (running)" in lines  # the running loss, converted with the training split's bytes
    assert plot_runs([root / "run"], tmp_path / "c.png", unit="bpb").is_file()
    from chargpt.web.runs import Runs
    summary = next(s for s in Runs(root).summaries() if s["name"] == "run")
    assert summary["best_bpb"] == pytest.approx(info["best_val_bpb"])
