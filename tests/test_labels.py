"""Texts with parts: a list trained as items (--items: whole items validate, samples are items, copies counted) and
several labelled texts in one model (--labels: each label writes its own style, survives the Hugging Face export,
validates on its own, and keeps its id through --resume and --init-from)."""

import json
import math
import random
import re
from dataclasses import replace

import numpy as np
import pytest
from helpers import TINY_RUN_KW, assert_one_line_error, invoke, need

import chargpt
from chargpt.cli import sample_cli
from chargpt.data.items import items_layout, split_items
from chargpt.data.tokenizer import Vocab
from chargpt.runs.info import format_info, run_info

ITEM_LETTERS = "abcdefgh"
STYLES = {"a": "abc", "b": "xyz"}


def make_items(n=24, seed=0):
    rng = random.Random(seed)
    return sorted({"".join(rng.choice(ITEM_LETTERS) for _ in range(rng.randint(3, 6))) for _ in range(n)})


def styled_text(alphabet, chars, rng):
    out = []
    while sum(map(len, out)) < chars:
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) + rng.choice(" \n"))
    return "".join(out)


def style_of(text):
    """The independent classifier: the label whose alphabet holds most of the text's letters."""
    counts = {label: sum(c in alphabet for c in text) for label, alphabet in STYLES.items()}
    return max(counts, key=counts.get) if any(counts.values()) else None


def train(log, **kw):
    return chargpt.train(**{**TINY_RUN_KW, "n_embd": 32, "curves": False, **kw}, log=log)


# --- lists ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def items_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("items")
    items = make_items()
    long_item = "abcdefgh" * 4  # 32 characters: longer than the context of 16
    (root / "names.txt").write_text("\n".join(items[:10]) + "\n\n\n" + "\n".join(items[10:] + [long_item]) + "\n")
    lines = []
    train(lines.append, data=root / "names.txt", items=True, out_dir=root / "run", cache_dir=root / "cache",
          max_iters=300, eval_interval=300, val_fraction=0.2)
    return root, set(items) | {long_item}, lines


def test_validation_holds_out_whole_items():
    items = make_items(40)
    text = "\n".join(items[:20]) + "\n\n" + "\n".join(items[20:]) + "\n"  # a blank line: no item
    vocab = Vocab.from_text(text)
    layout = items_layout(np.array(vocab.encode(text), dtype=vocab.id_dtype), vocab, 0.2, 8)
    train, val = split_items(len(items), 0.2)

    def read(side):
        a, b = layout.split.__getattribute__(side)[0]
        part = vocab.decode(layout.ids[a:b])
        assert part.startswith("\n") and part.endswith("\n")  # every item after a newline, ending with one
        return [t for t in part.split("\n") if t]

    assert read("train") == [items[i] for i in train] and read("val") == [items[i] for i in val]
    assert len(val) == 8 and not set(train) & set(val) and sorted([*train, *val]) == list(range(40))
    assert items_layout(np.array(vocab.encode(text), dtype=vocab.id_dtype), vocab, 0.2, 8).split.val.tolist() \
        == layout.split.val.tolist()  # the same items validate every time


def test_items_run_says_its_split_and_warns_of_long_items(items_run):
    _, items, lines = items_run
    said = "\n".join(lines)
    assert re.search(rf"items: {len(items)} items .*validation: {int(len(items) * 0.2)} whole items", said)
    assert "warning: 1 item(s) are longer than the context" in said and "the longest has 32 characters" in said


def test_sampling_writes_items_and_counts_copies_exactly(items_run):
    root, items, _ = items_run
    latest = root / "run/latest.safetensors"  # its best is from before it memorised the list
    result = invoke(sample_cli, ["--checkpoint", latest, "--num-samples", 12, "--seed", 1, "--temperature", 0.3,
                                 "--device", "cpu"])
    assert result.exit_code == 0, result.output
    written = result.stdout.splitlines()
    assert len(written) == 12 and all(written)  # one item a line, none empty
    copies = sum(w in items for w in written)  # the set lookup, here
    assert copies >= 1  # a tiny list at a low temperature: the model repeats what it memorised
    assert f"12 item(s), {copies} of them exact copies of an item of the list" in result.stderr


