"""The one exception type users see.

Every problem a user can fix (a bad path, an impossible flag, a broken checkpoint) raises a ChargptError
with a one-line message that names the problem and the fix. The CLIs print that line and exit non-zero;
Python callers can catch the type. Anything else escaping is a bug in chargpt and keeps its traceback.
"""


class ChargptError(Exception):
    """A problem with the user's input or environment, explained in one line."""


class DataError(ChargptError):
    """The corpus cannot be used (missing, empty, not text, too short...)."""


class ConfigError(ChargptError):
    """A flag or combination of flags is impossible."""


class CheckpointError(ChargptError):
    """A checkpoint is missing, not chargpt's, damaged, or cannot be written."""


class Interrupted(ChargptError):
    """Training stopped by SIGINT/SIGTERM after saving; `signum` gives the conventional exit status."""

    def __init__(self, message, signum):
        super().__init__(message)
        self.signum = signum
