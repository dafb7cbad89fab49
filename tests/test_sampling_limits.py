"""Where sampling's settings meet their limits: constraints that leave nothing a sample may write (a labelled run's
label characters are never written), numbers at which float32 sampling would overflow or underflow, an n-gram rule
that runs out of characters, empty constraint strings, prompts holding a label's character, and scores that stay
JSON. Each is checked at the Generator (which sample.py, the playground's /api/generate and /v1 all call) and
through sample.py."""

import json
import random

import pytest
import torch
from helpers import TINY_RUN_KW, VOCAB, assert_one_line_error, invoke, random_model, train_pairs, write_cipher

import chargpt
from chargpt.cli import sample_cli
from chargpt.config import SampleSettings
from chargpt.data.labels import NULL
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, ConfigError
from chargpt.model.inside import look_inside
from chargpt.sampling.constraints import Sample
from chargpt.sampling.decode import sample_next
from chargpt.sampling.engine import Generator

A, B = "\U000f0001", "\U000f0002"  # the label characters of labels a and b
LABEL_VOCAB = Vocab(sorted("\n abcxyz" + NULL + A + B))


def labelled_gen():
    """An in-memory Generator of a run trained with --labels a and b (random weights)."""
    meta = {"labels": {"null": NULL, "names": {"a": A, "b": B}}}
    return Generator(random_model(vocab_size=len(LABEL_VOCAB)), LABEL_VOCAB, "cpu", meta=meta)


def plain_gen():
    return Generator(random_model(vocab_size=len(LABEL_VOCAB) - 3), Vocab(sorted("\n abcxyz")), "cpu")


@pytest.fixture(scope="module")
def label_run(tmp_path_factory):
    """A real labelled run on disk (two steps), for sample.py."""
    root = tmp_path_factory.mktemp("labelled")
    rng = random.Random(0)
    for label, alphabet in (("a", "abc"), ("b", "xyz")):
        (root / "texts" / label).mkdir(parents=True)
        (root / "texts" / label / "1.txt").write_text(
            " ".join("".join(rng.choice(alphabet) for _ in range(5)) for _ in range(300)) + "\n")
    chargpt.train(**{**TINY_RUN_KW, "max_iters": 2, "eval_interval": 2}, data=str(root / "texts"), labels="folders",
                  out_dir=str(root / "run"), cache_dir=str(root / "cache"), log=lambda *a: None)
    return root / "run"


def sample(run, *args):
    return invoke(sample_cli, ["--checkpoint", run, "--device", "cpu", "--max-new-tokens", 20, "--seed", 1, *args])


# --- label characters are never written, never in a prompt --------------------------------------------------------
@pytest.mark.parametrize("kw,message", [
    (dict(ban="abcxyz \n"), r"leave no character this model writes \(its reserved characters, labels' or markers, "
                            r"are never written\)"),
    (dict(allow=B), r"allow holds U\+F0002, a private-use character this run reserves"),
    (dict(allow=NULL + A), r"allow holds U\+F0000"),
    (dict(form="__" + A), r"form holds U\+F0001"),
    (dict(acrostic="a" + B), r"acrostic holds U\+F0002"),
], ids=["ban-all-text", "allow-a-label", "allow-null", "form", "acrostic"])
def test_a_constraint_that_leaves_only_label_characters_is_refused_before_decoding(kw, message):
    gen = labelled_gen()
    with pytest.raises(ConfigError, match=message):
        gen.generate("", max_new_tokens=10, seed=1, **kw)


def test_a_ban_that_leaves_only_label_characters_is_one_line_in_sample_py(label_run):
    assert_one_line_error(sample(label_run, "--ban", "abcxyz \n"), r"--ban and --allow leave no character")
    assert_one_line_error(sample(label_run, "--allow", B), r"--allow holds U\+F0002")


