"""Beam search for text (sample.py --beam N): width 1 is greedy, a wider beam finds text at least as likely as greedy's,
stop strings and constraints hold under it, labels work with it, and what it cannot combine with is one line."""

import io

import pytest
import torch
from helpers import MODEL_ALPHABET, VOCAB, assert_one_line_error, counter_gen, invoke, random_model

import chargpt
from chargpt.cli import sample_cli
from chargpt.cli.repl import repl
from chargpt.data.labels import LabelSet
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.sampling.engine import Generator
from chargpt.sampling.options import SampleOptions
from chargpt.sampling.translate import translate

PROMPTS = ["the ", "a", "hel", "zz", "\n"]
LABELS = {"a": "\U000f0001", "b": "\U000f0002"}


def gen_of(model=None, vocab=VOCAB, meta=None):
    return Generator(model or random_model(), vocab, "cpu", meta=meta, threads=1)


def text_logprob(gen, prompt, text):
    """The model's log-probability of `text` after `prompt`, scored with one plain forward (both within the context)."""
    ids = gen.vocab.encode(prompt + text)
    with torch.no_grad():
        logp = torch.log_softmax(gen.model(torch.tensor([ids]))[0][0].float(), dim=-1)  # (T, V)
    start = len(gen.vocab.encode(prompt))
    return sum(logp[i - 1, ids[i]].item() for i in range(start, len(ids)))


@pytest.mark.parametrize("new", [10, 45])  # 45: past the context of 16, so the window slides as sampling's does
def test_beam_1_is_greedy(new):
    gen = gen_of()
    for prompt in PROMPTS:
        assert gen.generate(prompt, beam=1, max_new_tokens=new) == gen.generate(prompt, temperature=0,
                                                                                max_new_tokens=new)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_wider_beam_is_never_less_likely_than_greedy(seed):
    gen = gen_of(random_model(seed=seed))
    for prompt in PROMPTS:
        greedy = text_logprob(gen, prompt, gen.generate(prompt, temperature=0, max_new_tokens=10)[0])
        for width in (2, 4):
            best = gen.samples(prompt, beam=width, max_new_tokens=10)[0]
            found = text_logprob(gen, prompt, best.text)
            assert len(best.text) == 10 and found >= greedy - 1e-4, (prompt, width, best.text, found, greedy)
            assert best.logprob == pytest.approx(found / 10, abs=1e-4)  # the score it reports is the model's


def test_num_samples_are_the_best_beams_best_first():
    gen = gen_of()
    found = gen.samples("the ", beam=4, num_samples=3, max_new_tokens=10)
    assert len({s.text for s in found}) == 3
    scores = [text_logprob(gen, "the ", s.text) for s in found]
    assert scores == sorted(scores, reverse=True)


def test_a_stop_string_ends_a_beam():
    gen = counter_gen()  # writes the alphabet on: "ab" -> "cdefg..."
    assert gen.generate("ab", beam=3, stop=["f"], max_new_tokens=10) == ["cde"]
    for stop in ("bcd", "ghi"):  # one begun in the prompt is cut as sampling cuts it
        assert gen.generate("ab", beam=3, stop=[stop], max_new_tokens=10) == gen.generate(
            "ab", temperature=0, stop=[stop], max_new_tokens=10)


def test_constraints_hold_under_beam():
    gen = gen_of()
    assert "o" in gen.generate("the ", beam=4, max_new_tokens=10)[0]  # what the ban below must keep out
    for text in gen.generate("the ", beam=4, num_samples=4, max_new_tokens=10, ban="o"):
        assert "o" not in text and len(text) == 10
    for text in gen.generate("the ", beam=4, num_samples=2, max_new_tokens=30, no_repeat_ngram=2):
        pairs = [("the " + text)[i:i + 2] for i in range(len("the " + text) - 1)]
        assert len(pairs) == len(set(pairs)), text
    shaped = gen.generate("the ", beam=4, num_samples=2, max_new_tokens=20, form="__ ___\n")
    assert all(len(t) == 7 and t[2] == " " and t[6] == "\n" and " " not in t[:2] + t[3:6] for t in shaped), shaped
    assert gen.generate("ab", beam=2, max_new_tokens=12, repetition_penalty=1.5)[0]


