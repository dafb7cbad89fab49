"""Write text with a trained run: python sample.py --prompt "ROMEO:" (python sample.py --help for every flag)."""
from chargpt.training.interrupt import quiet_start

quiet_start()  # a Ctrl-C during the imports exits quietly
from chargpt.cli import sample_cli  # noqa: E402

if __name__ == "__main__":
    sample_cli()