def test_a_constrained_labelled_sample_never_writes_a_label_or_a_banned_character():
    texts = labelled_gen().generate("", ban="abc\n", num_samples=8, max_new_tokens=30, seed=2, temperature=2.0)
    assert all(t and set(t) <= set(" xyz") for t in texts), texts


@pytest.mark.parametrize("prompt", ["ab" + A + "xy", NULL, "x" + B])
def test_a_prompt_holding_a_label_character_is_refused(prompt):
    """A label mid-prompt would read as a change of style there (as a pairs model refuses its markers)."""
    with pytest.raises(ChargptError, match=r"the prompt holds U\+F000[012], a private-use character this run "
                                           r"reserves for its labels; remove it"):
        labelled_gen().generate(prompt, max_new_tokens=5, seed=1)


def test_a_prompt_holding_a_label_character_is_one_line_in_sample_py(label_run):
    assert_one_line_error(sample(label_run, "--prompt", "ab" + A + "c"), r"the prompt holds U\+F0001")


# --- scores are JSON -------------------------------------------------------------------------------------------------
def test_scores_that_are_not_finite_are_null_in_records():
    record = Sample("ab", logprob=float("-inf"), removed=float("inf")).record(best_of=2)
    assert record["removed"] is None and record["logprob"] is None
    json.dumps(record, allow_nan=False)  # strict JSON: no Infinity, no NaN
    assert Sample("ab", logprob=-1.23456, removed=0.5).record() == {"logprob": -1.2346, "chars": 2, "removed": 0.5}


# --- float under- and overflow -----------------------------------------------------------------------------------
def test_a_temperature_too_small_for_float32_is_greedy():
    """Below 1e-5 sampling is greedy (vLLM's rule): at 1e-50 the divisor is 0 in float32, whose NaNs picked id 0."""
    logits = 3 * torch.randn(6, 12, generator=torch.Generator().manual_seed(0))
    greedy = logits.argmax(dim=-1)
    for t in (1e-6, 1e-46, 1e-50, 5e-324):
        assert torch.equal(sample_next(logits, torch.Generator().manual_seed(1), t), greedy)
    gen = plain_gen()
    kw = dict(max_new_tokens=20, num_samples=2, seed=3)
    assert gen.generate("ab", temperature=1e-50, **kw) == gen.generate("ab", temperature=0.0, **kw)


def test_a_top_p_too_small_for_float32_keeps_the_most_likely():
    logits = 3 * torch.randn(6, 12, generator=torch.Generator().manual_seed(0))
    for p in (1e-50, 5e-324):
        assert torch.equal(sample_next(logits, torch.Generator().manual_seed(1), 1.0, top_p=p), logits.argmax(-1))


@pytest.mark.parametrize("kw,message", [
    (dict(repetition_penalty=1e-40), r"repetition_penalty must be from 0.01 to 100 \(1 disables it"),
    (dict(repetition_penalty=1e39), r"repetition_penalty must be from 0.01 to 100"),
    (dict(guidance=1e39, label="a"), r"guidance must be >= 1 \(at most 100\)"),
    (dict(temperature=1e39), r"temperature must be at most 100"),
], ids=["penalty-small", "penalty-large", "guidance", "temperature"])
def test_numbers_past_float32_sampling_are_refused_naming_the_range(kw, message):
    with pytest.raises(ConfigError, match=message):
        SampleSettings(**kw)


def test_numbers_past_float32_sampling_are_one_line_in_sample_py(label_run):
    assert_one_line_error(sample(label_run, "--repetition-penalty", "1e-40"), r"--repetition-penalty must be from "
                                                                               r"0.01 to 100")
    assert_one_line_error(sample(label_run, "--label", "a", "--guidance", "1e39"),
                          r"--guidance must be >= 1 \(at most 100\)")
    result = sample(label_run, "--temperature", "1e-50", "--top-p", "1e-50", "--num-samples", 2)
    assert result.exit_code == 0 and result.stdout.strip("\n=") and set(result.stdout) - {"\n"}, result.output


