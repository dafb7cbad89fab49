"""Mixing the styles of a labels run (--label a:0.7,b:0.3): the next-character distribution is the normalised
weighted sum of the labels' log-softmaxes, a weight of 1 on one label is that label exactly, and a bad mix is one
line before anything is decoded."""

import random

import pytest
import torch
from helpers import TINY_RUN_KW, assert_one_line_error, invoke

import chargpt
from chargpt.cli import sample_cli
from chargpt.config import SampleSettings
from chargpt.config.decoding import LabelMix
from chargpt.errors import ChargptError, ConfigError

STYLES = {"a": "abc", "b": "xyz"}  # two labels, disjoint alphabets: what each writes is plain to see


@pytest.fixture(scope="module")
def styled(tmp_path_factory):
    root = tmp_path_factory.mktemp("mix")
    rng = random.Random(0)
    for label, alphabet in STYLES.items():
        (root / "authors" / label).mkdir(parents=True)
        words = ["".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) + rng.choice(" \n")
                 for _ in range(300)]
        (root / "authors" / label / "1.txt").write_text("".join(words))
    chargpt.train(**{**TINY_RUN_KW, "curves": False}, data=root / "authors", labels="folders", out_dir=root / "run",
                  cache_dir=root / "cache", max_iters=40, eval_interval=20, log=lambda *a: None)
    return root / "run"


def label_logp(gen, label, ids):
    """log_softmax of the next-character logits after `ids` under one label (read first, as sampling does)."""
    head = [gen.vocab.stoi[gen.labels.token(label)]]
    with torch.no_grad():
        return torch.log_softmax(gen.model(torch.tensor([head + ids]))[0][0, -1].float(), dim=-1)  # (V,)


def test_weight_1_on_one_label_is_that_label(styled):
    gen = chargpt.load(styled, device="cpu", dtype="float32")
    for mix in ("a:1", "a:0.25"):  # one label's weight is normalised to 1
        assert gen.generate("", label=mix, num_samples=4, max_new_tokens=30, seed=5) == gen.generate(
            "", label="a", num_samples=4, max_new_tokens=30, seed=5)
        mixed, plain = (gen.samples("a", label=name, max_new_tokens=20, seed=2) for name in (mix, "a"))
        assert [s.logprob for s in mixed] == [s.logprob for s in plain]  # the logits the choice is made from


@pytest.mark.parametrize("spec, weights", [("a:0.5,b:0.5", (0.5, 0.5)), ("a:7,b:3", (0.7, 0.3)), ("a,b", (0.5, 0.5))])
def test_a_mix_is_the_normalised_weighted_sum_of_the_labels_log_softmaxes(styled, spec, weights):
    gen = chargpt.load(styled, device="cpu", dtype="float32")
    labels = [gen.vocab.stoi[c] for c in gen.labels.chars()]
    for prompt in ("", "ab", "xy z", "abc\nx"):
        ids = gen.vocab.encode(prompt or gen.start_text())
        want = weights[0] * label_logp(gen, "a", ids) + weights[1] * label_logp(gen, "b", ids)
        want[labels] = float("-inf")  # label characters are never written
        want = torch.log_softmax(want, dim=-1)
        for seed in range(4):  # the score of the character it chose is the mix's log-probability of it
            s = gen.samples(prompt, label=spec, max_new_tokens=1, seed=seed, temperature=1.0)[0]
            assert s.logprob == pytest.approx(want[gen.vocab.stoi[s.text]].item(), abs=1e-5), (prompt, s.text)


def test_a_mix_writes_between_the_styles(styled):
    gen = chargpt.load(styled, device="cpu", dtype="float32")

    def share_of_a(spec):
        text = "".join(gen.generate("", label=spec, num_samples=8, max_new_tokens=40, seed=1, temperature=1.0))
        return sum(c in "abc" for c in text) / max(1, sum(c in "abcxyz" for c in text))
    assert share_of_a("a:0.1,b:0.9") < share_of_a("a:0.9,b:0.1")
    assert gen.generate("", label="a:0.5,b:0.5", beam=1, max_new_tokens=30) == gen.generate(
        "", label="a:0.5,b:0.5", temperature=0, max_new_tokens=30)  # a beam over a mix searches the same logits


def test_a_mix_parses_once_into_a_label_mix():
    assert SampleSettings(label="a:0.7,b:0.3").label_mix == LabelMix((("a", 0.7), ("b", 0.3)))
    assert SampleSettings(label="a:3,b:1").label_mix.weights == [0.75, 0.25]
    assert SampleSettings(label="austen").label_mix.single == "austen"
    assert SampleSettings(label="a:b").label_mix.single == "a:b"  # a lone name holding ':' is still that name
    assert SampleSettings().label_mix is None


@pytest.mark.parametrize("spec, pattern", [
    ("a:0,b:1", r"--label: the weight of 'a' must be a positive number \(weights are normalised to sum 1\), got 0"),
    ("a:-1,b:1", r"--label: the weight of 'a' must be a positive number"),
    ("a:-0.5", r"--label: the weight of 'a' must be a positive number"),
    ("a:x,b", r"--label: the weight of 'a' is 'x', not a number; write a mix as a:0.7,b:0.3"),
    ("a,,b", r"--label: '' is not LABEL or LABEL:WEIGHT; write a mix as a:0.7,b:0.3"),
    ("a:,b", r"--label: 'a:' is not LABEL or LABEL:WEIGHT"),
    ("a:1,a:2", r"--label names 'a' twice; give each label once"),
    (",".join("abcdefghijklmnopq"), r"--label mixes at most 16 labels, got 17"),
])
def test_a_bad_mix_is_one_line(styled, spec, pattern):
    result = invoke(sample_cli, ["--checkpoint", styled, "--device", "cpu", "--label", spec])
    assert_one_line_error(result, pattern)


def test_an_unknown_label_in_a_mix_or_guidance_with_one_is_one_line(styled):
    result = invoke(sample_cli, ["--checkpoint", styled, "--device", "cpu", "--label", "a:0.5,c:0.5"])
    assert_one_line_error(result, r"unknown label 'c'; this run's labels: a, b$")
    result = invoke(sample_cli, ["--checkpoint", styled, "--device", "cpu", "--label", "a,b", "--guidance", "2"])
    assert_one_line_error(result, r"--guidance steers towards one label, not a mix; drop it, or give --label one name")
    gen = chargpt.load(styled, device="cpu", dtype="float32")
    with pytest.raises(ChargptError, match="unknown label 'c'"):
        gen.generate("", label="c:1,a:1", max_new_tokens=5)
    with pytest.raises(ConfigError, match="guidance steers towards one label"):
        gen.generate("", label="a,b", guidance=3.0, max_new_tokens=5)


def test_the_repl_takes_a_mix_and_refuses_a_label_the_run_lacks(styled):
    import io

    from chargpt.cli.repl import repl
    from chargpt.sampling.options import sample_options
    err = io.StringIO()
    repl(chargpt.load(styled, device="cpu", dtype="float32"), sample_options(None, seed=1, max_new_tokens=5),
         inp=io.BytesIO(b"/label a:0.7,b:0.3\n/label a:1,zz:1\n/show\n"), out=io.StringIO(), err=err)
    said = err.getvalue()
    assert "label = a:0.7,b:0.3" in said and "unknown label 'zz'" in said and "'label': 'a:0.7,b:0.3'" in said
