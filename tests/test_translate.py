"""Translating: greedy, sampled and beam search over a step callback, cached against uncached decoding, and the
scores, on models part-trained by the real trainer (the learning test itself is in test_seq2seq.py)."""

import sys

import pytest
import torch
from helpers import train_pairs, write_cipher

from chargpt.config import ModelConfig
from chargpt.data.pairs import END, SEP, PairBatches, encode_pairs
from chargpt.data.tokenizer import Unknowns, Vocab
from chargpt.errors import ChargptError
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import load_model
from chargpt.sampling.translate import (
    CHRF_MISSING,
    DecoderSteps,
    EncoderDecoderSteps,
    beam_search,
    check_translate_options,
    chrf,
    exact_match,
    sample_search,
    translate,
)

ARCHS = ["decoder", "encoder-decoder"]


def toy_step(table):
    """A step callback over a fixed tree of next-character log-probabilities: table[prefix] -> {id: logp}."""
    V = 1 + max(i for probs in table.values() for i in probs)
    state = {"prefixes": None}

    def step(prev, rows):
        if prev is None:
            state["prefixes"] = [() for _ in rows]
        else:
            state["prefixes"] = [state["prefixes"][r] + (p,) for r, p in zip(rows.tolist(), prev.tolist())]
        logits = torch.full((len(rows), V), float("-inf"))  # characters off the tree are impossible
        for j, prefix in enumerate(state["prefixes"]):
            for i, logp in table.get(prefix, {}).items():
                logits[j, i] = logp
        return logits
    return step


# END is id 0. Greedy takes 1 (p 0.6) then can only go on uncertainly; beam finds 2 2 (p 0.4 x 1.0).
TREE = {(): {1: 0.6, 2: 0.4}, (1,): {3: 0.34, 4: 0.33, 5: 0.33}, (1, 3): {0: 1.0}, (1, 4): {0: 1.0},
        (1, 5): {0: 1.0}, (2,): {2: 1.0}, (2, 2): {0: 1.0}}


def log_tree(tree):
    return {k: {i: torch.tensor(p).log().item() for i, p in v.items()} for k, v in tree.items()}


def test_beam_search_finds_what_greedy_misses():
    table = log_tree(TREE)
    assert sample_search(toy_step(table), 1, end_id=0, max_len=5) == [[1, 3]]
    assert beam_search(toy_step(table), 1, end_id=0, max_len=5, beam=1) == [[1, 3]]  # beam 1 is greedy
    assert beam_search(toy_step(table), 1, end_id=0, max_len=5, beam=2) == [[2, 2]]


def test_length_normalisation_stops_short_outputs_winning():
    """'1 END' has the highest total probability (0.36); '2 2 2 2 END' the highest per character (0.2 ** 1/5)."""
    table = log_tree({(): {1: 0.6, 2: 0.4}, (1,): {0: 0.6, 3: 0.4}, (1, 3): {0: 1.0}, (2,): {2: 0.5, 5: 0.5},
                      (2, 2): {2: 1.0}, (2, 2, 2): {2: 1.0}, (2, 2, 2, 2): {0: 1.0}, (2, 5): {0: 1.0}})
    assert beam_search(toy_step(table), 1, 0, 8, beam=4, alpha=0.0) == [[1]]  # total log-probability
    assert beam_search(toy_step(table), 1, 0, 8, beam=4, alpha=1.0) == [[2, 2, 2, 2]]  # per character


def test_beam_search_batches_sources_independently_and_respects_max_len():
    table = log_tree(TREE)
    assert beam_search(toy_step(table), 3, 0, 5, beam=2) == [[2, 2]] * 3
    assert beam_search(toy_step(table), 1, 0, 1, beam=2) == [[1]]  # cut at max_len: the best live one
    assert sample_search(toy_step(table), 2, 0, 1) == [[1], [1]]


