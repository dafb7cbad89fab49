"""Samples held to a pattern (chargpt/sampling/grammar.py, through llguidance): every sample under a regular
expression matches it whole, JSON-schema samples parse and validate, a Lark grammar gives its rows and fields, a
pattern and the other constraints hold together, and what cannot be (a malformed pattern, one the vocabulary cannot
write) is a one-line error before any decoding; the same through sample.py, the REPL, /api/generate and the
OpenAI endpoint's extra_body. Tiny random models over small alphabets; one tiny run for the command line and the
server."""

import io
import json
import re
import sys

import pytest
from helpers import VOCAB, assert_one_line_error, invoke, need, parse_sse, random_model, texts_of, train_tiny

import chargpt
from chargpt.config import SampleSettings
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ConfigError
from chargpt.sampling.engine import Generator

need("llguidance")

JSON_VOCAB = Vocab(sorted(set('\n {}[]",:-.0123456789abcdefghijklmnopqrstuvwxyz')))
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[a-z]{1,6}$"},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False,
          "x-guidance": {"whitespace_flexible": False}}  # none: a random model loves whitespace
CSV = 'start: row row row\nrow: FIELD "," FIELD "," FIELD "\\n"\nFIELD: /[a-z]{1,4}/\n'


@pytest.fixture(scope="module")
def gen():
    return Generator(random_model(), VOCAB, "cpu")


@pytest.fixture(scope="module")
def json_gen():
    return Generator(random_model(len(JSON_VOCAB)), JSON_VOCAB, "cpu")


# --- what a sample under a pattern is ---------------------------------------------------------------------------
def test_every_sample_under_a_regex_matches_it_whole(gen):
    regex = "k[a-z]{2,5}( [a-z]{1,3})?"
    samples = gen.samples("", regex=regex, num_samples=200, max_new_tokens=12, temperature=1.0, seed=0)
    assert len(samples) == 200 and all(re.fullmatch(regex, s.text) for s in samples), \
        [s.text for s in samples if not re.fullmatch(regex, s.text)][:5]
    assert all(s.ended is None and s.removed is not None and s.removed >= 0 for s in samples)
    assert len({s.text for s in samples}) > 50  # the model chose: not one text forced 200 times
    # the end is the model's: where the text may end, it ends when the model would write what the pattern forbids
    assert {len(s.text) for s in samples} - {3}, "every sample ended at the shortest match"


def test_json_schema_samples_parse_and_validate(json_gen):
    jsonschema = need("jsonschema")
    samples = json_gen.samples("", json_schema=SCHEMA, num_samples=20, max_new_tokens=120, temperature=1.0, seed=1)
    done = [s for s in samples if s.ended is None]
    for s in done:
        jsonschema.validate(json.loads(s.text), SCHEMA)
    assert len(done) >= 15, [(s.text, s.ended) for s in samples if s.ended]
    # a schema's text works as its dict does, and the text of a sample the budget cut says so
    cut = json_gen.samples("", json_schema=json.dumps(SCHEMA), max_new_tokens=5, seed=1)[0]
    assert cut.ended == "max_new_tokens=5 came before the JSON schema was complete"


def test_a_lark_grammar_for_a_csv_gives_three_rows_of_three_fields(json_gen):
    texts = json_gen.generate("", grammar=CSV, num_samples=10, max_new_tokens=60, temperature=1.0, seed=2)
    for text in texts:
        rows = text.split("\n")
        assert rows[-1] == "" and len(rows) == 4, text  # the grammar is complete after its third row: it ends
        assert all(re.fullmatch("[a-z]{1,4}(,[a-z]{1,4}){2}", row) for row in rows[:3]), text


def test_a_pattern_and_a_ban_both_hold(gen):
    samples = gen.samples("", regex="[a-z]{4,8}", ban="aeiou", num_samples=50, max_new_tokens=10, seed=3)
    assert all(re.fullmatch("[b-df-hj-np-tv-z]{4,8}", s.text) for s in samples), [s.text for s in samples]
    # and with a stop string, the repetition controls and best-of
    kept = gen.samples("", regex="[a-z]{4,8}", stop="q", no_repeat_ngram=2, repetition_penalty=1.3, best_of=6,
                       num_samples=2, max_new_tokens=10, seed=4)
    assert len(kept) == 2 and all(re.fullmatch("[a-pr-z]{0,8}", s.text) for s in kept)


