"""The settings themselves (chargpt/config/__init__.py, chargpt/config/flags.py): every field is a flag with its help
and default, messages name a setting as the user gave it, validation fails in one line naming the setting, and every
dictionary from outside is checked by one function (typed_fields) before it becomes a config."""

import math
from dataclasses import fields
from pathlib import Path

import pytest

from chargpt.config import (
    ARCH_FIELDS,
    CPU_DEFAULTS,
    MAX_LAYERS,
    PRESETS,
    SIZED,
    ModelConfig,
    SampleSettings,
    TrainConfig,
    check_task,
    device_preset,
    model_config_from_dict,
    split_overrides,
    typed_fields,
)
from chargpt.config.architecture import describe_model
from chargpt.config.flags import cli_names, flag_specs, param, spelled
from chargpt.errors import ConfigError


def specs(cls):
    return {s.dest: s for s in flag_specs(cls)}


# --- fields as flags -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [ModelConfig, TrainConfig, SampleSettings])
def test_every_field_is_a_flag_with_its_help_and_the_same_name(cls):
    hidden = {f.name for f in fields(cls) if f.metadata.get("flag") is False}
    assert hidden <= {"vocab_size"}  # set from the corpus, never typed
    for f in fields(cls):
        if f.name in hidden:
            continue
        spec = specs(cls)[f.name]
        assert spec.name == f.name.replace("_", "-") and spec.help.startswith(f.metadata["help"])
        assert spec.default == f.default


def test_help_shows_both_defaults_where_the_device_decides():
    train, model = specs(TrainConfig), specs(ModelConfig)
    assert model["n_layer"].help.endswith("[default: sized by --preset auto on CPU, 6 on GPU]")
    assert train["learning_rate"].help.endswith("[default: 0.004 on CPU, 0.001 on GPU]")
    assert train["max_time"].help.endswith("[default: 150 on CPU (--preset auto), none on GPU]")
    assert train["weight_decay"].help.endswith("[default: 0.1]")  # the same everywhere: one default
    assert "[default" not in train["curves"].help  # a switch shows its state as --curves/--no-curves
    assert set(CPU_DEFAULTS) == set(PRESETS["auto"]) | set(SIZED)


def test_flags_take_the_type_and_choices_of_their_field():
    train, sample = specs(TrainConfig), specs(SampleSettings)
    assert (train["max_iters"].type, train["max_time"].type, train["curves"].type) == (int, float, bool)
    assert train["optimizer"].choices == ("adamw", "muon") and train["optimizer"].type is str
    assert train["compile"].switch == ("on", "off")  # --compile alone means on, --no-compile off
    assert sample["stop"].multiple and sample["stop"].type is str


def test_settings_are_named_as_the_user_gave_them():
    assert (param("n_layer"), param("unknown", "skip")) == ("n_layer", "unknown='skip'")
    assert spelled("sample_prompt", "To be") == "sample_prompt='To be'"
    with cli_names():
        assert (param("n_layer"), param("unknown", "skip")) == ("--n-layer", "--unknown skip")
        assert spelled("sample_prompt", "To be") == "--sample-prompt 'To be'"
        assert (spelled("bias", False), spelled("curves", True)) == ("--no-bias", "--curves")
    assert param("n_layer") == "n_layer"  # only inside the block


def test_cli_names_end_with_their_block_even_on_an_error():
    with pytest.raises(ConfigError), cli_names():
        ModelConfig(n_layer=0).validate()
    with pytest.raises(ConfigError, match=r"^n_layer must be at least 1"):
        ModelConfig(n_layer=0).validate()


# --- defaults and presets --------------------------------------------------------------------------------------
def test_model_defaults_are_the_classic_shakespeare_char_model():
    cfg = ModelConfig()
    assert (cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.block_size, cfg.dropout) == (6, 6, 384, 256, 0.2)
    assert (cfg.arch, cfg.pos_emb, cfg.norm, cfg.activation, cfg.head_size) == ("decoder", "learned", "pre", "gelu", 64)
    assert describe_model(cfg) == "6 layers x 384 wide, 6 heads, context 256"


