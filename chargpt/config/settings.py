"""Where a run's settings come from: defaults <- preset <- config file <- flags; and the config.toml a run keeps.

    chargpt train --preset tiny --config run.toml --max-iters 500

Each layer overrides the one below it: the dataclass defaults (config.py); a named preset (config.PRESETS; without
--preset the device picks auto or shakespeare-char); a TOML file (--config), its keys the flag names, with dashes
or underscores; the flags typed (from Python: the keyword arguments). new_run_settings merges them for a new run;
resume_settings and init_settings for a run continued or started from another. The start-up log names the layer
each setting came from (Settings.describe). A run directory keeps its resolved settings as config.toml (config_toml),
and `chargpt train --config DIR/config.toml` trains that run again, into a new run directory.
"""

import difflib
import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, from PyPI (a dependency there)
    import tomli as tomllib

from chargpt.config import (
    PRESET_ABOUT,
    PRESETS,
    UNLIMITED,
    ModelConfig,
    TrainConfig,
    check_preset,
    device_preset,
    split_overrides,
    typed_fields,
)
from chargpt.config.flags import flag, flag_specs, named_as_flags, param, spelled
from chargpt.errors import ConfigError
from chargpt.runs.checkpoint import PATHS, run_settings
from chargpt.textio import MAX_CONFIG_BYTES, read_bounded

HARDWARE = ("device", "dtype", "threads", "compile", "attention")  # how a run is computed, not what it is
FLAGS = "flags"  # the source name of the top layer: the command line, or chargpt.train's keyword arguments
NOT_IN_FILE = {"config": "config files do not include one another", "resume": "pass --resume on the command line"}
NOT_WRITTEN = ("config", "resume", "out_dir")  # a repeat is a new run, in a new run directory
WANT = {bool: "true or false", int: "a whole number", float: "a number", str: "a string (in quotes)"}


# --- reading a config file -------------------------------------------------------------------------------------
def file_keys():
    """{field name: FlagSpec} of every setting a config file may hold: each flag but those in NOT_IN_FILE."""
    return {s.dest: s for cls in (ModelConfig, TrainConfig) for s in flag_specs(cls) if s.dest not in NOT_IN_FILE}


