"""Bad input, one test each: a one-line message naming the problem and the fix, exit status 1, no traceback,
nothing on disk changed; the Python API raises the matching ChargptError subclass. Also: checkpoints that
are damaged, foreign, from the future, or crafted to run code or to make the loader allocate absurd sizes.

The CLIs run in-process through click's CliRunner (a subprocess per case would cost seconds of torch import);
one case runs as a real subprocess to show the end-to-end stderr.
"""

import errno
import json
import os
import pathlib
import re
import resource
import struct

import pytest
import torch
from helpers import TINY_API_KW, api_pattern, assert_one_line_error, flags, invoke, run_cli, snapshot
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import chargpt
from chargpt.cli import sample_cli, train_cli
from chargpt.errors import CheckpointError, ConfigError, DataError
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir


def train_ok(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_API_KW, **kw})


@pytest.fixture
def inputs(tmp_path, corpus):
    """Bad corpora next to the good `corpus.txt` (the cwd is tmp_path)."""
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes(b"abc" * 1000 + "caf\u00e9 ol\u00e9".encode("latin-1"))  # 0xe9 at 3003
    (tmp_path / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    (tmp_path / "short.txt").write_text("a short corpus.\n" * 2, encoding="utf-8")
    (tmp_path / "no-text").mkdir()
    (tmp_path / "no-text" / "data.bin").write_bytes(b"\x00\x01\x02" * 10)
    return tmp_path


# (id, keyword arguments, exception type, regex on the message)
BAD_TRAIN_INPUTS = [
    ("missing-corpus", dict(data="nope.txt"), DataError, r"corpus not found: nope\.txt.*--data"),
    ("dir-without-text", dict(data="no-text"), DataError, r"no-text has no readable text files.*\.txt"),
    ("empty-file", dict(data="empty.txt"), DataError, r"empty\.txt is empty"),
    ("not-utf8", dict(data="latin1.txt"), DataError,
     r"latin1\.txt is not valid utf-8: undecodable byte 0xe9 at byte offset 3003.*--encoding.*"
     r"--encoding-errors replace"),
    ("binary-file", dict(data="image.png"), DataError, r"image\.png looks like a binary file.*text file"),
    ("too-short-for-block-size", dict(data="short.txt", val_split="tail"), DataError,
     r"32 characters is too short for --block-size 16 with --val-fraction 0\.1.*--block-size 2 or less.*"
     r"at least 170 characters"),
    ("too-short-for-blocks", dict(data="short.txt"), DataError,
     r"split is empty: a corpus of 32 characters is too short for --block-size 16 with --val-fraction 0\.1 and "
     r"--val-split blocks.*"
     r"at least 340 characters, or use --val-split tail"),
    ("empty-validation-split", dict(val_fraction=0.0001), DataError, r"validation split is empty.*--val-fraction"),
    ("n-embd-not-divisible", dict(n_embd=15), ConfigError, r"--n-embd 15 is not divisible by --n-head 2"),
    ("zero-layers", dict(n_layer=0), ConfigError, r"--n-layer must be at least 1 \(got 0\)"),
    ("negative-block-size", dict(block_size=-8), ConfigError, r"--block-size must be at least 1"),
    ("zero-heads", dict(n_head=0), ConfigError, r"--n-head must be at least 1"),
    ("zero-batch-size", dict(batch_size=0), ConfigError, r"--batch-size must be positive"),
    ("zero-learning-rate", dict(learning_rate=0.0), ConfigError, r"--learning-rate must be positive"),
    ("negative-learning-rate", dict(learning_rate=-1e-3), ConfigError, r"--learning-rate must be positive"),
    ("dropout-one", dict(dropout=1.0), ConfigError, r"--dropout must be in \[0, 1\)"),
    ("dropout-negative", dict(dropout=-0.1), ConfigError, r"--dropout must be in \[0, 1\)"),
    ("val-fraction-zero", dict(val_fraction=0.0), ConfigError, r"--val-fraction must be between 0 and 1"),
    ("val-fraction-one", dict(val_fraction=1.0), ConfigError, r"--val-fraction must be between 0 and 1"),
    ("grad-accum-zero", dict(grad_accum=0), ConfigError, r"--grad-accum must be at least 1"),
    ("lr-decay-iters-zero", dict(lr_decay_iters=0), ConfigError, r"--lr-decay-iters must be at least 1"),
    ("dtype-the-cpu-cannot-train-in", dict(dtype="float16", device="cpu"), ConfigError,
     r"--dtype float16 is not supported for training on CPU.*bfloat16 or float32"),
    ("unknown-device", dict(device="tpu"), ConfigError, r"unknown device 'tpu'.*cpu"),
    ("resume-without-checkpoint", dict(resume=True, out_dir="run"), CheckpointError,
     r"--resume: no training state in run.*start without --resume"),
    ("out-dir-under-a-file", dict(out_dir="corpus.txt/run"), CheckpointError,
     r"cannot write to --out-dir corpus\.txt/run.*not a directory.*writable directory"),
    ("unknown-encoding", dict(encoding="klingon"), DataError, r"unknown encoding 'klingon'"),
]
if not torch.cuda.is_available():
    BAD_TRAIN_INPUTS.append(("cuda-without-gpu", dict(device="cuda"), ConfigError,
                             r"--device cuda: this machine has no CUDA GPU.*--device cpu"))


@pytest.mark.parametrize("kw,exc,pattern", [c[1:] for c in BAD_TRAIN_INPUTS], ids=[c[0] for c in BAD_TRAIN_INPUTS])
def test_bad_training_input(inputs, kw, exc, pattern):
    kw = {"data": "corpus.txt", **TINY_API_KW, **kw}
    before = snapshot(inputs)
    assert_one_line_error(invoke(train_cli, flags(kw)), pattern)
    with pytest.raises(exc, match=api_pattern(pattern)):
        chargpt.train(log=lambda msg: None, **kw)
    assert snapshot(inputs) == before


def test_unwritable_out_dir(tmp_path, corpus):
    """An --out-dir that cannot be created is refused before anything is written. A path below a regular file
    fails for every user, root included; a read-only folder is tried too where permissions bind (not as root)."""
    (tmp_path / "notes.txt").write_text("a file, not a folder")
    (tmp_path / "locked").mkdir(mode=0o500)
    cases = {"notes.txt/runs/run": r"notes\.txt is not a directory"}
    if os.geteuid() != 0:
        cases["locked/run"] = r"locked is not writable"
    before = snapshot(tmp_path)
    for out_dir, problem in cases.items():
        pattern = rf"cannot write to --out-dir {re.escape(out_dir)} \(.*{problem}\); choose a writable directory"
        assert_one_line_error(invoke(train_cli, ["--data", "corpus.txt", "--out-dir", out_dir, *flags(TINY_API_KW)]),
                              pattern)
        with pytest.raises(CheckpointError, match=pattern):
            chargpt.train(log=lambda msg: None, data="corpus.txt", out_dir=out_dir, **TINY_API_KW)
    assert snapshot(tmp_path) == before


def test_usage_errors_exit_2_without_traceback(corpus):
    for args in (["--dtype", "float8"], ["--n-layer", "two"], ["--no-such-flag"]):
        result = invoke(train_cli, ["--data", "corpus.txt", *args])
        assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
        assert "Error:" in result.stderr and "Traceback" not in result.output


def test_bad_input_end_to_end_in_a_real_process(tmp_path):
    """The same contract through python train.py itself: stderr is one line, no traceback."""
    result = run_cli("train.py", "--data", "nope.txt", "--threads", "1", timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["error: corpus not found: nope.txt; pass --data with an existing "
                                                  "text file or directory"]
    assert not any(tmp_path.iterdir())


def test_python_api_checks_types_and_accepts_paths(tmp_path, corpus):
    before = snapshot(tmp_path)
    for kw, pattern in ((dict(n_layer="2"), r"'n_layer' has the wrong type \(str: '2'\)"),
                        (dict(data=5), r"'data' has the wrong type \(int: 5\)"),
                        (dict(bogus=1), r"unknown setting\(s\): bogus")):
        with pytest.raises(ConfigError, match=pattern):
            chargpt.train(**kw)
    assert snapshot(tmp_path) == before
    assert train_ok(data=corpus, out_dir=tmp_path / "run")["step"] == 2


def test_non_utf8_options_make_it_work(inputs):
    latin = chargpt.train(log=lambda msg: None, **{**TINY_API_KW, "data": "latin1.txt", "encoding": "latin-1",
                                                   "out_dir": "a"})
    replaced = chargpt.train(log=lambda msg: None, **{**TINY_API_KW, "data": "latin1.txt", "encoding_errors": "replace",
                                                      "out_dir": "b"})
    assert "\u00e9" in ckpt.read_meta("a/latest.safetensors")[0]["vocab"].chars
    assert "\ufffd" in ckpt.read_meta("b/latest.safetensors")[0]["vocab"].chars
    assert latin["step"] == replaced["step"] == 2


# --- resuming ----------------------------------------------------------------------------------------------
def test_resume_with_disagreeing_architecture_lists_every_disagreement(tmp_path, corpus):
    train_ok(out_dir="run")
    before = snapshot(tmp_path)
    args = ["--data", "corpus.txt", "--out-dir", "run", "--resume", "--n-layer", "2", "--n-embd", "32",
            "--n-head", "2", "--threads", "1"]
    pattern = r"flags disagree with the checkpoint's model: --n-layer 2 \(checkpoint: 1\); --n-embd 32 " \
              r"\(checkpoint: 16\); drop them"
    assert_one_line_error(invoke(train_cli, args), pattern)
    with pytest.raises(ConfigError, match=pattern):
        chargpt.train(data="corpus.txt", out_dir="run", resume=True, n_layer=2, n_embd=32, n_head=2)
    assert snapshot(tmp_path) == before


def test_new_run_never_overwrites_an_existing_one(tmp_path, corpus):
    train_ok(out_dir="run")
    before = snapshot(tmp_path)
    assert_one_line_error(invoke(train_cli, ["--data", "corpus.txt", "--out-dir", "run", *flags(TINY_API_KW)]),
                          r"run already holds a run; pass --resume")
    assert snapshot(tmp_path) == before


def test_resume_from_damaged_state_is_refused(tmp_path, corpus):
    train_ok(out_dir="run")
    state = tmp_path / "run" / rundir.STATE
    state.write_bytes(state.read_bytes()[:-100])
    before = snapshot(tmp_path)
    assert_one_line_error(invoke(train_cli, ["--out-dir", "run", "--resume", "--max-iters", "4", "--threads", "1"]),
                          r"state\.safetensors is not a readable safetensors checkpoint \(truncated")
    assert snapshot(tmp_path) == before


def test_resume_with_tampered_optimizer_state_is_refused(tmp_path, corpus):
    train_ok(out_dir="run")
    state = tmp_path / "run" / rundir.STATE
    tensors, header = load_file(state), safe_open(str(state), "pt").metadata()
    tensors["optim.0.exp_avg"] = torch.zeros(3, 3)
    save_file(tensors, str(state), metadata=header)
    before = snapshot(tmp_path)
    with pytest.raises(CheckpointError, match=r"optimizer state optim\.0\.exp_avg \[3, 3\] does not match"):
        train_ok(out_dir="run", resume=True, max_iters=4)
    assert snapshot(tmp_path) == before


# --- disk full -------------------------------------------------------------------------------------------
def test_disk_full_while_saving_keeps_the_previous_checkpoint(tmp_path, corpus, monkeypatch):
    train_ok(out_dir="run")
    run = tmp_path / "run"
    saved = {name: (run / name).read_bytes() for name in (rundir.STATE, rundir.LATEST, rundir.BEST)}

    def full_disk(tensors, filename, metadata=None):
        pathlib.Path(filename).write_bytes(b"\0" * 64)  # a partial write, then the error
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as m:
        m.setattr(ckpt, "save_file", full_disk)
        result = invoke(train_cli, ["--out-dir", "run", "--resume", "--max-iters", "4", "--threads", "1"])
    assert_one_line_error(result, r"could not write run/state\.safetensors \(No space left on device\); the "
                                  r"previous state\.safetensors is intact; free disk space")
    assert {name: (run / name).read_bytes() for name in saved} == saved
    assert not [p.name for p in run.iterdir() if ".tmp" in p.name]
    assert ckpt.load_model(run)[2]["step"] == 2
    train_ok(out_dir="run", resume=True, max_iters=4)  # space is back: the run goes on
    steps = [json.loads(line)["step"] for line in (run / rundir.METRICS).read_text().splitlines()]
    assert steps == [0, 1, 2, 3, 4]


# --- checkpoints: missing, foreign, damaged, from the future ----------------------------------------------
def rewrite(path, out, header_update=None, drop=(), tensors_update=None):
    """Copy a checkpoint with its header changed (None values delete keys) and tensors dropped or replaced."""
    tensors = {k: v for k, v in load_file(path).items() if k not in drop}
    tensors.update(tensors_update or {})
    with safe_open(str(path), "pt") as f:
        header = dict(f.metadata())
    for k, v in (header_update or {}).items():
        header.pop(k) if v is None else header.__setitem__(k, v)
    save_file(tensors, str(out), metadata=header)
    return out


def with_meta(path, out, **changes):
    """Copy a checkpoint with fields of its JSON metadata changed ('model_config.n_embd' style keys)."""
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["chargpt"])
    for key, value in changes.items():
        obj, *rest = key.split("__")
        (meta[obj].__setitem__(rest[0], value) if rest else meta.__setitem__(obj, value))
    return rewrite(path, out, {"chargpt": json.dumps(meta)})


@pytest.fixture
def good(tmp_path, corpus):
    train_ok(out_dir="run")
    return tmp_path / "run" / rundir.LATEST


def bad_checkpoints(good, tmp_path):
    raw = good.read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "text.safetensors").write_text("these are not the weights you are looking for")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    return [
        ("nope.safetensors", r"checkpoint not found: nope\.safetensors"),
        ("empty-dir", r"no checkpoint in empty-dir.*train first"),
        ("text.safetensors", r"text\.safetensors is not a readable safetensors checkpoint"),
        ("truncated.safetensors", r"truncated\.safetensors is not a readable safetensors checkpoint \(truncated"),
        ("foreign.safetensors", r"foreign\.safetensors is a safetensors file but not a chargpt checkpoint"),
        (rewrite(good, tmp_path / "no-meta.safetensors", {"chargpt": None}).name,
         r"no-meta\.safetensors has missing or corrupted metadata"),
        (rewrite(good, tmp_path / "garbled.safetensors", {"chargpt": '{"model_config": {"n_'}).name,
         r"garbled\.safetensors has missing or corrupted metadata"),
        (rewrite(good, tmp_path / "future.safetensors", {"format_version": "99"}).name,
         r"future\.safetensors was written by a newer chargpt \(checkpoint format 99.*update chargpt"),
        (rewrite(good, tmp_path / "bad-version.safetensors", {"format_version": "one"}).name,
         r"corrupted format version"),
        (with_meta(good, tmp_path / "no-vocab.safetensors", vocab=None).name, r"vocabulary missing"),
        (rewrite(good, tmp_path / "missing-tensor.safetensors", drop=("wpe.weight",)).name,
         r"does not match the tensors stored with it"),
    ]


