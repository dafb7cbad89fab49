"""chargpt export: a transformers folder that computes what the run computes, and says so.

Models are built in-process with every parameter drawn at random (biases and LayerNorms included, so a dropped or
misplaced one shows), saved as chargpt checkpoints, exported, and loaded back the way a user would: with the Auto
classes and no custom code. All in float32 on the CPU.
"""

import json
import math
import subprocess
import sys

import pytest
import torch
from helpers import ROOT, run_chargpt
from safetensors import safe_open

import chargpt.export as export_module
from chargpt.checkpoint import read_meta, save_model
from chargpt.config import ModelConfig
from chargpt.engine import Generator
from chargpt.errors import ChargptError
from chargpt.export import FILES, export
from chargpt.model import build_model
from chargpt.pairs import END, SEP
from chargpt.tokenizer import Vocab

transformers = pytest.importorskip("transformers")  # the export extra, which the test extra installs
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

# English with a tab, runs of spaces and a Windows line end, Chinese, emoji (one with a skin-tone modifier)
TEXT = "To be,\tor not   to be:  that is\r\nthe question.\n床前明月光，疑是地上霜。\nOK 😀👍🏽!?\n"
VOCAB = Vocab.from_text(TEXT)


def random_model(seed=0, vocab=VOCAB, scale=0.3, block_size=32, **options):
    """A float32 model whose every parameter is random: N(1, scale) for LayerNorm weights, N(0, scale) otherwise."""
    cfg = ModelConfig(vocab_size=len(vocab), block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                      **options).validate()
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if ".ln_" in f".{name}" and name.endswith("weight") else 0.0, scale)
    return model.eval()


def exported(tmp_path, model, vocab=VOCAB, task="text", name="hf", **meta):
    """Save `model` as a chargpt checkpoint and export it; -> the export folder."""
    ckpt = tmp_path / f"{name}.safetensors"
    save_model(ckpt, model, vocab, {"task": task}, step=7, val_loss=1.5, **meta)
    return export(ckpt, tmp_path / name, log=lambda m: None)


@pytest.mark.parametrize("options", [dict(), dict(bias=False), dict(tie_weights=False),
                                     dict(bias=False, tie_weights=False), dict(pos_emb="sinusoidal"),
                                     dict(activation="relu"), dict(emb_scale=True, tie_weights=False)],
                         ids=["bias-tied", "nobias-tied", "bias-untied", "nobias-untied", "sinusoidal", "relu",
                              "emb-scale-untied"])
@torch.no_grad()
def test_exported_logits_equal_chargpts(tmp_path, options):
    model = random_model(**options)
    folder = exported(tmp_path, model)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()  # no trust_remote_code
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.dtype == torch.float32
    assert hf.config.activation_function == options.get("activation", "gelu")  # exact erf GELU, not gelu_new
    assert hf.config.n_positions == hf.config.n_ctx == 32 and hf.config.layer_norm_epsilon == model.h[0].ln_1.eps
    assert hf.config.tie_word_embeddings == model.config.tie_weights
    ids = torch.randint(len(VOCAB), (3, 32), generator=torch.Generator().manual_seed(1))  # (B, T): every position
    assert (hf(ids).logits - model(ids)[0]).abs().max().item() <= 1e-5


def test_weights_file_is_plain_gpt2(tmp_path):
    """No attention-mask buffers; a --no-bias run's biases are zeros; a tied head is stored once."""
    folder = exported(tmp_path, random_model(bias=False))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        biases = {k: f.get_tensor(k) for k in names if k.endswith(".bias")}
    assert not [k for k in names if k.endswith((".attn.bias", ".attn.masked_bias"))]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    assert len(biases) == 2 * 6 + 1 and all((t == 0).all() for t in biases.values())  # 6 per block, and ln_f
    assert {p.name for p in folder.iterdir()} == set(FILES)


def test_greedy_generation_continues_as_chargpt(tmp_path):
    model = random_model(seed=3, scale=0.5, block_size=128)  # room for the prompt and 100 characters: no sliding
    folder = exported(tmp_path, model)
    prompt = "To be"
    ours = Generator(model, VOCAB, "cpu").generate(prompt, max_new_tokens=100, temperature=0)[0]
    assert len(ours) == 100 and len(set(ours)) >= 8  # a varied continuation, not one repeated character
    with torch.no_grad():  # no step is a near-tie that float rounding could flip: the verdict is the export's
        logits = model(torch.tensor([VOCAB.encode(prompt + ours)]))[0][0, len(prompt) - 1:-1]  # (100, V)
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    hf, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = hf.generate(ids, max_new_tokens=100, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:]) == ours
    piped = pipeline("text-generation", model=str(folder))(prompt, max_new_tokens=10, do_sample=False)
    assert piped[0]["generated_text"] == prompt + ours[:10]  # decoded with skip_special_tokens: nothing dropped


