"""Train a character-level GPT: python train.py --data corpus.txt (python train.py --help for every flag)."""
from chargpt.cli import train_cli

if __name__ == "__main__":
    train_cli()
