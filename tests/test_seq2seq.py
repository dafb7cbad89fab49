"""Sentence pairs end to end: the pairs flags build and train, a pairs checkpoint is rebuilt by
every loader (load_model, chargpt.load, sample.py, chargpt translate, eval, info, the playground, --resume),
chargpt translate's inputs and outputs and its bad inputs, the inverse-square-root schedule and the presets, and
checkpoints from before tasks were recorded. Two tiny runs of the cipher task (tests/helpers.py) are trained per
module, one per architecture (a few seconds each)."""

import json
import math
import re
import shutil
import sys

import pytest
import torch
from click.testing import CliRunner
from helpers import (
    STEPS,
    TINY_FLAGS,
    cipher,
    need,
    parse_sse,
    run_chargpt,
    run_cli,
    texts_of,
    train_pairs,
    write_cipher,
)

import chargpt
from chargpt.cli import eval_cli, sample_cli, train_cli, translate_cli
from chargpt.config import ARCH_FIELDS, PRESETS, ModelConfig, TrainConfig
from chargpt.data.pairs import encode_pairs, split_pairs
from chargpt.errors import ChargptError, CheckpointError, ConfigError
from chargpt.model.transformer import CharGPT, EncoderDecoder, build_model
from chargpt.runs.checkpoint import load_model, read_meta, write_safetensors
from chargpt.runs.info import format_info, run_info
from chargpt.runs.rundir import BEST, LATEST, STATE
from chargpt.sampling.translate import exact_match
from chargpt.tools.evaluate import evaluate
from chargpt.training.schedules import inverse_sqrt_lr

ARCHS = ["decoder", "encoder-decoder"]
TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", log=lambda *a: None)
WORDS = ["abc", "hgfe", "bad", "cafe", "dead", "ghab"]  # sources; cipher(w) is each one's translation


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{arch: run directory} of the cipher task, both translating it (>= 99% exact match)."""
    root = tmp_path_factory.mktemp("pairs")
    data = write_cipher(root / "cipher.tsv")
    for arch in ARCHS:
        train_pairs(data, root / arch, arch, cache_dir=root / "cache")
    return {arch: root / arch for arch in ARCHS}


@pytest.fixture(params=ARCHS)
def run(request, runs):
    return runs[request.param]


def one_line_error(r, needle):
    """Exit 1 with one error line, the last (after the `loaded ...` line once a model is loaded, as sample.py)."""
    lines = r.stderr.strip().splitlines()
    assert r.exit_code == 1 and lines[-1].startswith("error: ") and needle in lines[-1], r.stderr
    assert len(lines) == 1 or len(lines) == 2 and lines[0].startswith("loaded "), r.stderr


# --- learning -----------------------------------------------------------------------------------------------------
def test_both_architectures_learn_to_translate(run):
    """Reverse and substitute 3-6 letters: through the real trainer, a tiny model goes from 0% to >= 90% exact match
    on held-out pairs, in its own evaluations (metrics.jsonl) and translating them afterwards, greedily and with beam
    search (both architectures reach 99-100% in these steps on every seed tried)."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    arch = load_model(run)[0].config.arch
    assert rows[0]["step"] == 0 and rows[0]["exact_match"] < 0.1
    assert rows[-1]["step"] == STEPS[arch] and rows[-1]["exact_match"] >= 0.9
    enc = encode_pairs(str(run.parent / "cipher.tsv"), cache_dir=run.parent / "cache")
    held_out = [enc.pair(int(i)) for i in split_pairs(enc.n_pairs, 0.1)[1][:100]]  # the trainer's validation pairs
    sources, refs = [s for s, _ in held_out], [t for _, t in held_out]
    gen = chargpt.load(run, device="cpu")
    assert exact_match(gen.translate(sources), refs) >= 0.9
    assert exact_match(gen.translate(sources, beam=3), refs) >= 0.9


# --- every loader rebuilds the right model from the file alone ------------------------------------------------------
def test_every_loader_rebuilds_a_pairs_checkpoint(run):
    model, vocab, meta = load_model(run)
    arch = model.config.arch
    assert isinstance(model, EncoderDecoder if arch == "encoder-decoder" else CharGPT)
    assert meta["task"] == "pairs" and meta["pair_markers"] == {"sep": "\ue000", "end": "\ue001"}
    gen = chargpt.load(run, device="cpu")
    assert gen.translate(WORDS) == [cipher(w) for w in WORDS]
    assert gen.generate("abc", temperature=0) == [cipher("abc")]  # a prompt is a source: its translation alone
    info = run_info(run)
    assert (info["task"], info["arch"]) == ("pairs", arch)
    assert "sentence pairs: translates" in format_info(info)
    assert ("encoder-decoder, 2+2 layers x 64 wide" in format_info(info)) == (arch == "encoder-decoder")
    result = evaluate(run, device="cpu", progress=False)  # the run's own validation pairs
    assert result["task"] == "pairs" and result["pairs"] == 200 and 0 < result["loss"] < 0.2


