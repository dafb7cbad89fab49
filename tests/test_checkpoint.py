"""Checkpoint integrity: damaged tensor data (NaN, huge values, flipped bytes, wrong dtypes) is refused on load
with one line naming the file, through sample.py, the Python API and --resume; a clean save still round-trips,
old checkpoints without a checksum still load; a compiled model saves plain names; sample.py without
--checkpoint picks the newest run."""

import json
import os
import random
import struct

import pytest
import torch
from click.testing import CliRunner
from helpers import run_cli
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import chargpt
from chargpt.cli import sample_cli
from chargpt.data.tokenizer import Vocab
from chargpt.errors import CheckpointError
from chargpt.model.transformer import CharGPT
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir

VOCAB = Vocab("\n abcdefghi")  # 11 characters, as tiny_config


@pytest.fixture
def saved(tmp_path, tiny_config):
    """A run directory with a best checkpoint of a random tiny model; -> (its file, the model)."""
    torch.manual_seed(0)
    model = CharGPT(tiny_config).eval()
    (tmp_path / "run").mkdir()
    path = tmp_path / "run" / rundir.BEST
    ckpt.save_model(path, model, VOCAB, step=3, val_loss=1.5)
    return path, model


def meta_of(path):
    with safe_open(str(path), "pt") as f:
        return json.loads(f.metadata()["chargpt"])


def rewrite(path, tensors_update=None, meta_update=None, out=None):
    """Copy a checkpoint with some tensors replaced and its metadata changed (None deletes a key), keeping
    everything else, the stored checksum included: what a damaged or hand-edited file looks like."""
    with safe_open(str(path), "pt") as f:
        header = dict(f.metadata())
    meta = json.loads(header["chargpt"])
    for k, v in (meta_update or {}).items():
        meta.pop(k) if v is None else meta.__setitem__(k, v)
    header["chargpt"] = json.dumps(meta)
    tensors = {**load_file(path), **(tensors_update or {})}
    save_file(tensors, str(out or path), metadata=header)
    return out or path


def with_value(path, name, value):
    t = load_file(path)[name].clone()
    t.view(-1)[0] = value
    return rewrite(path, {name: t})


def flip_bytes(path, n=50, seed=0):
    """XOR n random bytes of the tensor data (after the 8-byte length and the JSON header) with nonzero masks."""
    raw = bytearray(path.read_bytes())
    start = 8 + struct.unpack("<Q", raw[:8])[0]
    rnd = random.Random(seed)
    for i in rnd.sample(range(start, len(raw)), n):
        raw[i] ^= rnd.randrange(1, 256)
    path.write_bytes(bytes(raw))
    return path


def sample(path, *args):
    return run_cli("sample.py", "--checkpoint", path, "--prompt", "a", "--max-new-tokens", 5, "--seed", 1, *args)


def assert_one_line_error(r, *needles):
    """r: a finished process, or click's in-process Result (exit_code instead of returncode)."""
    assert getattr(r, "returncode", getattr(r, "exit_code", None)) == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_clean_round_trip_keeps_every_weight_and_samples(saved):
    path, model = saved
    assert meta_of(path)["checksum"].startswith("sha256:")
    loaded, vocab, meta = ckpt.load_model(path)
    assert vocab.chars == VOCAB.chars and meta["step"] == 3
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    r = sample(path.parent)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() and set(r.stdout) <= set(VOCAB.chars) and "error" not in r.stderr


CORRUPTIONS = {  # name: (damage done to a saved checkpoint, what the one-line error must say)
    "nan-in-wte": (lambda p: with_value(p, "wte.weight", float("nan")), "is corrupted (checksum mismatch"),
    "huge-value-in-wte": (lambda p: with_value(p, "wte.weight", 1e30), "is corrupted (checksum mismatch"),
    "50-flipped-bytes": (flip_bytes, "is corrupted (checksum mismatch"),
    "float64-weights": (lambda p: rewrite(p, {"wpe.weight": load_file(p)["wpe.weight"].double()}),
                        "tensor wpe.weight is float64, not a type chargpt writes"),
    "nan-in-a-file-without-checksum": (
        lambda p: with_value(rewrite(p, meta_update={"checksum": None}), "h.0.attn.c_attn.weight", float("nan")),
        "holds non-finite values (nan or inf) in h.0.attn.c_attn.weight"),
}