def read_config_file(path):
    """A TOML file of settings -> {field name: value}. An unreadable file, an unknown key (with the closest valid
    one) and a value of the wrong type are ConfigErrors naming the file and the key."""
    try:
        with open(path, "rb") as f:
            data = read_bounded(f, MAX_CONFIG_BYTES, f"config file {path}")
        table = tomllib.loads(data.decode("utf-8").removeprefix("\ufeff"))  # a BOM, as some editors write one
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}; pass {param('config')} an existing TOML file") from None
    except OSError as e:
        raise ConfigError(f"cannot read config file {path} ({e.strerror}); pass {param('config')} a readable TOML "
                          f"file") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"config file {path} is not UTF-8 (byte offset {e.start}); save it as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML ({e}); write one setting per line, as "
                          f"n-layer = 4") from None
    except RecursionError:  # the parser recurses into each nested array or table
        raise ConfigError(f"config file {path} nests arrays or tables too deeply to read; settings are top-level "
                          f"keys (n-layer = 4)") from None
    keys, values, seen = file_keys(), {}, {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name in NOT_IN_FILE:
            raise ConfigError(f"{path}: {key!r} cannot be set in a config file; {NOT_IN_FILE[name]}")
        if name not in keys:
            raise ConfigError(_unknown_key(path, key, value, keys))
        if name in seen:
            raise ConfigError(f"{path}: {seen[name]!r} and {key!r} are the same setting; keep one of them")
        seen[name] = key
        values[name] = _checked(path, key, value, keys[name])
    return values


def _unknown_key(path, key, value, keys):
    if isinstance(value, dict):
        return f"{path}: [{key}] is a table; settings are top-level keys (n-layer = 4), not in tables"
    names = list(keys) if "_" in key else [flag(name) for name in keys]  # suggest in the user's spelling
    close = difflib.get_close_matches(key.lower(), names, n=1)
    hint = f"did you mean {close[0]!r}?" if close else "the keys are the flag names (chargpt train --help)"
    return f"{path}: unknown setting {key!r}; {hint}"


def _checked(path, key, value, spec):
    """The value of `key` if it has its setting's type (config.typed_fields: an integer is a number too) and is one
    of its choices; a number as a float where the setting is one."""
    def wrong_type(name, value, want):
        return f"{path}: {key} must be {WANT[want]}, not {_kind(value)}: {_shown(value)}"

    value = typed_fields((ModelConfig, TrainConfig), {spec.dest: value}, path, wrong_type)[spec.dest]
    if isinstance(value, float) and not math.isfinite(value):  # TOML has inf and nan; no setting takes them
        raise ConfigError(f"{path}: {key} must be a finite number, not {_shown(value)}"
                          + ("; to train without a time limit, leave max-time out and set max-iters"
                             if spec.dest == "max_time" and value > 0 else ""))
    if spec.choices and value not in spec.choices:
        close = difflib.get_close_matches(value, spec.choices, n=1) if isinstance(value, str) else []
        raise ConfigError(f"{path}: {key} must be one of {', '.join(spec.choices)}, not {_shown(value)}"
                          + (f"; did you mean {close[0]!r}?" if close else ""))
    return float(value) if spec.type is float else value


def _kind(value):
    for t, word in ((bool, "true/false"), (int, "a whole number"), (float, "a float"), (str, "a string"),
                    (list, "an array"), (dict, "a table")):
        if isinstance(value, t):
            return word
    return "a date or time"


def _shown(value):
    """A value as the file has it (TOML spelling), cut short."""
    text = toml_value(value) if isinstance(value, (bool, int, float, str)) else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


# --- the layers --------------------------------------------------------------------------------------------------
def no_step_limit(values):
    """Within one layer, a time budget given without a step budget means no step limit: --max-time alone on the
    command line lifts a config file's or preset's --max-iters."""
    if values.get("max_time") and "max_iters" not in values:
        return {**values, "max_iters": UNLIMITED}
    return values


class Settings:
    """The settings of one training start, as layers (source, {name: value}), lowest first: the preset (once
    chosen), the config file (if any), the flags. merged() is what the run takes over the dataclass defaults."""

    def __init__(self, flags):
        self.layers = []
        if flags.get("config"):
            self.layers.append((str(flags["config"]), no_step_limit(read_config_file(flags["config"]))))
        self.layers.append((FLAGS, no_step_limit(flags)))
        self.preset = self.preset_source = self.device_type = None

    def merged(self):
        return {k: v for _, values in self.layers for k, v in values.items()}

    def source(self, name):
        """The source that set `name` (the highest layer holding it), or None."""
        return next((source for source, values in reversed(self.layers) if name in values), None)

    def pick_preset(self, device_type, current=None, fallback=None):
        """The preset: the one named (by the flags or the file), else `fallback` (name, source) if given, else the
        device's. On --resume (device_type None) only a preset named that is not the run's `current` one is a
        layer."""
        named = self.merged().get("preset")
        check_preset(named)
        if device_type is None and named in (None, current):
            return
        if named is None and fallback is not None:
            named, source = fallback
        else:
            source = self.source("preset")
        self.preset, self.preset_source = named or device_preset(device_type), source
        self.device_type = device_type
        values = PRESETS[self.preset]
        if "max_time" in values and "max_iters" in self.given() and "max_time" not in self.given():
            # a step budget given lifts the preset's time budget (as --max-time alone lifts a step budget)
            values = {k: v for k, v in values.items() if k not in ("max_time", "max_iters")}
        self.layers.insert(0, (f"preset {self.preset}", values))

    def given(self):
        """{name: value} of what a config file or the flags set (not a preset); a step limit lifted by --max-time
        alone (no_step_limit) is not a step budget given."""
        values = {k: v for source, layer in self.layers if not source.startswith("preset ") for k, v in layer.items()}
        if values.get("max_iters", 0) >= UNLIMITED:
            del values["max_iters"]
        return values

    def keep_changes(self, saved):
        """For --resume: keep, from the preset and the config file, only values that differ from the run's `saved`
        settings (flags all count, as before: a --max-time given starts a new budget)."""
        self.layers = [(source, values if source == FLAGS else {k: v for k, v in values.items()
                                                                 if k not in saved or not _same(k, saved[k], v)})
                       for source, values in self.layers]

    def describe(self):
        """Start-up log lines: the preset, then each source's settings that are in effect and change what the
        layers below give (a config.toml repeats every setting: only what it changes is worth a mention)."""
        why = f"the default on {str(self.device_type).upper()}" if self.preset_source is None else \
            param("preset") if self.preset_source == FLAGS else f"from {self.preset_source}"
        lines = [f"preset: {self.preset} ({why}) — {PRESET_ABOUT[self.preset]}"] if self.preset else []
        below = {f.name: f.default for cls in (ModelConfig, TrainConfig) for f in fields(cls)}
        for i, (source, values) in enumerate(self.layers):
            later = {k for _, higher in self.layers[i + 1:] for k in higher}
            shown = [spelled(k, v) for k, v in values.items() if k not in later and below.get(k) != v
                     and k not in ("preset", "config") and not (k == "max_iters" and v >= UNLIMITED)]
            below.update(values)
            where = source if source != FLAGS else "the command line" if named_as_flags() else "arguments"
            if shown and not source.startswith("preset "):
                lines.append(f"from {where}: {' '.join(shown)}")
        return lines


def _same(name, a, b):
    """Whether two values of a setting mean the same (a path, relative or absolute, is the same file)."""
    if name in PATHS and isinstance(a, str) and isinstance(b, str):
        return Path(a).resolve() == Path(b).resolve()
    return a == b


def _as_flag(name, value, alone=False):
    """A model setting as its flag, in messages about a checkpoint's model: --n-layer 4, --no-bias (alone: the
    value only, 4, for a flag that takes one)."""
    if isinstance(value, bool):
        return f"--{flag(name)}" if value else f"--no-{flag(name)}"
    return str(value) if alone else f"--{flag(name)} {value}"


def new_run_settings(flags, device_type="cpu"):
    """Defaults <- preset <- config file <- flags -> (model fields but the vocabulary size, validated TrainConfig,
    Settings). The one merge of the layers for a new run; a resumed run starts from its checkpoint instead."""
    settings = flags if isinstance(flags, Settings) else Settings(flags)
    settings.pick_preset(device_type)
    model_kw, train_kw = split_overrides(settings.merged())
    # every model field, the dataclass default where no layer sets one: a preset that sets nothing (shakespeare-char,
    # the default on CUDA, is exactly the defaults) still yields a whole model
    return {**model_defaults(), **model_kw}, TrainConfig(**{**train_kw, "preset": settings.preset}).validate(), settings


def model_defaults():
    """{field: default} of every model setting but the vocabulary size (which the corpus gives)."""
    return {f.name: f.default for f in fields(ModelConfig) if f.name != "vocab_size"}




# --- the settings of a resumed run -----------------------------------------------------------------------------------
def resume_settings(meta, settings: Settings, out_dir):
    """A run's saved state (checkpoint.read_meta of its state.safetensors) + the settings given now -> (model
    fields but the vocabulary size, validated TrainConfig, notes for the start-up log). Architecture settings must
    agree with the checkpoint (dropout may change, as when fine-tuning); training settings may change; hardware
    settings come from this command alone (a run may move to other hardware). From a config file or a named preset
    only what differs from the run counts as given. The run's state: chargpt/training/state.py."""
    model_kw, cfg = _resumed_configs(meta, settings)
    cfg = replace(cfg, out_dir=str(out_dir))
    return model_kw, cfg, corpus_changes(run_settings(meta), cfg)


def corpus_changes(saved: TrainConfig | None, cfg: TrainConfig):
    """Lines saying that --resume trains on other data than the run did. A resume continues the weights and the
    optimizer state on whatever corpus it is given, as long as the alphabet is the same (the trainer refuses
    another): on another corpus that is fine-tuning. It is said, so that it is never a mistake no one saw."""
    notes = []
    for name in ("data", "target_data"):
        old, new = getattr(saved, name, None), getattr(cfg, name)
        if saved is not None and not _same(name, old, new):
            shown = {None: "the built-in corpus" if name == "data" else "none"}
            notes.append(f"the corpus changed: {param(name)} is {shown.get(new, new)} (the run trained on "
                         f"{shown.get(old, old)}); training goes on from the checkpoint on the new data (its "
                         f"characters are the same)")
    return notes


def _resumed_configs(meta, settings: Settings):
    saved_model: ModelConfig = meta["model_config"]
    saved_train = {k: v for k, v in asdict(run_settings(meta, assumed=True)).items() if k not in HARDWARE}
    settings.pick_preset(None, current=saved_train.get("preset"))  # only another preset named now
    settings.keep_changes({**asdict(saved_model), **saved_train})
    if settings.merged().get("init_from"):
        raise ConfigError(f"--resume continues the run's own weights and optimizer; {param('init_from')} starts a "
                          f"new run from another's weights: drop one of them")
    model_kw, train_kw = split_overrides(settings.merged())
    clashes = [_as_flag(k, v) + (f" from {settings.source(k)}" if settings.source(k) != FLAGS else "")
               + f" (checkpoint: {_as_flag(k, getattr(saved_model, k), alone=True)})" for k, v in model_kw.items()
               if k != "dropout" and getattr(saved_model, k) != v]
    if clashes:
        raise ConfigError(f"--resume: flags disagree with the checkpoint's model: {'; '.join(clashes)}; "
                          f"drop them to resume, or train a new run with another --out-dir")
    if train_kw.get("task", meta["task"]) != meta["task"]:
        raise ConfigError(f"--resume: the run was trained with --task {meta['task']}, not {train_kw['task']}; drop "
                          f"--task to resume, or train a new run with another --out-dir")
    saved_optimizer = saved_train["optimizer"]
    if train_kw.get("optimizer", saved_optimizer) != saved_optimizer:
        raise ConfigError(f"--resume: the run was trained with --optimizer {saved_optimizer}, whose state it "
                          f"continues; drop --optimizer {train_kw['optimizer']}, or train a new run with another "
                          f"--out-dir")
    if train_kw.get("val_split", saved_train["val_split"]) != saved_train["val_split"]:
        raise ConfigError(f"--resume: the run was trained with --val-split {saved_train['val_split']}; another split "
                          f"would train on its validation text; drop --val-split, or train a new run with another "
                          f"--out-dir")
    for name in ("items", "labels"):  # they decide what the model reads and which text validates
        saved = saved_train[name] or None
        if (train_kw.get(name, saved) or None) != saved:
            how = f"with {_as_flag(name, saved)}" if saved else f"without {param(name)}"
            raise ConfigError(f"--resume: the run was trained {how}; drop {param(name)}, or train a new run with "
                              f"another --out-dir")
    saved_fraction = saved_train["val_fraction"]
    if train_kw.get("val_fraction", saved_fraction) != saved_fraction:
        raise ConfigError(f"--resume: the run was trained with --val-fraction {saved_fraction:g}; another fraction "
                          f"moves the split and would train on its validation text; drop --val-fraction, or train a "
                          f"new run with another --out-dir")
    if "max_iters" in train_kw and "max_time" not in train_kw:
        train_kw["max_time"] = None  # a step budget alone lifts the run's old time budget
    tcfg = TrainConfig(**{**saved_train, **train_kw, "resume": True}).validate()
    model = {k: v for k, v in asdict(saved_model).items() if k != "vocab_size"}
    return {**model, **model_kw}, tcfg


# --- the settings of a run started from another (--init-from) -------------------------------------------------------
@dataclass
class Initialised:
    """What a new run started from a trained one trains with: the model fields (the base's architecture, all but
    the vocabulary size), the training config, and the notes the start-up log prints."""
    model_kw: dict
    cfg: TrainConfig
    notes: list = field(default_factory=list)
    task_from_base: bool = False  # --task pairs came from a pairs base, not from the user


def adaptive_base(base_name):
    """The one advice for --init-from a run trained with --softmax adaptive, which no setting makes possible yet."""
    return ConfigError(f"{param('init_from')}: {base_name} was trained with {param('softmax', 'adaptive')}, which a "
                       f"new run cannot start from yet (its clusters follow that run's text); train from scratch "
                       f"(drop {param('init_from')}), or start from a run trained with {param('softmax', 'full')}")


def init_settings(meta, settings: Settings, device_type, base_name):
    """The base run's checkpoint metadata (checkpoint.read_meta) + the settings given now -> Initialised.

    The architecture is the base's: model settings from a config file or the flags must agree with it, but for
    dropout (which may change) and --block-size (at most the base's learned positions; any with sinusoidal ones).
    A preset's model settings do not apply. Training settings are a new run's (defaults <- preset <- config file
    <- flags), the preset by default the base's, --task by default the base's: a fresh optimizer, schedule and
    budget, in a new run directory."""
    base = meta["model_config"]
    if base.softmax == "adaptive":  # first: no flag makes it work, so no other advice may come before this one
        raise adaptive_base(base_name)
    base_preset = getattr(run_settings(meta), "preset", None)
    preset = base_preset if base_preset in PRESETS else None
    settings.pick_preset(device_type, fallback=(preset, f"the base run {base_name}") if preset else None)
    model_given, _ = split_overrides(settings.given())
    _, train_kw = split_overrides(settings.merged())
    clashes = [_as_flag(k, v) + (f" from {settings.source(k)}" if settings.source(k) != FLAGS else "")
               + f" (base: {_as_flag(k, getattr(base, k), alone=True)})" for k, v in model_given.items()
               if k not in ("dropout", "block_size") and getattr(base, k) != v]
    if clashes:
        raise ConfigError(f"{param('init_from')}: settings disagree with the base model {base_name}: "
                          f"{'; '.join(clashes)}; drop them (a run started from another keeps its architecture)")
    model = {**{k: v for k, v in asdict(base).items() if k != "vocab_size"},
             **{k: model_given[k] for k in ("dropout", "block_size") if k in model_given}}
    if base.pos_emb == "learned" and model["block_size"] > base.block_size:
        raise ConfigError(f"{param('init_from')}: {param('block_size', model['block_size'])} is longer than the "
                          f"{base.block_size} positions the base model {base_name} learned; pass "
                          f"{param('block_size', base.block_size)} or less")
    task_from_base = "task" not in train_kw
    train_kw.setdefault("task", meta["task"])
    if base.arch == "encoder-decoder" and train_kw["task"] != "pairs":
        raise ConfigError(f"{param('init_from')}: the base model {base_name} is an encoder-decoder (a translator); "
                          f"it continues only as {param('task', 'pairs')}, or start from a decoder run")
    if meta["task"] == "pairs" and train_kw["task"] == "text":
        raise ConfigError(f"{param('init_from')}: the base model {base_name} was trained on sentence pairs; it "
                          f"continues only on pairs ({param('task', 'pairs')}, a TSV of source<TAB>target lines), so "
                          f"start a text run from a text run, or from scratch")
    cfg = TrainConfig(**{**train_kw, "preset": settings.preset}).validate()
    notes = [f"dropout {model['dropout']} (base: {base.dropout})"] if model["dropout"] != base.dropout else []
    if task_from_base and cfg.task == "pairs":
        notes.append(f"{param('task', 'pairs')} (from the base run {base_name}, trained on sentence pairs)")
    if model["block_size"] != base.block_size:
        notes.append(f"context {model['block_size']} characters (base: {base.block_size})")
    return Initialised(model, cfg, notes, task_from_base=task_from_base and cfg.task == "pairs")


# --- writing config.toml ---------------------------------------------------------------------------------------
def toml_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)  # the shortest text that reads back as the same number
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")  # JSON's escapes are TOML's


def config_toml(mcfg: ModelConfig, tcfg: TrainConfig):
    """A run's resolved settings as TOML, every flag's value (a None, "not set", is left out: TOML has no null),
    paths absolute: --config with this file trains the same run again, from any folder."""
    lines = ["# The settings of this run. chargpt train --config <this file> trains it again, in a new run",
             "# directory; flags given with it override these. Keys are the flag names (chargpt train --help)."]
    for title, cls, cfg in (("model", ModelConfig, mcfg), ("training", TrainConfig, tcfg)):
        lines.append(f"\n# {title}")
        for spec in flag_specs(cls):
            value = getattr(cfg, spec.dest)
            if spec.dest in NOT_WRITTEN or value is None:
                continue
            if spec.dest in PATHS:
                value = str(Path(value).resolve())
            unlimited = spec.dest == "max_iters" and value >= UNLIMITED
            lines.append(f"{spec.name} = {toml_value(value)}" + ("  # no step limit: max-time decides" if unlimited
                                                                 else ""))
    return "\n".join(lines) + "\n"
