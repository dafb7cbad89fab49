"""python -m chargpt: the `chargpt` command (train, sample, eval, info, plot, bench, data, serve)."""

from .startup import quiet_start

quiet_start()  # a Ctrl-C during the imports exits quietly
from .cli import main  # noqa: E402

if __name__ == "__main__":
    main(prog_name="chargpt")