def test_sample_py_on_a_pairs_checkpoint_prints_the_target_only(runs):
    r = run_cli("sample.py", "--checkpoint", runs["decoder"], "--prompt", "hgfe", "--temperature", "0", "--device",
                "cpu")
    assert r.returncode == 0, r.stderr
    assert r.stdout == cipher("hgfe") + "\n" and "sentence pairs, decoder" in r.stderr
    r = CliRunner().invoke(sample_cli, ["--checkpoint", str(runs["encoder-decoder"]), "--device", "cpu"])  # no source
    assert r.exit_code == 1 and r.stderr.strip().splitlines()[-1] == (
        "error: this model was trained on sentence pairs: its prompt is the sentence to translate; give --prompt "
        "some text")


def test_eval_scores_pairs_files_and_refuses_stride(run, tmp_path):
    """eval on a pairs file: the target characters (and END) given the source; the batch changes nothing; a
    character the model never saw is counted, not scored."""
    (tmp_path / "t.tsv").write_text("".join(f"{w}\t{cipher(w)}\n" for w in WORDS) + "abz\tZHG\n", encoding="utf-8")
    one = evaluate(run, str(tmp_path / "t.tsv"), device="cpu", batch_size=1)
    many = evaluate(run, str(tmp_path / "t.tsv"), device="cpu", batch_size=64)
    assert one["loss"] == pytest.approx(many["loss"], rel=1e-4)
    assert many["pairs"] == 7 and many["scored"] == sum(len(w) + 1 for w in WORDS) + 3 and many["unknown"] == 2
    with pytest.raises(ConfigError, match="--stride is for runs trained on text"):
        evaluate(run, str(tmp_path / "t.tsv"), device="cpu", stride=4)
    r = CliRunner().invoke(eval_cli, ["--checkpoint", str(run), "--data", str(tmp_path / "t.tsv")])
    assert r.exit_code == 0 and "target characters" in r.stdout and "of 7 pairs" in r.stdout, r.output


def test_resume_a_pairs_run(runs, tmp_path):
    shutil.copytree(runs["encoder-decoder"], tmp_path / "run")
    summary = chargpt.train(out_dir=str(tmp_path / "run"), resume=True, max_iters=160, dtype="float32",
                            log=lambda *a: None)  # as trained: a learning threshold means one dtype, not the CPU's
    assert summary["step"] == 160 and summary["exact_match"] >= 0.9
    with pytest.raises(ConfigError, match="--resume: the run was trained with --task pairs, not text"):
        chargpt.train(out_dir=str(tmp_path / "run"), resume=True, task="text", max_iters=170, log=lambda *a: None)


# --- chargpt translate -----------------------------------------------------------------------------------------
def translate(*args, input=None):
    return CliRunner().invoke(translate_cli, [*map(str, args), "--device", "cpu"], input=input)


def test_translate_arguments_stdin_and_files(run, tmp_path):
    want = [cipher(w) for w in WORDS]
    r = translate("--checkpoint", run, *WORDS)
    assert r.exit_code == 0 and r.stdout.splitlines() == want, r.output
    r = translate("--checkpoint", run, input="\ufeff" + "\r\n".join(WORDS[:2]) + "\r\n\n" + WORDS[2] + "\n")
    assert r.stdout == f"{want[0]}\n{want[1]}\n\n{want[2]}\n"  # a BOM, CRLF, a blank line kept blank
    (tmp_path / "in.txt").write_text("\n".join(WORDS), encoding="utf-8")  # no newline at the end
    r = translate("--checkpoint", run, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt", "--beam",
                  "3", "--batch-size", "2")
    assert r.exit_code == 0 and r.stdout == "" and "wrote 6 translation(s)" in r.stderr
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(t + "\n" for t in want)
    sampled = [translate("--checkpoint", run, *WORDS, "--temperature", "1.5", "--seed", s).stdout for s in "112"]
    assert sampled[0] == sampled[1] and len(sampled[0].splitlines()) == 6


def test_translate_in_a_real_process_from_stdin(runs):
    r = run_chargpt("translate", "--checkpoint", runs["decoder"], "--unknown", "skip", input="abzc\nhg\n")
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{cipher('abc')}\n{cipher('hg')}\n"
    assert "warning: 1 sentence(s) had characters the model never saw, dropped" in r.stderr


