"""Stopping a command cleanly: a Ctrl-C while it starts exits quietly; a signal while it trains saves the run first.

    from chargpt.training.interrupt import quiet_start   # first thing in an entry point (train.py, ...)
    quiet_start()

The quiet start. Until the command begins its work (cli.run_guarded calls work_begins), SIGINT ends the process at
once with "interrupted" and status 130: nothing has been written yet, and an import cut short by a
KeyboardInterrupt would print a traceback (or, for a C extension, fail again later with "cannot load module more
than once"). This module imports only the standard library, so it is in place before torch starts loading.

During training, SignalFlag turns SIGINT/SIGTERM into a request the loop reads (flag.requested) and that any long
inner loop (an evaluation, the scoring of translations) can act on by calling flag.check(), which raises
StopRequested: what was running is abandoned and the run saved as it stands.
"""

import contextlib
import os
import signal
import sys

from chargpt.platforms import STOP_SIGNALS


# --- the quiet start ---------------------------------------------------------------------------------------------
def _exit(signum, frame):
    os.write(sys.stderr.fileno(), b"\ninterrupted\n")
    os._exit(128 + signum)


def quiet_start():
    signal.signal(signal.SIGINT, _exit)


_interrupted = []  # the SIGINTs received since work began


def _interrupt(signum, frame):
    _interrupted.append(signum)
    raise KeyboardInterrupt


def work_begins():
    """From here on Ctrl-C raises KeyboardInterrupt again, for the command to handle (or training's handlers), and
    is remembered: a library that catches the exception (torch's import may, while it is being loaded lazily by a
    command) does not make the Ctrl-C disappear (see interrupted). A process that runs several commands (the test
    suite, a notebook) starts each with none remembered: a Ctrl-C handled by the last one is not this one's."""
    _interrupted.clear()
    try:
        if signal.getsignal(signal.SIGINT) is _exit:
            signal.signal(signal.SIGINT, _interrupt)
    except ValueError:  # not the main thread
        pass


def interrupted():
    """Whether Ctrl-C was pressed since work began, whatever became of its KeyboardInterrupt."""
    return bool(_interrupted)


# --- a handler for a while ------------------------------------------------------------------------------------------
@contextlib.contextmanager
def handling(signals, handler):
    """`handler` for `signals` within the block, the old handlers after. Only the main thread can set them; in
    another they stay as they are."""
    old = {}
    with contextlib.suppress(ValueError):  # not the main thread
        for sig in signals:
            old[sig] = signal.signal(sig, handler)
    try:
        yield
    finally:
        for sig, was in old.items():
            signal.signal(sig, signal.SIG_DFL if was is None else was)  # None: set outside Python, e.g. by default


# --- a signal while training ---------------------------------------------------------------------------------------
class StopRequested(Exception):
    """Raised by SignalFlag.check inside an evaluation or scoring loop once a signal has asked training to stop:
    the evaluation is abandoned and the run saved as it is."""


class Aborted(BaseException):
    """A third signal: what was running (`during`: a save, or a step or evaluation before the save) is abandoned,
    and the run is not saved again (a BaseException, so that nothing on the way catches it)."""

    def __init__(self, signum, during="save"):
        super().__init__(signum)
        self.signum, self.during = signum, during


class SignalFlag:
    """SIGINT/SIGTERM during training. The first sets a flag that the loop reads (and every evaluation and scoring
    loop, through check()), and says so at once; the run then saves and exits. The handlers stay in place until
    that save is done: a second signal only says "saving, please wait", and a third aborts the save, whose atomic
    writes then leave the previous complete files in place.

    distributed: under torchrun check() never raises: ranks that left an evaluation at different batches would wait
    on each other; there the loop's agreed flags stop every rank at the same step instead."""

    def __init__(self, say=lambda message: None, distributed=False):
        self.requested, self.signum, self.count, self.old, self.say = False, None, 0, {}, say
        self.distributed = distributed
        self.where = "step"  # what is running: "step", "evaluation" or "save" (what a signal waits for)

    def check(self):
        """Raise StopRequested if a signal asked training to stop (called inside evaluation and scoring loops)."""
        if self.requested and not self.distributed:
            raise StopRequested

    def _handle(self, signum, frame):
        self.count += 1
        name = signal.Signals(signum).name
        if self.count == 1:
            self.requested, self.signum = True, signum
            if self.where == "evaluation" and not self.distributed:  # check() abandons it at the next batch
                now = "abandoning the evaluation, then saving the run as it stands"
            elif self.where == "save":
                now = "finishing the save under way, then stopping"
            else:
                now = f"stopping after the current {self.where}, then saving the run"
            self.say(f"{name}: {now} (a second signal waits for the save; a third abandons it, keeping the last "
                     f"complete save)")
        elif self.count == 2:
            self.say(f"{name}: saving, please wait (a third signal abandons the save, keeping the last complete one)"
                     if self.where == "save" else
                     f"{name}: already stopping; the run saves after the current {self.where} (a third signal stops "
                     f"without saving, keeping the last complete save)")
        else:
            raise Aborted(signum, self.where)

    @contextlib.contextmanager
    def doing(self, what):
        """A span of the loop in which a signal waits for `what` ("evaluation", "save")."""
        before, self.where = self.where, what
        try:
            yield
        finally:
            self.where = before

    def __enter__(self):
        try:
            for sig in STOP_SIGNALS:  # SIGINT, SIGTERM, and Ctrl-Break (SIGBREAK) on Windows
                self.old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)
