"""What `chargpt train --help` shows after its flags: the presets, each with its shape, parameters and purpose.

    chargpt train --help        # ... Presets (--preset NAME; ...):  tiny  0.11M parameters: 2 layers x 64 wide, ...

Parameters are counted on torch's meta device for a vocabulary of 65 characters (tiny Shakespeare's), when the
help is shown: nothing is allocated, and a training start pays nothing for it.
"""

import textwrap

from chargpt.config import PRESET_ABOUT, PRESETS, ModelConfig, split_overrides
from chargpt.config.architecture import describe_model
from chargpt.training import sizing


def preset_params(name, vocab_size=65):
    """Parameters of the model preset `name` builds at a vocabulary of `vocab_size` characters (tiny Shakespeare
    has 65), counted on torch's meta device: nothing is allocated, so even the largest costs nothing. For auto,
    whose model is sized at start: (smallest, largest) of its rungs."""
    if name == "auto":
        return tuple(model_params(r.model_settings(), vocab_size) for r in (sizing.RUNGS[0], sizing.RUNGS[-1]))
    return model_params(split_overrides(PRESETS[name])[0], vocab_size)


def model_params(model_kw, vocab_size=65):
    import torch  # here, not at the top: importing this module stays cheap

    from chargpt.model.transformer import build_model
    with torch.device("meta"):
        return build_model(ModelConfig(**{**model_kw, "vocab_size": vocab_size})).num_params()


def describe_params(name, vocab_size=65):
    """'0.43M', or auto's range '0.11M-10.77M'."""
    n = preset_params(name, vocab_size)
    return "-".join(f"{x / 1e6:.2f}M" for x in n) if isinstance(n, tuple) else f"{n / 1e6:.2f}M"


def preset_table(vocab_size=65):
    """Lines for --help: each preset with its size, parameters and purpose."""
    lines = [f"Presets (--preset NAME; parameters at a vocabulary of {vocab_size} characters, as tiny Shakespeare's):"]
    for name in PRESETS:
        model_kw, _ = split_overrides(PRESETS[name])
        shape = "sized at start" if name == "auto" else describe_model(ModelConfig(**model_kw))
        lines.append(f"  {name:<17} {describe_params(name, vocab_size):>12} parameters: {shape}")
        lines += textwrap.wrap(PRESET_ABOUT[name], 100, initial_indent=" " * 6, subsequent_indent=" " * 6,
                               break_on_hyphens=False)
    return lines
