"""chargpt eval: loss and bits/char of a checkpoint on any text, against references computed the slow way."""

import json
import math

import pytest
import torch
from click.testing import CliRunner
from helpers import run_chargpt
from torch.nn import functional as F

import chargpt.tools.evaluate as ev
from chargpt.cli import eval_cli
from chargpt.data.corpus import encode_corpus, split_of
from chargpt.errors import DataError
from chargpt.runs.checkpoint import load_model, read_meta, save_model
from chargpt.runs.rundir import resolve
from chargpt.tools.evaluate import evaluate, window_plan

# only characters of the tiny run's corpus
TEXT = "ROMEO: To be, or not to be: that is the question 7.\nO, she doth teach the torches to be the question.\n"


def naive_nlls(model, ids):
    """-log p of each character after the first, each from the (at most) block_size characters before it: one
    forward per character, the definition that stride 1 must reproduce."""
    T = model.config.block_size
    out = []
    with torch.no_grad():
        for j in range(1, len(ids)):
            ctx = torch.tensor([ids[max(0, j - T):j]])
            logits, _ = model(ctx)
            out.append(F.cross_entropy(logits[0, -1:], torch.tensor([ids[j]])).item())
    return out


def test_eval_on_validation_text_equals_full_validation_loss(tiny_run, tmp_path):
    """The run's validation split (each stretch of it) written out as text files scores exactly what the full
    validation loss (the number bench's quality mode reports) is."""
    full = evaluate(tiny_run, device="cpu")  # no text: the run's own validation split
    meta, _ = read_meta(resolve(tiny_run))
    cfg = meta["train_config"]
    corpus = encode_corpus(cfg.data, cache_dir=cfg.cache_dir)
    split = split_of(corpus.ids(), corpus.vocab, cfg.val_fraction, meta["model_config"].block_size, cfg.val_split)
    assert cfg.val_split == "blocks" and len(split.val) > 1 and "blocks" in full["data"]
    total = scored = 0
    for i, piece in enumerate(split.pieces(corpus.ids(), "val")):
        (tmp_path / f"val{i}.txt").write_text(corpus.vocab.decode(piece), encoding="utf-8")
        part = evaluate(tiny_run, tmp_path / f"val{i}.txt", device="cpu")
        assert part["unknown"] == 0
        total, scored = total + part["loss"] * part["scored"], scored + part["scored"]
    assert total / scored == pytest.approx(full["loss"], rel=1e-9)
    assert scored == full["scored"] == split.size("val") - len(split.val)  # all but each stretch's first
    assert full["characters"] == split.size("val")
    assert full["bpc"] == pytest.approx(full["loss"] / math.log(2))
    # and it is the loss the training loop estimated from a few random batches, to within that estimate's noise
    assert full["loss"] == pytest.approx(meta["val_loss"], abs=0.15)


@pytest.mark.parametrize("n_chars", [5, 40, 95])  # shorter than the window, a few windows, a ragged end
def test_stride_one_scores_every_character_with_a_full_window(tiny_run, n_chars):
    model, vocab, _ = load_model(tiny_run)
    ids = vocab.encode(TEXT[:n_chars])
    total, count = ev.score_ids(model, torch.tensor(ids).numpy(), stride=1, batch_size=7)
    reference = naive_nlls(model, ids)
    assert count == len(ids) - 1
    assert total / count == pytest.approx(sum(reference) / len(reference), rel=1e-5)


def test_stride_of_the_context_is_the_loss_over_consecutive_chunks(tiny_run):
    model, vocab, _ = load_model(tiny_run)
    T = model.config.block_size
    ids = torch.tensor(vocab.encode(TEXT[:3 * T + 1]))  # exactly 3 windows of targets
    total, count = ev.score_ids(model, ids.numpy(), stride=T)
    with torch.no_grad():
        _, chunked = model(ids[:-1].view(3, T), ids[1:].view(3, T))
    assert count == 3 * T and total / count == pytest.approx(chunked.item(), rel=1e-5)


@pytest.mark.parametrize("n_targets,block,stride", [(1, 16, 8), (16, 16, 8), (17, 16, 8), (100, 16, 3), (100, 16, 16)])
def test_window_plan_scores_each_target_exactly_once(n_targets, block, stride):
    starts, fresh, L = window_plan(n_targets, block, stride)
    scored = [s + L - k + i for s, k in zip(starts, fresh) for i in range(k)]  # 0-based target indices
    assert sorted(scored) == list(range(n_targets))
    assert starts[-1] + L == n_targets and all(0 < k <= max(stride, L) for k in fresh[1:])


