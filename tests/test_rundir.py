"""Run directories: one training owns one at a time (an OS lock that dies with its process; also without fcntl and
on filesystems without OS locks), a failed start leaves nothing behind, portable names, latest-run selection, atomic
writes and the clean-up of what killed writers left."""

import errno
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import ROOT, TINY_FLAGS

import chargpt
from chargpt.cli import train_cli
from chargpt.data.corpus import corpus_key, corpus_sources, encode_corpus
from chargpt.errors import CheckpointError
from chargpt.runs import rundir
from chargpt.runs.checkpoint import read_meta
from chargpt.runs.rundir import LOCK, METRICS, OWNER, STATE, RunDir, default_out_dir, latest_run, lock_holder
from chargpt.training import start

TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", warmup_iters=0)


def quiet_train(**kw):
    return chargpt.train(log=lambda msg: None, **{"data": "corpus.txt", **TINY_KW, **kw})


def one_line_error(args):
    """Run train.py's command in-process; -> its one stderr line (exit 1, no traceback)."""
    result = CliRunner().invoke(train_cli, [str(a) for a in args])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.exception, result.output)
    lines = [line for line in re.sub(r"[^\n]*\r", "", result.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def snapshot(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else "dir") for p in sorted(Path(root).rglob("*"))}


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


# --- one training per run directory ----------------------------------------------------------------------
def test_a_second_training_into_a_busy_run_directory_is_refused_until_the_first_dies(tmp_path, corpus):
    out, err = open(tmp_path / "stdout.txt", "w"), open(tmp_path / "stderr.txt", "w")
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--data", "corpus.txt", "--out-dir", "run",
                             *TINY_FLAGS, "--max-iters", "100000", "--eval-interval", "5"], stdout=out, stderr=err,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    out.close(), err.close()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / STATE).exists():  # it trains and has saved once
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.01)
        for extra in ([], ["--resume"]):  # a new run, or a resume, into the same directory
            line = one_line_error(["--data", "corpus.txt", "--out-dir", "run", *TINY_FLAGS, "--max-iters", "100000",
                                   *extra])
            assert re.fullmatch(rf"error: run is in use by another training \(pid {proc.pid}\); wait for it to finish "
                                rf"or stop it \(Ctrl-C saves it\), or pass another --out-dir", line), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert (tmp_path / "run" / LOCK).exists()  # kill -9 leaves the file, but the kernel has dropped the lock
    step = read_meta(tmp_path / "run" / STATE)[0]["step"]
    assert quiet_train(out_dir="run", resume=True, max_iters=step + 2)["step"] == step + 2
    assert not (tmp_path / "run" / LOCK).exists()  # a training that ends gives the directory back


def test_the_lock_names_its_holder_and_new_default_runs_step_around_it(tmp_path):
    held = RunDir("checkpoints/corpus").claim()  # a training that has started but not saved yet
    try:
        assert lock_holder("checkpoints/corpus") == f"pid {os.getpid()}"
        with pytest.raises(CheckpointError, match=rf"checkpoints/corpus is in use by another training \(pid "
                                                  rf"{os.getpid()}\)"):
            RunDir("checkpoints/corpus").claim()
        assert default_out_dir("corpus", resume=False) == Path("checkpoints/corpus-2")
    finally:
        held.release()
    assert lock_holder("checkpoints/corpus") is None
    assert not Path("checkpoints").exists()  # it created both folders, saved nothing: both are gone


WITHOUT_FCNTL = "import runpy, sys; sys.modules['fcntl'] = None; sys.argv[0] = {script!r}; runpy.run_path(" \
                "{script!r}, run_name='__main__')"  # train.py as on a system without fcntl (Windows has none)


def train_without_fcntl(*args, **kw):
    script = str(ROOT / "train.py")
    return subprocess.Popen([sys.executable, "-c", WITHOUT_FCNTL.format(script=script), "--data", "corpus.txt",
                             "--out-dir", "run", *TINY_FLAGS, *args], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            text=True, **kw)