def test_a_pattern_the_other_constraints_leave_nothing_to_write_ends_the_sample_there(gen):
    """The check before decoding knows --ban and --allow; an n-gram rule is met only while writing: the sample ends
    where the two leave nothing, and its score says why."""
    s = gen.samples("", regex="a{6}", no_repeat_ngram=3, max_new_tokens=8)[0]
    assert s.text == "aaa" and s.ended == "the regular expression needed a character the other constraints leave " \
                                         "out here"


def test_decoding_is_the_same_with_a_pattern_that_allows_everything_it_writes(gen):
    """A pattern that never masks anything the model writes changes no character: the mask is a mask, no more."""
    plain = gen.generate("", max_new_tokens=12, temperature=1.0, seed=5, num_samples=4)
    held = gen.generate("", regex="[\\n a-z]*", max_new_tokens=12, temperature=1.0, seed=5, num_samples=4)
    assert held == plain


# --- what cannot be is said in one line, before decoding -----------------------------------------------------------
@pytest.mark.parametrize("kw, words", [
    (dict(regex="a(b"), "regex: "),
    (dict(regex=""), "regex is empty"),
    (dict(grammar="start: foo"), "grammar: "),
    (dict(json_schema="{not json"), "json_schema is not JSON"),
    (dict(json_schema="[1]"), "must be a JSON object"),
    (dict(regex="a", grammar=CSV), "regex and grammar both give the sample a pattern"),
], ids=str)
def test_a_malformed_pattern_is_one_line_naming_it(kw, words):
    with pytest.raises(ConfigError) as e:
        SampleSettings(**kw)
    assert words in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_a_pattern_the_vocabulary_cannot_write_is_one_line_naming_the_character(gen):
    with pytest.raises(ConfigError, match=r"needs 'Q' \(U\+0051\) there, a character this model never saw"):
        gen.generate("", regex="Q[a-z]+")
    with pytest.raises(ConfigError, match=r"needs 'c' \(U\+0063\) there, a character ban, allow"):
        gen.generate("", regex="ab?c", ban="c")
    with pytest.raises(ConfigError, match="no text this model can write matches the JSON schema"):
        gen.generate("", json_schema={"type": "object"})  # no '{' in this vocabulary


def test_a_pattern_the_check_cannot_settle_is_a_note_and_samples_that_say_they_are_incomplete():
    notes = []
    gen = Generator(random_model(), VOCAB, "cpu", log=notes.append)
    s = gen.samples("", regex="[a-z]+@", max_new_tokens=20, seed=1)[0]  # no '@': only letters, never complete
    assert len(notes) == 1 and "found no text of up to 400 characters" in notes[0]
    assert re.fullmatch("[a-z]{20}", s.text) and s.ended == "max_new_tokens=20 came before the regular expression " \
                                                             "was complete"


def test_without_llguidance_the_error_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "llguidance", None)
    with pytest.raises(ConfigError, match=re.escape('pip install -e ".[grammar]"')):
        SampleSettings(regex="a+")


# --- the surfaces ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("grammar")
    train_tiny(root)
    return root


