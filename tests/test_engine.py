"""The engine (chargpt/sampling/engine.py): chargpt.load -> Generator. A seed reproduces a text whatever else ran before
and however the model was loaded; streamed pieces are the generated texts; prompts are conditioned on as given, an
empty one on a line start; what a model cannot do is said in one line."""

import inspect
from dataclasses import FrozenInstanceError

import pytest
import torch

import chargpt
import chargpt.sampling.options as options_module
from chargpt.config import ModelConfig, SampleSettings
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, ConfigError
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import save_model
from chargpt.sampling.engine import Generator
from chargpt.sampling.options import SampleOptions

VOCAB = Vocab("\n abcdefghijklmnopqrstuvwxyz")


def random_model(vocab_size=len(VOCAB), seed=0):
    """A tiny CharGPT whose next-character distribution is far from flat (so seeds make different texts)."""
    torch.manual_seed(seed)
    model = CharGPT(ModelConfig(vocab_size=vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=16, dropout=0.0))
    with torch.no_grad():
        model.wte.weight.mul_(10)
    return model.eval()


@pytest.fixture
def saved_run(tmp_path):
    (tmp_path / "run").mkdir()
    save_model(tmp_path / "run" / "best.safetensors", random_model(), VOCAB, step=1)
    return tmp_path / "run"


def test_a_seed_gives_the_same_text_from_every_load_of_a_run(saved_run):
    kw = dict(max_new_tokens=30, temperature=1.0, seed=11)
    first = chargpt.load(saved_run, device="cpu", dtype="float32").generate("to be", **kw)
    again = chargpt.load(saved_run / "best.safetensors", device="cpu", dtype="float32").generate("to be", **kw)
    assert first == again and len(first[0]) == 30
    assert first != chargpt.load(saved_run, device="cpu", dtype="float32").generate("to be", **{**kw, "seed": 12})


def test_a_seed_is_independent_of_the_global_random_state():
    gen = Generator(random_model(), VOCAB, "cpu")
    torch.manual_seed(1)
    a = gen.generate("ab", max_new_tokens=20, temperature=1.0, seed=3)
    torch.manual_seed(2)
    torch.rand(100)
    assert gen.generate("ab", max_new_tokens=20, temperature=1.0, seed=3) == a


def test_within_the_context_the_cache_changes_nothing_but_speed():
    """(Past the context the cached loop slides its window in steps, the uncached one by one: test_sampling.py.)"""
    gen = Generator(random_model(), VOCAB, "cpu")
    kw = dict(max_new_tokens=11, temperature=0.9, top_k=8, seed=5, num_samples=2)  # 5 + 11 = the 16 of the context
    assert gen.generate("hello", **kw) == gen.generate("hello", use_cache=False, **kw)


def test_streamed_pieces_are_the_generated_texts_sample_by_sample():
    gen = Generator(random_model(), VOCAB, "cpu")
    kw = dict(max_new_tokens=12, temperature=1.0, seed=9, num_samples=3)
    texts = ["", "", ""]
    for i, piece in gen.stream("ab", **kw):
        texts[i] += piece
    assert texts == gen.generate("ab", **kw)
    assert all(len(t) == 12 for t in texts)  # the new characters alone: the prompt is not repeated in front


def test_an_empty_prompt_starts_a_new_line_or_else_a_word():
    assert Generator(random_model(), VOCAB, "cpu").start_text() == "\n"
    assert Generator(random_model(27), Vocab(" abcdefghijklmnopqrstuvwxyz"), "cpu").start_text() == " "
    assert Generator(random_model(3), Vocab("xyz"), "cpu").start_text() == "x"
    assert Generator(random_model(3), Vocab("xyz"), "cpu").generate("", max_new_tokens=4, seed=0)[0] != ""


def test_the_prompt_seen_is_the_prompt_after_the_unknown_character_policy():
    gen = Generator(random_model(), VOCAB, "cpu")
    assert gen.prompt_text("caf\u00e9 ok", "skip") == "caf ok"
    assert gen.prompt_text("caf\u00e9 ok", "replace") == "caf  ok"  # a space: no U+FFFD or '?' to stand in
    assert gen.unknown_warning("caf\u00e9", "replace") == \
        "1 prompt character(s) the model never saw were replaced with ' ': '\u00e9' (U+00E9) at 3"
    with pytest.raises(ChargptError, match=r"prompt has 1 character\(s\) the model never saw"):
        gen.generate("caf\u00e9", max_new_tokens=1)


