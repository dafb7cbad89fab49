"""Settings as flags: each config dataclass field is a command-line flag (`n_embd` -> `--n-embd`), its help line
carried by the field (opt); and every message names a setting as the user gave it (param).

    n_layer: int = opt(6, "number of transformer blocks")       # in chargpt/config/__init__.py: the field and its help
    flag_specs(ModelConfig)                                     # -> [FlagSpec(dest="n_layer", name="n-layer", ...)]
    param("n_layer", 4)                                         # '--n-layer 4' in a CLI, "n_layer=4" from Python

The CLIs (chargpt/cli/) turn the specs into click options and wrap their work in cli_names(); a config file's
keys are the same flag names (chargpt/config/settings.py). This module knows no setting by name: it sits below
config.py, which defines them.
"""

import contextlib
import contextvars
import shlex
from dataclasses import dataclass, field, fields


def opt(default, help, **extra):
    """A dataclass field carrying its --help line (and optionally click `choices`, `multiple`, flag=False, or
    switch=(bare, negative): the flag alone means `bare`, and --no-<flag> means `negative`)."""
    return field(default=default, metadata={"help": help, **extra})


def flag(name):
    """A field name as its flag, without the dashes: n_embd -> n-embd."""
    return name.replace("_", "-")


# --- naming settings in messages ------------------------------------------------------------------------------
_CLI_NAMES = contextvars.ContextVar("chargpt_cli_names", default=False)
_NO_VALUE = object()


@contextlib.contextmanager
def cli_names():
    """Within this block, param() spells settings as command-line flags (the CLIs wrap their work in it)."""
    token = _CLI_NAMES.set(True)
    try:
        yield
    finally:
        _CLI_NAMES.reset(token)


def named_as_flags():
    """Whether settings are spelled as flags here (inside cli_names()) rather than as Python keywords."""
    return _CLI_NAMES.get()


def param(name, value=_NO_VALUE):
    """A setting as the user gave it: `--unknown skip` on the command line, `unknown='skip'` from Python."""
    if named_as_flags():
        return f"--{flag(name)}" + ("" if value is _NO_VALUE else f" {value}")
    return name + ("" if value is _NO_VALUE else f"={value!r}")


def spelled(name, value):
    """A setting as the user would type it: --n-layer 4, --no-bias, --sample-prompt 'ROMEO:' (n_layer=4 from
    Python)."""
    if not named_as_flags():
        return param(name, value)
    if isinstance(value, bool):
        return f"--{flag(name)}" if value else f"--no-{flag(name)}"
    return f"--{flag(name)} {shlex.quote(str(value))}"


# --- the flags of a dataclass ------------------------------------------------------------------------------------
def field_type(f):
    """The type a field's flag parses to: bool, int, float or str (`int | None` -> int; a tuple of strings -> str;
    a field with choices -> str)."""
    if f.metadata.get("choices"):
        return str
    for cand in (bool, int, float, str):
        if f.type is cand or cand in getattr(f.type, "__args__", ()):
            return cand
    return str


@dataclass(frozen=True)
class FlagSpec:
    """One command-line flag, as a dataclass field defines it (the CLI turns these into click options)."""
    dest: str  # the field name: the keyword argument it fills
    name: str  # the flag without its dashes
    type: type  # bool, int, float or str
    default: object  # the dataclass default (what a bool switch starts as)
    help: str  # the field's help line, with its default(s) appended
    choices: tuple | None = None
    multiple: bool = False
    switch: tuple | None = None  # (value of the bare flag, value of --no-<flag>)


def flag_specs(cls):
    """The flags of dataclass `cls`, in field order, each help line ending with its default. Where the default
    without a GPU differs, `cls.cpu_defaults` ({field name: 'VALUE on CPU'}) has it, and both are shown."""
    cpu_defaults = getattr(cls, "cpu_defaults", {})
    specs = []
    for f in fields(cls):
        if f.metadata.get("flag") is False:
            continue
        typ, help_ = field_type(f), f.metadata["help"]
        if f.name in cpu_defaults:
            help_ += f" [default: {cpu_defaults[f.name]}, {'none' if f.default is None else f.default} on GPU]"
        elif f.default is not None and typ is not bool and "[default" not in help_:
            help_ += f" [default: {f.default}]"
        specs.append(FlagSpec(f.name, flag(f.name), typ, f.default, help_, f.metadata.get("choices"),
                              f.metadata.get("multiple", False), f.metadata.get("switch")))
    return specs
