"""A hostile user's inputs on the newer surfaces: signals during the final save and during evaluation, inputs that
never end, absurd model sizes, Ctrl-C while a command starts, and messages that must point the right way. The web
playground's server gets its hostile inputs in tests/test_serve.py."""

import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from helpers import (
    BODY,
    GOOD,
    ROOT,
    TINY_RUN_KW,
    Server,
    run_chargpt,
    run_cli,
    start_training,
    train_pairs,
    wait_for_training,
    write_cipher,
)

import chargpt
from chargpt import textio
from chargpt.config import ModelConfig
from chargpt.errors import ChargptError, ConfigError, DataError
from chargpt.model.transformer import check_model_fits, estimated_params
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir

TINY_KW = {**TINY_RUN_KW, "curves": False}


def quiet_train(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_KW, **kw})


def wait_for(condition, proc, tmp_path, timeout=60.0):
    """wait_for_training, polling every millisecond: the saves these tests catch last tens of milliseconds."""
    return wait_for_training(condition, proc, tmp_path, timeout, poll=0.001)


def finish(proc, timeout=60):
    """-> the exit status of proc; one that does not end in time is killed (no training left running)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"the process did not end within {timeout} s")


def saving_state(run):
    """-> a condition: the state file is being written (its temporary file exists)."""
    return lambda: any(p.name.startswith(f".{rundir.STATE}.tmp") for p in run.iterdir()) if run.is_dir() else False


# A model whose state takes a while to write (about 4.7M parameters: 57 MB with the AdamW moments).
SLOW_SAVE = ["--n-layer", "6", "--n-embd", "256", "--n-head", "4", "--max-iters", "100000"]


# --- two or three signals during the final save -------------------------------------------------------------------
def test_a_second_signal_during_the_final_save_waits_for_it(tmp_path, corpus):
    run = tmp_path / "run"
    proc = start_training(tmp_path, *SLOW_SAVE, "--save-state", "end", "--eval-interval", "100000")
    # evaluated at step 0, its best weights saved and the evaluation's line written after them: now training
    wait_for(lambda: "step      0:" in (tmp_path / "stderr.txt").read_text(), proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    wait_for(saving_state(run), proc, tmp_path)  # the final save has begun
    proc.send_signal(signal.SIGTERM)
    assert finish(proc) == 143
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "stopping after the current step" in stderr and "saving, please wait" in stderr
    assert "Traceback" not in stderr and "saved the run to run" in stderr
    step = ckpt.read_meta(run / rundir.STATE)[0]["step"]
    assert step >= 1 and ckpt.read_meta(run / rundir.LATEST)[0]["step"] == step


def test_a_third_signal_abandons_the_save_and_keeps_the_last_complete_one(tmp_path, corpus):
    run = tmp_path / "run"
    proc = start_training(tmp_path, *SLOW_SAVE, "--eval-interval", "100000")  # state saved at step 0
    wait_for(lambda: (run / rundir.STATE).exists(), proc, tmp_path)
    wait_for(lambda: not saving_state(run)(), proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    wait_for(saving_state(run), proc, tmp_path)
    proc.send_signal(signal.SIGTERM)
    time.sleep(0.002)
    proc.send_signal(signal.SIGTERM)
    status = finish(proc)
    stderr = (tmp_path / "stderr.txt").read_text()
    assert status == 143 and "Traceback" not in stderr, stderr
    # the save was abandoned (or, on a fast disk, had just finished): either way a complete, readable state
    assert "stopped during the save" in stderr or "saved the run" in stderr
    said = json.loads((run / rundir.STATUS).read_text())  # what the playground reads: not "saved" when it was not
    assert said["state"] == "stopped" and said["saved"] is ("stopped during the save" not in stderr)
    assert ckpt.read_meta(run / rundir.STATE)[0]["step"] >= 0
    assert not saving_state(run)()  # no temporary file left behind
    assert chargpt.train(log=lambda m: None, data="corpus.txt", out_dir="run", resume=True, max_iters=2,
                         **{k: v for k, v in TINY_KW.items() if k not in ("n_layer", "n_embd", "n_head")})


# --- --resume on another corpus with the same alphabet ------------------------------------------------------------
def test_resume_on_another_corpus_says_so(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=2)
    lines = corpus.read_text().splitlines(keepends=True)
    (tmp_path / "other.txt").write_text("".join(reversed(lines)))  # the same characters, another text
    said = []
    chargpt.train(log=said.append, data="other.txt", out_dir="run", resume=True, max_iters=4,
                  **{k: v for k, v in TINY_KW.items()})
    note = next(line for line in said if "corpus changed" in line)
    assert "other.txt" in note and str(corpus) in note
    said.clear()
    chargpt.train(log=said.append, data=str(tmp_path / "other.txt"), out_dir="run", resume=True, max_iters=6,
                  **TINY_KW)  # the same file, spelled another way: no note
    assert not any("corpus changed" in line for line in said)


# --- endless inputs -----------------------------------------------------------------------------------------------
def test_a_config_file_that_never_ends_is_refused_naming_it(tmp_path, corpus):
    with pytest.raises(ChargptError, match=r"config file /dev/zero is larger than 1 MiB"):
        quiet_train(config="/dev/zero")


def test_prompts_that_never_end_are_refused_naming_them(tiny_run):
    with pytest.raises(ChargptError, match=r"prompt file /dev/zero is larger than 4 MiB"):
        textio.read_prompt(None, "/dev/zero")
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        r = subprocess.run([sys.executable, str(ROOT / "sample.py"), "--checkpoint", str(tiny_run), "--prompt", "-"],
                           stdin=yes.stdout, capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        yes.kill()
        yes.wait()
    assert r.returncode == 1 and "stdin (--prompt -) is larger than 4 MiB" in r.stderr and "batch" not in r.stderr


class Endless(io.RawIOBase):
    """A pipe that never ends: `yes` (b"y\\n" for ever), or /dev/zero's bytes without a newline."""

    def __init__(self, piece, head=b""):
        self.piece, self.head, self.given = piece, head, 0

    def readable(self):
        return True

    def readinto(self, b):
        n = len(b)
        data, self.head = (self.head + self.piece * (n // len(self.piece) + 1))[:n], self.head[n:]
        b[:n] = data
        self.given += n
        return n


def test_translation_input_streams_line_by_line(monkeypatch):
    stream = io.BufferedReader(Endless(b"y\n"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(stream))
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    lines, name = textio.source_lines((), None)

    class Upper:  # a stand-in translator: what matters is that lines flow through, not the model
        def translate(self, sources, name, **options):
            return [s.upper() for s in sources]

    out = textio.translations(Upper(), lines, name, {})
    assert [next(out) for _ in range(5)] == ["Y"] * 5  # the first translations come at once, from an endless pipe
    assert stream.raw.given < 10 * textio.MAX_LINE_BYTES


def test_an_endless_line_is_refused_naming_it(tmp_path):
    lines, _ = textio.source_lines((), "/dev/zero")
    with pytest.raises(ChargptError, match=r"line 1 of /dev/zero is longer than 1 MiB"):
        next(lines)
    written = tmp_path / "out.txt"
    assert textio.write_output_lines(written, iter(["a", "b"])) == 2 and written.read_text() == "a\nb\n"


def test_interactive_input_without_line_ends_ends_the_session(tiny_run):
    from chargpt.cli.repl import repl
    from chargpt.sampling.options import SampleOptions
    gen = chargpt.load(tiny_run, device="cpu")
    settings = {"max_new_tokens": 2, "temperature": 0.0, "top_k": None, "top_p": None, "stop": ()}
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(ChargptError, match=r"input line 2 is longer than 1 MiB"):
        repl(gen, SampleOptions.of(seed=0, **settings), inp=io.BufferedReader(Endless(b"\0", head=b"To be\n")), out=out,
             err=err)
    assert out.getvalue().startswith("To be")  # line 1 was answered


# --- absurd model sizes -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
@pytest.mark.parametrize("size", [dict(), dict(n_layer=3, n_embd=48, block_size=40, n_enc_layer=2),
                                  dict(tie_weights=False, pos_emb="sinusoidal", bias=False)])
def test_the_estimate_matches_the_model_built(arch, size):
    if arch == "decoder" and "n_enc_layer" in size:
        size = {k: v for k, v in size.items() if k != "n_enc_layer"}
    cfg = ModelConfig(**{**dict(vocab_size=70, block_size=32, n_layer=2, n_head=4, n_embd=32), **size}, arch=arch)
    from chargpt.model.transformer import build_model
    with torch.device("meta"):
        actual = build_model(cfg).num_params()
    assert abs(estimated_params(cfg) - actual) / actual < 0.05


def test_a_model_that_cannot_fit_is_refused_before_building(tmp_path, corpus):
    """A ConfigError naming the setting to lower, where building would fail to allocate (or take hours). The time
    each command takes is not asserted: --preset auto first waits up to 30 s for a busy machine's CPUs to quieten
    (chargpt/training/sizing.py), so on a loaded one a refusal takes longer; the timeouts only guard against a hang."""
    write_cipher(tmp_path / "pairs.tsv", n=50)
    with pytest.raises(ConfigError, match=r"lower n_embd \(now 1,000,000\)"):
        quiet_train(n_embd=1_000_000, n_head=4)  # about 1.2e13 parameters: 190 TB to train
    with pytest.raises(ConfigError, match=r"n_enc_layer 100,000 is more layers than a checkpoint holds"):
        quiet_train(data="pairs.tsv", task="pairs", arch="encoder-decoder", n_enc_layer=100_000)
    (tmp_path / "big.toml").write_text("n-layer = 9223372036854775807\n")
    r = run_cli("train.py", "--data", "corpus.txt", "--config", "big.toml", "--device", "cpu", timeout=600)
    assert r.returncode == 1 and "--n-layer 9,223,372,036,854,775,807 is more layers than a checkpoint holds" \
        in r.stderr
    (tmp_path / "wide.toml").write_text("n-embd = 1000000\nn-head = 4\n")
    r = run_cli("train.py", "--data", "corpus.txt", "--config", "wide.toml", "--device", "cpu", timeout=600)
    assert r.returncode == 1 and "lower --n-embd (now 1,000,000 in wide.toml)" in r.stderr
    assert "Traceback" not in r.stderr
    check_model_fits(ModelConfig(vocab_size=65), 10**12, "here")  # 10.7M parameters fit in a terabyte
    with pytest.raises(ConfigError, match=r"lower n_embd"):
        check_model_fits(ModelConfig(vocab_size=65, n_embd=60_000, n_head=1), 10**12, "here")


# --- a signal during a long evaluation, or during pairs scoring ---------------------------------------------------
def test_a_signal_during_evaluation_stops_it_at_once(tmp_path, corpus):
    proc = start_training(tmp_path, "--eval-iters", "1000000", "--max-iters", "10")  # minutes of evaluation
    wait_for(lambda: "budget: " in (tmp_path / "stderr.txt").read_text(), proc, tmp_path)  # the last start-up lines
    time.sleep(1.0)  # well inside the first evaluation
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert finish(proc, 30) == 143 and time.monotonic() - t0 < 30
    stderr = (tmp_path / "stderr.txt").read_text()
    assert "SIGTERM: abandoning the evaluation, then saving the run as it stands" in stderr
    assert "Traceback" not in stderr
    assert ckpt.read_meta(tmp_path / "run" / rundir.STATE)[0]["step"] == 0


def test_translation_scoring_checks_the_stop_flag(tmp_path):
    from chargpt.sampling.translate import translate
    run = tmp_path / "pairs"
    train_pairs(write_cipher(tmp_path / "pairs.tsv", n=200), run, steps=2)
    gen = chargpt.load(run, device="cpu")
    calls = []

    def check_stop():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # what a stop looks like from inside: the search ends there

    with pytest.raises(KeyboardInterrupt):
        translate(gen.model, gen.vocab, ["abc", "hgf"], check_stop=check_stop)
    assert len(calls) == 3


# --- interactive mode goes on after a bad line --------------------------------------------------------------------
def interactive(run, stdin_bytes):
    return subprocess.run([sys.executable, str(ROOT / "sample.py"), "--checkpoint", str(run), "--interactive",
                           "--temperature", "0", "--max-new-tokens", "3"], input=stdin_bytes, capture_output=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_interactive_pairs_run_goes_on_after_a_bad_line(tmp_path):
    run = tmp_path / "pairs"
    train_pairs(write_cipher(tmp_path / "pairs.tsv", n=200), run, steps=2)
    r = interactive(run, "abc\n\ue000\nhgf\n".encode())
    err = r.stderr.decode()
    assert r.returncode == 0 and "Traceback" not in err
    assert "U+E000" in err and len(r.stdout.decode().splitlines()) == 2  # lines 1 and 3 answered


def test_interactive_invalid_utf8_is_named_as_such(tiny_run):
    r = interactive(tiny_run, b"To\xff be\nTo be\n")
    err = r.stderr.decode()
    assert r.returncode == 0 and "input line 1 is not UTF-8" in err and "U+DC" not in err
    assert r.stdout.decode().startswith("To be")  # the next line is answered


# --- TOML edge cases ----------------------------------------------------------------------------------------------
def test_a_deeply_nested_config_is_one_line(tmp_path, corpus):
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="nests arrays or tables too deeply"):
        quiet_train(config="deep.toml")


def test_a_config_with_a_byte_order_mark_is_read(tmp_path, corpus):
    (tmp_path / "bom.toml").write_text("max-iters = 2\n", encoding="utf-8-sig")
    assert quiet_train(config="bom.toml", out_dir="run")["step"] == 2


# --- plot and info ------------------------------------------------------------------------------------------------
def test_plot_to_an_empty_name_is_one_line(tiny_run):
    pytest.importorskip("matplotlib")
    r = run_chargpt("plot", tiny_run, "-o", "")
    assert r.returncode == 1 and "is not a file name" in r.stderr and "Traceback" not in r.stderr


def test_plot_leaves_out_losses_too_large_to_draw(tmp_path):
    pytest.importorskip("matplotlib")
    from chargpt.runs.plot import plot_runs
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": i, "train_loss": v, "val_loss": v} for i, v in enumerate([4.0, 1.7e308, 3.0, 1e307])]
    (run / rundir.METRICS).write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_runs([run], tmp_path / "c.png").stat().st_size > 0


@pytest.mark.parametrize("command", [["info"], ["plot"]])
def test_no_runs_suggests_what_the_command_takes(tmp_path, command):
    r = run_chargpt(*command)
    assert r.returncode == 1 and "--checkpoint" not in r.stderr
    assert f"chargpt {command[0]} RUN" in r.stderr


def test_info_on_a_device_says_it_is_not_a_checkpoint():
    r = run_chargpt("info", "/dev/zero")
    assert r.returncode == 1 and "is not a checkpoint" in r.stderr and "not found" not in r.stderr


# --- data get -----------------------------------------------------------------------------------------------------
def test_a_malformed_mirror_url_is_one_line(tmp_path):
    r = run_chargpt("data", "get", "tinyshakespeare", env={"CHARGPT_DATA_URL": "::::"})
    assert r.returncode == 1 and "CHARGPT_DATA_URL='::::' is not an http(s) URL" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_damaged_partial_file_is_downloaded_again_whole(tmp_path, monkeypatch):
    import chargpt.data.corpora as corpora
    monkeypatch.setitem(corpora.CORPORA, GOOD.name, GOOD)
    server = Server()
    try:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / ".test.txt.part").write_bytes(b"garbage " * 1000)  # shorter than the corpus
        said = []
        path = corpora.get(GOOD.name, tmp_path / "data", base_url=server.url, log=said.append, progress=False)
    finally:
        server.close()
    assert path.read_bytes() == BODY
    assert any("does not match the published file" in line for line in said)


# --- Ctrl-C while the command starts ------------------------------------------------------------------------------
def test_ctrl_c_during_start_up_is_quiet():
    """Until the command's work begins, SIGINT exits at once with 'interrupted' (here the start-up is held open)."""
    script = ("from chargpt.training.interrupt import quiet_start\nquiet_start()\nimport time\n"
              "print('importing', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    assert proc.stdout.readline() == "importing\n"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted"


def test_ctrl_c_while_the_real_command_imports_torch():
    proc = subprocess.Popen([sys.executable, "-m", "chargpt", "info"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)}, text=True)
    time.sleep(0.3)  # importing: torch alone takes longer than this
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err and "ImportError" not in err, err
    assert proc.returncode == 130 and err.strip().endswith("interrupted")


def test_importing_the_commands_leaves_ctrl_c_to_the_importer():
    """Only a process started as a command exits at once on Ctrl-C: one that imports the entry points (this test
    suite, a notebook) keeps its own handler, so a later Ctrl-C in it is a KeyboardInterrupt as usual."""
    code = "import signal, chargpt.__main__, chargpt.serve; print(signal.getsignal(signal.SIGINT).__name__)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.stdout.strip() == "default_int_handler", r.stdout + r.stderr


def test_the_installed_commands_start_quietly_too():
    """pyproject's console scripts go through chargpt/__main__.py's quiet start, as train.py and python -m chargpt
    do."""
    import importlib

    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for target in scripts.values():
        module, _, name = target.partition(":")
        assert module == "chargpt.__main__" and callable(getattr(importlib.import_module(module), name))
    for script in ("train.py", "sample.py", "chargpt/__main__.py", "chargpt/serve.py"):
        text = (ROOT / script).read_text()
        assert text.index("quiet_start()") < re.search(r"cli import|import cli", text).start()


# --- the corpus path is stored absolute ---------------------------------------------------------------------------
def test_a_run_evaluates_from_any_folder(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=2)  # data="corpus.txt", relative
    saved = ckpt.read_meta(tmp_path / "run" / rundir.BEST)[0]["train_config"]
    assert saved.data == str(corpus.resolve()) and Path(saved.cache_dir or "/").is_absolute()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    r = run_chargpt("eval", "--checkpoint", tmp_path / "run", "--device", "cpu", "--json", cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["characters"] > 0


# --- where training data and runs go ------------------------------------------------------------------------------
def test_an_out_dir_that_cannot_be_created_says_why(corpus):
    with pytest.raises(ChargptError, match=r"/proc does not allow creating folders"):
        quiet_train(out_dir="/proc/nope/x")


@pytest.mark.parametrize("target,words", [("nope.txt", "file not found: nope.txt; pass target_data"),
                                          ("/dev/null", "neither a file nor a directory .*; pass target_data"),
                                          ("folder", "target_data folder is a directory; pass target_data with one")])
def test_target_data_is_named_when_wrong(tmp_path, target, words):
    write_cipher(tmp_path / "sources.txt", n=50)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_text("x\n")
    with pytest.raises(DataError, match=words):
        quiet_train(data="sources.txt", target_data=target, task="pairs")


@pytest.mark.parametrize("encoding,hint", [("utf-16", "--encoding utf-16"), ("utf-16-le", "--encoding utf-16"),
                                           ("utf-32", "--encoding utf-32")])
def test_a_utf16_file_gets_an_encoding_hint(tmp_path, encoding, hint):
    (tmp_path / "pairs.tsv").write_text("".join(f"hello {i}\tciao {i}\n" for i in range(50)), encoding=encoding)
    r = run_cli("train.py", "--task", "pairs", "--data", "pairs.tsv", "--device", "cpu")
    assert r.returncode == 1 and f"looks like {hint.split()[-1].upper()} text: pass {hint}" in r.stderr


def test_cr_line_ends_are_read(tmp_path):
    (tmp_path / "pairs.tsv").write_bytes(b"".join(f"abc{i % 7}\tdef{i % 5}\r".encode() for i in range(100)))
    summary = quiet_train(data="pairs.tsv", task="pairs", out_dir="run", max_iters=1, block_size=16)
    assert summary["step"] == 1
    from chargpt.data.pairs import encode_pairs
    assert encode_pairs("pairs.tsv", log=lambda m: None).n_pairs == 100


# --- sampling flags with --beam -----------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", [["--top-k", "2"], ["--top-p", "0.5"], ["--temperature", "0.5"]])
def test_beam_refuses_every_sampling_flag(flag):
    from chargpt.cli import translate_cli
    r = CliRunner().invoke(translate_cli, ["--beam", "3", *flag, "hello"])
    assert r.exit_code == 1 and f"drop {flag[0]}" in r.output


# --- the share of time spent evaluating ---------------------------------------------------------------------------
def test_the_evaluation_share_never_passes_100_percent(tmp_path, corpus):
    said = []
    summary = chargpt.train(log=said.append, data="corpus.txt", out_dir="run", max_iters=2, eval_interval=1,
                            **{**TINY_KW, "eval_iters": 300})  # evaluations are nearly all of the time
    assert 0.5 < summary["eval_fraction"] <= 1.0
    state = ckpt.read_meta(tmp_path / "run" / rundir.STATE)[0]["run_state"]
    assert state["eval_time"] <= state["elapsed"]
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)

