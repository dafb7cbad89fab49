"""The OpenAI-compatible API (chargpt/web/endpoints/openai.py), driven by the official openai client through
Starlette's test client: completions, streamed or not, give sample.py's text for the same seed and settings; stop
strings cut as OpenAI cuts them; the runs are the models; refusals are the client's typed errors. One tiny run is
trained per module (a second or two)."""

import sys

import pytest
from helpers import need, train_tiny

import chargpt

need("starlette")
openai = need("openai")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.web import limits  # noqa: E402
from chargpt.web import server as serve  # noqa: E402

PROMPT = "ROMEO:"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    train_tiny(root)
    return root


@pytest.fixture(scope="module")
def gen(served):
    """The run as sample.py loads it, in float32 on the CPU (what the server loads it as there)."""
    return chargpt.load(served / "tiny", device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def app(served):
    return serve.create_app(served, device="cpu")


@pytest.fixture(scope="module")
def client(app):
    """The openai client, its requests answered by the app in this process (no retries: a 429 is asserted)."""
    return openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                         http_client=TestClient(app, base_url="http://localhost"))


def streamed(chunks, count):
    """The choices' texts and finish reasons joined from a stream's chunks, and the usage chunk's usage."""
    texts, reasons, usage = [""] * count, [None] * count, None
    for chunk in chunks:
        assert chunk.object == "text_completion" and chunk.id.startswith("cmpl-") and chunk.model == "tiny"
        for c in chunk.choices:
            assert reasons[c.index] is None, "text after a choice's finish_reason"
            texts[c.index] += c.text
            reasons[c.index] = c.finish_reason
        usage = chunk.usage or usage
    return texts, reasons, usage


# --- the text is sample.py's -----------------------------------------------------------------------------------
def test_completion_is_sample_py_text_for_the_same_seed_and_settings(client, gen):
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0.8, top_p=0.9, seed=3,
                                    n=2)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == "tiny"
    assert [c.index for c in out.choices] == [0, 1]  # n=2: sample.py --num-samples 2, one batch, one seed
    assert [c.text for c in out.choices] == gen.generate(PROMPT, max_new_tokens=40, temperature=0.8, top_p=0.9,
                                                         seed=3, num_samples=2)
    assert all(c.finish_reason == "length" and c.logprobs is None for c in out.choices)
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (6, 80, 86)

    # absent fields are OpenAI's defaults, meant as sample.py's flags: temperature 1, 16 characters, top_p off
    plain = client.completions.create(model="tiny", prompt=PROMPT, seed=5)
    assert plain.choices[0].text == gen.generate(PROMPT, max_new_tokens=16, temperature=1.0, seed=5)[0]
    assert client.completions.create(model="tiny", prompt=PROMPT, seed=5, top_p=1, temperature=1,
                                     max_tokens=16).choices[0].text == plain.choices[0].text

    # a list of prompts: each written as sample.py writes it, prompt k's choices after prompt k-1's
    many = client.completions.create(model="tiny", prompt=[PROMPT, "To be"], max_tokens=12, seed=7, n=2,
                                     extra_body={"top_k": 5})
    expected = [t for p in (PROMPT, "To be") for t in gen.generate(p, max_new_tokens=12, seed=7, num_samples=2,
                                                                   temperature=1.0, top_k=5)]
    assert [(c.index, c.text) for c in many.choices] == list(enumerate(expected))
    assert many.usage.prompt_tokens == len(PROMPT) + len("To be")


def test_streamed_completion_is_the_same_text(client, gen):
    chunks = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=40, temperature=0.8, seed=3, n=2,
                                       stream=True, stream_options={"include_usage": True})
    texts, reasons, usage = streamed(chunks, 2)
    assert texts == gen.generate(PROMPT, max_new_tokens=40, temperature=0.8, seed=3, num_samples=2)
    assert reasons == ["length", "length"]
    assert (usage.prompt_tokens, usage.completion_tokens) == (6, 80)