# --- the n-gram rule running out, empty constraint strings --------------------------------------------------------
def ngrams(text, n):
    return [text[i:i + n] for i in range(len(text) - n + 1)]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_ends_the_sample_where_it_leaves_nothing_to_write(n):
    """--allow ab --no-repeat-ngram 1 wrote 'baaaa...' (the rule dropped once it banned everything): now the sample
    ends there, with the reason in its score, and no n-gram of the text (start included) repeats."""
    samples = plain_gen().samples("", allow="ab", no_repeat_ngram=n, num_samples=3, max_new_tokens=60, seed=n)
    for s in samples:
        grams = ngrams("\n" + s.text, n)  # an empty prompt conditions on a newline
        assert len(grams) == len(set(grams)) and set(s.text) <= set("ab"), s.text
        assert len(s.text) < 60 and s.ended == f"no_repeat_ngram={n} left nothing to write"
        assert s.record()["ended"] == s.ended


def test_no_repeat_ngram_running_out_is_said_by_sample_py(label_run):
    result = sample(label_run, "--allow", "ab", "--no-repeat-ngram", 1)
    assert result.exit_code == 0, result.output
    assert set(result.stdout.strip("\n")) <= set("ab") and len(result.stdout.strip("\n")) <= 2
    assert "ended early: --no-repeat-ngram 1 left nothing to write" in result.stderr


@pytest.mark.parametrize("name", ["allow", "form", "acrostic"])
def test_an_empty_constraint_string_is_an_error_not_off(name, label_run):
    with pytest.raises(ConfigError, match=rf"^{name} is empty; give it .*, or leave it out$"):
        SampleSettings(**{name: ""})
    assert_one_line_error(sample(label_run, f"--{name}", ""), rf"--{name} is empty")


# --- labels where a run has none, and in what the model is said to expect ------------------------------------------
def test_a_label_on_a_translator_is_an_error_not_ignored(tmp_path):
    gen = Generator(random_model(), VOCAB, "cpu", meta={"task": "pairs"})
    with pytest.raises(ConfigError, match=r"this model translates .* has no labels; drop label$"):
        gen.generate("abc", label="a", max_new_tokens=5)
    write_cipher(tmp_path / "pairs.tsv", n=200)
    train_pairs(tmp_path / "pairs.tsv", tmp_path / "run", steps=2, cache_dir=tmp_path / "cache", eval_pairs=5)
    assert_one_line_error(sample(tmp_path / "run", "--prompt", "abc", "--label", "a"), r"has no labels; drop --label$")


def test_look_inside_never_expects_a_label_character():
    """The characters a labelled run is said to expect next are text: its labels (NULL, "no label", included) are
    never written, so they are never listed, however likely the model finds them."""
    gen = labelled_gen()
    with torch.no_grad():
        gen.model.lm_head.weight[LABEL_VOCAB.stoi[NULL]] += 100.0  # NULL: by far the most likely after anything
    view = look_inside(gen, "abc xyz", top=len(LABEL_VOCAB))
    listed = {c for row in view.expected for c, _ in row}
    assert listed and not listed & {NULL, A, B} and len(view.expected[1]) == len(LABEL_VOCAB) - 3


def test_best_of_out_of_memory_says_to_lower_best_of(label_run, monkeypatch):
    """best-of decodes its N samples together, so --best-of, not --num-samples, is what to lower."""
    from chargpt.model import transformer

    def fail(self, *a, **kw):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 2000000000 bytes.")
    monkeypatch.setattr(transformer.KVCache, "__init__", fail)
    result = sample(label_run, "--best-of", 4, "--compile", "off")
    assert_one_line_error(result, r"^error: out of memory \(2.0 GB requested\); lower --best-of \(its samples decode "
                                  r"together, each with its own cache\)$")
    assert "Exception ignored" not in result.output