# --- real models ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cipher_tsv(tmp_path_factory):
    """2,000 pairs of the cipher task (tests/helpers.py: substitution of the reversed string)."""
    return write_cipher(tmp_path_factory.mktemp("cipher") / "cipher.tsv")


@pytest.fixture(scope="module")
def cipher(cipher_tsv):
    return encode_pairs(str(cipher_tsv), cache_dir=cipher_tsv.parent / "cache")


def tiny_model(vocab_size, arch, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(vocab_size=vocab_size, block_size=16, n_layer=2, n_head=4, n_embd=64, dropout=0.0, arch=arch,
                      **kw)
    return build_model(cfg)


def held_out(cipher, arch, n=100):
    """The first n validation pairs of the split the trainer makes (whole pairs, a fixed choice)."""
    batches = PairBatches(cipher, 0.1, 16, 32, "cpu", arch=arch)
    pairs = [cipher.pair(int(i)) for i in batches.splits["val"][:n]]
    return [s for s, _ in pairs], [t for _, t in pairs]


def random_model(arch, vocab, seed=0):
    return tiny_model(len(vocab), arch, seed).eval()


@pytest.fixture(scope="module", params=ARCHS)
def half_trained(request, cipher, cipher_tsv, tmp_path_factory):
    """A model 40 steps into the cipher task: it writes non-empty, partly wrong translations (so greedy, beam
    search and the cache have something to disagree about), with 12 held-out sources of 3 to 6 letters."""
    d = tmp_path_factory.mktemp("half")
    train_pairs(cipher_tsv, d / "run", request.param, steps=40, cache_dir=d / "cache", eval_pairs=0)
    model, vocab, _ = load_model(d / "run")
    return model, vocab, held_out(cipher, request.param, 12)[0]


def steps_for(model, vocab, sources, use_cache=True):
    """The step callback of the model's architecture over sources of one length, with or without the KV cache."""
    src = torch.tensor([vocab.encode(s) for s in sources])
    if model.config.arch == "encoder-decoder":
        return EncoderDecoderSteps(model, src, None, vocab.stoi[SEP], use_cache)
    return DecoderSteps(model, torch.cat([src, src.new_full((len(src), 1), vocab.stoi[SEP])], 1), use_cache)


def test_cached_and_uncached_decoding_give_identical_translations(half_trained):
    model, vocab, sources = half_trained
    for beam in (1, 3):
        cached = translate(model, vocab, sources, beam=beam, batch_size=5)
        assert cached == translate(model, vocab, sources, beam=beam, batch_size=5, use_cache=False)
        assert sum(map(len, cached)) >= 2 * len(sources)


def test_beam_size_one_equals_greedy_and_batching_changes_nothing(half_trained):
    model, vocab, sources = half_trained
    greedy = translate(model, vocab, sources)
    assert translate(model, vocab, sources, batch_size=1) == translate(model, vocab, sources, batch_size=5) == greedy
    for batch in ([s for s in sources if len(s) == n] for n in range(3, 7)):  # the decoder batches one length
        if not batch:
            continue
        want = sample_search(steps_for(model, vocab, batch), len(batch), vocab.stoi[END], 8)
        assert beam_search(steps_for(model, vocab, batch), len(batch), vocab.stoi[END], 8, beam=1) == want
        assert [vocab.decode(w) for w in want] == [greedy[sources.index(s)] for s in batch]


VOCAB = Vocab(sorted(set("abcdefgh ") | {SEP, END}))
SOURCES = ["abc", "hgfedcba", "a", "bad cafe", "ab", "hg", "deed"]
SAME_LENGTH = ["abcd", "hgfe", "dead"]


@pytest.mark.parametrize("arch", ARCHS)
def test_long_decodes_agree_cached_uncached_and_beam_one_greedy(arch):
    """With no END (id -1), every row runs to the end of the context: long sequences, and beam search forks
    and reorders rows of the cache every step."""
    model = random_model(arch, VOCAB)
    n = 16 - 4 if arch == "decoder" else 16
    greedy = sample_search(steps_for(model, VOCAB, SAME_LENGTH), 3, -1, n)
    assert all(len(g) == n for g in greedy)
    assert greedy == sample_search(steps_for(model, VOCAB, SAME_LENGTH, use_cache=False), 3, -1, n)
    assert beam_search(steps_for(model, VOCAB, SAME_LENGTH), 3, -1, n, beam=1) == greedy
    beams = beam_search(steps_for(model, VOCAB, SAME_LENGTH), 3, -1, n, beam=3)
    assert beams == beam_search(steps_for(model, VOCAB, SAME_LENGTH, use_cache=False), 3, -1, n, beam=3)


@pytest.mark.parametrize("arch", ARCHS)
def test_sampling_is_seeded(arch):
    model = random_model(arch, VOCAB)

    def sample(seed):
        return translate(model, VOCAB, SOURCES, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(seed))
    assert sample(7) == sample(7)
    assert sample(7) != sample(8)


def test_source_problems_are_clear_errors():
    model = random_model("decoder", VOCAB)
    with pytest.raises(ChargptError, match=r"character\(s\) the model never saw: 'z'"):
        translate(model, VOCAB, ["abz"])
    assert translate(model, VOCAB, ["abz"], unknown="skip") == translate(model, VOCAB, ["ab"])
    with pytest.raises(ChargptError, match="source 2 has 16 characters; the model translates 1 to 15"):
        translate(model, VOCAB, ["ab", "a" * 16])
    with pytest.raises(ChargptError, match="source 1 has 0 characters"):
        translate(model, VOCAB, [""])
    assert translate(random_model("encoder-decoder", VOCAB), VOCAB, ["a" * 16])  # no separator in its source


@pytest.mark.parametrize("options, said", [
    ((0, 1.0, 0.0, None, None, 64), "--beam must be from 1 to 1000"),
    ((1, float("nan"), 0.0, None, None, 64), "--alpha must be from 0 to 10"),
    ((4, 1.0, 0.8, None, 0.9, 64), "does not sample; drop --temperature, --top-p, or use --beam 1"),
    ((1, 1.0, 0.0, None, None, 0), "--batch-size must be from 1 to 1000000"),
])
def test_translate_options_are_checked_before_loading(options, said):
    with pytest.raises(ChargptError, match=said):
        check_translate_options(*options)
    check_translate_options(4, 0.6, 0.0, None, None, 64)  # a beam search
    check_translate_options(1, 1.0, 0.8, 40, 0.9, 64)  # sampling


def test_sentences_with_unknown_characters_are_counted_as_they_pass():
    lines = ["ab", "azb", "zz", "ba"]
    seen = Unknowns(VOCAB, iter(lines), "skip")
    assert seen.warning() is None and list(seen) == lines  # counted while read, not before
    assert seen.warning() == "2 sentence(s) had characters the model never saw, dropped (the first: 'z' (U+007A) at 1)"
    replaced = Unknowns(VOCAB, lines, "replace")
    list(replaced)
    assert f"replaced with {VOCAB.replacement()!r}" in replaced.warning()
    strict = Unknowns(VOCAB, lines, "error")
    list(strict)
    assert strict.warning() is None  # 'error' stops at the first, naming it, before any warning


def test_exact_match_and_chrf():
    assert exact_match(["Ciao.", "Corri"], ["Ciao.", "Corri!"]) == 0.5
    pytest.importorskip("sacrebleu")
    assert chrf(["Ciao.", "Corri!"], ["Ciao.", "Corri!"]) == pytest.approx(100.0)
    assert 0 < chrf(["Ciao.", "Corri"], ["Ciao.", "Corri!"]) < 100


def test_chrf_without_sacrebleu_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)  # import fails, as when it is not installed
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    assert chrf(["a"], ["a"]) is None
    assert "pip install 'chargpt[translate]'" in CHRF_MISSING
