"""chargpt export --format gguf: a file llama.cpp runs as chargpt's model, read back and computed as llama.cpp would.

Models are built in-process with every parameter drawn at random (biases and LayerNorms included), saved as chargpt
checkpoints and exported. The file is read back with gguf's own reader, and its tensors run through llama.cpp's gpt2
graph written in numpy (chargpt.tools.ggufread.forward). The test that runs llama.cpp itself is skipped where
llama-cpp-python is not installed (it builds llama.cpp from source: pip install -e ".[llama]").
"""

import sys

import numpy as np
import pytest
import torch
from helpers import assert_one_line_error, invoke

from chargpt.cli import export_cli
from chargpt.config import ModelConfig, TrainConfig
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import load_model, save_model
from chargpt.sampling.engine import Generator
from chargpt.tools.gguf import EOS, UNK, export_gguf
from chargpt.tools.ggufread import forward, read_gguf, tokenize

gguf = pytest.importorskip("gguf")  # the gguf extra, which the test extra installs

# English with a tab, runs of spaces and a Windows line end, Chinese, emoji (one with a skin-tone modifier)
TEXT = "To be,\tor not   to be:  that is\r\nthe question.\n床前明月光，疑是地上霜。\nOK 😀👍🏽!?\n"
VOCAB = Vocab.from_text(TEXT)
# llama.cpp's GELU (tanh approximation, from a float16 table) against chargpt's exact one, relative to the largest
# |logit|: 7e-4 measured on these random models; f16 and q8_0 weights add their rounding
GELU_TOLERANCE = 2e-3


def random_model(seed=0, vocab=VOCAB, scale=0.3, block_size=32, n_embd=32, **options):
    """A float32 model whose every parameter is random: N(1, scale) for LayerNorm weights, N(0, scale) otherwise.
    Width 32: q8_0 quantises rows in blocks of 32."""
    cfg = ModelConfig(vocab_size=len(vocab), block_size=block_size, n_layer=2, n_head=2, n_embd=n_embd, dropout=0.0,
                      **options).validate()
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if ".ln_" in f".{name}" and name.endswith("weight") else 0.0, scale)
    return model.eval()


def exported(tmp_path, model, vocab=VOCAB, precision="f32", name="m", task="text", **meta):
    ckpt = tmp_path / f"{name}.safetensors"
    save_model(ckpt, model, vocab, TrainConfig(task=task), step=7, val_loss=1.5, **meta)
    return export_gguf(ckpt, tmp_path / f"{name}.gguf", precision=precision, log=lambda m: None)


def weights(model):
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}


OPTIONS = [dict(), dict(bias=False), dict(tie_weights=False), dict(pos_emb="sinusoidal"),
           dict(emb_scale=True, tie_weights=False), dict(emb_scale=True)]