def test_the_device_picks_the_preset_and_every_preset_is_valid():
    assert (device_preset("cuda"), device_preset("cpu"), device_preset("mps")) == ("shakespeare-char", "auto", "auto")
    for name, values in PRESETS.items():
        model_kw, train_kw = split_overrides(values)  # every key is a setting of the right type
        ModelConfig(**model_kw).validate()
        TrainConfig(**train_kw, preset=name).validate()


def test_describe_model_names_the_2017_options():
    cfg = ModelConfig(arch="encoder-decoder", n_layer=2, n_enc_layer=3, n_embd=128, n_head=4, block_size=64,
                      pos_emb="sinusoidal", norm="post", activation="relu")
    assert describe_model(cfg) == ("encoder-decoder, 3+2 layers x 128 wide, 4 heads, context 64, sinusoidal "
                                   "positions, post-LN, ReLU")


# --- validation: one line, naming the setting ------------------------------------------------------------------
BAD_MODELS = [
    (dict(n_embd=100, n_head=7), r"n_embd=100 is not divisible by n_head=7; .* e\.g\. one of \[4, 5, 10, 20, 25, 50\]"),
    (dict(n_layer=0), r"n_layer must be at least 1 \(got 0\)"),
    (dict(vocab_size=0), r"the vocabulary size must be at least 1"),
    (dict(n_layer=MAX_LAYERS + 1), r"n_layer 10,001 is more layers than a checkpoint holds"),
    (dict(dropout=1.0), r"dropout must be in \[0, 1\) \(got 1.0\)"),
    (dict(dropout=math.nan), r"dropout must be a finite number \(got nan\)"),
    (dict(block_size=2**64), r"block_size is too large"),
    (dict(arch="rnn"), r"--arch must be one of decoder, encoder-decoder"),
    (dict(n_enc_layer=2), r"--n-enc-layer 2 needs --arch encoder-decoder"),
]
BAD_TRAINING = [
    (dict(batch_size=0), r"batch_size must be positive \(got 0\)"),
    (dict(warmup_iters=-1), r"warmup_iters must be non-negative"),
    (dict(val_fraction=1.0), r"val_fraction must be between 0 and 1, exclusive"),
    (dict(learning_rate=1e-3, min_lr=1e-2), r"min_lr must be between 0 and learning_rate=0.001 \(got 0.01\)"),
    (dict(max_time=math.inf), r"max_time must be a finite number \(got inf\)"),
    (dict(seed=-1), r"seed must be a whole number from 0 to"),
    (dict(data=""), r"data is an empty path; give a path, or leave it out for the built-in corpus"),
    (dict(optimizer="sgd"), r"optimizer must be one of adamw, muon \(got 'sgd'\)"),
    (dict(preset="tinyy"), r"preset 'tinyy' is not a preset; did you mean 'tiny'\?"),
    (dict(sample_every=10, sample_chars=0), r"sample_every needs sample_chars above 0"),
    (dict(target_data="t.txt"), r"target_data is for sentence pairs; add task='pairs'"),
]
BAD_SAMPLING = [
    (dict(temperature=-1.0), r"temperature must be >= 0 \(0 means greedy\), got -1.0"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\] \(1 disables it\), got 0.0"),
    (dict(top_k=-3), r"top_k must be >= 0 \(0 disables it\), got -3"),
    (dict(stop=("",)), r"stop needs a non-empty string"),
    (dict(max_new_tokens="5"), r"'max_new_tokens' has the wrong type \(str: '5'\)"),
]


@pytest.mark.parametrize("cls,kw,message", [(ModelConfig, kw, m) for kw, m in BAD_MODELS]
                         + [(TrainConfig, kw, m) for kw, m in BAD_TRAINING]
                         + [(SampleSettings, kw, m) for kw, m in BAD_SAMPLING])