@pytest.mark.parametrize("damage,message", CORRUPTIONS.values(), ids=CORRUPTIONS.keys())
def test_corrupted_checkpoint_is_one_line_error_through_sample_py(saved, damage, message):
    """sample.py in-process (a subprocess per case costs seconds of imports); one case as a real process below."""
    path, _ = saved
    damage(path)
    r = CliRunner().invoke(sample_cli, ["--checkpoint", str(path.parent), "--prompt", "a", "--max-new-tokens", "5",
                                        "--seed", "1"])
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit) and "Traceback" not in r.output, r.output
    assert_one_line_error(r, str(path), message, "re-copy it, or use latest.safetensors")


def test_corrupted_checkpoint_as_a_real_process_prints_one_line_and_exits_1(saved):
    path, _ = saved
    flip_bytes(path)
    r = sample(path.parent)
    assert r.returncode == 1
    assert_one_line_error(r, str(path), "is corrupted (checksum mismatch", "re-copy it, or use latest.safetensors")


@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.float64, torch.complex64], ids=str)
def test_wrong_tensor_dtypes_are_refused_not_cast(saved, dtype):
    path, _ = saved
    ln = load_file(path)["ln_f.weight"]
    rewrite(path, {"ln_f.weight": ln.to(dtype)})
    with pytest.raises(CheckpointError, match=rf"tensor ln_f\.weight is {str(dtype)[6:]}, not a type chargpt "
                                              rf"writes \(float32, bfloat16 or float16\)"):
        ckpt.load_model(path)


def test_checkpoint_without_checksum_still_loads(saved):
    """Files written before checksums existed (same format version) load as before."""
    path, model = saved
    old = rewrite(path, meta_update={"checksum": None}, out=path.with_name(rundir.LATEST))
    assert "checksum" not in meta_of(old)
    loaded, _, _ = ckpt.load_model(old)
    assert torch.equal(loaded.wte.weight, model.wte.weight)


def test_malformed_checksum_is_corrupted_metadata(saved):
    path, _ = saved
    rewrite(path, meta_update={"checksum": 12})
    with pytest.raises(CheckpointError, match=r"missing or corrupted metadata \(checksum is not a sha256\)"):
        ckpt.load_model(path)


# --- the training state, through --resume ------------------------------------------------------------------
RUN_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
              threads=1, sample_chars=0, dtype="float32", max_iters=2, eval_interval=2)


def resume_error(corpus, damage, run="run"):
    """Train 2 steps, damage state.safetensors, resume: -> the CheckpointError's message (nothing changed)."""
    chargpt.train(log=lambda msg: None, data=str(corpus), out_dir=run, **RUN_KW)
    state = damage(corpus.parent / run / rundir.STATE)
    before = state.read_bytes()
    with pytest.raises(CheckpointError) as info:
        chargpt.train(log=lambda msg: None, out_dir=run, resume=True, max_iters=4)
    assert state.read_bytes() == before and ckpt.read_meta(corpus.parent / run / rundir.LATEST)[0]["step"] == 2
    return str(info.value)


def test_resume_refuses_a_state_with_flipped_bytes(corpus):
    message = resume_error(corpus, flip_bytes)
    assert "state.safetensors is corrupted (checksum mismatch" in message
    assert "best.safetensors and latest.safetensors of the run still load for sampling" in message


def test_resume_refuses_wrong_dtype_and_nonfinite_optimizer_state(corpus):
    def float64_moment(p):
        return rewrite(p, {"optim.0.exp_avg": load_file(p)["optim.0.exp_avg"].double()})
    assert "tensor optim.0.exp_avg is float64" in resume_error(corpus, float64_moment)

    def inf_moment_without_checksum(p):
        return with_value(rewrite(p, meta_update={"checksum": None}), "optim.1.exp_avg_sq", float("inf"))
    message = resume_error(corpus, inf_moment_without_checksum, run="run2")
    assert "non-finite values (nan or inf) in optim.1.exp_avg_sq" in message