IDS = ["bias-tied", "nobias-tied", "untied", "sinusoidal", "emb-scale-untied", "emb-scale-tied"]


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_the_file_holds_the_model_under_llama_cpps_gpt2_names(tmp_path, options):
    model = random_model(**options)
    meta, t = read_gguf(exported(tmp_path, model))
    cfg, w, V, C = model.config, weights(model), len(VOCAB), 32
    assert meta["general.architecture"] == "gpt2" and meta["gpt2.context_length"] == cfg.block_size
    assert (meta["gpt2.embedding_length"], meta["gpt2.feed_forward_length"], meta["gpt2.block_count"],
            meta["gpt2.attention.head_count"]) == (C, 4 * C, 2, 2)
    assert meta["gpt2.attention.layer_norm_epsilon"] == pytest.approx(model.h[0].ln_1.eps)
    assert meta["tokenizer.ggml.model"] == "gpt2" and len(meta["tokenizer.ggml.tokens"]) == V + 2
    assert meta["tokenizer.ggml.tokens"][V:] == [EOS, UNK] and meta["tokenizer.ggml.token_type"][V:] == [3, 2]
    assert (meta["tokenizer.ggml.eos_token_id"], meta["tokenizer.ggml.unknown_token_id"]) == (V, V + 1)
    assert meta["tokenizer.ggml.add_bos_token"] is False and meta["general.file_type"] == 0
    assert set(meta["tensor_types"].values()) == {"F32"}
    wte = w["wte.weight"] * (C ** 0.5 if cfg.emb_scale else 1.0)
    standin = wte[VOCAB.stoi[VOCAB.replacement()]]
    assert np.array_equal(t["token_embd.weight"], np.concatenate([wte, [standin, standin]]))
    pos = w["wpe.weight"] if cfg.pos_emb == "learned" else model.pe.numpy()
    assert np.array_equal(t["position_embd.weight"], pos)
    head = w["lm_head.weight"]
    assert np.array_equal(t["output.weight"][:V], head)
    assert np.allclose(t["output.weight"][V:], head.mean(0), atol=1e-7)  # the appended tokens: the mean row
    ours = {"attn_norm": "ln_1", "attn_qkv": "attn.c_attn", "attn_output": "attn.c_proj", "ffn_norm": "ln_2",
            "ffn_up": "mlp.c_fc", "ffn_down": "mlp.c_proj"}
    for i in range(2):
        for theirs, name in ours.items():
            assert np.array_equal(t[f"blk.{i}.{theirs}.weight"], w[f"h.{i}.{name}.weight"])  # (out, in): as is
            bias = w.get(f"h.{i}.{name}.bias", np.zeros(t[f"blk.{i}.{theirs}.bias"].shape, np.float32))
            assert np.array_equal(t[f"blk.{i}.{theirs}.bias"], bias)  # --no-bias: zeros
    assert np.array_equal(t["output_norm.weight"], w["ln_f.weight"])
    assert len(t) == 4 + 1 + 12 * 2  # nothing else


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@torch.no_grad()
def test_llama_cpps_arithmetic_on_the_file_gives_chargpts_logits(tmp_path, options):
    model = random_model(**options)
    meta, t = read_gguf(exported(tmp_path, model))
    ids = torch.randint(len(VOCAB), (32,), generator=torch.Generator().manual_seed(1))  # every position
    want = model(ids[None])[0][0].numpy()
    scale = np.abs(want).max()
    exact = forward(meta, t, ids.numpy(), gelu="erf")  # the file's tensors with chargpt's GELU: the same numbers
    assert np.abs(exact[:, :len(VOCAB)] - want).max() <= 1e-5 * scale
    ggml = forward(meta, t, ids.numpy())[:, :len(VOCAB)]  # llama.cpp's GELU: the one difference
    assert 0 < np.abs(ggml - want).max() <= GELU_TOLERANCE * scale
    assert (exact[:, len(VOCAB):] < exact[:, :len(VOCAB)].max(1, keepdims=True)).all()  # appended: never the best


@pytest.mark.parametrize("precision, file_type, bound", [("f16", 1, 5e-3), ("q8_0", 7, 3e-2)])
@torch.no_grad()
def test_f16_and_q8_0_store_the_matrices_and_keep_the_vectors(tmp_path, precision, file_type, bound):
    model = random_model()
    meta, t = read_gguf(exported(tmp_path, model, precision=precision))
    assert meta["general.file_type"] == file_type
    matrices = {k for k, v in t.items() if v.ndim == 2}
    assert {meta["tensor_types"][k] for k in matrices} == {precision.upper()}
    assert {meta["tensor_types"][k] for k in set(t) - matrices} == {"F32"}  # norms and biases stay f32
    ids = torch.randint(len(VOCAB), (32,), generator=torch.Generator().manual_seed(1))
    want = model(ids[None])[0][0].numpy()
    assert np.abs(forward(meta, t, ids.numpy())[:, :len(VOCAB)] - want).max() <= bound * np.abs(want).max()