def test_without_fcntl_a_second_training_is_still_refused_and_a_killed_one_leaves_no_stale_lock(tmp_path, corpus):
    """Where fcntl cannot be imported filelock locks with a marker file that names its process: a second training
    is refused, naming the first, and once the first is killed (-9) the next one takes the directory over."""
    err = open(tmp_path / "stderr.txt", "w")
    first = train_without_fcntl("--max-iters", "100000", "--eval-interval", "5", stdout=subprocess.DEVNULL,
                                stderr=err)
    err.close()
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / STATE).exists():  # it trains and has saved once
            assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "stderr.txt").read_text()
            time.sleep(0.01)
        second = train_without_fcntl("--max-iters", "100000", "--resume", stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE)
        out, err = second.communicate(timeout=120)
        assert second.returncode == 1, err
        assert err.strip() == (f"error: run is in use by another training (pid {first.pid}); wait for it to finish "
                               f"or stop it (Ctrl-C saves it), or pass another --out-dir"), err
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    step = read_meta(tmp_path / "run" / STATE)[0]["step"]
    third = train_without_fcntl("--resume", "--max-iters", str(step + 2), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    out, err = third.communicate(timeout=120)
    assert third.returncode == 0, err
    assert read_meta(tmp_path / "run" / STATE)[0]["step"] == step + 2
    assert not (tmp_path / "run" / LOCK).exists() and not (tmp_path / "run" / OWNER).exists()


def test_a_filesystem_without_os_locks_falls_back_to_a_marker_lock(tmp_path, monkeypatch):
    """Some network mounts refuse flock (ENOLCK): the run directory is then locked by a marker file, still
    refusing a second claim and naming its holder."""
    def no_locks(self, *args, **kw):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(rundir.filelock.FileLock, "acquire", no_locks)
    held = RunDir("run").claim()
    try:
        assert lock_holder("run") == f"pid {os.getpid()}"
        with pytest.raises(CheckpointError, match=rf"run is in use by another training \(pid {os.getpid()}\)"):
            RunDir("run").claim()
    finally:
        held.release()
    assert lock_holder("run") is None and not Path("run").exists()


def test_a_holder_on_another_machine_is_named_with_how_to_clear_its_lock(tmp_path, monkeypatch):
    held = RunDir("run").claim()
    try:
        (tmp_path / "run" / OWNER).write_text(json.dumps({"pid": 42, "host": "elsewhere"}))  # a shared filesystem
        with pytest.raises(CheckpointError, match=r"in use by another training \(pid 42 on elsewhere\); .*; if that "
                                                  r"training is gone, delete run/\.lock$"):
            RunDir("run").claim()
    finally:
        held.release()


def test_a_killed_holders_owner_file_is_not_taken_for_the_new_holder(tmp_path):
    """The owner file is written just after the lock is taken; until then the last one a killed training left
    is there, naming a dead process, which the message must not name."""
    held = RunDir("run").claim()
    try:
        (tmp_path / "run" / OWNER).write_text(json.dumps({"pid": dead_pid(), "host": socket.gethostname()}))
        assert lock_holder("run") == "a process that is still starting"
    finally:
        held.release()


def test_corpus_names_become_one_portable_folder_name(tmp_path):
    assert default_out_dir("a:b*c", resume=False) == Path("checkpoints/a_b_c")
    assert default_out_dir(".", resume=False) == Path("checkpoints/corpus")  # the stem of a file named '..txt'
    assert default_out_dir("con", resume=False) == Path("checkpoints/con_")  # a device name on Windows


# --- a failed start leaves nothing behind ------------------------------------------------------------------
def test_a_failed_start_removes_the_run_directory_it_created(tmp_path, corpus, monkeypatch):
    (tmp_path / "short.txt").write_text("a short corpus.\n" * 2, encoding="utf-8")  # found too short after claiming
    (tmp_path / "mine").mkdir()
    before = snapshot(tmp_path)
    for out_dir in (["--out-dir", "new/run"], [], ["--out-dir", "mine"]):  # new folders, checkpoints/short, an old one
        assert "too short" in one_line_error(["--data", "short.txt", *out_dir, *TINY_FLAGS])
    assert snapshot(tmp_path) == before  # "mine" was there before: kept, and still empty

    def no_memory(cfg):
        raise MemoryError
    monkeypatch.setattr(start, "build_model", no_memory)
    assert "does not fit in cpu memory" in one_line_error(["--data", "corpus.txt", "--out-dir", "big/run", *TINY_FLAGS])
    assert not (tmp_path / "big").exists()


# --- metrics.jsonl ----------------------------------------------------------------------------------------
def test_resume_with_metrics_replaced_by_a_directory_is_a_clean_error(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=2, eval_interval=1)
    (tmp_path / "run" / METRICS).unlink()
    (tmp_path / "run" / METRICS).mkdir()
    before = snapshot(tmp_path)
    line = one_line_error(["--out-dir", "run", "--resume", "--max-iters", "4", *TINY_FLAGS])
    assert re.search(r"cannot resume: run/metrics\.jsonl is unusable \(it is a directory\); move it out", line), line
    assert snapshot(tmp_path) == before


def test_resume_drops_metrics_logged_after_the_saved_state(tmp_path):
    path = tmp_path / METRICS
    path.write_text('{"step": 0}\n{"step": 5}\n{"step": 10}\n{"step": 1', encoding="utf-8")  # cut short by a kill
    rundir.truncate_metrics(path, 5)
    assert path.read_text(encoding="utf-8") == '{"step": 0}\n{"step": 5}\n'


# --- which run ------------------------------------------------------------------------------------------------
def test_latest_run_and_resume_pick_the_newest_and_new_runs_the_next_free_name(tmp_path):
    def make(d, name, age):
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
        (tmp_path / d / name).write_bytes(b"")
        os.utime(tmp_path / d / name, (time.time() - age, time.time() - age))

    with pytest.raises(CheckpointError, match=r"no trained run under checkpoints/; train one with python train\.py"):
        latest_run()
    make("checkpoints/poems", "best.safetensors", age=100)
    make("checkpoints/poems-2", "latest.safetensors", age=10)  # newer, only a latest (stopped before improving)
    make("checkpoints/notes", "state.safetensors", age=1)  # no model file: nothing to sample
    assert latest_run() == Path("checkpoints/poems-2")
    make("checkpoints/poems", "state.safetensors", age=50)
    make("checkpoints/poems-2", "state.safetensors", age=60)
    assert default_out_dir("poems", resume=True) == Path("checkpoints/poems")  # its state was saved last
    assert default_out_dir("poems", resume=False) == Path("checkpoints/poems-3")
    assert default_out_dir("other", resume=False) == Path("checkpoints/other")


# --- writing files ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("failure", [OSError(errno.ENOSPC, "No space left on device"), KeyboardInterrupt()],
                         ids=["disk-full", "ctrl-c"])
