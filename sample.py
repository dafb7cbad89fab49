"""Write text with a trained run: python sample.py --prompt "ROMEO:" (python sample.py --help for every flag)."""
from chargpt.cli import sample_cli

if __name__ == "__main__":
    sample_cli()