def test_an_impossible_setting_is_one_line_naming_it(cls, kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        cls(**kw).validate()
    assert "\n" not in str(e.value)


def test_messages_use_flag_names_on_the_command_line():
    with cli_names(), pytest.raises(ConfigError, match=r"^--batch-size must be positive \(got 0\)$"):
        TrainConfig(batch_size=0).validate()
    with cli_names(), pytest.raises(ConfigError, match=r"--target-data is for sentence pairs; add --task pairs"):
        TrainConfig(target_data="t.txt").validate()


def test_an_encoder_decoder_needs_sentence_pairs():
    check_task("decoder", TrainConfig())
    check_task("encoder-decoder", TrainConfig(task="pairs"))
    with pytest.raises(ConfigError, match=r"arch='encoder-decoder' translates a source into a target: it needs "
                                          r"task='pairs'"):
        check_task("encoder-decoder", TrainConfig())


# --- the one check of dictionaries from outside ----------------------------------------------------------------
def test_typed_fields_keeps_the_known_fields_of_the_right_type():
    got = typed_fields(TrainConfig, {"max_iters": 5, "learning_rate": 1, "min_lr": None, "curves": False,
                                     "data": Path("corpus.txt"), "not_a_setting": 1}, "settings")
    assert got == {"max_iters": 5, "learning_rate": 1, "min_lr": None, "curves": False, "data": "corpus.txt"}
    assert typed_fields((ModelConfig, TrainConfig), {"n_layer": 2, "max_iters": 5}, "both") == \
        {"n_layer": 2, "max_iters": 5}


@pytest.mark.parametrize("d,message", [
    ({"n_layer": "2"}, r"^settings: 'n_layer' has the wrong type \(str: '2'\)$"),
    ({"n_layer": 2.0}, r"'n_layer' has the wrong type \(float: 2.0\)"),
    ({"n_layer": True}, r"'n_layer' has the wrong type \(bool: True\)"),  # a bool is never a number
    ({"dropout": False}, r"'dropout' has the wrong type \(bool: False\)"),
    ({"bias": 1}, r"'bias' has the wrong type \(int: 1\)"),
    ({"n_embd": None}, r"'n_embd' has the wrong type \(NoneType: None\)"),  # only `| None` fields take None
    ({"n_layer": "x" * 100}, r"\(str: 'x{39}\)$"),  # the value cut short
])
def test_typed_fields_refuses_a_value_of_another_type_in_one_line(d, message):
    with pytest.raises(ConfigError, match=message):
        typed_fields(ModelConfig, d, "settings")


def test_typed_fields_refuses_what_is_not_an_object_and_can_word_its_own_error():
    with pytest.raises(ConfigError, match=r"^model config is not an object$"):
        typed_fields(ModelConfig, ["n_layer", 2], "model config")
    with pytest.raises(ConfigError, match=r"^run.toml: n_layer wants int, not '2'$"):
        typed_fields(ModelConfig, {"n_layer": "2"}, "run.toml",
                     lambda name, value, want: f"run.toml: {name} wants {want.__name__}, not {value!r}")


def test_split_overrides_refuses_unknown_settings_and_empty_paths():
    assert split_overrides({"n_layer": 2, "max_iters": 9}) == ({"n_layer": 2}, {"max_iters": 9})
    with pytest.raises(ConfigError, match=r"^unknown setting\(s\): bogus, n_layers$"):
        split_overrides({"n_layers": 2, "bogus": 1})
    with pytest.raises(ConfigError, match=r"out_dir is an empty path"):
        split_overrides({"out_dir": ""})


def test_a_checkpoints_model_config_is_checked_before_it_is_used():
    saved = {f.name: getattr(ModelConfig(vocab_size=30), f.name) for f in fields(ModelConfig)}
    assert model_config_from_dict(saved) == ModelConfig(vocab_size=30)
    old = {k: v for k, v in saved.items() if k not in ARCH_FIELDS}  # written before the 2017 options existed
    assert model_config_from_dict(old) == ModelConfig(vocab_size=30)  # the GPT they were
    for bad, message in (({**saved, "n_layer": "6"}, r"model config: 'n_layer' has the wrong type"),
                         ({k: v for k, v in saved.items() if k != "n_embd"}, r"model config is missing \['n_embd'\]"),
                         ({**saved, "block_size": 2**40}, r"'block_size' is implausibly large"),
                         ({**saved, "n_head": 5}, r"n_embd=384 is not divisible by n_head=5"),
                         ("not a dict", r"model config is not an object")):
        with pytest.raises(ConfigError, match=message):
            model_config_from_dict(bad)
