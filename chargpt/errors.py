"""The one exception type users see.

Every problem a user can fix (a bad path, an impossible flag, a broken checkpoint) raises a ChargptError
with a one-line message that names the problem and the fix. The CLIs print that line and exit non-zero;
Python callers can catch the type. Anything else escaping is a bug in chargpt and keeps its traceback.
"""

import re
import sys


class ChargptError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class DataError(ChargptError):
    """The corpus cannot be used (missing, empty, not text, too short...)."""


class ConfigError(ChargptError):
    """A flag or combination of flags is impossible."""


class CheckpointError(ChargptError):
    """A checkpoint is missing, not chargpt's, damaged, or cannot be written."""


class Interrupted(ChargptError):
    """A command stopped by SIGINT/SIGTERM, having saved (training) or changed nothing (an export); `signum` gives the
    conventional exit status, `out_dir` the run saved (the CLI says how to resume it) and `distributed` whether it
    ran under torchrun."""

    def __init__(self, message, signum, out_dir=None, distributed=False, saved=True):
        super().__init__(message)
        self.signum, self.out_dir, self.distributed = signum, out_dir, distributed
        self.saved = saved  # False: a third signal abandoned the save; the run keeps its last complete one


def out_of_memory(e):
    """Whether `e` is a failed allocation. By type where there is one: torch.OutOfMemoryError (CUDA, MPS) and
    MemoryError (Python, numpy). Torch's CPU allocator raises a plain RuntimeError (checked with torch 2.13 under
    `ulimit -v`), recognised by the allocator's fixed message."""
    torch = sys.modules.get("torch")
    if isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower())


def requested_memory(e):
    """' (2.0 GB requested)' from an allocator's message, or ''."""
    m = re.search(r"allocate (\d+) bytes", str(e))
    if m:
        return f" ({int(m[1]) / 1e9:,.1f} GB requested)"
    m = re.search(r"allocate ([\d.]+ [KMGT]iB)", str(e))  # CUDA: "Tried to allocate 2.00 GiB"
    return f" ({m[1]} requested)" if m else ""
