"""python -m chargpt: the `chargpt` command (train, sample, eval, info, plot, bench, data, serve)."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="chargpt")