def test_rows_q8_0_cannot_block_stay_f16(tmp_path):
    meta, t = read_gguf(exported(tmp_path, random_model(n_embd=16), precision="q8_0"))
    assert meta["tensor_types"]["blk.0.attn_qkv.weight"] == "F16"  # rows of 16: not a multiple of 32
    assert meta["tensor_types"]["blk.0.ffn_down.weight"] == "Q8_0"  # rows of 64


def test_the_tokenizer_gives_every_character_chargpts_id_and_skips_unknown_ones(tmp_path):
    meta, _ = read_gguf(exported(tmp_path, random_model()))
    assert tokenize(meta, TEXT) == VOCAB.encode(TEXT)
    rng = np.random.default_rng(0)  # no merge reaches across characters, in any order
    shuffled = "".join(rng.choice(VOCAB.chars, 500))
    assert tokenize(meta, shuffled) == VOCAB.encode(shuffled)
    unseen = "To be 🙂, 月€!"  # characters the model never saw are left out, as --unknown skip does
    assert tokenize(meta, unseen) == VOCAB.encode(unseen, unknown="skip")
    merges = meta["tokenizer.ggml.merges"]
    assert len(merges) == len(set(merges)) and all(len(m.split(" ")[1]) == 1 for m in merges)


def test_an_ascii_vocabulary_has_a_merge_that_never_applies(tmp_path):
    vocab = Vocab.from_text("abc de\n")
    meta, _ = read_gguf(exported(tmp_path, random_model(vocab=vocab), vocab))
    assert len(meta["tokenizer.ggml.merges"]) == 1  # llama.cpp refuses a gpt2 vocabulary without merges
    assert tokenize(meta, "abc de\nA") == vocab.encode("abc de\n")


def test_the_modelfile_beside_it(tmp_path):
    model = random_model(block_size=48)
    path = exported(tmp_path, model, name="poems")
    text = (tmp_path / "poems.Modelfile").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[1] == "FROM ./poems.gguf" and "ollama create poems -f poems.Modelfile" in lines[0]
    assert {"PARAMETER num_ctx 48", "PARAMETER num_predict 24", "PARAMETER temperature 0.8",
            f"PARAMETER top_k {len(VOCAB) + 2}", "PARAMETER repeat_penalty 1.0", f'PARAMETER stop "{EOS}"',
            'TEMPLATE """{{ .Prompt }}"""'} <= set(lines)
    assert path == tmp_path / "poems.gguf"


@pytest.mark.parametrize("options, task, named", [
    (dict(arch="encoder-decoder"), "pairs", "--arch encoder-decoder"), (dict(norm="post"), "text", "--norm post"),
    (dict(activation="relu"), "text", "--activation relu"), (dict(softmax="adaptive"), "text", "--softmax adaptive"),
    (dict(), "pairs", "a run trained on sentence pairs")])
def test_what_llama_cpps_gpt2_cannot_compute_is_refused_in_one_line(tmp_path, options, task, named):
    vocab = Vocab.from_text(TEXT + SEP + END)
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(vocab=vocab, **options), vocab, TrainConfig(task=task))
    r = invoke(export_cli, ["--checkpoint", ckpt, "--format", "gguf", "--to", tmp_path / "m.gguf"])
    assert_one_line_error(r, f"cannot export as GGUF: {named}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]


def test_a_labels_run_is_refused(tmp_path):
    vocab = Vocab.from_text(TEXT + "\ue100\ue101")
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(vocab=vocab), vocab, TrainConfig(),
               labels={"null": "\ue100", "names": {"austen": "\ue101"}})
    r = invoke(export_cli, ["--checkpoint", ckpt, "--format", "gguf", "--to", tmp_path / "m.gguf"])
    assert_one_line_error(r, "cannot export as GGUF: a run trained with --labels")


