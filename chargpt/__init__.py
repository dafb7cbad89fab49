"""chargpt: train a character-level GPT on any UTF-8 text and write new text in its style.

    import chargpt
    chargpt.train(data="corpus.txt", max_iters=1000)          # -> checkpoints/corpus/
    gen = chargpt.load("checkpoints/corpus")
    print(gen.generate("ROMEO:", max_new_tokens=200)[0])

    chargpt.train(data="ita.tsv", task="pairs", arch="encoder-decoder")   # sentence pairs -> checkpoints/ita/
    print(chargpt.load("checkpoints/ita").translate(["Good morning."], beam=4)[0])
"""

import time

# when chargpt was first imported: where a command (train.py, chargpt train) began, before torch's import; its
# --max-time is wall time from here (a Python program's chargpt.train counts from its call)
STARTED = time.perf_counter()

from chargpt.config import ModelConfig, TrainConfig  # noqa: E402
from chargpt.errors import ChargptError, CheckpointError, ConfigError, DataError  # noqa: E402

__version__ = "0.1.0"
# imported when first used (PEP 562): `import chargpt` stays light, so a command starts (and a Ctrl-C while it
# starts is handled, chargpt/training/interrupt.py) before torch is loaded
LAZY = {"Generator": "sampling.engine", "load": "sampling.engine", "CharGPT": "model.transformer",
        "Vocab": "data.tokenizer", "SampleOptions": "sampling.options"}


def __getattr__(name):
    if name in LAZY:
        import importlib
        return getattr(importlib.import_module(f".{LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def train(**kwargs):
    """Train a model; keyword arguments are the training flags with underscores. See chargpt.training.trainer.train."""
    from chargpt.training.trainer import train as _train
    return _train(**kwargs)


__all__ = ["CharGPT", "ChargptError", "CheckpointError", "ConfigError", "DataError", "Generator", "ModelConfig",
           "SampleOptions", "TrainConfig", "Vocab", "load", "train"]
