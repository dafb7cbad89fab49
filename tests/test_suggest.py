"""Suggestions as a person types (chargpt/sampling/suggest.py, Generator.suggest, POST /api/suggest, the REPL's
/suggest): on a toy corpus of a few words, a tiny trained model's completions are the corpus's words; the next
characters' probabilities are the model's softmax, and each completion's probability the product of its characters'
(and its boundary's) from plain forward passes without a cache; Chinese gets 2-4 ideographs; bad requests are one
line."""

import io

import pytest
import torch
from helpers import TOY_WORDS, need, random_model, train_toy_words

import chargpt
from chargpt.cli.repl import repl
from chargpt.data.labels import FIRST_LABEL
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, ConfigError
from chargpt.sampling.engine import Generator
from chargpt.sampling.options import SampleOptions
from chargpt.sampling.suggest import MAX_K, MAX_TEXT_CHARS, Query, is_ideograph, is_word_char

WORDS = TOY_WORDS


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """A tiny model trained on lines of the six WORDS in random order (about two seconds)."""
    root = tmp_path_factory.mktemp("toy")
    train_toy_words(root)
    return root / "checkpoints"


def next_probs(model, ids):
    """The reference: a plain forward pass over the whole text, no cache -> (V,) probabilities of the next id."""
    with torch.no_grad():
        return torch.softmax(model(torch.tensor([ids]))[0][0, -1].float(), dim=-1)


def completion_prob(gen, text, added, boundary):
    """The reference probability of writing `added` after `text` (and then a character `boundary` accepts)."""
    ids, p = gen.vocab.encode(text or gen.start_text()), 1.0
    for c in added:
        p *= float(next_probs(gen.model, ids)[gen.vocab.stoi[c]])
        ids = ids + [gen.vocab.stoi[c]]
    if boundary is not None:
        probs = next_probs(gen.model, ids)
        p *= sum(float(probs[i]) for i, c in enumerate(gen.vocab.chars) if boundary(c))
    return p


def test_word_completions_on_a_toy_corpus_are_its_words_with_the_models_probabilities(toy):
    gen = chargpt.load(toy / "toy", device="cpu")
    for text in ("cat ", "dog s", "ran m", "sat l", "log d", ""):
        found = gen.suggest(text, k=5, words=3)
        assert found.kind == "words" and len(found.words) == 3, (text, found)
        typed = text.rsplit(" ", 1)[-1].strip()
        likely = [w.word for w in found.words if w.p > 0.02 or text.endswith(" ")]  # after "dog s" only "sat" is
        assert likely and set(likely) <= set(WORDS), (text, found.words)
        for w in found.words:
            assert w.word == typed + w.text, (text, found.words)
            assert w.p == pytest.approx(completion_prob(gen, text, w.text, lambda c: not is_word_char(c)), rel=1e-4)
        assert [w.p for w in found.words] == sorted((w.p for w in found.words), reverse=True)
    assert gen.suggest("dog s", words=1).words[0].word == "sat"  # the only word that starts with s


def test_next_characters_are_the_models_softmax_at_temperature_one(toy):
    gen = chargpt.load(toy / "toy", device="cpu")
    for text in ("cat d", "mat ", ""):
        probs = next_probs(gen.model, gen.vocab.encode(text or gen.start_text()))
        found = gen.suggest(text, k=4, words=0)
        top = probs.topk(4)
        assert [c for c, _ in found.chars] == [gen.vocab.chars[i] for i in top.indices.tolist()]
        assert [p for _, p in found.chars] == pytest.approx(top.values.tolist(), rel=1e-5)
        assert found.words == ()


def test_a_text_longer_than_the_window_reads_its_last_window():
    gen = Generator(random_model(), Vocab("\n abcdefghijklmnopqrstuvwxyz"), "cpu")
    text = "the quick brown fox jumps over the lazy do"  # 42 characters; the window is 16
    window = gen.vocab.encode(text)[-16:]
    found = gen.suggest(text, k=3, words=3)
    assert [p for _, p in found.chars] == pytest.approx(next_probs(gen.model, window).topk(3).values.tolist(),
                                                        rel=1e-5)
    assert len(found.words) == 3 and all(0 < len(w.text) <= 16 and w.word.startswith("do") for w in found.words)