def test_sample_py_takes_a_regex_and_grammar_and_schema_files(run, tmp_path):
    from chargpt.cli import sample_cli
    base = ["--checkpoint", run / "tiny", "--seed", "1", "--device", "cpu", "--json"]
    out = invoke(sample_cli, [*base, "--regex", "[a-z]{3,6}", "--num-samples", "3", "--max-new-tokens", "8",
                              "--prompt", "ROMEO: "])
    assert out.exit_code == 0, out.output
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(records) == 3 and all(re.fullmatch("[a-z]{3,6}", r["text"]) for r in records), out.stdout
    assert all(r["score"]["removed"] >= 0 and r["settings"]["regex"] == "[a-z]{3,6}" for r in records)
    grammar, schema = tmp_path / "g.lark", tmp_path / "s.json"
    grammar.write_text('start: "to " WORD\nWORD: /[a-z]{2,4}/\n', encoding="utf-8")
    schema.write_text(json.dumps({"type": "integer", "minimum": 10, "maximum": 59}), encoding="utf-8")
    for flag, path, pattern in (("--grammar", grammar, "to [a-z]{2,4}"), ("--json-schema", schema, "[1-5][0-9]")):
        out = invoke(sample_cli, [*base, flag, path])
        assert out.exit_code == 0 and re.fullmatch(pattern, json.loads(out.stdout)["text"]), out.output


@pytest.mark.parametrize("args, words", [
    (["--regex", "a(b"], "--regex: "),
    (["--grammar", "missing.lark"], "cannot read --grammar file missing.lark: not found"),
    (["--json-schema", "BAD"], "--json-schema is not JSON"),
], ids=str)
def test_sample_py_refuses_a_bad_pattern_in_one_line(args, words, tmp_path, monkeypatch):
    from chargpt.cli import sample_cli
    monkeypatch.chdir(tmp_path)
    (tmp_path / "BAD").write_text("{oops", encoding="utf-8")
    assert_one_line_error(invoke(sample_cli, args), re.escape(words))


def test_the_repl_takes_a_regex(gen):
    from chargpt.cli.repl import repl
    from chargpt.sampling.options import SampleOptions
    out, err = io.StringIO(), io.StringIO()
    repl(gen, SampleOptions.of(max_new_tokens=8, seed=1), inp=io.BytesIO(b"/regex [a-c]{5}\nab\n"), out=out, err=err)
    assert "regex = [a-c]{5}" in err.getvalue() and re.fullmatch(r"ab[a-c]{5}\n", out.getvalue()), err.getvalue()


def test_the_server_and_the_openai_client_take_a_pattern(run):
    need("starlette")
    openai = need("openai")
    need("httpx2" if sys.version_info >= (3, 11) else "httpx")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    app = serve.create_app(run, device="cpu")
    http = TestClient(app, base_url="http://localhost")
    client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0, http_client=http)
    out = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=10, seed=3, n=3, temperature=0.8,
                                    extra_body={"guided_regex": " [A-Z]{2,5}"})
    assert all(re.fullmatch(" [A-Z]{2,5}", c.text) and c.finish_reason == "stop" for c in out.choices), out
    gen = chargpt.load(run / "tiny", device="cpu", dtype="float32")
    assert [c.text for c in out.choices] == gen.generate("ROMEO:", regex=" [A-Z]{2,5}", max_new_tokens=10, seed=3,
                                                         num_samples=3, temperature=0.8)
    with pytest.raises(openai.BadRequestError, match="needs 'Z'"):
        client.completions.create(model="tiny", prompt="a", extra_body={"guided_regex": "Z"})
    with pytest.raises(openai.BadRequestError, match="response_format must be"):
        client.completions.create(model="tiny", prompt="a", extra_body={"response_format": {"type": "xml"}})
    with pytest.raises(openai.BadRequestError, match=r"JSON schema \(it needs '\{'"):  # any object: the run has no {
        client.completions.create(model="tiny", prompt="a", extra_body={"response_format": {"type": "json_object"}})
    r = http.post("/api/generate", json={"run": "tiny", "regex": "a(b"})
    assert r.status_code == 400 and r.json()["error"].startswith("regex: "), r.text
    # /api/generate takes a schema as an object; its scores come with the `done` event
    schema = {"type": "integer", "minimum": 10, "maximum": 59}
    r = http.post("/api/generate", json={"run": "tiny", "json_schema": schema, "num_samples": 2, "seed": 1})
    events = parse_sse(r.text)
    assert all(re.fullmatch("[1-5][0-9]", t) for t in texts_of(events, 2)), r.text
    assert events[-1][1]["scores"][0]["removed"] >= 0 and events[0][1]["settings"]["json_schema"] == json.dumps(schema)