def test_unknown_characters_are_counted_not_scored_and_stand_in_as_context(tiny_run, tmp_path):
    model, vocab, _ = load_model(tiny_run)
    text = TEXT[:30] + "é€" + TEXT[30:60] + "é"
    (tmp_path / "u.txt").write_text(text, encoding="utf-8")
    r = evaluate(tiny_run, tmp_path / "u.txt", device="cpu", stride=1)
    assert r["unknown"] == 3 and r["unknown_chars"] == {"é": 2, "€": 1} and r["characters"] == len(text)
    assert r["scored"] == len(text) - 1 - 3
    # the documented rule, the slow way: stand-in in the context, unknown targets skipped
    stand_in = vocab.replacement()
    ids = vocab.encode(text.replace("é", stand_in).replace("€", stand_in))
    nlls = [n for n, c in zip(naive_nlls(model, ids), text[1:]) if c in vocab.stoi]
    assert r["loss"] == pytest.approx(sum(nlls) / len(nlls), rel=1e-5)
    assert "3 character(s) outside the model's vocabulary" in ev.format_result(r)


def test_text_is_read_like_a_corpus_with_its_encoding(tiny_run, tmp_path):
    (tmp_path / "utf8.txt").write_text(TEXT, encoding="utf-8")
    (tmp_path / "utf16.txt").write_text(TEXT, encoding="utf-16")
    a = evaluate(tiny_run, tmp_path / "utf8.txt", device="cpu")
    b = evaluate(tiny_run, tmp_path / "utf16.txt", device="cpu", encoding="utf-16")
    assert a["loss"] == pytest.approx(b["loss"], rel=1e-9) and a["scored"] == len(TEXT) - 1


def test_progress_bar_on_long_texts(tiny_run, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ev, "PROGRESS_MIN_CHARS", 10)
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    evaluate(tiny_run, tmp_path / "t.txt", device="cpu")
    captured = capsys.readouterr()
    assert "scoring" in captured.err and captured.out == ""


def test_eval_command_human_and_json(tiny_run, tmp_path):
    (tmp_path / "t.txt").write_text(TEXT + "é", encoding="utf-8")
    r = run_chargpt("eval", "--checkpoint", tiny_run, "--data", tmp_path / "t.txt", "--stride", "4")
    assert r.returncode == 0, r.stderr
    assert "bits/char" in r.stdout and "every 4 (--stride 4)" in r.stdout and "1 character(s) outside" in r.stdout
    r = CliRunner().invoke(eval_cli, ["--checkpoint", str(tiny_run), "--json"])
    assert r.exit_code == 0, r.output
    result = json.loads(r.stdout)
    assert result["data"].startswith("validation split") and result["stride"] == 8 and result["loss"] > 0


@pytest.mark.parametrize("args,needle", [
    (["--data", "missing.txt"], "corpus not found: missing.txt"),
    (["--data", "one.txt"], "needs at least 2"),
    (["--data", "alien.txt"], "none of the characters"),
    (["--stride", "0"], "--stride must be between 1 and"),
    (["--stride", "17"], "--stride must be between 1 and"),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--data", "t.txt", "--encoding", "nope"], "unknown encoding"),
])
def test_eval_bad_input_is_one_line(tiny_run, tmp_path, args, needle):
    (tmp_path / "one.txt").write_text("R", encoding="utf-8")
    (tmp_path / "alien.txt").write_text("ζζζζ", encoding="utf-8")
    (tmp_path / "t.txt").write_text(TEXT, encoding="utf-8")
    r = CliRunner().invoke(eval_cli, ["--checkpoint", str(tiny_run), *args])
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], r.stderr


def test_a_checkpoint_without_its_run_needs_data(tiny_run, tmp_path):
    model, vocab, _ = load_model(tiny_run)
    save_model(tmp_path / "bare.safetensors", model, vocab)  # saved from Python: no training config
    with pytest.raises(DataError, match="no validation split; pass --data FILE"):
        evaluate(tmp_path / "bare.safetensors", device="cpu")


def test_eval_without_a_run_says_how_to_make_one(tmp_path):
    r = CliRunner().invoke(eval_cli, [])
    assert r.exit_code == 1 and "no trained run under checkpoints/" in r.stderr