def cjk_gen():
    chars = "\n，。" + "春眠不觉晓处闻啼鸟夜来风雨声花落知多少"
    return Generator(random_model(vocab_size=len(chars), seed=3), Vocab(sorted(chars)), "cpu")


def test_chinese_gets_completions_of_two_to_four_ideographs_with_their_probabilities():
    gen = cjk_gen()
    found = gen.suggest("春眠", k=5, words=4)
    assert found.kind == "cjk" and len(found.words) == 4
    for w in found.words:
        assert 2 <= len(w.text) <= 4 and all(is_ideograph(c) for c in w.text), found.words
        assert w.word == "春眠" + w.text  # the ideographs typed at the end count as the word's start
        assert w.p == pytest.approx(completion_prob(gen, "春眠", w.text, None), rel=1e-4)
    per_char = [w.p ** (1 / len(w.text)) for w in found.words]  # ranked per character, as beam search's length norm
    assert per_char == pytest.approx(sorted(per_char, reverse=True))


def test_a_labelled_run_suggests_in_its_labels_style_and_never_offers_a_label_character():
    null, poet = chr(FIRST_LABEL), chr(FIRST_LABEL + 1)
    chars = sorted("\n abcdefghijklmnopqrst" + null + poet)
    meta = {"labels": {"null": null, "names": {"poet": poet}}}
    gen = Generator(random_model(vocab_size=len(chars), seed=5), Vocab(chars), "cpu", meta=meta)
    found = gen.suggest("the ", k=20, words=5, label="poet")
    probs = next_probs(gen.model, gen.vocab.encode(poet + "the "))
    probs[[gen.vocab.stoi[null], gen.vocab.stoi[poet]]] = 0
    probs /= probs.sum()
    top = probs.topk(20)
    assert dict(found.chars) == pytest.approx({chars[i]: p for p, i in zip(top.values.tolist(), top.indices.tolist())})
    assert not {null, poet} & {c for w in found.words for c in w.text}
    with pytest.raises(ChargptError, match="unknown label 'nobody'; this run's labels: poet"):
        gen.suggest("the ", label="nobody")


@pytest.mark.parametrize("kw, message", [
    (dict(k=0), f"k must be a whole number from 1 to {MAX_K}, got 0"),
    (dict(k=MAX_K + 1), f"k must be a whole number from 1 to {MAX_K}, got {MAX_K + 1}"),
    (dict(words=-1), "words must be a whole number from 0 to 10, got -1"),
    (dict(k=2.5), "k must be a whole number"),
    (dict(text="a" * (MAX_TEXT_CHARS + 1)), "the text to suggest for is 10,001 characters; the limit is 10,000"),
])
def test_a_bad_query_is_one_line_naming_the_limit(kw, message):
    with pytest.raises(ConfigError) as e:
        Query(**kw)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_a_text_with_an_unknown_character_is_refused_or_skipped_as_a_prompt_is():
    gen = Generator(random_model(), Vocab("\n abcdefghijklmnopqrstuvwxyz"), "cpu")
    with pytest.raises(ChargptError, match="never saw: 'é'"):
        gen.suggest("the caf\u00e9")
    assert gen.suggest("the caf\u00e9", unknown="skip").chars == gen.suggest("the caf").chars


def test_the_repl_prints_suggestions_for_the_text_after_the_command(toy):
    gen = chargpt.load(toy / "toy", device="cpu")
    out, err = io.StringIO(), io.StringIO()
    repl(gen, SampleOptions.of(seed=0), inp=io.StringIO("/suggest dog s\n/suggest\n"), out=out, err=err)
    found = gen.suggest("dog s")
    shown = err.getvalue()
    assert "next: " + "  ".join(f"{c!r} {p:.1%}" for c, p in found.chars) in shown
    assert "words: " + "  ".join(f"{w.word} {w.p:.1%}" for w in found.words) in shown
    assert "sat" in shown and out.getvalue() == ""  # suggestions are messages: nothing on stdout
    assert "usage: /suggest TEXT" in shown