@pytest.mark.parametrize("kw,message", [(dict(num_samples=0), r"num_samples must be from 1"),
                                        (dict(seed=-1), r"seed must be a whole number from 0"),
                                        (dict(temperature=-0.5), r"temperature must be >= 0")])
def test_bad_options_are_refused_before_anything_is_written(kw, message):
    gen = Generator(random_model(), VOCAB, "cpu")
    with pytest.raises(ConfigError, match=message):
        gen.generate("ab", **kw)


def test_a_text_model_does_not_translate_and_a_translator_needs_a_source():
    with pytest.raises(ChargptError, match=r"trained on plain text, not sentence pairs, so it does not translate"):
        Generator(random_model(), VOCAB, "cpu").translate(["hello"])
    pairs_vocab = Vocab(VOCAB.chars + [SEP, END])
    translator = Generator(random_model(len(pairs_vocab)), pairs_vocab, "cpu", meta={"task": "pairs"})
    with pytest.raises(ChargptError, match=r"its prompt is the sentence to translate; give prompt some text"):
        translator.generate("", max_new_tokens=5)


def test_generate_returns_the_continuation_or_with_include_prompt_the_whole_text(saved_run):
    gen = chargpt.load(saved_run, device="cpu", dtype="float32")
    alone = gen.generate("to be", max_new_tokens=12, seed=3)[0]
    whole = gen.generate("to be", max_new_tokens=12, seed=3, include_prompt=True)[0]
    assert len(alone) == 12 and whole == "to be" + alone
    assert gen.generate("to bX", max_new_tokens=4, seed=3, unknown="skip", include_prompt=True)[0].startswith("to b")


# --- the options: one object, checked once where it is made -------------------------------------------------------
@pytest.mark.parametrize("kw,message", [(dict(temperature=-0.5), r"^temperature must be >= 0"),
                                        (dict(top_p=1.5), r"^top_p must be in \(0, 1\]"),
                                        (dict(num_samples=2, best_of=1), r"^best_of \(1\) must be at least"),
                                        (dict(tempreature=0.5), r"^'tempreature' is not a sampling option \(did you "
                                                                r"mean temperature\?\)$")])
def test_options_are_checked_when_made_in_one_line(kw, message):
    with pytest.raises(ConfigError, match=message) as e:
        SampleOptions.of(**kw)
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match=message):  # as keywords of a call, the same check in the same place
        Generator(random_model(), VOCAB, "cpu").generate("ab", **kw)


def test_options_are_frozen_and_replace_makes_a_new_checked_one():
    options = SampleOptions.of(max_new_tokens=5, seed=1)
    with pytest.raises(FrozenInstanceError):
        options.seed = 2
    with pytest.raises(FrozenInstanceError):
        options.settings.temperature = 2.0
    assert options.replace(seed=2).seed == 2 and options.seed == 1
    assert options.replace(top_k=3).settings.top_k == 3 and options.settings.top_k is None
    with pytest.raises(ConfigError, match=r"^seed must be a whole number"):
        options.replace(seed=-1)


def test_keyword_overrides_write_what_an_options_object_writes():
    gen = Generator(random_model(), VOCAB, "cpu")
    kw = dict(max_new_tokens=14, temperature=1.0, top_k=9, seed=4, num_samples=2)
    options = SampleOptions.of(**kw)
    assert gen.generate("to be", options) == gen.generate("to be", **kw)
    assert gen.generate("to be", SampleOptions.of(**{**kw, "seed": 0}), seed=4) == gen.generate("to be", **kw)
    assert [s.text for s in gen.samples("ab", options)] == gen.generate("ab", **kw)
    assert list(gen.stream("ab", options)) == list(gen.stream("ab", **kw))


def test_an_options_object_is_not_checked_again(monkeypatch):
    """Checked once where it was made: the engine's entry points hand it on without checking it again."""
    options = SampleOptions.of(max_new_tokens=6, temperature=0.5, seed=3, num_samples=2)
    checks = []
    monkeypatch.setattr(SampleSettings, "validate", lambda self: checks.append(self) or self)
    monkeypatch.setattr(options_module, "check_sample_options", lambda *a: checks.append(a))
    gen = Generator(random_model(), VOCAB, "cpu")
    gen.generate("ab", options)
    list(gen.stream("ab", options))
    gen.samples("ab", options)
    assert checks == []


def test_the_entry_points_take_a_prompt_and_options_in_a_few_parameters():
    for name in ("stream", "decoding", "generate", "samples", "items"):
        params = list(inspect.signature(getattr(Generator, name)).parameters)
        assert "options" in params and len(params) <= 8, (name, params)