def label_gen(seed=3):
    """A random model over the alphabet and two labels (and NULL), its label embeddings large enough to matter."""
    vocab = Vocab(sorted(MODEL_ALPHABET + "\U000f0000" + "".join(LABELS.values())))
    model = random_model(vocab_size=len(vocab), seed=seed)
    with torch.no_grad():
        model.wte.weight[-3:].mul_(20)
    return gen_of(model, vocab, {"labels": LabelSet(dict(LABELS)).to_meta(), "vocab": vocab})


def test_beam_with_a_label_reads_the_label_first(monkeypatch):
    gen = label_gen()
    first = []
    forward = gen.model.forward
    monkeypatch.setattr(gen.model, "forward", lambda idx, *a, **kw: first.append(idx[:, 0].tolist()) or
                        forward(idx, *a, **kw))
    for label in LABELS:
        greedy = gen.generate("zq", label=label, temperature=0, max_new_tokens=40)
        first.clear()
        assert gen.generate("zq", label=label, beam=1, max_new_tokens=40) == greedy  # the window slides: pinned
        assert first[0] == [gen.vocab.stoi[LABELS[label]]]  # the prefill reads the label first
        assert not set("".join(gen.generate("zq", label=label, beam=3, max_new_tokens=40))) & set(LABELS.values())


@pytest.mark.parametrize("args, pattern", [
    (["--beam", "2", "--best-of", "4"], r"--best-of ranks samples and --beam searches for the likeliest text"),
    (["--beam", "2", "--num-samples", "3"], r"--beam \(2\) must be at least --num-samples \(3\)"),
    (["--beam", "0"], r"--beam must be from 1 to 1000"),
    (["--beam", "2", "--length-penalty", "-1"], r"--length-penalty must be from 0 to 10"),
    (["--beam", "2", "--regex", "[a-z]+"], r"--beam cannot search under --regex"),
    (["--beam", "2", "--suffix", "end"], r"--beam does not fill in the middle \(--suffix\)"),
])
def test_what_beam_cannot_do_is_one_line(tiny_run, args, pattern):
    result = invoke(sample_cli, ["--checkpoint", tiny_run, "--device", "cpu", *args])
    assert_one_line_error(result, pattern)


def test_beam_from_the_command_line(tiny_run):
    result = invoke(sample_cli, ["--checkpoint", tiny_run, "--device", "cpu", "--prompt", "To be", "--beam", "3",
                                 "--num-samples", "2", "--max-new-tokens", "20", "--temperature", "1.5"])
    assert result.exit_code == 0, result.output
    gen = chargpt.load(tiny_run, device="cpu", dtype="float32")
    texts = gen.generate("To be", beam=3, num_samples=2, max_new_tokens=20, include_prompt=True)
    assert all(t in result.stdout for t in texts), (texts, result.stdout)


def test_the_repl_sets_a_beam():
    out, err = io.StringIO(), io.StringIO()
    repl(counter_gen(), SampleOptions.of(max_new_tokens=4, temperature=1.0, seed=0), inp=io.StringIO(
        "/beam 2\nab\n/beam 0\n/show\n"), out=out, err=err)
    assert out.getvalue() == "abcdef\n" and "beam = 2" in err.getvalue() and "beam = None" in err.getvalue()
    assert "mean log-prob" in err.getvalue()  # the beam's score, as sample.py --beam prints it


def test_a_translator_searches_with_translations_beam():
    vocab = Vocab(sorted(MODEL_ALPHABET + SEP + END))
    gen = gen_of(random_model(vocab_size=len(vocab), seed=4), vocab, {"task": "pairs"})
    for source in ("abc", "the cat"):
        found = gen.generate(source, beam=3, max_new_tokens=8)
        assert found == translate(gen.model, vocab, [source], beam=3, max_len=8)
        assert len(gen.generate(source, beam=3, num_samples=3, max_new_tokens=8)) == 3
        samples = gen.samples(source, beam=3, num_samples=2, max_new_tokens=8)  # scored, as a text run's beam
        assert [s.text for s in samples] == gen.generate(source, beam=3, num_samples=2, max_new_tokens=8)
        assert all(s.logprob is not None and s.logprob <= 0 for s in samples if s.text)


def test_a_beam_that_finds_fewer_texts_than_asked_says_so(tiny_run):
    said = []
    gen = chargpt.load(tiny_run, device="cpu", dtype="float32")
    gen.log = said.append
    texts = gen.generate("To be", beam=5, allow="a", num_samples=3, max_new_tokens=6)
    assert texts[0] == "aaaaaa" and texts[1:] == ["", ""]  # one text can be written under --allow a
    assert any("the beam found 1 distinct text(s) under these constraints, not num_samples=3" in s for s in said)
