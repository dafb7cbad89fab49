"""What differs between Linux, macOS and Windows, in one place: whether a process is alive, which signals stop a
training, which names a folder may have, how a listening socket claims its port, renaming over a file, and
holding a folder for one process.

Linux is where the test suite runs; macOS and Windows are supported by design (docs/contributing.md, Platforms):
each function below is the portable form of something POSIX offers directly, so the rest of chargpt never asks
which system it is on.
"""

import contextlib
import os
import re
import signal
import socket
import sys
import time

WINDOWS = sys.platform == "win32"

# Ctrl-C (SIGINT) everywhere; SIGTERM where the system sends it (kill, systemd, a job scheduler; on Windows nothing
# does: a killed process is terminated outright, like kill -9); Ctrl-Break (SIGBREAK) in a Windows console, where it is
# the usual way to stop a program that handles Ctrl-C. Each stops training after the current step, with a save.
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGBREAK") if hasattr(signal, name))


# --- processes ------------------------------------------------------------------------------------------------
def pid_alive(pid):
    """Whether process `pid` (on this machine) is running. Never os.kill(pid, 0) on Windows: there any signal but
    Ctrl-C/Ctrl-Break terminates the process instead of probing it."""
    return _pid_alive_windows(pid) if WINDOWS else _pid_alive_posix(pid)


def _pid_alive_posix(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def _pid_alive_windows(pid):
    import ctypes
    kernel32 = ctypes.WinDLL("kernel32", use_last_error=True)
    query_limited_information, still_active, access_denied = 0x1000, 259, 5
    handle = kernel32.OpenProcess(query_limited_information, False, pid)
    if not handle:
        return ctypes.get_last_error() == access_denied  # exists, owned by someone else
    try:
        code = ctypes.c_ulong()
        return bool(kernel32.GetExitCodeProcess(handle, ctypes.byref(code))) and code.value == still_active
    finally:
        kernel32.CloseHandle(handle)


# --- names ----------------------------------------------------------------------------------------------------
# Characters no Windows file name may hold (and '/', which no name anywhere may); device names Windows reserves in
# every folder, with any extension.
_NOT_IN_NAMES = re.compile(r'[<>:"/\\|?*\x00-\x1f]')
_RESERVED = re.compile(r"(con|prn|aux|nul|com[0-9¹²³]|lpt[0-9¹²³])(\..*)?", re.IGNORECASE)


def portable_name(name, fallback="corpus"):
    """`name` as a single folder name that every system accepts, so a run directory made from a corpus's name is
    one folder (never a path: no separators, no '.' or '..') that can be copied to any machine: characters Windows
    forbids become '_', trailing dots and spaces (which Windows drops) go, a reserved device name gets a '_'."""
    name = _NOT_IN_NAMES.sub("_", name).rstrip(" .")
    if not name.strip(" ."):
        return fallback
    reserved = _RESERVED.fullmatch(name)  # reserved with any extension: the '_' goes before it
    return f"{reserved[1]}_{reserved[2] or ''}" if reserved else name


# --- sockets --------------------------------------------------------------------------------------------------
def claim_port(sock):
    """Set a listening socket up so that binding fails while another server has the port: SO_REUSEADDR on POSIX (a
    restart does not wait out old connections in TIME_WAIT), SO_EXCLUSIVEADDRUSE on Windows, where SO_REUSEADDR
    would instead let two servers bind one port."""
    if WINDOWS and hasattr(socket, "SO_EXCLUSIVEADDRUSE"):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)


# --- files ----------------------------------------------------------------------------------------------------
REPLACE_RETRIES = 20  # x 50 ms: how long a rename waits for a reader on Windows


def replace(src, dst):
    """os.replace, which on Windows fails while another process has dst open (the web playground reading a
    checkpoint, a virus scanner, an indexer): such holds are brief, so it is retried for about a second there."""
    for _ in range(REPLACE_RETRIES if WINDOWS else 0):
        with contextlib.suppress(PermissionError):
            return os.replace(src, dst)
        time.sleep(0.05)
    return os.replace(src, dst)


# --- a folder held by one process ---------------------------------------------------------------------------------
@contextlib.contextmanager
def lock_folder(folder):
    """Hold an exclusive lock on `folder` itself (flock on the folder: nothing is created in it; it dies with its
    process) -> yields False if another process holds it, else True. Where there is no flock (Windows) or the
    filesystem refuses locks, it yields True without a lock."""
    try:
        import fcntl
    except ImportError:
        yield True
        return
    fd = os.open(folder, os.O_RDONLY)
    try:
        held = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held = False
        except OSError:  # no locks on this filesystem
            pass
        yield held
    finally:
        os.close(fd)
