"""python -m chargpt: the `chargpt` command; and the installed commands (chargpt, chargpt-train, chargpt-sample,
chargpt-bench, chargpt-serve in pyproject.toml), each the click command of chargpt/cli/ behind a quiet start."""

from .components.interrupt import quiet_start

quiet_start()  # a Ctrl-C during the imports exits quietly
from . import cli  # noqa: E402


def chargpt():
    cli.main(prog_name="chargpt")


def train():
    cli.train_cli()


def sample():
    cli.sample_cli()


def bench():
    cli.bench_cli()


def serve():
    cli.serve_cli()


if __name__ == "__main__":
    chargpt()