def test_targets_and_force(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    target = tmp_path / "m.gguf"
    args = ["--checkpoint", ckpt, "--format", "gguf", "--to", target]
    r = invoke(export_cli, [*args[:-1], tmp_path / "m.bin"])
    assert_one_line_error(r, "a GGUF export is one .gguf file; give a name ending in .gguf")
    r = invoke(export_cli, ["--checkpoint", ckpt, "--to", tmp_path / "hf", "--precision", "f16"])
    assert_one_line_error(r, "--precision is for --format gguf")
    r = invoke(export_cli, [*args, "--precision", "q8_0"])
    assert r.exit_code == 0 and r.stdout.strip() == str(target) and "q8_0" in r.stderr
    first = target.read_bytes()
    r = invoke(export_cli, args)
    assert_one_line_error(r, f"--to {target} exists; pass --force")
    r = invoke(export_cli, [*args, "--force"])  # an earlier export, and its Modelfile: replaced
    assert r.exit_code == 0 and target.read_bytes() != first
    (tmp_path / "m.Modelfile").write_text("FROM llama3\n")  # the user's own Modelfile is not replaced
    r = invoke(export_cli, [*args, "--force"])
    assert_one_line_error(r, "is not a file an earlier GGUF export wrote")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF" + bytes(60))  # a GGUF file, but not one of ours
    r = invoke(export_cli, [*args[:-1], other, "--force"])
    assert_one_line_error(r, "is not a file an earlier GGUF export wrote")
    assert other.read_bytes() == b"GGUF" + bytes(60)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary file left


def test_missing_gguf_is_one_line(tmp_path, monkeypatch):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf now raises ImportError
    with pytest.raises(ChargptError, match=r'pip install -e "\.\[gguf\]"'):
        export_gguf(ckpt, tmp_path / "m.gguf")
    assert not (tmp_path / "m.gguf").exists()


@pytest.mark.parametrize("failure", [KeyboardInterrupt(), OSError(28, "No space left on device")],
                         ids=["ctrl-c", "disk-full"])
def test_an_interrupted_or_failed_export_leaves_nothing(tmp_path, monkeypatch, failure):
    import chargpt.tools.gguf as gguf_module
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())

    def fail(*args):
        raise failure
    monkeypatch.setattr(gguf_module, "check_gguf", fail)  # the file is written, then the check fails
    if isinstance(failure, OSError):
        r = invoke(export_cli, ["--checkpoint", ckpt, "--format", "gguf", "--to", tmp_path / "new" / "m.gguf"])
        assert_one_line_error(r, "No space left on device.*free disk space")
    else:
        with pytest.raises(KeyboardInterrupt):
            export_gguf(ckpt, tmp_path / "new" / "m.gguf")
    assert not (tmp_path / "new").exists()  # no file, no temporary file, and the folder made for them is gone


def test_other_commands_do_not_import_gguf_or_onnx():
    import subprocess
    code = "import sys, chargpt, chargpt.cli, chargpt.config; print(sorted({'gguf', 'onnx', 'onnxruntime', " \
           "'llama_cpp'} & set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


# --- llama.cpp itself ------------------------------------------------------------------------------------------
def greedy_margin(model, vocab, prompt, text):
    """The smallest gap between the best and second-best logit along prompt + text (chargpt's greedy text)."""
    with torch.no_grad():
        logits = model(torch.tensor([vocab.encode(prompt + text)]))[0][0, len(prompt) - 1:-1]
    top2 = logits.topk(2, dim=-1).values
    return float((top2[:, 0] - top2[:, 1]).min())


def llama(path, **kw):
    from llama_cpp import Llama
    return Llama(model_path=str(path), n_ctx=0, n_threads=1, verbose=False, seed=0, **kw)


F32_CACHE = dict(type_k=0, type_v=0)  # GGML_TYPE_F32: llama.cpp keeps keys and values in f16 by default


def test_llama_cpp_tokenizes_and_writes_chargpts_greedy_text(tmp_path, capfd):
    """A model trained for 250 steps (about 5 s) on TEXT and a line, with room in its window for the prompt and 200
    characters: it has learnt the text, so no greedy step is a near-tie."""
    llama_cpp = pytest.importorskip("llama_cpp")  # pip install -e ".[llama]": builds llama.cpp
    import chargpt
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((TEXT + "ROMEO: O, she doth teach the torches to burn bright!\n") * 80, encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(tmp_path / "run"), max_iters=250, eval_interval=250, device="cpu",
                  n_layer=2, n_head=2, n_embd=64, block_size=256, batch_size=4, eval_iters=1, dropout=0.0, threads=1,
                  sample_chars=0, dtype="float32", learning_rate=1e-2, warmup_iters=5, curves=False, val_split="tail",
                  log=lambda *a: None)
    model, vocab, _ = load_model(tmp_path / "run" / "best.safetensors", "cpu")
    model.float().eval()
    text = corpus.read_text(encoding="utf-8")
    prompt = "To be"
    ours = Generator(model, vocab, "cpu").generate(prompt, max_new_tokens=200, temperature=0)[0]  # sample.py's
    assert len(ours) == 200 and len(set(ours)) >= 8
    margin = greedy_margin(model, vocab, prompt, ours)
    assert margin > 0.5  # no step is a near-tie that llama.cpp's GELU could flip: the verdict is the export's
    path = export_gguf(tmp_path / "run", tmp_path / "f32.gguf", log=lambda m: None)
    f32 = llama(path, logits_all=True, **F32_CACHE)
    assert f32.n_vocab() == len(vocab) + 2 and f32.n_ctx() == 256
    assert f32.tokenize(text.encode(), add_bos=False, special=False) == vocab.encode(text)  # the whole corpus
    unseen = "To be 🙂, 月€!"
    assert f32.tokenize(unseen.encode(), add_bos=False) == vocab.encode(unseen, unknown="skip")
    assert f32.detokenize(vocab.encode(text)).decode() == text
    full = vocab.encode(prompt + ours)
    f32.eval(full)  # llama.cpp's logits are what ggufread.forward computes from the file: within a float16 step of
    got = np.asarray(f32.scores[:len(full)])  # its GELU table where an input lies on a rounding boundary
    meta, t = read_gguf(path)
    want = forward(meta, t, full)
    emulated = float(np.abs(got - want).max() / np.abs(want).max())
    with torch.no_grad():
        chargpt = float(np.abs(got[:, :len(vocab)] - model(torch.tensor([full]))[0][0].numpy()).max() /
                        np.abs(want).max())
    assert emulated <= 5e-4
    f32.reset()
    greedy = dict(max_tokens=200, temperature=0, top_k=1, repeat_penalty=1.0)
    assert f32.create_completion(prompt, **greedy)["choices"][0]["text"] == ours
    default = llama(path).create_completion(prompt, **greedy)["choices"][0]["text"]  # f16 keys and values
    q8 = llama(export_gguf(tmp_path / "run", tmp_path / "q8.gguf", precision="q8_0", log=lambda m: None),
               logits_all=True)
    q8.eval(full[:-1])  # teacher-forced along chargpt's greedy text: q8_0's choice at each of the 200 steps
    choices = np.asarray(q8.scores[len(prompt) - 1:len(full) - 1, :len(vocab)]).argmax(-1)
    agree = float((choices == np.asarray(full[len(prompt):])).mean())
    q8.reset()
    free = q8.create_completion(prompt, **greedy)["choices"][0]["text"]
    same = next((i for i, (a, b) in enumerate(zip(free, ours)) if a != b), len(ours))
    cache = "the same" if default == ours else "not the same"
    with capfd.disabled():
        print(f"\nllama.cpp (llama-cpp-python {llama_cpp.__version__}): f32 weights, f32 cache: chargpt's 200 greedy "
              f"characters (smallest top-2 margin {margin:.3f}; logits {emulated:.1e} from ggufread.forward's, "
              f"{chargpt:.1e} from chargpt's, relative to the largest); with llama.cpp's default f16 cache: {cache}; "
              f"q8_0 chooses chargpt's character at {agree:.1%} of the 200 steps (teacher-forced), and its own "
              f"greedy text follows chargpt's for {same} characters")
    assert agree >= 0.95
