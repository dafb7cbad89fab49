"""The suite's guard (tests/conftest.py process_unchanged): a test that leaves process-wide state changed fails,
naming what it changed, and the tests after it start from the state before it; one that undoes its changes (as
monkeypatch does) passes. And --reverse-files runs the files in the other order."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LEAKS = '''
import logging, os, signal
import torch

def test_sets_a_variable():
    os.environ["CHARGPT_LEFT_BEHIND"] = "1"

def test_handles_ctrl_c():
    signal.signal(signal.SIGINT, lambda *a: None)

def test_changes_dtype_and_logging():
    torch.set_default_dtype(torch.float64)
    logging.getLogger().addHandler(logging.NullHandler())

def test_after_them_finds_the_process_as_it_was():
    assert "CHARGPT_LEFT_BEHIND" not in os.environ
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert torch.get_default_dtype() is torch.float32 and torch.get_num_threads() == 1

def test_undoing_its_changes_passes(monkeypatch, tmp_path):
    monkeypatch.setenv("CHARGPT_LEFT_BEHIND", "1")
    monkeypatch.delenv("CHARGPT_CACHE_DIR")
    monkeypatch.chdir(tmp_path)
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    signal.signal(signal.SIGTERM, old)
'''


def pytest_in(folder, *args):
    """pytest on `folder`, which holds a copy of the suite's conftest.py, in a process of its own."""
    shutil.copy(ROOT / "tests" / "conftest.py", folder / "conftest.py")
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
                          capture_output=True, text=True, cwd=folder, timeout=600,
                          env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})


def test_a_test_that_leaves_the_process_changed_fails_naming_what_changed(tmp_path):
    (tmp_path / "test_leaks.py").write_text(LEAKS)
    r = pytest_in(tmp_path, "-rE")
    assert "5 passed, 3 errors" in r.stdout, r.stdout + r.stderr
    errors = {line.split("::")[1].split(" ")[0]: line for line in r.stdout.splitlines() if line.startswith("ERROR ")}
    assert sorted(errors) == ["test_changes_dtype_and_logging", "test_handles_ctrl_c", "test_sets_a_variable"]
    assert "os.environ['CHARGPT_LEFT_BEHIND']: None -> '1'" in r.stdout
    assert "the SIGINT handler: <built-in function default_int_handler> -> <function" in r.stdout
    assert "torch's default dtype: torch.float32 -> torch.float64" in r.stdout
    assert "the root logger's handlers: [" in r.stdout and "NullHandler" in r.stdout


def test_reverse_files_runs_the_files_last_to_first(tmp_path):
    for name in ("test_a.py", "test_b.py", "test_c.py"):
        (tmp_path / name).write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    r = pytest_in(tmp_path, "--collect-only", "--reverse-files")
    assert r.stdout.splitlines()[:6] == [f"{name}::{test}" for name in ("test_c.py", "test_b.py", "test_a.py")
                                         for test in ("test_one", "test_two")], r.stdout
