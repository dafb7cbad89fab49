"""Bad input: every case gives one `error:` line that names the setting and the fix, exit
status 1, and nothing on disk changed; the Python API raises a ChargptError naming its own parameter (no `--`).
Also: running out of memory, a damaged corpus cache, terminals that cannot show a character, and the output
rule (results on stdout, diagnostics on stderr).
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner
from helpers import (
    ROOT,
    TINY_API_KW,
    TINY_FLAGS,
    VOCAB,
    api_pattern,
    assert_one_line_error,
    counter_gen,
    counter_model,
    flags,
    invoke,
    snapshot,
)
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import chargpt
from chargpt.cli import sample_cli, train_cli
from chargpt.config import MAX_SEED
from chargpt.data import corpus as data
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, CheckpointError, ConfigError, DataError
from chargpt.runs.checkpoint import save_model

NAN, INF = float("nan"), float("inf")


def train_kw(**kw):
    return {"data": "corpus.txt", **TINY_API_KW, **kw}


@pytest.fixture
def ckpt(tmp_path):
    """The counter model of test_sampling: greedy text is the alphabet from the prompt on ("ab" -> "cdef...")."""
    (tmp_path / "ckpt").mkdir()
    save_model(tmp_path / "ckpt" / "best.safetensors", counter_model(), VOCAB, step=1)
    return tmp_path / "ckpt"


# --- training flags: (id, settings, exception, message) ------------------------------------------------------------
BAD_TRAIN_INPUTS = [
    # 2: a thread count that crashes torch
    ("threads-100000", dict(threads=100000), ConfigError,
     r"--threads must be between 1 and \d+ \(4 per CPU.*got 100000"),
    ("threads-0", dict(threads=0), ConfigError, r"--threads must be between 1 and"),
    # 5: NaN and inf, caught once for every float flag
    ("max-time-nan", dict(max_time=NAN), ConfigError, r"--max-time must be a finite number \(got nan\)"),
    ("learning-rate-nan", dict(learning_rate=NAN), ConfigError, r"--learning-rate must be a finite number"),
    ("weight-decay-nan", dict(weight_decay=NAN), ConfigError, r"--weight-decay must be a finite number"),
    ("grad-clip-nan", dict(grad_clip=NAN), ConfigError, r"--grad-clip must be a finite number"),
    ("min-lr-inf", dict(min_lr=INF), ConfigError, r"--min-lr must be a finite number \(got inf\)"),
    ("beta2-nan", dict(beta2=NAN), ConfigError, r"--beta2 must be a finite number"),
    ("dropout-nan", dict(dropout=NAN), ConfigError, r"--dropout must be a finite number"),
    ("val-fraction-inf", dict(val_fraction=INF), ConfigError, r"--val-fraction must be a finite number"),
    # 6: codecs that are not text encodings, and a decode failure that is not a bad byte
    ("encoding-rot13", dict(encoding="rot13"), DataError, r"'rot13' is not a text encoding.*--encoding"),
    ("encoding-zlib", dict(encoding="zlib"), DataError, r"'zlib' is not a text encoding"),
    ("encoding-hex", dict(encoding="hex"), DataError, r"'hex' is not a text encoding"),
    ("utf-16-without-bom", dict(encoding="utf-16"), DataError,
     r"corpus\.txt is not valid utf-16: UTF-16 stream does not start with BOM \(in the bytes from offset 0\); "
     r"pass --encoding .*utf-16-le"),
    # 7: an empty path is never the current folder
    ("empty-data", dict(data=""), ConfigError, r"--data is an empty path; .*leave it out for the built-in corpus"),
    ("empty-out-dir", dict(out_dir=""), ConfigError, r"--out-dir is an empty path"),
    ("empty-cache-dir", dict(cache_dir=""), ConfigError, r"--cache-dir is an empty path"),
    ("empty-init-from", dict(init_from=""), ConfigError, r"--init-from is an empty path; .*random weights"),
    # 9: seeds torch cannot take
    ("seed-1e23", dict(seed=10**23), ConfigError,
     rf"--seed must be a whole number from 0 to {MAX_SEED} \(2\*\*63 - 1\), got 100000000000000000000000"),
    ("seed-negative", dict(seed=-1), ConfigError, r"--seed must be a whole number from 0"),
    # integers past 64 bits overflow inside torch
    ("batch-size-1e20", dict(batch_size=10**20), ConfigError, r"--batch-size is too large \(got 1e\+20; at most"),
    ("grad-accum-1e20", dict(grad_accum=10**20), ConfigError, r"--grad-accum is too large"),
]


@pytest.mark.parametrize("kw,exc,pattern", [c[1:] for c in BAD_TRAIN_INPUTS], ids=[c[0] for c in BAD_TRAIN_INPUTS])
def test_bad_training_input(tmp_path, corpus, kw, exc, pattern):
    before = snapshot(tmp_path)
    assert_one_line_error(invoke(train_cli, flags(train_kw(**kw))), pattern)
    with pytest.raises(exc) as info:
        chargpt.train(log=lambda msg: None, **train_kw(**kw))
    message = str(info.value)
    assert re.search(api_pattern(pattern), message) and "--" not in message, message  # the API's own names
    assert snapshot(tmp_path) == before


def test_unicode_escape_corpus_with_a_lone_surrogate_leaves_no_cache_file(tmp_path):
    (tmp_path / "escaped.txt").write_text("a \\ud800 b, and more text\n" * 20, encoding="ascii")
    assert_one_line_error(invoke(train_cli, flags(train_kw(data="escaped.txt", encoding="unicode_escape"))),
                          r"escaped\.txt decoded as unicode_escape: .*lone surrogate.*U\+D800.*--encoding")
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def test_text_encodings_still_work(tmp_path):
    (tmp_path / "le.txt").write_bytes("caf\u00e9 \u4e2d\n".encode("utf-16-le") * 30)
    corpus = data.encode_corpus("le.txt", encoding="utf-16-le")
    assert corpus.vocab.decode(corpus.ids()) == "caf\u00e9 \u4e2d\n" * 30


# --- 3: out of memory, on the CPU for real and on CUDA by type ------------------------------------------------------
CAPPED = """import resource, runpy, sys
# everything imported first: the cap is for the work
import chargpt.cli, chargpt.sampling.engine, chargpt.training.trainer
vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
resource.setrlimit(resource.RLIMIT_AS, (vm + (1 << 30), vm + (1 << 30)))  # 1 GB more than the imports took
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's /proc to size the memory cap")
@pytest.mark.parametrize("script,args,hint", [
    ("train.py", [*TINY_FLAGS, "--data", "corpus.txt", "--out-dir", "run", "--batch-size", "3000000"], "--batch-size"),
    ("sample.py", ["--checkpoint", "ckpt", "--num-samples", "2000000", "--seed", "1", "--device", "cpu"],
     "--num-samples"),
], ids=["train", "sample"])
def test_out_of_cpu_memory_is_one_line(tmp_path, corpus, ckpt, script, args, hint):
    """Like `ulimit -v`, but the cap is set after the imports, so it means the same on any machine."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-c", CAPPED, str(ROOT / script), *args], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    lines = [line for line in re.sub(r"[^\n]*\r", "", r.stderr).splitlines() if line.strip()]
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[-1].startswith("error: out of memory") and hint in lines[-1], lines[-1]
    if script == "sample.py":
        assert r.stdout == ""  # nothing was printed before the cache was allocated


@pytest.mark.parametrize("error,shown", [
    (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.1 GiB total)"),
     "error: out of memory (2.00 GiB requested); lower --num-samples"),
    (MemoryError(), "error: out of memory; lower --num-samples"),
], ids=["cuda", "python"])
def test_out_of_memory_is_recognised_by_type(ckpt, monkeypatch, error, shown):
    def stream(self, *args, **kwargs):
        raise error
        yield  # a generator, as the real one is

    monkeypatch.setattr(chargpt.Generator, "stream", stream)
    r = invoke(sample_cli, ["--checkpoint", ckpt, "--seed", "1"])
    assert r.exit_code == 1 and r.stdout == "" and r.stderr.splitlines()[-1].startswith(shown), r.stderr


# --- 8: a damaged corpus cache is rebuilt -------------------------------------------------------------------------
def test_damaged_corpus_cache_is_rebuilt_and_said(tmp_path, corpus):
    ids_path = data.encode_corpus("corpus.txt").ids_path
    good = ids_path.read_bytes()
    ids_path.write_bytes(b"\xff" * len(good))  # same size: only the ids are wrong
    logs = []
    assert data.encode_corpus("corpus.txt", log=logs.append).ids_path.read_bytes() == good
    assert len(logs) == 1 and "damaged" in logs[0] and "rebuilding" in logs[0]

    ids_path.write_bytes(b"\xff" * len(good))
    r = invoke(train_cli, flags(train_kw(out_dir="run")))
    assert r.exit_code == 0 and "rebuilding it" in r.stderr, r.stderr
    assert ids_path.read_bytes() == good


# --- sampling flags --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    (["--temperature", "inf"], "--temperature must be a finite number (got inf)"),
    (["--top-p", "nan"], "--top-p must be a finite number (got nan)"),
    (["--seed", str(10**23)], "--seed must be a whole number from 0 to"),
    (["--seed", "-5"], "--seed must be a whole number from 0 to"),
    (["--num-samples", str(10**20)], "--num-samples must be from 1 to 2**63 - 1"),
], ids=str)
def test_bad_sampling_input(ckpt, args, needle):
    r = invoke(sample_cli, ["--checkpoint", ckpt, *args])
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [f"error: {r.stderr.split('error: ', 1)[1].strip()}"]
    assert needle in r.stderr


@pytest.mark.parametrize("kw,name", [(dict(temperature=INF), "temperature"), (dict(top_p=NAN), "top_p"),
                                     (dict(seed=2**64), "seed"), (dict(num_samples=0), "num_samples"),
                                     (dict(temperature="hot"), "temperature")], ids=str)
def test_python_api_names_its_own_parameters(kw, name):
    with pytest.raises(ConfigError) as info:
        counter_gen().generate("ab", **kw)
    assert name in str(info.value) and "--" not in str(info.value)
    with pytest.raises(ChargptError, match=r"pass unknown='skip' or unknown='replace'$"):
        counter_gen().generate("a\u00c9")


# --- 10: terminals that cannot show a character; lone surrogates ---------------------------------------------------
WIDE = "\n \u4e2d\u5b57\u6587\u8a9e"  # newline, space and four CJK characters, in code point order


@pytest.fixture
def wide_ckpt(tmp_path):
    (tmp_path / "wide").mkdir()
    save_model(tmp_path / "wide" / "best.safetensors", counter_model(len(WIDE)), Vocab(WIDE))
    return tmp_path / "wide"


def test_ascii_stdout_gets_escapes_not_a_crash(wide_ckpt):
    runner = CliRunner(charset="ascii")  # PYTHONIOENCODING=ascii, or a Windows code page without CJK
    r = runner.invoke(sample_cli, ["--checkpoint", str(wide_ckpt), "--prompt", "\u4e2d", "--max-new-tokens", "2",
                                   "--temperature", "0"])
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "\\u4e2d\\u5b57\\u6587\n"
    r = runner.invoke(sample_cli, ["--checkpoint", str(wide_ckpt), "--prompt", "\u4e2d", "--max-new-tokens", "2",
                                   "--temperature", "0", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["text"] == "\u5b57\u6587"  # still exact JSON


def test_vocabulary_with_a_lone_surrogate_is_refused(ckpt, tmp_path):
    with pytest.raises(ChargptError, match=r"lone surrogate.*U\+D800"):
        Vocab(["a", "\ud800"])
    path = ckpt / "best.safetensors"
    header = safe_open(str(path), "pt").metadata()
    meta = json.loads(header["chargpt"])
    meta["vocab"] = meta["vocab"][:-1] + "\ud800"  # still sorted and distinct: only the surrogate is wrong
    save_file(load_file(path), str(tmp_path / "surrogate.safetensors"),
              metadata={**header, "chargpt": json.dumps(meta)})  # ASCII JSON: \ud800 survives as an escape
    with pytest.raises(CheckpointError, match=r"surrogate\.safetensors has missing or corrupted metadata.*surrogate"):
        chargpt.load(tmp_path / "surrogate.safetensors", device="cpu")
    assert_one_line_error(invoke(sample_cli, ["--checkpoint", tmp_path / "surrogate.safetensors"]), "lone surrogate")


# --- output rule and defaults -------------------------------------------------------------------------------------
def test_training_logs_on_stderr_and_prints_the_run_directory(tmp_path, corpus):
    r = invoke(train_cli, flags(train_kw(out_dir="run")))
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "run\n"  # scripts: run=$(python train.py ...)
    assert "step      2: train" in r.stderr and "done: 2 steps" in r.stderr


def test_greedy_sampling_prints_no_seed(ckpt):
    r = invoke(sample_cli, ["--checkpoint", ckpt, "--prompt", "ab", "--max-new-tokens", "2", "--temperature", "0"])
    assert r.exit_code == 0 and r.stdout == "abcd\n" and "seed" not in r.stderr
