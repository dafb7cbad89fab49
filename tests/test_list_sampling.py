"""Writing a list's items (--items runs, chargpt/data/items.py and Generator.items): what an item is (a line with more
than whitespace), a prompt that starts every item (one line), an acrostic giving each item its first character,
--new-only that finds nothing failing, and best-of refused before it builds anything."""

import random

import numpy as np
import pytest
from helpers import TINY_RUN_KW, assert_one_line_error, invoke

import chargpt
from chargpt.cli import sample_cli
from chargpt.data.items import ItemSamples, corpus_items, items_layout
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ConfigError
from chargpt.sampling.engine import Generator

LETTERS = "abcdefgh"


@pytest.fixture(scope="module")
def list_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("list")
    rng = random.Random(0)
    items = sorted({"".join(rng.choice(LETTERS) for _ in range(rng.randint(3, 6))) for _ in range(40)})
    (root / "names.txt").write_text("\n".join(items) + "\n")
    chargpt.train(**{**TINY_RUN_KW, "max_iters": 30, "eval_interval": 30}, data=str(root / "names.txt"), items=True,
                  out_dir=str(root / "run"), cache_dir=str(root / "cache"), log=lambda *a: None)
    return root / "run", set(items)


def sample(run, *args):
    return invoke(sample_cli, ["--checkpoint", run, "--device", "cpu", "--seed", 1, "--max-new-tokens", 20, *args])


def test_whitespace_only_lines_are_no_items():
    text = "abc\n  \n\t\ndef\n \t \nghi jk\n\n"
    vocab = Vocab.from_text(text)
    ids = np.array(vocab.encode(text), dtype=vocab.id_dtype)
    assert items_layout(ids, vocab, 0.34, 4).n_train + items_layout(ids, vocab, 0.34, 4).n_val == 3
    corpus = type("Corpus", (), {"vocab": vocab, "ids": lambda self: ids})()
    assert corpus_items(corpus) == {"abc", "def", "ghi jk"}


def test_a_prompt_with_a_line_break_is_refused(list_run):
    run, _ = list_run
    gen = chargpt.load(run, device="cpu", dtype="float32")
    with pytest.raises(ConfigError, match=r"the prompt starts every one, so it may not hold a line break"):
        gen.items(3, "ab\ncd", seed=1)
    assert_one_line_error(sample(run, "--prompt", "ab\ncd", "--num-samples", 3), r"may not hold a line break; give "
                                                                                  r"--prompt one line")


def test_an_acrostic_gives_each_item_its_first_character(list_run):
    run, _ = list_run
    gen = chargpt.load(run, device="cpu", dtype="float32")
    got = gen.items(7, acrostic="abc", seed=2, max_new_tokens=12)
    assert [t[0] for t in got.items] == list("abcabca") and all("\n" not in t for t in got.items), got.items
    result = sample(run, "--acrostic", "hgf", "--num-samples", 4)
    assert result.exit_code == 0, result.output
    assert [line[0] for line in result.stdout.splitlines()] == list("hgfh"), result.stdout
    assert_one_line_error(sample(run, "--acrostic", "ab", "--prompt", "c"),
                          r"--acrostic gives each item its first character, so it cannot follow a --prompt")


def test_new_only_finding_no_new_item_fails_saying_so(list_run, monkeypatch):
    run, items = list_run
    monkeypatch.setattr(Generator, "known_items", lambda self, *a: items)
    monkeypatch.setattr(Generator, "items", lambda self, n, *a, **kw: ItemSamples([], 10 * n, 0, 0, 10 * n))
    result = sample(run, "--new-only", "--num-samples", 4)
    assert_one_line_error(result, r"^error: no item in 40 tries \(at most 10 per item\): every one copied the list "
                                  r"\(--new-only\); try another --seed or a higher --temperature$")
    assert result.stdout == ""


def test_best_of_on_a_list_is_refused_before_the_copy_index_is_built(list_run, monkeypatch):
    run, _ = list_run
    built = []
    monkeypatch.setattr(Generator, "copy_check", lambda self, *a, **kw: built.append(1))
    assert_one_line_error(sample(run, "--best-of", 3), r"--best-of ranks text samples; a list's items take --new-only")
    assert built == []