def test_stop_strings_cut_the_text_in_both_modes(client, gen):
    settings = dict(max_new_tokens=60, temperature=0.8, seed=11)
    full = gen.generate(PROMPT, **settings)[0]
    stop = full[20:22]  # two characters the sample writes: it ends before their first appearance
    cut = gen.generate(PROMPT, stop=(stop, "\x07never"), **settings)[0]
    assert cut == full[:full.index(stop)] and len(cut) < 60
    never = full[30] + "\x07never"  # begins where the sample writes full[30], never completes: held back, then sent
    for stops, text, reason in (([stop, "\x07never"], cut, "stop"), (never, full, "length")):
        kw = dict(model="tiny", prompt=PROMPT, max_tokens=60, temperature=0.8, seed=11, stop=stops)
        out = client.completions.create(**kw)
        assert (out.choices[0].text, out.choices[0].finish_reason) == (text, reason)
        # streamed, nothing is sent that the stop string takes back: the pieces join to the same text
        assert streamed(client.completions.create(**kw, stream=True), 1)[:2] == ([text], [reason])


# --- models --------------------------------------------------------------------------------------------------------
def test_the_runs_are_the_models(client, app):
    models = client.models.list()
    assert [(m.id, m.object, m.owned_by) for m in models.data] == [("tiny", "model", "chargpt")]
    assert models.data[0].created > 0
    assert client.models.retrieve("tiny").id == "tiny"
    for ask in (lambda: client.models.retrieve("nope"),
                lambda: client.completions.create(model="nope", prompt=PROMPT)):
        with pytest.raises(openai.NotFoundError, match="no model named 'nope'.*the runs in its folder: tiny") as e:
            ask()
        assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"
    # the playground's Host check guards /v1 too (no DNS rebinding); no API key is needed
    assert TestClient(app, base_url="http://evil.example").get("/v1/models").status_code == 400
    keyless = TestClient(app, base_url="http://localhost").post("/v1/completions", json={"model": "tiny",
                                                                                         "max_tokens": 3})
    assert keyless.status_code == 200 and keyless.json()["choices"][0]["finish_reason"] == "length"


def test_sample_py_constraints_are_extra_body_fields(client, gen):
    """sample.py's constraints reach /v1/completions as fields of the same names (the client's extra_body): a form
    and an acrostic are written as sample.py writes them, streamed or not; best_of is OpenAI's own field, with
    sample.py's meaning; label and guidance reach the run (this one has no labels: a 400 that says so)."""
    form = {"form": "__ ___\n___ __", "acrostic": "TO"}
    out = client.completions.create(model="tiny", prompt="", max_tokens=40, seed=2, extra_body=form)
    text = out.choices[0].text
    assert text == gen.generate("", max_new_tokens=40, temperature=1.0, seed=2, **form)[0]
    lines = text.split("\n")
    assert [line[0] for line in lines] == ["T", "O"] and [len(w) for line in lines for w in line.split(" ")] == \
        [2, 3, 3, 2]
    assert out.choices[0].finish_reason == "stop"  # the form ended it before max_tokens
    chunks = client.completions.create(model="tiny", prompt="", max_tokens=40, seed=2, stream=True, extra_body=form)
    assert streamed(chunks, 1)[0] == [text]

    masks = {"ban": "e", "min_p": 0.05, "repetition_penalty": 1.3, "no_repeat_ngram": 3}
    out = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, seed=4, n=2, best_of=3,
                                    extra_body={**masks, "allow": "abcdfghijklmnopqrstuvwxyz ,.:\nRTO"})
    texts = [c.text for c in out.choices]
    assert texts == gen.generate(PROMPT, max_new_tokens=20, temperature=1.0, seed=4, num_samples=2, best_of=3,
                                 allow="abcdfghijklmnopqrstuvwxyz ,.:\nRTO", **masks)
    assert len(texts) == 2 and not any("e" in t for t in texts)
    with pytest.raises(openai.BadRequestError, match="trained without labels"):
        client.completions.create(model="tiny", prompt=PROMPT, extra_body={"label": "poem", "guidance": 2.0})
    with pytest.raises(openai.BadRequestError, match=r"best_of \(2\) must be at least"):
        client.completions.create(model="tiny", prompt=PROMPT, n=3, best_of=2)


