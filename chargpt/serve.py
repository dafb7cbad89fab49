"""`python -m chargpt.serve`: the same command as `chargpt serve` (the server itself is chargpt/web/server.py)."""

import sys

from chargpt.training.interrupt import quiet_start

if __name__ == "__main__":  # run, not imported: an importing process keeps its own Ctrl-C handler
    quiet_start()  # a Ctrl-C during the imports exits quietly
from chargpt.cli import serve_cli as main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