def test_bad_checkpoints_are_explained(good, tmp_path):
    (tmp_path / "empty-dir").mkdir()
    cases = bad_checkpoints(good, tmp_path)
    before = snapshot(tmp_path)
    for name, pattern in cases:
        assert_one_line_error(invoke(sample_cli, ["--checkpoint", name, "--max-new-tokens", "5", "--seed", "1"]),
                              pattern)
        with pytest.raises(CheckpointError, match=pattern):
            chargpt.load(name, device="cpu")
    assert snapshot(tmp_path) == before


def test_no_run_to_sample_from(tmp_path):
    assert_one_line_error(invoke(sample_cli, ["--max-new-tokens", "5"]), r"no trained run under checkpoints/")


# --- security: no pickle, metadata is untrusted --------------------------------------------------------------
class Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):  # unpickling this would create the marker file
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


def test_pickle_checkpoint_never_runs(tmp_path, corpus):
    marker = tmp_path / "pwned"
    torch.save({"model": Payload(marker)}, tmp_path / "evil.safetensors")
    (tmp_path / "evil-run").mkdir()
    torch.save({"model": Payload(marker)}, tmp_path / "evil-run" / rundir.LATEST)
    for path in ("evil.safetensors", "evil-run"):
        with pytest.raises(CheckpointError, match="not a readable safetensors checkpoint"):
            chargpt.load(path, device="cpu")
        assert_one_line_error(invoke(sample_cli, ["--checkpoint", path]), "not a readable safetensors")
    (tmp_path / "evil-run" / rundir.STATE).write_bytes((tmp_path / "evil.safetensors").read_bytes())
    with pytest.raises(CheckpointError):
        train_ok(out_dir="evil-run", resume=True)
    assert not marker.exists()


