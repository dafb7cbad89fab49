"""A Ctrl-C while a command is starting (its imports take a second or two, torch most of it) exits quietly.

    from chargpt.startup import quiet_start   # first thing in an entry point (train.py, python -m chargpt)
    quiet_start()

The installed commands (chargpt, chargpt-train, ...; pyproject.toml) start through chargpt/__main__.py.

Until the command begins its work (cli.run_guarded calls work_begins), SIGINT ends the process at once with
"interrupted" and status 130: nothing has been written yet, and an import cut short by a KeyboardInterrupt
would print a traceback (or, for a C extension, fail again later with "cannot load module more than once").
"""

import os
import signal
import sys


def _exit(signum, frame):
    os.write(sys.stderr.fileno(), b"\ninterrupted\n")
    os._exit(128 + signum)


def quiet_start():
    signal.signal(signal.SIGINT, _exit)


def work_begins():
    """From here on Ctrl-C raises KeyboardInterrupt again, for the command to handle (or training's handlers)."""
    try:
        if signal.getsignal(signal.SIGINT) is _exit:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:  # not the main thread
        pass