def test_an_interrupted_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, failure):
    path = tmp_path / "metrics.jsonl"
    rundir.write_text_atomic(path, "old\n")

    def fails_half_way(tmp):
        tmp.write_text("partial", encoding="utf-8")
        raise failure

    with pytest.raises(type(failure)):
        rundir.write_atomic(path, fails_half_way)
    assert path.read_text(encoding="utf-8") == "old\n" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_temporaries_of_dead_writers_are_removed_and_live_ones_kept(tmp_path, corpus):
    dead, alive = dead_pid(), os.getppid()
    run = tmp_path / "run"
    run.mkdir()
    for name in (f".state.safetensors.tmp{dead}", f".latest.safetensors.tmp{alive}", ".tmpab12cd"):
        (run / name).write_bytes(b"x")
    rundir.remove_stale_temps(run)
    assert [p.name for p in run.iterdir()] == [f".latest.safetensors.tmp{alive}"]

    # the names of the sweep's own kind only: a user's file that merely contains ".tmp" is theirs
    for name in (".notes.tmp.txt", ".backup.tmpl", ".zz.html.tmp_my_draft", f".latest.safetensors.tmp{dead}x",
                 f".x.tmp{dead}-host.name", ".tmp_draft", ".tmpab12cd.txt", f".x.tmp{'9' * 12}"):
        (run / name).write_bytes(b"mine")
    rundir.remove_stale_temps(run)
    assert len(list(run.iterdir())) == 9

    # the corpus cache goes through the same helpers: a dead encoder's temporary is cleaned up
    _, sources = corpus_sources(str(corpus))
    key, cache = corpus_key(sources, "utf-8", "strict"), tmp_path / "cache"
    cache.mkdir()
    (cache / f".{key}.json.tmp{dead}").write_text("{", encoding="utf-8")
    encode_corpus(str(corpus), cache_dir=cache)
    assert sorted(p.name for p in cache.iterdir()) == [f"{key}.bin", f"{key}.json"]


USERS_FILES = (".notes.tmp.txt", ".backup.tmpl", ".zz.html.tmp_my_draft")  # hidden, with ".tmp" in the name


def test_resume_sweeps_a_killed_saves_temporaries_and_keeps_a_users_files(tmp_path, corpus):
    quiet_train(out_dir="run", max_iters=2)
    run, dead = tmp_path / "run", dead_pid()
    for name in USERS_FILES:
        (run / name).write_text("my own notes", encoding="utf-8")
    stale = run / f".{STATE}.tmp{dead}-{rundir.host_tag()}"
    stale.write_bytes(b"half a save")
    quiet_train(out_dir="run", max_iters=4, resume=True)
    assert not stale.exists()
    assert all((run / name).read_text(encoding="utf-8") == "my own notes" for name in USERS_FILES)


def test_a_web_export_keeps_a_users_files_beside_it(tmp_path):
    from chargpt.tools.webpage import write_page
    for name in USERS_FILES:
        (tmp_path / name).write_text("my own notes", encoding="utf-8")
    stale = tmp_path / f".zz.html.tmp{dead_pid()}-{rundir.host_tag()}"
    stale.write_text("<html>half a page", encoding="utf-8")
    write_page(tmp_path / "zz.html", "<html>the page</html>", lambda path: None, force=False)
    assert (tmp_path / "zz.html").read_text(encoding="utf-8") == "<html>the page</html>" and not stale.exists()
    assert all((tmp_path / name).read_text(encoding="utf-8") == "my own notes" for name in USERS_FILES)