def crafted_header_file(path, header, data=b"\0" * 8):
    """A safetensors file written by hand: 8-byte little-endian header length, JSON header, data."""
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    return path


def test_crafted_metadata_is_rejected_without_allocating(good, tmp_path, monkeypatch):
    code = "__import__('os').system('touch pwned')"
    cases = {
        "code-as-metadata": rewrite(good, tmp_path / "c1.safetensors", {"chargpt": code}),
        "pickle-as-metadata": rewrite(good, tmp_path / "c2.safetensors", {"chargpt": "\x80\x04\x95cos\nsystem\n"}),
        "config-is-code": with_meta(good, tmp_path / "c3.safetensors", model_config=code),
        "class-in-config": with_meta(good, tmp_path / "c4.safetensors", model_config__n_layer={"__class__": "os"}),
        "block-size-1e9": with_meta(good, tmp_path / "c5.safetensors", model_config__block_size=10**9),
        "n-embd-1e6": with_meta(good, tmp_path / "c6.safetensors", model_config__n_embd=10**6),
        "n-layer-1e6": with_meta(good, tmp_path / "c7.safetensors", model_config__n_layer=10**6),
        "n-layer-1e100": with_meta(good, tmp_path / "c8.safetensors", model_config__n_layer=10**100),
        "string-size": with_meta(good, tmp_path / "c9.safetensors", model_config__block_size="16"),
        "float-size": with_meta(good, tmp_path / "c10.safetensors", model_config__n_layer=1.5),
        "bool-size": with_meta(good, tmp_path / "c11.safetensors", model_config__n_layer=True),
        "negative-size": with_meta(good, tmp_path / "c12.safetensors", model_config__n_embd=-16),
        "nan-dropout": with_meta(good, tmp_path / "c13.safetensors", model_config__dropout=float("nan")),
        "shapes-disagree": with_meta(good, tmp_path / "c14.safetensors", model_config__n_embd=32),
        "vocab-size-disagrees": with_meta(good, tmp_path / "c15.safetensors", model_config__vocab_size=10**6),
        "train-config-wrong-type": with_meta(good, tmp_path / "c16.safetensors", train_config__max_iters="lots"),
        "negative-step": with_meta(good, tmp_path / "c17.safetensors", step=-5),
        "run-state-not-object": with_meta(good, tmp_path / "c18.safetensors", run_state="os.system"),
        "huge-tensor-in-header": crafted_header_file(tmp_path / "c19.safetensors", {
            "__metadata__": json.loads(json.dumps(safe_open(str(good), "pt").metadata())),
            "wte.weight": {"dtype": "F32", "shape": [10**6, 10**6], "data_offsets": [0, 8]}}),
    }

    def no_model(*args, **kwargs):
        raise AssertionError("a model was built from untrusted metadata")

    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with monkeypatch.context() as m:
        m.setattr(ckpt, "build_model", no_model)  # the one builder every loader calls
        for name, path in cases.items():
            with pytest.raises(CheckpointError) as info:
                ckpt.load_model(path)
            assert str(path) in str(info.value), name
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 50_000  # KiB: nothing big allocated
    assert not (tmp_path / "pwned").exists()
    assert ckpt.load_model(good)[2]["step"] == 2  # the untouched original still loads