def test_tokenizer_round_trips_with_chargpts_ids(tmp_path):
    folder = exported(tmp_path, random_model())
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(TEXT)["input_ids"]
    assert ids == VOCAB.encode(TEXT)  # every character, \r, \n, \t and each space included, has chargpt's id
    assert tok.decode(ids) == TEXT and tok.decode(ids, skip_special_tokens=True) == TEXT
    assert tok.decode(tok("a  b . e ,")["input_ids"]) == "a  b . e ,"  # no clean-up of spaces before punctuation
    stand_in = VOCAB.replacement()  # chargpt's --unknown replace: a character of the vocabulary
    assert stand_in == "?" and tok("é")["input_ids"] == [VOCAB.stoi["?"]]
    assert tok.convert_ids_to_tokens(list(range(len(VOCAB)))) == VOCAB.chars


def test_export_command_writes_a_model_card(tiny_run, tmp_path):
    target = tmp_path / "shared" / "tiny-hf"
    r = run_chargpt("export", "--checkpoint", tiny_run, "--to", target)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target) and "reproduces its logits" in r.stderr
    card = (target / "README.md").read_text(encoding="utf-8")
    meta, _ = read_meta(tiny_run / "best.safetensors")  # what a run directory exports: its best checkpoint
    size = len((tiny_run.parent / "corpus.txt").read_text(encoding="utf-8"))
    assert f"on **corpus** ({size:,} characters, 10% held out for validation in blocks spread through it)" in card
    assert "1 layers x 16 wide, 2 heads, context 16" in card and f"{meta['step']:,} steps" in card
    loss = meta["val_loss"]
    assert f"{loss:.4f} nats per character ({loss / math.log(2):.4f} bits per character)" in card
    assert 'AutoModelForCausalLM.from_pretrained("tiny-hf")' in card and "AutoTokenizer.from_pretrained" in card
    gen = json.loads((target / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["temperature"] == 0.8 and gen["top_k"] == 0 and gen["top_p"] == 1.0
    assert gen["max_length"] == 16  # GPT-2 in transformers cannot go past its positions
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_pairs_decoder_stops_at_the_end_marker(tmp_path):
    vocab = Vocab.from_text(TEXT + SEP + END)
    folder = exported(tmp_path, random_model(vocab=vocab), vocab, task="pairs")
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == vocab.stoi[END]
    assert "U+E000" in (folder / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("options, named", [
    (dict(arch="encoder-decoder"), "arch"), (dict(norm="post"), "norm"), (dict(emb_scale=True), "emb_scale")])
def test_what_gpt2_cannot_compute_is_refused_by_name(tmp_path, options, named):
    vocab = Vocab.from_text(TEXT + SEP + END)
    task = "pairs" if options.get("arch") else "text"
    with pytest.raises(ChargptError, match=named):
        exported(tmp_path, random_model(vocab=vocab, **options), vocab, task=task)
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_errors_are_one_line_and_leave_folders_alone(tmp_path):
    ckpt = tmp_path / "post.safetensors"
    save_model(ckpt, random_model(norm="post"), VOCAB, {"task": "text"})
    r = run_chargpt("export", "--checkpoint", ckpt, "--to", tmp_path / "out")
    assert r.returncode == 1 and r.stderr.startswith("error: --norm post cannot be exported")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    save_model(ckpt, random_model(), VOCAB, {"task": "text"})
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):  # not empty; and --force replaces only an earlier export
        r = run_chargpt("export", "--checkpoint", ckpt, "--to", busy, *force)
        assert r.returncode == 1 and r.stderr.startswith("error: --to") and len(r.stderr.splitlines()) == 1
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    (busy / "config.json").write_text("{}")  # a config.json alone does not make a folder an export
    r = run_chargpt("export", "--checkpoint", ckpt, "--to", busy, "--force")
    assert r.returncode == 1 and "is not an earlier export" in r.stderr and (busy / "notes.txt").read_text() == "mine"
    r = run_chargpt("export", "--checkpoint", ckpt)
    assert r.returncode == 1 and r.stderr == "error: --to is required: the folder to write the export to\n"


def test_force_replaces_an_earlier_export(tmp_path):
    first = exported(tmp_path, random_model(seed=1))
    (first / "stale.txt").write_text("from before")
    ckpt = tmp_path / "second.safetensors"
    save_model(ckpt, random_model(seed=2), VOCAB, {"task": "text"})
    with pytest.raises(ChargptError, match="not empty"):
        export(ckpt, first, log=lambda m: None)
    export(ckpt, first, force=True, log=lambda m: None)
    assert not (first / "stale.txt").exists() and (first / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    """A full disk half-way through: the earlier export is intact and no temporary folder is left."""
    first = exported(tmp_path, random_model(seed=1))
    before = {p.name: p.read_bytes() for p in first.iterdir()}

    def full_disk(model, vocab, meta, folder, name):
        (folder / "config.json").write_text("{")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "write_hf", full_disk)
    with pytest.raises(ChargptError, match=r"could not write .*No space left on device.*nothing was changed"):
        export(tmp_path / "hf.safetensors", first, force=True, log=lambda m: None)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_missing_transformers_is_one_line(tmp_path, monkeypatch):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, {"task": "text"})
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ChargptError, match=r'pip install -e "\.\[export\]"'):
        export(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_other_commands_do_not_import_transformers():
    code = "import sys, chargpt, chargpt.cli, chargpt.config; print(sorted({'transformers', 'tokenizers'} & " \
           "set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr
