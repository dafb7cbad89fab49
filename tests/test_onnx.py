"""chargpt export --format onnx: a folder onnxruntime runs as chargpt's model, with its key/value cache.

Models are built in-process with every parameter drawn at random (biases and LayerNorms included), saved as chargpt
checkpoints, exported, and run with onnxruntime as an app would: the cached generate loop of chargpt.tools.onnx
(Session), which docs/export.md shows.
"""

import json
import re
import sys

import numpy as np
import pytest
import torch
from helpers import ROOT, assert_one_line_error, invoke

from chargpt.cli import export_cli
from chargpt.config import ModelConfig, TrainConfig
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import load_model, save_model
from chargpt.sampling.engine import Generator
from chargpt.tools.onnx import FILES, Session, export_onnx

onnx = pytest.importorskip("onnx")  # the onnx extra, which the test extra installs
pytest.importorskip("onnxruntime")

TEXT = "To be,\tor not   to be:  that is\r\nthe question.\n床前明月光，疑是地上霜。\nOK 😀👍🏽!?\n"
VOCAB = Vocab.from_text(TEXT)


def random_model(seed=0, vocab=VOCAB, scale=0.3, block_size=32, **options):
    cfg = ModelConfig(vocab_size=len(vocab), block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                      **options).validate()
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if ".ln_" in f".{name}" and name.endswith("weight") else 0.0, scale)
    return model.eval()


def exported(tmp_path, model, vocab=VOCAB, name="onnx", task="text", **meta):
    ckpt = tmp_path / f"{name}.safetensors"
    save_model(ckpt, model, vocab, TrainConfig(task=task), step=7, val_loss=1.5, **meta)
    return export_onnx(ckpt, tmp_path / name, log=lambda m: None)


@torch.no_grad()
def test_onnxruntime_gives_the_runs_logits_over_a_validation_window(tiny_run, tmp_path):
    """A trained run, on a window of the text it was validated on: within 1e-4 of chargpt's float32 logits, at
    once and one character at a time through the cache."""
    folder = export_onnx(tiny_run, tmp_path / "run-onnx", log=lambda m: None)
    model, vocab, _ = load_model(tiny_run / "best.safetensors", "cpu")
    model.float().eval()
    text = (tiny_run.parent / "corpus.txt").read_text(encoding="utf-8")
    window = vocab.encode(text[-model.config.block_size:])  # the end of the corpus
    want = model(torch.tensor([window]))[0][0].numpy()
    s = Session(folder)
    whole, _ = s.step([window], s.empty())
    assert np.abs(whole[0] - want).max() <= 1e-4
    past, steps = s.empty(), []
    for i in window:
        logits, past = s.step([[i]], past)
        steps.append(logits[0, -1])
    assert np.abs(np.stack(steps) - want).max() <= 1e-4


@pytest.mark.parametrize("options", [dict(), dict(bias=False), dict(tie_weights=False), dict(pos_emb="sinusoidal"),
                                     dict(norm="post", activation="relu", pos_emb="sinusoidal", emb_scale=True)],
                         ids=["bias-tied", "nobias-tied", "untied", "sinusoidal", "2017"])
@torch.no_grad()
def test_every_decoder_option_computes_as_chargpt(tmp_path, options):
    model = random_model(**options)
    s = Session(exported(tmp_path, model))
    ids = torch.randint(len(VOCAB), (3, 32), generator=torch.Generator().manual_seed(1))
    logits, present = s.step(ids.numpy(), s.empty(3))
    assert np.abs(logits - model(ids)[0].numpy()).max() <= 1e-4
    assert len(present) == 4 and present[0].shape == (3, 2, 32, 8)


@pytest.mark.parametrize("block_size", [256, 48], ids=["in-window", "sliding"])
def test_the_cached_loop_writes_sample_pys_greedy_text(tmp_path, block_size):
    """200 characters at temperature 0; with a window of 48 the cache is rebuilt as sample.py rebuilds it."""
    model = random_model(seed=3, scale=0.5, block_size=block_size)
    prompt = "To be"
    ours = Generator(model, VOCAB, "cpu").generate(prompt, max_new_tokens=200, temperature=0)[0]
    assert len(ours) == 200 and len(set(ours)) >= 3  # not one repeated character
    assert Session(exported(tmp_path, model)).greedy(prompt, 200) == ours


def test_the_docs_generate_loop_writes_sample_pys_greedy_text(tmp_path, capsys):
    """docs/export.md's loop, run as written on a folder of its name, past the window (48) too."""
    doc = (ROOT / "docs" / "export.md").read_text(encoding="utf-8")
    code = next(b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "import onnxruntime as ort" in b)
    vocab = Vocab.from_text(TEXT + "ROMEO:")
    model = random_model(seed=3, scale=0.5, vocab=vocab, block_size=48)
    exported(tmp_path, model, vocab, name="shakespeare-onnx")  # in the current folder: tmp_path
    capsys.readouterr()
    exec(compile(code, "docs/export.md", "exec"), {"__name__": "__doc_example__"})
    ours = Generator(model, vocab, "cpu").generate("ROMEO:", max_new_tokens=200, temperature=0)[0]
    assert capsys.readouterr().out == ours + "\n"


@torch.no_grad()
def test_inputs_and_outputs_are_optimums_gpt2_layout_and_padding_is_masked(tmp_path):
    model = random_model()
    folder = exported(tmp_path, model)
    graph = onnx.load(str(folder / "model.onnx")).graph
    assert [i.name for i in graph.input] == ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key",
                                             "past_key_values.0.value", "past_key_values.1.key",
                                             "past_key_values.1.value"]
    assert [o.name for o in graph.output] == ["logits", "present.0.key", "present.0.value", "present.1.key",
                                              "present.1.value"]
    s = Session(folder)
    ids = VOCAB.encode("To be, or")
    want = model(torch.tensor([ids]))[0][0].numpy()
    padded = np.array([[0, 0] + ids, [1, 2] + ids])  # left padding in row 0, two real characters in row 1
    feed = {"input_ids": padded, "attention_mask": np.array([[0, 0] + [1] * len(ids), [1] * (len(ids) + 2)]),
            "position_ids": np.array([[0, 0, *range(len(ids))], list(range(len(ids) + 2))])}
    feed.update(zip([i.name for i in graph.input][3:], s.empty(2)))
    logits = s.session.run(None, feed)[0]
    assert np.abs(logits[0, 2:] - want).max() <= 1e-4  # the padding is not seen
    assert np.isfinite(logits).all()


def test_vocab_and_config_files(tmp_path):
    folder = exported(tmp_path, random_model())
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert vocab["chars"] == VOCAB.chars and vocab["unknown"] == VOCAB.replacement()
    assert "床" in (folder / "vocab.json").read_text(encoding="utf-8")  # as characters, not \u escapes
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    assert config["format"] == "chargpt-onnx" and (config["block_size"], config["head_size"]) == (32, 8)
    assert "Session(" in (folder / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("options, task, named", [
    (dict(arch="encoder-decoder"), "pairs", "--arch encoder-decoder"), (dict(softmax="adaptive"), "text",
                                                                         "--softmax adaptive"),
    (dict(), "pairs", "a run trained on sentence pairs")])
def test_what_the_cached_decoder_does_not_compute_is_refused(tmp_path, options, task, named):
    vocab = Vocab.from_text(TEXT + SEP + END)
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(vocab=vocab, **options), vocab, TrainConfig(task=task))
    r = invoke(export_cli, ["--checkpoint", ckpt, "--format", "onnx", "--to", tmp_path / "out"])
    assert_one_line_error(r, f"cannot export as ONNX: {named}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_force_replaces_only_an_earlier_onnx_export(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    target = tmp_path / "out"
    args = ["--checkpoint", ckpt, "--format", "onnx", "--to", target]
    assert invoke(export_cli, args).exit_code == 0
    (target / "notes.txt").write_text("mine")
    assert_one_line_error(invoke(export_cli, args), "exists and is not empty")
    r = invoke(export_cli, [*args, "--force"])
    assert r.exit_code == 0 and (target / "notes.txt").read_text() == "mine"  # the export's files, only
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "config.json").write_text("{}")
    assert_one_line_error(invoke(export_cli, [*args[:-1], busy, "--force"]), "is not an earlier ONNX export")
    assert [p.name for p in busy.iterdir()] == ["config.json"]


def test_missing_onnxruntime_is_one_line(tmp_path, monkeypatch):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ChargptError, match=r'pip install -e "\.\[onnx\]"'):
        export_onnx(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