@pytest.mark.dtype  # a float32 run resumed in auto: bf16 or float32 by the CPU's kind
def test_resume_from_a_clean_state_still_works(corpus):
    chargpt.train(log=lambda msg: None, data=str(corpus), out_dir="run", **RUN_KW)
    assert chargpt.train(log=lambda msg: None, out_dir="run", resume=True, max_iters=3)["step"] == 3


# --- what gets saved -----------------------------------------------------------------------------------------
def test_compiled_model_saves_the_plain_names(tiny_config, tmp_path):
    """torch.compile wraps the model as `_orig_mod`; checkpoints hold the plain names (no compiled step is run)."""
    model = CharGPT(tiny_config)
    compiled = torch.compile(model)
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())  # what a naive save would store
    assert list(ckpt.model_tensors(compiled)) == list(ckpt.model_tensors(model))
    assert not any("_orig_mod" in k for k in ckpt.model_tensors(compiled))
    ckpt.save_model(tmp_path / "c.safetensors", compiled, VOCAB)
    loaded, _, _ = ckpt.load_model(tmp_path / "c.safetensors")
    assert torch.equal(loaded.wte.weight, model.wte.weight)


# --- which run sample.py picks ---------------------------------------------------------------------------------
def test_sample_without_checkpoint_uses_the_most_recently_saved_run(tmp_path, tiny_config):
    model, root, now = CharGPT(tiny_config), tmp_path / "checkpoints", 2_000_000_000
    for name, age in (("a-newer", 10), ("b-older", 1000)):  # the checkpoint's time decides, not the name
        (root / name).mkdir(parents=True)
        ckpt.save_model(root / name / rundir.LATEST, model, VOCAB)
        os.utime(root / name / rundir.LATEST, (now - age, now - age))
    (root / "c-no-checkpoint-yet").mkdir()  # the newest directory, but nothing to sample from
    (root / "d.txt").write_text("not a run")
    r = CliRunner().invoke(sample_cli, ["--prompt", "a", "--max-new-tokens", "2", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert f"loaded {os.path.join('checkpoints', 'a-newer')} (" in r.stderr


def test_sample_without_any_run_says_how_to_make_one(tmp_path):
    (tmp_path / "checkpoints" / "empty").mkdir(parents=True)
    r = CliRunner().invoke(sample_cli, ["--prompt", "a"])
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert r.stderr.startswith("error: no trained run under checkpoints/; train one with python train.py")



def test_a_checkpoint_s_settings_are_read_typed_and_an_old_run_gets_what_it_trained_with(tmp_path):
    """read_meta types the training settings once; run_settings reads them. A run saved before --val-split gets the
    tail it validated on; a checkpoint saved without settings is None, or, where a split is needed, the oldest runs'."""
    from chargpt.config import ModelConfig, TrainConfig
    from chargpt.runs.checkpoint import run_settings, saved_train_config
    model = CharGPT(ModelConfig(vocab_size=len(VOCAB), block_size=8, n_layer=1, n_head=1, n_embd=8))
    ckpt.save_model(tmp_path / "bare.safetensors", model, VOCAB)
    bare = ckpt.read_meta(tmp_path / "bare.safetensors")[0]
    assert run_settings(bare) is None and run_settings(bare, assumed=True).val_split == "tail"
    ckpt.save_model(tmp_path / "run.safetensors", model, VOCAB, TrainConfig(data="corpus.txt"))
    settings = run_settings(ckpt.read_meta(tmp_path / "run.safetensors")[0])
    assert isinstance(settings, TrainConfig) and settings.val_split == "blocks" and settings.data.endswith("corpus.txt")
    assert saved_train_config({"max_iters": 5}).val_split == "tail"  # from before --val-split
