"""Train a character-level GPT: python train.py --data corpus.txt (python train.py --help for every flag)."""
from chargpt.training.interrupt import quiet_start

quiet_start()  # a Ctrl-C during the imports exits quietly
from chargpt.cli import train_cli  # noqa: E402

if __name__ == "__main__":
    train_cli()
