"""python -m chargpt: the `chargpt` command; and the installed commands (chargpt, chargpt-train, chargpt-sample,
chargpt-bench, chargpt-serve in pyproject.toml), each the click command of chargpt/cli/ behind a quiet start.

The quiet start is made when a command starts, not when this module is imported: a process that only imports it (a
test, a notebook) keeps its own Ctrl-C handler."""

from chargpt.training.interrupt import quiet_start


def _command(name):
    quiet_start()  # a Ctrl-C during the imports exits quietly
    from chargpt import cli
    return getattr(cli, name)


def chargpt():
    _command("main")(prog_name="chargpt")


def train():
    _command("train_cli")()


def sample():
    _command("sample_cli")()


def bench():
    _command("bench_cli")()


def serve():
    _command("serve_cli")()


if __name__ == "__main__":
    chargpt()