@pytest.mark.parametrize("args,stdin,needle", [
    (["abz"], None, "sentence 1 has 1 character(s) the model never saw: 'z' (U+007A) at 2"),
    (["--input", "in.txt"], None, "line 3 of in.txt has 20 characters; the model translates 1 to"),
    (["--input", "missing.txt"], None, "cannot read --input missing.txt"),
    (["--input", "latin1.txt"], None, "latin1.txt is not UTF-8 (byte offset 1)"),
    (["abc", "--input", "in.txt"], None, "give sentences as arguments or with --input, not both"),
    (["abc", "--beam", "0"], None, "--beam must be from 1 to 1000"),
    (["abc", "--beam", "2", "--temperature", "0.5"], None, "does not sample"),
    (["abc", "--temperature", "-1"], None, "--temperature must be >= 0"),
    (["abc", "--top-p", "0"], None, "--top-p must be in (0, 1]"),
    (["abc", "--alpha", "nan"], None, "--alpha must be from 0 to 10"),
    (["abc", "--batch-size", "0"], None, "--batch-size must be from 1"),
    (["abc", "--output", "no/such/dir/out.txt"], None, "cannot write --output no/such/dir/out.txt"),
    (["\ue000"], None, "sentence 1 contains U+E000, a private-use character chargpt reserves"),
])
def test_translate_bad_input_is_one_line(runs, tmp_path, args, stdin, needle):
    (tmp_path / "in.txt").write_text("abc\n\n" + "a" * 20 + "\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("a\xe9".encode("latin-1"))
    one_line_error(translate("--checkpoint", runs["decoder"], *args, input=stdin), needle)
    assert not (tmp_path / "no").exists()


def test_translate_shares_its_options_with_sample():
    shared = {p.name: p for p in sample_cli.params}
    for p in translate_cli.params:
        if p.name in ("checkpoint_path", "seed", "unknown", "device", "no_cache"):
            assert p is shared[p.name]
        if p.name in ("temperature", "top_k", "top_p"):  # the same help, from SampleSettings; greedy by default
            assert p.help.split(" [default")[0] == shared[p.name].help.split(" [default")[0]
    assert {p.name: p.default for p in translate_cli.params}["temperature"] == 0.0


def test_translate_refuses_a_text_run(tiny_run):
    one_line_error(translate("--checkpoint", tiny_run, "abc"), "was trained on plain text, not sentence pairs")


# --- the playground -----------------------------------------------------------------------------------------------
def test_playground_translates_and_look_inside_refuses_encoder_decoders(runs):
    need("starlette")
    need("httpx2" if sys.version_info >= (3, 11) else "httpx")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    client = TestClient(serve.create_app(runs["decoder"].parent, device="cpu"), base_url="http://127.0.0.1")
    listed = {r["name"]: r for r in client.get("/api/runs").json()["runs"]}
    assert {n: (r["task"], r["arch"]) for n, r in listed.items()} == {a: ("pairs", a) for a in ARCHS}
    for arch in ARCHS:
        r = client.post("/api/generate", json={"run": arch, "prompt": "hgfe", "temperature": 0})
        events = parse_sse(r.text)
        assert events[0][1]["task"] == "pairs" and texts_of(events, 1) == [cipher("hgfe")]
        r = client.post("/api/generate", json={"run": arch, "prompt": ""})
        assert r.status_code == 400 and "type a sentence for it to translate" in r.json()["error"]
    r = client.post("/api/inside", json={"run": "encoder-decoder", "text": "abc"})
    assert r.status_code == 400 and "Look inside shows decoder-only models" in r.json()["error"]
    assert client.post("/api/inside", json={"run": "decoder", "text": "abc"}).status_code == 200


# --- flags, schedule, presets ---------------------------------------------------------------------------------------
def test_the_2017_options_are_flags_that_build_and_train(tmp_path):
    """Every architecture option through train.py: a 2017-style encoder-decoder with inverse-sqrt warmup and label
    smoothing on pairs, and the same parts in a decoder-only model on plain text."""
    data = write_cipher(tmp_path / "c.tsv", n=300)
    paper = ["--pos-emb", "sinusoidal", "--emb-scale", "--norm", "post", "--activation", "relu", "--label-smoothing",
             "0.1", "--lr-schedule", "inverse-sqrt", "--warmup-iters", "4", "--max-iters", "8", "--eval-interval", "4"]
    pairs = ["--task", "pairs", "--arch", "encoder-decoder", "--n-enc-layer", "2", "--eval-pairs", "5"]
    r = CliRunner().invoke(train_cli, [*TINY_FLAGS, *paper, *pairs, "--data", str(data), "--out-dir",
                                       str(tmp_path / "ed")])
    assert r.exit_code == 0, r.output
    assert "encoder-decoder, 2+1 layers x 16 wide" in r.stderr and "sinusoidal positions, embeddings x sqrt(width), " \
        "post-LN, ReLU" in r.stderr and "300 sentence pairs" in r.stderr
    cfg = read_meta(tmp_path / "ed" / LATEST)[0]["model_config"]
    assert (cfg.arch, cfg.n_enc_layer, cfg.pos_emb, cfg.emb_scale, cfg.norm, cfg.activation) == (
        "encoder-decoder", 2, "sinusoidal", True, "post", "relu")
    rows = [json.loads(line) for line in (tmp_path / "ed" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [0, 4, 8] and all("exact_match" in row for row in rows)
    assert rows[1]["lr"] == pytest.approx(PRESETS["cpu"]["learning_rate"] * math.sqrt(4 / 5))  # step 5: past the peak
    corpus = tmp_path / "t.txt"
    corpus.write_text("to be or not to be " * 50, encoding="utf-8")
    r = CliRunner().invoke(train_cli, [*TINY_FLAGS, *paper[:9], "--data", str(corpus), "--out-dir",
                                       str(tmp_path / "text"), "--max-iters", "4"])
    assert r.exit_code == 0, r.output
    assert read_meta(tmp_path / "text" / BEST)[0]["model_config"].pos_emb == "sinusoidal"


def test_inverse_sqrt_schedule_is_the_papers_formula():
    """lrate = d_model**-0.5 x min(step**-0.5, step x warmup**-1.5), step from 1 (Vaswani et al. 2017, 5.3)."""
    base = PRESETS["transformer-base"]
    cfg = TrainConfig(learning_rate=base["learning_rate"], warmup_iters=base["warmup_iters"])
    for it in (0, 1, 999, 3998, 3999, 4000, 10_000, 99_999):
        step = it + 1
        assert inverse_sqrt_lr(it, cfg) == pytest.approx(512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5))
    assert max(inverse_sqrt_lr(it, cfg) for it in range(8000)) == pytest.approx(7.0e-4, rel=2e-3)


def test_transformer_base_preset_is_the_papers_model():
    """With the paper's shared 37,000-token vocabulary, transformer-base has about Table 3's 65M parameters (63.1M;
    built on the meta device: nothing allocated)."""
    preset = PRESETS["transformer-base"]
    model_kw = {k: v for k, v in preset.items() if k in ModelConfig.__dataclass_fields__}
    cfg = ModelConfig(**model_kw, vocab_size=37_000).validate()
    assert (cfg.n_embd, cfg.n_layer, cfg.n_enc_layer, cfg.n_head, 4 * cfg.n_embd) == (512, 6, 6, 8, 2048)
    with torch.device("meta"):
        model = build_model(cfg)
    assert isinstance(model, EncoderDecoder) and 62e6 < model.num_params() < 66e6
    train = TrainConfig(**{k: v for k, v in preset.items() if k in TrainConfig.__dataclass_fields__}).validate()
    assert (train.task, train.lr_schedule, train.warmup_iters, train.beta2, train.label_smoothing) == (
        "pairs", "inverse-sqrt", 4000, 0.98, 0.1)


@pytest.mark.dtype  # the preset's auto dtype: bf16 or float32 by the CPU's kind
def test_transformer_small_preset_trains(tmp_path):
    data = write_cipher(tmp_path / "c.tsv", n=300)
    summary = chargpt.train(**{**PRESETS["transformer-small"], "max_iters": 6, "eval_interval": 3, "eval_iters": 2,
                               "eval_pairs": 4, "batch_size": 8}, data=str(data), out_dir=str(tmp_path / "run"),
                            device="cpu", threads=1, sample_chars=0, log=lambda *a: None)
    assert summary["step"] == 6 and math.isfinite(summary["best_val_loss"])
    assert 0.9e6 < chargpt.load(tmp_path / "run", device="cpu").model.num_params() < 1.5e6


@pytest.mark.parametrize("kw,message", [
    (dict(arch="encoder-decoder"), "arch='encoder-decoder' translates a source into a target: it needs task='pairs'"),
    (dict(target_data="t.txt"), "target_data is for sentence pairs; add task='pairs'"),
    (dict(task="pairs", data=None), "sentence pairs need --data"),
    (dict(task="pairs", target_data=""), "target_data is an empty path"),
    (dict(lr_schedule="linear"), "lr_schedule must be one of cosine, wsd, inverse-sqrt"),
    (dict(task="pairs", eval_pairs=-1), "eval_pairs must be non-negative"),
    (dict(task="pairs", block_size=4), "no train pair fits the context of 4 characters"),
])
def test_bad_pairs_settings_fail_before_training(tmp_path, kw, message):
    data = write_cipher(tmp_path / "c.tsv", n=50)
    with pytest.raises(ChargptError, match=re.escape(message)):
        chargpt.train(**{"data": str(data), "out_dir": str(tmp_path / "run"), "max_iters": 2, **TINY_KW, **kw})
    assert not (tmp_path / "run").exists()


def test_chrf_missing_is_said_once_and_exact_match_still_logged(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    lines = []
    train_pairs(write_cipher(tmp_path / "c.tsv", n=200), tmp_path / "run", steps=4, eval_interval=2, eval_pairs=5,
                log=lines.append)
    assert sum("pip install 'chargpt[translate]'" in line for line in lines) == 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and all("exact_match" in row and "chrf" not in row for row in rows)


# --- checkpoints: old ones keep loading, crafted ones are refused ----------------------------------------------------
NEW_TRAIN_FIELDS = ("task", "target_data", "lr_schedule", "eval_pairs", "label_smoothing")


def strip_new_keys(path):
    """Rewrite a checkpoint's metadata as chargpt wrote it before tasks and architectures were recorded."""
    from safetensors import safe_open
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["chargpt"]), {k: f.get_tensor(k) for k in f.keys()}
    meta["model_config"] = {k: v for k, v in meta["model_config"].items() if k not in ARCH_FIELDS}
    meta["train_config"] = {k: v for k, v in meta["train_config"].items() if k not in NEW_TRAIN_FIELDS}
    for key in ("task", "pair_markers", "chars_per_step"):
        meta.pop(key, None)
    write_safetensors(path, tensors, meta)


def test_checkpoints_from_before_tasks_load_sample_eval_and_resume(tiny_run, tmp_path):
    run = tmp_path / "old"
    shutil.copytree(tiny_run, run)
    for name in (BEST, LATEST, STATE):
        strip_new_keys(run / name)
    model, _, meta = load_model(run)
    assert meta["task"] == "text" and meta["train_config"].task == "text"  # the text task they all were
    assert isinstance(model, CharGPT) and model.config == load_model(tiny_run)[0].config
    r = run_cli("sample.py", "--checkpoint", run, "--prompt", "To be", "--max-new-tokens", "5", "--seed", "1")
    assert r.returncode == 0 and r.stdout.startswith("To be"), r.stderr
    assert run_info(run)["task"] == "text" and evaluate(run, device="cpu", progress=False)["loss"] > 0
    summary = chargpt.train(out_dir=str(run), resume=True, max_iters=24, log=lambda *a: None)
    assert summary["step"] == 24
    assert read_meta(run / LATEST)[0]["task"] == "text"


def rewrite_meta(src, dst, change):
    from safetensors import safe_open
    with safe_open(str(src), framework="pt") as f:
        meta, tensors = json.loads(f.metadata()["chargpt"]), {k: f.get_tensor(k) for k in f.keys()}
    change(meta, tensors)
    write_safetensors(dst, tensors, meta)
    return dst


@pytest.mark.parametrize("change,message", [
    (lambda m, t: m.update(task="poetry"), "unknown task 'poetry'"),
    (lambda m, t: m.pop("pair_markers"), "pair markers are not U+E000 and U+E001"),
    (lambda m, t: m.update(task="text"), "an encoder-decoder needs the pairs task"),
    (lambda m, t: m["model_config"].update(n_enc_layer=10**6), "more layers than a checkpoint holds"),
    (lambda m, t: m["model_config"].update(block_size=2**30), "does not match the tensors stored with it"),
    (lambda m, t: m["model_config"].update(pos_emb="learned"), "does not match the tensors stored with it"),
])
def test_crafted_pairs_metadata_is_refused(runs, tmp_path, change, message):
    src = runs["encoder-decoder"] / BEST
    src_sinusoidal = tmp_path / "sin.safetensors"

    def to_sinusoidal(meta, tensors):  # the run uses learned positions; make a sinusoidal twin
        meta["model_config"]["pos_emb"] = "sinusoidal"
        tensors.pop("wpe.weight")
        meta.pop("checksum")
    rewrite_meta(src, src_sinusoidal, to_sinusoidal)
    assert load_model(src_sinusoidal)[0].config.pos_emb == "sinusoidal"
    bad = rewrite_meta(src_sinusoidal, tmp_path / "bad.safetensors", change)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        load_model(bad)
