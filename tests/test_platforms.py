"""What differs between Linux, macOS and Windows (chargpt/platforms.py): the Windows branches are driven here by
pretending to be Windows (sys.platform and the system calls faked), since the suite runs on Linux."""

import errno
import os
import signal
import socket
import subprocess
import sys

import pytest
from helpers import ROOT, TINY_FLAGS

from chargpt import platforms
from chargpt.platforms import STOP_SIGNALS, claim_port, pid_alive, portable_name
from chargpt.runs import rundir


def dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", ""])
    proc.wait()
    return proc.pid


def test_a_process_is_alive_until_it_ends():
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid())


def test_on_windows_no_process_is_probed_with_os_kill(tmp_path, monkeypatch):
    """os.kill(pid, 0) terminates the process on Windows: cleaning up a run's temporary files there must ask
    Windows whether the writer lives instead."""
    asked = []
    monkeypatch.setattr(platforms, "WINDOWS", True)
    monkeypatch.setattr(platforms, "_pid_alive_windows", lambda pid: asked.append(pid) or True)

    def kill(pid, sig):
        raise AssertionError("os.kill on Windows")
    monkeypatch.setattr(os, "kill", kill)
    live = tmp_path / ".best.safetensors.tmp12345"
    live.write_bytes(b"x")
    rundir.remove_stale_temps(tmp_path)
    assert asked == [12345] and live.exists()  # a live writer's file is kept


def test_ctrl_c_and_sigterm_stop_training_everywhere_and_ctrl_break_where_it_exists():
    assert {signal.SIGINT, signal.SIGTERM} <= set(STOP_SIGNALS)
    assert (getattr(signal, "SIGBREAK", None) in STOP_SIGNALS) == hasattr(signal, "SIGBREAK")


@pytest.mark.parametrize("name,want", [("tinyshakespeare", "tinyshakespeare"), ("唐诗", "唐诗"), ("a:b", "a_b"),
                                       ('q"<>|?*', "q______"), ("back\\slash", "back_slash"), ("dots...", "dots"),
                                       (".", "corpus"), ("..", "corpus"), (" ", "corpus"), ("NUL", "NUL_"),
                                       ("com1.txt", "com1_.txt"), (".hidden", ".hidden")])
def test_run_folder_names_are_one_name_every_system_accepts(name, want):
    assert portable_name(name) == want


def test_a_second_server_on_a_port_in_use_fails_instead_of_sharing_it():
    first = socket.socket()
    claim_port(first)
    first.bind(("127.0.0.1", 0))
    first.listen()
    second = socket.socket()
    try:
        claim_port(second)
        with pytest.raises(OSError) as info:
            second.bind(first.getsockname())
        assert info.value.errno == errno.EADDRINUSE
    finally:
        first.close(), second.close()


def test_on_windows_claiming_a_port_is_exclusive(monkeypatch):
    options = []

    class Sock:
        def setsockopt(self, level, option, value):
            options.append(option)
    monkeypatch.setattr(platforms, "WINDOWS", True)
    monkeypatch.setattr(socket, "SO_EXCLUSIVEADDRUSE", -5, raising=False)  # defined on Windows only
    claim_port(Sock())
    assert options == [-5]  # not SO_REUSEADDR, which there lets a second server bind the same port


def test_on_windows_a_rename_waits_out_a_brief_reader(tmp_path, monkeypatch):
    """Windows refuses to replace a file another process has open (the playground reading a checkpoint)."""
    calls, real = [], os.replace

    def busy_twice(src, dst):
        calls.append(dst)
        if len(calls) <= 2:
            raise PermissionError(13, "The process cannot access the file because it is being used")
        return real(src, dst)
    monkeypatch.setattr(platforms, "WINDOWS", True)
    monkeypatch.setattr(platforms.time, "sleep", lambda s: None)
    monkeypatch.setattr(os, "replace", busy_twice)
    rundir.write_text_atomic(tmp_path / "metrics.jsonl", "{}\n")
    assert len(calls) == 3 and (tmp_path / "metrics.jsonl").read_text() == "{}\n"


def test_a_console_that_cannot_show_the_corpus_gets_escapes_on_stderr_not_a_crash(tmp_path):
    """stdout is made tolerant by the CLI; stderr (log lines, the progress bar, the closing sample) must be too,
    as on a Windows console with a code page that lacks the corpus's characters."""
    (tmp_path / "poems.txt").write_text("床前明月光，疑是地上霜。举头望明月，低头思故乡。\n" * 80, encoding="utf-8")
    r = subprocess.run([sys.executable, str(ROOT / "train.py"), "--data", "poems.txt", "--out-dir", "run", *TINY_FLAGS,
                        "--max-iters", "4", "--eval-interval", "2", "--sample-chars", "20"], capture_output=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONIOENCODING": "ascii"})
    err = r.stderr.decode("ascii")  # every byte ASCII: what such a console can show
    assert r.returncode == 0 and "Traceback" not in err, err
    assert "--- sample from run" in err and "\\u" in err and "4/4" in err


def test_torchrun_where_torch_lacks_what_it_needs_is_one_line_at_start(monkeypatch):
    """torch.distributed is missing from some builds, and NCCL (several processes on CUDA) exists on Linux only."""
    import torch

    from chargpt.errors import ConfigError
    from chargpt.runtime import init_distributed
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr(torch.distributed, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"torchrun started 2 processes, but this torch build has no "
                                          r"torch.distributed; train in one process"):
        init_distributed("cpu")
    monkeypatch.setattr(torch.distributed, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: False)  # as on Windows and macOS
    with pytest.raises(ConfigError, match=r"several processes on CUDA GPUs need NCCL, which this torch build lacks"):
        init_distributed("cuda")
