"""Every preset and every config file the docs show starts and trains, as a user's first command would run it.

The default on a CUDA GPU, shakespeare-char, once died at start-up (KeyError: 'block_size': it sets no model field
of its own, and start-up read the size from a dict that held only the fields some layer set); the docs' runs all
added tiny sizes, so no test met it. Here each preset trains two steps in its own shape where a CPU allows it (the
two GPU-sized ones at a smaller width, their own shape checked as the run resolves it), and each documented config
file trains as written but for the step budget."""

import re

import pytest
from helpers import ROOT

import chargpt
from chargpt.config import PRESETS, ModelConfig, device_preset
from chargpt.config.settings import new_run_settings
from chargpt.runs.checkpoint import read_meta
from chargpt.runs.rundir import STATE

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

SHORT = dict(device="cpu", dtype="float32", threads=1, max_iters=2, batch_size=2, eval_iters=1, eval_interval=1,
             sample_chars=0, curves=False, log=lambda *a: None)
TEXT = "".join(f"ROMEO: O, she doth teach the torches to burn bright {i}.\nJULIET: Good night, good night!\n"
               for i in range(400))  # 36,000 characters: room for windows of 1,024
PAIRS = "".join(f"the cat {i}\tle chat {i}\nthe dog {i}\tle chien {i}\n" for i in range(300))
GPU_SIZED = {"gpt2-small-char", "transformer-base"}  # 85M and 44M parameters: a step is minutes on one CPU thread
SHAPE = ("n_layer", "n_head", "n_embd", "block_size", "arch", "n_enc_layer", "pos_emb", "norm", "activation")


def preset_shape(name):
    """The model a preset describes: its own fields over the dataclass defaults (the GPU's)."""
    defaults = ModelConfig()
    return {k: PRESETS[name].get(k, getattr(defaults, k)) for k in SHAPE}


def corpus_for(name, tmp_path):
    pairs = PRESETS[name].get("task") == "pairs"
    path = tmp_path / ("pairs.tsv" if pairs else "corpus.txt")
    path.write_text(PAIRS if pairs else TEXT, encoding="utf-8")
    return path


@pytest.mark.parametrize("name", [n for n in PRESETS if n not in GPU_SIZED])
def test_every_preset_trains_in_its_own_shape(name, tmp_path):
    summary = chargpt.train(data=str(corpus_for(name, tmp_path)), out_dir="run", preset=name, **SHORT)
    meta, _ = read_meta(tmp_path / "run" / STATE)
    assert summary["step"] == 2 and meta["step"] == 2
    assert meta["train_config"].preset == name
    if name != "auto":  # auto's shape is sized at start (tests/test_sizing.py)
        model = meta["model_config"]
        assert {k: getattr(model, k) for k in SHAPE} == preset_shape(name)


def test_the_cuda_default_is_a_preset_that_trains():
    """What `python train.py` picks on a CUDA GPU is one of the presets trained above, whole (every model field)."""
    model_kw, cfg, _ = new_run_settings({}, "cuda")
    assert cfg.preset == device_preset("cuda") == "shakespeare-char" and cfg.preset not in GPU_SIZED
    assert {k: model_kw[k] for k in SHAPE} == preset_shape("shakespeare-char")
    assert (model_kw["n_layer"], model_kw["n_embd"], model_kw["block_size"], cfg.batch_size) == (6, 384, 256, 64)


@pytest.mark.parametrize("name", sorted(GPU_SIZED))
def test_gpu_sized_presets_resolve_to_their_shape_and_train_narrower(name, tmp_path):
    model_kw, cfg, _ = new_run_settings({"preset": name}, "cuda")
    assert {k: model_kw[k] for k in SHAPE} == preset_shape(name)  # the shape a GPU run builds
    narrow = dict(n_layer=1, n_head=2, n_embd=16, block_size=32) | ({"n_enc_layer": 1} if "n_enc_layer" in
                                                                     PRESETS[name] else {})
    summary = chargpt.train(data=str(corpus_for(name, tmp_path)), out_dir="run", preset=name, **narrow, **SHORT)
    meta, _ = read_meta(tmp_path / "run" / STATE)
    assert summary["step"] == 2 and meta["train_config"].preset == name
    assert meta["train_config"].learning_rate == PRESETS[name]["learning_rate"]  # the preset's training, whole
    assert meta["model_config"].pos_emb == preset_shape(name)["pos_emb"]


def documented_configs():
    """(guide, file name, its TOML) of every config file the README and docs/ show a reader writing."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for block in re.findall(r"^```toml\n(.*?)^```", doc.read_text(encoding="utf-8"), re.M | re.S):
            name = re.match(r"# (\S+\.toml)", block)
            found.append(pytest.param(block, id=f"{doc.name}:{name[1] if name else '?'}"))
    return found


@pytest.mark.parametrize("text", documented_configs())
def test_every_documented_config_file_trains(text, tmp_path):
    """The file as written (its preset, its model), its corpus a small one of ours, two steps."""
    settings = tomllib.loads(text)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    if "data" in settings:
        text = re.sub(r'^data *= *".*"$', f'data = "{corpus.as_posix()}"', text, flags=re.M)
    (tmp_path / "doc.toml").write_text(text, encoding="utf-8")
    given = {**SHORT, "sample_chars": 10} | ({} if "data" in settings else {"data": str(corpus)})  # --sample-every
    summary = chargpt.train(config="doc.toml", out_dir="run", **given)
    assert summary["step"] == 2
    meta, _ = read_meta(tmp_path / "run" / STATE)
    if settings.get("preset") in PRESETS and settings["preset"] != "auto":
        assert meta["model_config"].n_embd == settings.get("n-embd", preset_shape(settings["preset"])["n_embd"])
