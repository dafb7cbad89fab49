"""The playground and a run trained with --labels: its details list its labels, /api/generate (and /v1/completions)
write in a label's style as chargpt.load(...).generate does for the same seed, a label the run lacks and a guidance
out of range are one-line 400s before any decoding, and in a browser Write offers the run's labels (a run without
labels: no picker) and Runs draws each label's validation loss. One labels run and one plain run per module."""

import os
import random
import sys

import pytest
from helpers import CHROMIUM, TINY_RUN_KW, launch_chromium, need, parse_sse, texts_of, train_tiny

import chargpt

need("starlette")
need("uvicorn")
need("httpx2" if sys.version_info >= (3, 11) else "httpx")
from starlette.testclient import TestClient  # noqa: E402

from chargpt.web import server as serve  # noqa: E402

HERE = "http://127.0.0.1"
STYLES = {"a": "abc", "b": "xyz"}  # two labels, disjoint alphabets


def styled(alphabet, chars, rng):
    words = []
    while sum(map(len, words)) < chars:
        words.append("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) + rng.choice(" \n"))
    return "".join(words)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder with `styled` (--labels folders: a, b) and `tiny` (no labels)."""
    root = tmp_path_factory.mktemp("labelled")
    rng = random.Random(0)
    authors = root.parent / f"{root.name}-authors"
    for label, alphabet in STYLES.items():
        (authors / label).mkdir(parents=True)
        (authors / label / "1.txt").write_text(styled(alphabet, 1500, rng))
    chargpt.train(**{**TINY_RUN_KW, "curves": False}, data=authors, labels="folders", out_dir=root / "styled",
                  cache_dir=root.parent / f"{root.name}-cache", max_iters=40, eval_interval=20, log=lambda *a: None)
    train_tiny(root)
    return root


@pytest.fixture
def client(served):
    return TestClient(serve.create_app(served, device="cpu"), base_url=HERE)


def test_runs_name_their_labels_and_metrics_carry_each_labels_loss(client):
    assert {r["name"]: r["labels"] for r in client.get("/api/runs").json()["runs"]} == {"styled": ["a", "b"],
                                                                                       "tiny": None}
    assert client.get("/api/runs/styled").json()["labels"] == ["a", "b"]
    assert client.get("/api/runs/tiny").json()["labels"] is None
    rows = [r for r in client.get("/api/runs/styled/metrics").json()["rows"] if "val_loss" in r]
    assert len(rows) == 3 and all(set(r["val_loss_by_label"]) == {"a", "b"} for r in rows)  # steps 0, 20, 40


@pytest.mark.parametrize("label,guidance,beam", [("a", None, None), ("b", 2.0, None), (None, None, None),
                                                 ("a:0.3,b:0.7", None, None), ("a:1,b:1", None, 3)])
def test_a_label_streams_the_librarys_text(client, served, label, guidance, beam):
    kw = dict(max_new_tokens=30, seed=3, num_samples=2, temperature=1.0, **({"beam": beam} if beam else {}))
    body = {"run": "styled", "prompt": "", **kw, **({"label": label} if label else {}),
            **({"guidance": guidance} if guidance else {})}
    r = client.post("/api/generate", json=body)
    assert r.status_code == 200, r.text
    events = parse_sse(r.text)
    want = chargpt.load(served / "styled", device="cpu", dtype="float32").generate("", label=label, guidance=guidance,
                                                                                   **kw)
    assert texts_of(events, 2) == want and events[-1][1]["error"] is None
    assert events[0][1]["settings"].get("label") == label and events[0][1]["settings"].get("guidance") == guidance


def test_completions_take_a_label_beside_openais_fields(client, served):
    r = client.post("/v1/completions", json={"model": "styled", "prompt": "", "max_tokens": 25, "seed": 4,
                                             "label": "b", "guidance": 1.5})
    assert r.status_code == 200, r.text
    gen = chargpt.load(served / "styled", device="cpu", dtype="float32")
    assert r.json()["choices"][0]["text"] == gen.generate("", label="b", guidance=1.5, max_new_tokens=25, seed=4,
                                                          temperature=1.0)[0]


BAD_LABELS = [  # (run, body fields, words the 400's one line must contain)
    ("styled", {"label": "c"}, "unknown label 'c'; this run's labels: a, b"),
    ("styled", {"label": "a", "guidance": 0.5}, "guidance must be >= 1"),
    ("styled", {"guidance": 2.0}, "steers towards a --label"),
    ("styled", {"label": "a", "guidance": 1e6}, "guidance must be at most 100"),
    ("styled", {"label": "a" * 2001}, "label is 2001 characters; the limit is 2000"),
    ("styled", {"label": "a:0.5,c:0.5"}, "unknown label 'c'; this run's labels: a, b"),
    ("styled", {"label": "a:0.5,b:0"}, "the weight of 'b' must be a positive number"),
    ("styled", {"label": "a:0.5,b:0.5", "guidance": 2.0}, "guidance steers towards one label, not a mix"),
    ("styled", {"label": 3}, "label must be a string or null"),
    ("tiny", {"label": "a"}, "this run was trained without labels; leave label out"),
]


@pytest.mark.parametrize("run,fields,words", BAD_LABELS, ids=[str(b[1])[:30] for b in BAD_LABELS])
def test_a_label_the_run_lacks_or_a_bad_guidance_is_a_one_line_400(client, run, fields, words):
    r = client.post("/api/generate", json={"run": run, **fields})
    assert r.status_code == 400 and words in r.json()["error"] and "\n" not in r.json()["error"], r.text
    assert client.get("/api/status").json()["busy"] == 0  # refused before decoding: the slot is given back


def test_the_page_offers_a_runs_labels_and_draws_their_losses(served, tmp_path):
    sync_api = need("playwright.sync_api")
    if not CHROMIUM and os.environ.get("CI") != "true":
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    gen = chargpt.load(served / "styled", device="cpu", dtype="float32")
    with serve.running(serve.create_app(served, device="cpu")) as url, sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(60_000)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        page.select_option("#run", "tiny")
        assert page.is_hidden("#label-pick") and page.is_hidden("#guidance-pick")  # no labels: no picker
        page.select_option("#run", "styled")
        assert page.is_visible("#label-pick") and page.is_hidden("#guidance-pick")
        assert page.eval_on_selector_all("#label option", "os => os.map(o => o.textContent)") == ["(none)", "a", "b",
                                                                                               "(mix)"]
        page.select_option("#label", "b")
        assert page.is_visible("#guidance-pick") and page.input_value("#guidance") == "1"
        page.fill("#guidance", "2")
        page.fill("#length", "30")
        page.fill("#seed", "5")
        page.click("#generate")
        page.wait_for_selector("body[data-state='done']")
        assert page.text_content(".sample[data-i='0'] .gen") == gen.generate(
            "", label="b", guidance=2.0, max_new_tokens=30, seed=5, temperature=0.8)[0]
        page.select_option("#label", "⟨mix⟩")  # (mix): a weight per label, the labels mixed as --label a:30,b:70
        assert page.is_visible("#mix-pick") and page.is_hidden("#guidance-pick")
        assert page.eval_on_selector_all("#mix-weights input", "s => s.map(x => x.dataset.label)") == ["a", "b"]
        page.fill("#mix-weights input[data-label='a']", "30")
        page.fill("#mix-weights input[data-label='b']", "70")
        assert page.text_content("#mix-weights label:nth-child(2) output") == "70"
        page.click("#generate")
        page.wait_for_selector("body[data-state='done']")
        assert page.text_content(".sample[data-i='0'] .gen") == gen.generate(
            "", label="a:0.3,b:0.7", max_new_tokens=30, seed=5, temperature=0.8)[0]
        page.fill("#prompt", "ab")  # suggestions under (mix): unconditioned, the picker's placeholder never a label
        page.wait_for_function("t => document.getElementById('suggestions').dataset.for === t", arg="ab")
        assert "no suggestions" not in page.text_content("#suggestions") and page.query_selector("#suggestions .chip")
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#chart[data-label-curves='2']")  # a and b of `styled`; `tiny` has none
        assert sorted(page.eval_on_selector_all("#chart path.label-curve", "ps => ps.map(p => p.dataset.label)")) \
            == ["a", "b"]
        page.screenshot(path=tmp_path / "labels.png", full_page=True)
        browser.close()
    assert not errors, errors