# --- refusals, in OpenAI's error shape -------------------------------------------------------------------------------
def test_unsupported_fields_are_named_in_a_400(client, gen):
    with pytest.raises(openai.BadRequestError, match=r"not supported .*logprobs=2, echo=true") as e:
        client.completions.create(model="tiny", prompt=PROMPT, logprobs=2, echo=True)
    assert set(e.value.body) == {"message", "type", "param", "code"} and e.value.body["param"] == "logprobs"
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="frequency_penalty=0.5"):
        client.completions.create(model="tiny", prompt=PROMPT, frequency_penalty=0.5)
    # at OpenAI's defaults they ask for nothing, and are accepted
    client.completions.create(model="tiny", prompt=PROMPT, max_tokens=2, echo=False, best_of=1, logprobs=None,
                              frequency_penalty=0, presence_penalty=0.0, logit_bias={}, user="someone")
    with pytest.raises(openai.BadRequestError, match="unknown field.*typo"):
        client.completions.create(model="tiny", prompt=PROMPT, extra_body={"typo": 1})
    with pytest.raises(openai.BadRequestError, match="prompt must be a string .* or a list"):
        client.completions.create(model="tiny", prompt=[[1, 2, 3]])
    # characters the run never saw: named, with the field that skips or replaces them (as sample.py --unknown)
    with pytest.raises(openai.BadRequestError, match=r"never saw: 'J' .* send \"unknown\": \"skip\" or \"replace\""):
        client.completions.create(model="tiny", prompt="JO")
    with pytest.raises(openai.BadRequestError, match=r"^Error code: 400 .*prompt 1 of the list \(counted from 0\) "
                                                     r"has 1 character\(s\) this model never saw: 'J'"):
        client.completions.create(model="tiny", prompt=["O", "JO"])
    skipped = client.completions.create(model="tiny", prompt="JO", max_tokens=8, seed=2, extra_body={"unknown": "skip"})
    assert skipped.choices[0].text == gen.generate("JO", max_new_tokens=8, seed=2, temperature=1.0, unknown="skip")[0]
    assert skipped.usage.prompt_tokens == 1  # the prompt as the run saw it
    with pytest.raises(openai.NotFoundError, match="no chat"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])


def test_limits_are_the_playgrounds(client, app):
    over = limits.MAX_NEW_CHARS + 1
    with pytest.raises(openai.BadRequestError, match=f"max_tokens must be between 0 and {limits.MAX_NEW_CHARS}, "
                                                     f"got {over}") as e:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=over)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match=f"the limit is {limits.MAX_SAMPLES} per request"):
        client.completions.create(model="tiny", prompt=[PROMPT] * 3, n=3)
    with pytest.raises(openai.APIStatusError, match="request body is .* the limit is") as e:
        client.completions.create(model="tiny", prompt="a" * (limits.MAX_BODY_BYTES + 1))
    assert e.value.status_code == 413
    busy = app.state.busy
    for _ in range(busy.limit):  # every generation slot taken: the next request is a 429, not a queue
        busy.take()
    try:
        with pytest.raises(openai.RateLimitError, match="busy"):
            client.completions.create(model="tiny", prompt=PROMPT)
    finally:
        for _ in range(busy.limit):
            busy.give()
    assert client.completions.create(model="tiny", prompt=PROMPT, max_tokens=3).choices[0].text


def test_a_server_that_speculates_writes_the_same_completions(served, gen):
    """chargpt serve --speculate on: one sample at a time checks drafts, and the text is the one written without."""
    app = serve.create_app(served, device="cpu", speculate="on")
    fast = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                         http_client=TestClient(app, base_url="http://localhost"))
    for temperature, seed in ((0.0, 1), (0.8, 3)):
        out = fast.completions.create(model="tiny", prompt=PROMPT, max_tokens=60, temperature=temperature, seed=seed)
        assert out.choices[0].text == gen.generate(PROMPT, max_new_tokens=60, temperature=temperature, seed=seed)[0]
    assert app.state.models.get(served / "tiny" / "best.safetensors").speculates()