def test_new_only_leaves_copies_out(items_run):
    root, items, _ = items_run
    result = invoke(sample_cli, ["--checkpoint", root / "run/latest.safetensors", "--num-samples", 6, "--seed", 2,
                                 "--new-only", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    written = result.stdout.splitlines()
    assert written and not set(written) & items
    assert re.search(r"\d+ cop(y|ies) left out \(--new-only\)", result.stderr)
    assert len(written) == 6 or f"only {len(written)} of 6 items" in result.stderr


def test_items_from_python_and_a_run_without_its_list(items_run):
    root, items, _ = items_run
    gen = chargpt.load(root / "run/latest.safetensors", device="cpu", dtype="float32")
    got = gen.items(5, "ab", seed=3, known=items, max_new_tokens=20)
    assert len(got.items) == 5 and all(t.startswith("ab") and "\n" not in t for t in got.items)
    assert got.copies == sum(t in items for t in got.items)
    gen.meta = {**gen.meta, "corpus_key": "0" * 32,
                "train_config": replace(gen.meta["train_config"], data=str(root / "gone.txt"))}
    said = []
    gen.log = said.append
    assert gen.known_items() is None and len(said) == 1 and said[0].startswith("copies of the list are not counted")


# --- labels --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def label_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    rng = random.Random(0)
    for label, alphabet in STYLES.items():
        (root / "authors" / label).mkdir(parents=True)
        (root / "authors" / label / "1.txt").write_text(styled_text(alphabet, 2500, rng))
        (root / "authors" / label / "2.txt").write_text(styled_text(alphabet, 500, rng))
    lines = []
    train(lines.append, data=root / "authors", labels="folders", out_dir=root / "run", cache_dir=root / "cache",
          max_iters=300, eval_interval=150, eval_iters=4)
    return root, lines


@pytest.mark.parametrize("guidance", [None, 2.0])
def test_each_label_writes_its_style(label_run, guidance):
    root, _ = label_run
    gen = chargpt.load(root / "run", device="cpu", dtype="float32")
    for label in STYLES:  # 40 characters: past the context of 16, so the window slides and keeps the label
        texts = gen.generate("", label=label, guidance=guidance, num_samples=20, max_new_tokens=40, seed=1)
        right = sum(style_of(t) == label for t in texts)
        assert right >= 19, (label, texts)


def test_start_up_lists_labels_and_metrics_hold_each_label(label_run):
    root, lines = label_run
    shares = r"labels: 2 \(a 50.0%, b 50.0% of the characters\); batches draw them proportional"
    assert any(re.match(shares, line) for line in lines), lines
    rows = [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "val_loss" in r]
    assert evals and all(set(r["val_loss_by_label"]) == {"a", "b"} for r in evals)
    assert evals[-1]["val_loss_by_label"]["a"] < evals[0]["val_loss_by_label"]["a"]
    info = run_info(root / "run")
    assert info["labels"] == ["a", "b"] and info["val_loss_by_label"] == evals[-1]["val_loss_by_label"]
    assert re.search(r"labels +a, b \(val loss at the last evaluation: a \d\.\d{3}, b \d\.\d{3}\)", format_info(info))


def test_an_unknown_label_is_a_one_line_error_listing_the_labels(label_run):
    root, _ = label_run
    result = invoke(sample_cli, ["--checkpoint", root / "run", "--label", "c", "--device", "cpu"])
    assert_one_line_error(result, r"unknown label 'c'; this run's labels: a, b$")


def test_the_label_survives_the_hugging_face_export(label_run, tmp_path):
    need("transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    root, _ = label_run
    from chargpt.tools.export import export
    export(root / "run", to=tmp_path / "hf", log=lambda _: None)
    model, tok = AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert "⟨a⟩" in (tmp_path / "hf" / "README.md").read_text()
    for label in STYLES:
        ids = tok(f"⟨{label}⟩", return_tensors="pt").input_ids
        assert ids.shape == (1, 1)  # one token, the label's id
        torch.manual_seed(0)
        out = model.generate(ids, do_sample=True, max_new_tokens=12, num_return_sequences=20)
        texts = tok.batch_decode(out, skip_special_tokens=True)
        assert sum(style_of(t) == label for t in texts) >= 19, texts


def test_balanced_sampling_keeps_a_small_label_learnable(tmp_path):
    rng = random.Random(1)
    (tmp_path / "big.txt").write_text(styled_text("abcdefg", 7600, rng))
    (tmp_path / "small.txt").write_text(styled_text("xyz", 400, rng))
    train(lambda _: None, data=tmp_path, labels="files", label_sampling="balanced", out_dir=tmp_path / "run",
          cache_dir=tmp_path / "cache", max_iters=200, eval_interval=200, eval_iters=8)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    uniform = math.log(len(chargpt.load(tmp_path / "run", device="cpu").vocab))
    small = [r["val_loss_by_label"]["small"] for r in rows if "val_loss_by_label" in r]
    assert small[0] > 0.9 * uniform and small[-1] < 0.7 * uniform, (small, uniform)


def test_labels_on_resume_and_init_from(label_run, tmp_path):
    root, _ = label_run
    base = chargpt.load(root / "run", device="cpu")
    chargpt.train(**{**TINY_RUN_KW, "n_embd": 32}, out_dir=root / "run", resume=True, max_iters=320,
                  cache_dir=root / "cache", log=lambda _: None)
    resumed = chargpt.load(root / "run/latest.safetensors", device="cpu")
    assert resumed.meta["step"] == 320 and resumed.labels == base.labels and resumed.vocab == base.vocab
    rng = random.Random(2)
    for label, alphabet in (("a", "abc"), ("c", "pqr")):  # a label the base has, and a new one
        (tmp_path / "more" / label).mkdir(parents=True)
        (tmp_path / "more" / label / "t.txt").write_text(styled_text(alphabet, 800, rng))
    chargpt.train(**{**TINY_RUN_KW, "n_embd": 32}, data=tmp_path / "more", labels="folders", out_dir=tmp_path / "run",
                  init_from=root / "run", cache_dir=tmp_path / "cache", max_iters=20, log=lambda _: None)
    grown = chargpt.load(tmp_path / "run/latest.safetensors", device="cpu")
    assert grown.labels.names["a"] == base.labels.names["a"] and set(grown.labels.names) == {"a", "b", "c"}
    assert grown.vocab.chars[:len(base.vocab)] == base.vocab.chars  # the base's ids kept, new ones after
    assert len(grown.generate("", label="c", max_new_tokens=5, seed=0)[0]) == 5


@pytest.mark.parametrize("rule, dropout, small_share", [("proportional", 0.0, 0.05), ("balanced", 0.0, 0.5),
                                                        ("balanced", 0.2, 0.4)])
def test_batches_draw_labels_by_their_rule(rule, dropout, small_share):
    import types

    import torch

    from chargpt.data.labels import LabelBatches
    ids = np.tile(np.arange(1, 9, dtype=np.uint16), 1250)  # 10,000 characters: 9,500 of "big", 500 of "small"
    cfg = types.SimpleNamespace(batch_size=4000, label_dropout=dropout, label_sampling=rule, val_fraction=0.1,
                                val_split="blocks")
    batches = LabelBatches(ids, {"big": (0, 9500), "small": (9500, 10000)}, {"big": 10, "small": 11}, 9, cfg, 16, None,
                           "cpu")
    x, y = batches.get("train", torch.Generator().manual_seed(0))
    assert torch.equal(x[:, 1:], y[:, :-1]) and x.shape == (4000, 16)  # [label] + 15 characters, y one further
    assert abs((x[:, 0] == 11).float().mean().item() - small_share) < 0.03
    assert abs((x[:, 0] == 9).float().mean().item() - dropout) < 0.03  # NULL, for --label-dropout of the windows
    x, _ = batches.get("val", torch.Generator().manual_seed(0), label=1)
    assert (x[:, 0] == 11).all()  # one label's own validation windows, never unlabelled


def test_samples_while_training_a_labels_run_start_unlabelled(monkeypatch):
    """--sample-every on a labels run: the sample starts with the "no label" token, as the unlabelled windows it
    trained on; a run without labels starts from the prompt alone."""
    from chargpt.data.labels import NULL
    from chargpt.training import samples
    seen = []
    monkeypatch.setattr(samples, "sample_text", lambda model, vocab, device, prompt, *a: seen.append(prompt) or "x")
    quiet = type("Quiet", (), {"score": lambda self, text: None, "write": lambda self, *a: None})()
    for chars in ("ab\n" + NULL, "ab\n"):
        samples.Samples(None, Vocab(sorted(chars)), "cpu", "a", 5, 0, quiet, quiet, lambda *a: None).write(10)
    assert seen == [NULL + "a", "a"]