# --- POST /api/suggest ---------------------------------------------------------------------------------------------
@pytest.fixture
def client(toy):
    need("starlette")
    need("httpx")
    from starlette.testclient import TestClient

    from chargpt.web import server
    return TestClient(server.create_app(toy, device="cpu"), base_url="http://127.0.0.1")


def test_the_endpoint_answers_with_the_libraries_suggestions_and_its_time(client, toy):
    r = client.post("/api/suggest", json={"run": "toy", "text": "dog s", "k": 3, "words": 2})
    assert r.status_code == 200, r.text
    reply = r.json()
    found = chargpt.load(toy / "toy", device="cpu").suggest("dog s", k=3, words=2)
    assert reply["chars"] == [{"char": c, "p": pytest.approx(p)} for c, p in found.chars]
    assert reply["words"] == [{"text": w.text, "word": w.word, "p": pytest.approx(w.p)} for w in found.words]
    assert reply["kind"] == "words" and reply["ms"] > 0


@pytest.mark.parametrize("body, status, message", [
    ({"text": "a" * 10_001}, 400, "text is 10001 characters; the limit is 10000"),
    ({"text": "cat", "k": 0}, 400, f"k must be between 1 and {MAX_K}, got 0"),
    ({"text": "cat", "k": 50}, 400, f"k must be between 1 and {MAX_K}, got 50"),
    ({"text": "cat", "words": 11}, 400, "words must be between 0 and 10, got 11"),
    ({"text": "caté"}, 400, "the prompt has 1 character(s) this model never saw: 'é' (U+00E9) at 3"),
    ({"text": "cat", "label": "poet"}, 400, "label 'poet': this run was trained without labels"),
    ({"text": "cat", "temperature": 1}, 400, "unknown field(s) temperature"),
    ({"run": "nope", "text": "cat"}, 404, "no run named 'nope'"),
])
def test_a_bad_request_is_one_line(client, body, status, message):
    r = client.post("/api/suggest", json={"run": "toy", **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error.startswith(message) and "\n" not in error, error


def test_the_benchmark_times_the_endpoint_over_varied_texts(toy):
    need("starlette")
    need("uvicorn")
    from chargpt.bench.suggest import PARAGRAPH, measure, percentile, report, texts
    from chargpt.web import server
    cut = texts(10)
    assert len(set(cut)) == 10 and len(cut[-1]) > len(PARAGRAPH) - 5 and any(t.endswith(" ") for t in cut)
    with server.running(server.create_app(toy, device="cpu")) as url:
        results = measure(url, "toy", 4)  # the paragraph has characters the toy run never saw: replaced
    assert len(results) == 4 and all(trip > 0 and ms > 0 for trip, ms in results)
    assert percentile([5, 1, 4, 2, 3], 50) == 3 and percentile(list(range(1, 101)), 95) == 95
    table = report(results, "toy", "cpu", 4)
    assert "| round trip (what the page waits for) |" in table and "| the server's suggestions (`ms`) |" in table


def test_the_search_runs_one_forward_a_step_through_the_thread_tuner_and_finds_the_same():
    from chargpt.sampling.suggest import suggest
    gen = Generator(random_model(), Vocab("\n abcdefghijklmnopqrstuvwxyz"), "cpu", threads="auto")
    steps = []

    def run(it):  # what ThreadTuner.run does: each next() is one timed step
        for out in it:
            steps.append(out)
            yield out
    ids = gen.vocab.encode("the ca")
    found = suggest(gen.model, gen.vocab.chars, ids, Query("the ca", 3, 2), text="the ca", run=run)
    assert found == suggest(gen.model, gen.vocab.chars, ids, Query("the ca", 3, 2), text="the ca")
    assert steps[-1] == found and len(steps) >= 3 and not any(steps[:-1])  # a prefill, search steps, the answer
    assert gen.suggest("the ca", k=3, words=2) == found
    assert gen.suggest_threads is not None and gen.suggest_threads is not gen.threads  # its own, timed apart
