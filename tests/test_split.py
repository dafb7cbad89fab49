"""The train/validation split of text: blocks spread through the corpus (the default), or the classic tail; what
training says about it, and old runs keeping the split they were trained with."""

import json
import re

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import chargpt
from chargpt.config import TrainConfig
from chargpt.data.corpus import Batches, make_split, split_of, val_snippet
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ConfigError, DataError
from chargpt.runs.rundir import BEST, LATEST, STATE
from chargpt.tools.evaluate import evaluate

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", curves=False, verbose=True)


def drifting_text(lines=4000):
    """A file that is not uniform, like most: plain songs first, then, in the last 10%, lines with words of their
    own (as a Tang anthology's named poets come last)."""
    head = [f"song {i}: the river runs to the sea\n" for i in range(lines * 9 // 10)]
    tail = [f"poem {i}: 郊廟 ode of the bright hall\n" for i in range(lines - len(head))]
    return "".join(head + tail)


def encoded(text):
    vocab = Vocab.from_text(text)
    return np.array(vocab.encode(text), dtype=vocab.id_dtype), vocab


def chars_in(ids, vocab, segs):
    return set("".join(vocab.decode(ids[a:b]) for a, b in segs))


def test_blocks_validate_the_whole_file_where_the_tail_sees_only_its_end():
    ids, vocab = encoded(drifting_text())
    tail = split_of(ids, vocab, 0.1, 64, "tail")
    assert "郊" in chars_in(ids, vocab, tail.val) and "郊" not in chars_in(ids, vocab, tail.train)  # unlearnable
    blocks = split_of(ids, vocab, 0.1, 64, "blocks")
    assert blocks.size("val") / len(ids) == pytest.approx(0.1, abs=0.01)
    assert len(blocks.val) >= 9  # many stretches...
    starts = blocks.val[:, 0] / len(ids)
    assert starts.min() < 0.2 and starts.max() > 0.9  # ...from all through the file
    assert chars_in(ids, vocab, blocks.val) <= chars_in(ids, vocab, blocks.train)  # nothing validation alone holds
    newline = vocab.stoi["\n"]
    for a, b in blocks.val:  # every cut between training and validation text is at a line end
        assert ids[a - 1] == newline and (b == len(ids) or ids[b - 1] == newline)
    # deterministic, and the two sides cover the corpus exactly once
    again = split_of(ids, vocab, 0.1, 64, "blocks")
    assert np.array_equal(again.val, blocks.val) and np.array_equal(again.train, blocks.train)
    covered = np.zeros(len(ids), dtype=int)
    for a, b in np.concatenate([blocks.train, blocks.val]):
        covered[a:b] += 1
    assert (covered == 1).all()


def test_training_windows_never_reach_into_validation_text():
    ids, vocab = encoded(drifting_text(2000))
    split = split_of(ids, vocab, 0.2, 32, "blocks")
    is_val = np.zeros(len(ids), dtype=bool)
    for a, b in split.val:
        is_val[a:b] = True
    marked = np.arange(len(ids))  # windows of positions: which characters each window covers
    batches = Batches(marked, 0.2, 32, 256, "cpu", split)
    gen = torch.Generator().manual_seed(0)
    for name, want in (("train", False), ("val", True)):
        x, y = batches.get(name, gen)
        covered = torch.cat([x, y[:, -1:]], dim=1).numpy()  # (B, T+1) positions
        assert (is_val[covered] == want).all()
        assert torch.equal(y[:, :-1], x[:, 1:])


def test_the_tail_split_is_the_classic_last_fraction():
    ids = np.arange(1000, dtype=np.uint16)
    split = make_split(ids, 0.1, 8, "tail")
    assert split.train.tolist() == [[0, 900]] and split.val.tolist() == [[900, 1000]]


def test_a_corpus_too_small_for_blocks_says_what_to_do():
    ids, vocab = encoded("ab\n" * 30)
    with pytest.raises(DataError, match=r"validation split is empty: .* use block_size=3 or less, give at least 820 "
                                        r"characters, or use val_split='tail'"):
        split_of(ids, vocab, 0.1, 40, "blocks")
    assert len(split_of(ids, vocab, 0.1, 3, "blocks").val)  # the hints are true
    with pytest.raises(DataError, match=r"or use val_split='tail' with block_size=8 or less$"):
        split_of(ids, vocab, 0.1, 40, "blocks")
    assert len(split_of(ids, vocab, 0.1, 8, "tail").val)


def suggestions_work(message, length, fraction, block_size):
    """Every way out that a too-short-corpus error suggests splits the corpus when taken: a shorter context (in the
    split the message is about), the tail split (with the context it names), a larger fraction."""
    ids, vocab = encoded(("ab\n" * length)[:length])
    how = "blocks" if "val_split='blocks'" in message else "tail"
    hints = re.split(r"\): |; ", message)[-1]  # what the message suggests
    assert "give at least" in hints, message
    more = int(re.search(r"give at least ([\d,]+) characters", hints)[1].replace(",", ""))
    assert len(split_of(*encoded(("ab\n" * more)[:more]), fraction, block_size, how).val), message
    if tail := re.search(r"val_split='tail'(?: with block_size=(\d+) or less)?", hints):
        assert len(split_of(ids, vocab, fraction, int(tail[1] or block_size), "tail").val), message
    if shorter := re.match(r"use block_size=(\d+) or less", hints):
        assert len(split_of(ids, vocab, fraction, int(shorter[1]), how).val), message
    if "a larger val_fraction" in hints:
        assert len(split_of(ids, vocab, 0.5, block_size, "tail").val), message
    return hints


@pytest.mark.parametrize("length", [1, 2, 5, 32, 61, 90, 300, 2041])
@pytest.mark.parametrize("how", ["blocks", "tail"])
def test_a_too_short_corpus_suggests_only_what_works(length, how):
    """A 1-character corpus once suggested --val-split tail, which then failed: every suggestion must work."""
    ids, vocab = encoded(("ab\n" * length)[:length])
    for block_size in (1, 2, 8, 40, 128):
        try:
            split_of(ids, vocab, 0.1, block_size, how)
        except DataError as e:
            hints = suggestions_work(str(e), length, 0.1, block_size)
            if length == 1:  # nothing but more text helps
                assert re.fullmatch(r"give at least [\d,]+ characters", hints), str(e)


def test_val_split_is_checked():
    with pytest.raises(ConfigError, match="val_split must be one of blocks, tail"):
        TrainConfig(val_split="middle").validate()
    assert TrainConfig().val_split == "blocks"


def write_drifting(path):
    path.write_text(drifting_text(600), encoding="utf-8")
    return path


def test_training_says_which_split_and_warns_about_characters_only_validation_has(tmp_path):
    data = write_drifting(tmp_path / "drift.txt")
    logs = []
    chargpt.train(data=str(data), out_dir="tail", max_iters=2, eval_interval=2, val_split="tail", log=logs.append,
                  **TINY_KW)
    text = "\n".join(logs)
    assert "validation: the last" in text and "--val-split tail" in text
    assert "warning: the validation text holds" in text and "'郊'" in text  # and the fix: the blocks split
    logs.clear()
    chargpt.train(data=str(data), out_dir="blocks", max_iters=2, eval_interval=2, log=logs.append, **TINY_KW)
    text = "\n".join(logs)
    assert "stretches spread through the corpus" in text and "warning: the validation text" not in text


def test_the_closing_sample_starts_from_a_line_of_validation_text(tmp_path):
    data = write_drifting(tmp_path / "drift.txt")
    logs = []
    chargpt.train(data=str(data), out_dir="run", max_iters=2, eval_interval=2, log=logs.append,
                  **{**TINY_KW, "sample_chars": 20})
    closing = logs[-1]
    assert "prompted with the start of a validation line" in closing
    ids, vocab = encoded(data.read_text(encoding="utf-8"))
    split = split_of(ids, vocab, 0.1, 16, "blocks")
    prompt = val_snippet(ids, split, vocab)
    assert prompt and repr(prompt) in closing
    val_lines = {ln for a, b in split.val for ln in vocab.decode(ids[a:b]).split("\n")}
    assert any(line.startswith(prompt) for line in val_lines)  # a real line of the validation text
    body = closing.split("---\n", 1)[1]
    assert body.startswith(prompt)  # the sample goes on from it


def strip_val_split(path):
    """Make a checkpoint look written before --val-split existed: no val_split in its train config."""
    with safe_open(str(path), framework="pt") as f:
        header = f.metadata()
    meta = json.loads(header["chargpt"])
    del meta["train_config"]["val_split"]
    save_file(load_file(str(path)), str(path), metadata={**header, "chargpt": json.dumps(meta)})


def test_an_old_run_resumes_and_evaluates_with_the_tail_split_it_was_trained_on(tmp_path):
    data = write_drifting(tmp_path / "drift.txt")
    chargpt.train(data=str(data), out_dir="run", max_iters=4, eval_interval=2, log=lambda m: None, **TINY_KW)
    for name in (STATE, LATEST, BEST):
        strip_val_split(tmp_path / "run" / name)
    logs = []
    chargpt.train(data=str(data), out_dir="run", resume=True, max_iters=6, log=logs.append, **TINY_KW)
    assert any(line.startswith("validation: the last") for line in logs)
    result = evaluate(tmp_path / "run", device="cpu", progress=False)
    assert result["data"].endswith("(0.1, tail)")
    # a new run on the same file validates in blocks; a resumed one never changes its split
    with pytest.raises(ConfigError, match="trained with --val-split tail"):
        chargpt.train(data=str(data), out_dir="run", resume=True, max_iters=8, val_split="blocks",
                      log=lambda m: None, **TINY_KW)
    with pytest.raises(ConfigError, match="trained with --val-fraction 0.1; another fraction moves the split"):
        chargpt.train(data=str(data), out_dir="run", resume=True, max_iters=8, val_fraction=0.2,
                      log=lambda m: None, **TINY_KW)


def test_novelty_indexes_the_split_the_run_trained_with(tmp_path):
    """A line of validation text is copied from the validation split, never from training, under the blocks
    split too (chargpt novelty, sample.py --novelty, the playground)."""
    from chargpt.tools import novelty
    data = write_drifting(tmp_path / "drift.txt")
    chargpt.train(data=str(data), out_dir="run", max_iters=2, eval_interval=2, log=lambda m: None, **TINY_KW)
    index = novelty.for_run(tmp_path / "run", log=lambda m: None)
    ids, vocab = encoded(data.read_text(encoding="utf-8"))
    split = split_of(ids, vocab, 0.1, 16, "blocks")
    a, b = split.val[len(split.val) // 2]
    line = vocab.decode(ids[a:b]).split("\n")[1]  # "song 123: the river runs to the sea": unique by its number
    report = index.score(line)
    assert report.val.longest.length == len(line) and report.train.longest.length < len(line)
    a, b = split.train[1]
    line = vocab.decode(ids[a:b]).split("\n")[1]
    assert index.score(line).train.longest.length == len(line)
