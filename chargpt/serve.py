"""`python -m chargpt.serve`: the same command as `chargpt serve` (the server itself is chargpt/web/server.py)."""

import sys

from .cli import serve_cli as main

if __name__ == "__main__":
    sys.exit(main())
