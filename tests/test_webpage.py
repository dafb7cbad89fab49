"""`chargpt export --format web`: one HTML file that writes with a run in a browser, offline (chargpt/tools/webpage/).

The page's decoder runs under node (skipped without node outside CI) on the exported file itself: greedy text equal
to chargpt's float32 greedy text for 200 characters (the window slides many times at context 16), seeded sampling
reproducible, int8 within its reported cost. Then the file in headless Chromium from file:// with every other
request refused: Generate writes chargpt's greedy text, chargpt.generate with a seed twice gives one text, Stop stops.
Errors are one line and leave nothing behind."""

import json
import os
import re
import shutil
import signal
import subprocess

import pytest
import torch
from helpers import CHROMIUM, assert_one_line_error, invoke, launch_chromium, need, snapshot, train_tiny

import chargpt
import chargpt.tools.webpage as webpage
from chargpt.cli import export_cli
from chargpt.config import ModelConfig, TrainConfig
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import save_model
from chargpt.tools.webpage.check import chargpt_greedy
from chargpt.tools.webpage.pack import dequantized, pack_weights
from chargpt.tools.webpage.page import read_page

NODE = shutil.which("node")
CHECK_JS = webpage.Path(webpage.__file__).with_name("check.js")
PROMPT = "ROMEO:"
needs_node = pytest.mark.skipif(not NODE and os.environ.get("CI") != "true", reason="node is not installed")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny run (1 layer x 16, context 16) trained until its greedy text is varied: 300 steps, about 1.5 s."""
    return train_tiny(tmp_path_factory.mktemp("webpage"), steps=300)


@pytest.fixture(scope="module")
def gen(run):
    return chargpt.load(run, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def pages(run, tmp_path_factory):
    """{weights: (page path, what the export printed)} for float32 and int8."""
    out, logs = tmp_path_factory.mktemp("pages"), {}
    for weights in ("float32", "int8"):
        lines = []
        path = webpage.export_web(run, out / f"{weights}.html", weights=weights, log=lines.append)
        logs[weights] = (path, "\n".join(lines))
    return logs


def node_write(page, prompt, simd=True, **request):
    """The page's own decoder under node (check.js): the text it writes after prompt with these options, its
    products in WebAssembly SIMD (simd, checked to be what ran) or in the plain JavaScript loops."""
    done = subprocess.run([NODE, str(CHECK_JS), str(page), json.dumps({"prompt": prompt, "text": True, "simd": simd,
                                                                         **request})],
                          capture_output=True, text=True, encoding="utf-8", timeout=60, check=True)
    out = json.loads(done.stdout)
    assert out["simd"] == simd  # node 20 runs WebAssembly SIMD: the path asked for is the one that wrote
    return out["text"]


def smallest_gap(model, vocab, prompt, n):
    """The smallest gap between the two largest logits over chargpt's n greedy steps after prompt: a near-tie there
    could flip with rounding, and the comparison would say nothing about the page."""
    _, logits = chargpt_greedy(model, vocab, prompt, n)
    top2 = torch.stack(logits).topk(2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).min().item()


@needs_node
def test_the_page_writes_chargpts_greedy_text(pages, gen):
    ours = gen.generate(PROMPT, max_new_tokens=200, temperature=0)[0]
    assert len(set(ours)) >= 10 and smallest_gap(gen.model, gen.vocab, PROMPT, 200) > 1e-3  # varied, no near-tie
    page, said = pages["float32"]
    assert node_write(page, PROMPT, maxNewTokens=200, temperature=0) == ours
    assert node_write(page, PROMPT, simd=False, maxNewTokens=200, temperature=0) == ours  # the loops agree too
    assert re.search(r"run in node v[\d.]+, writes chargpt's greedy text .* reproduces its logits", said)


@needs_node
def test_seeded_sampling_is_reproducible_in_the_page(pages):
    page = pages["float32"][0]
    opts = dict(maxNewTokens=120, temperature=1.0, topK=20, topP=0.95)
    first, again, other = (node_write(page, "To", seed=s, **opts) for s in (7, 7, 8))
    assert first == again and first != other and len(first) == 120


@needs_node
def test_stop_strings_cut_the_text_as_chargpt_does(pages, gen):
    """Greedy with a stop string: chargpt's text up to it (StopFilter), a stop that begins in the prompt too."""
    page = pages["float32"][0]
    for prompt, stop in [(PROMPT, "the"), (PROMPT, ":"), ("ROMEO: O, she doth teach the t", "the torches")]:
        want = gen.generate(prompt, max_new_tokens=200, temperature=0, stop=[stop])[0]
        assert len(want) < 150  # it stopped
        assert node_write(page, prompt, maxNewTokens=200, temperature=0, stop=[stop]) == want


@needs_node
def test_int8_page_writes_as_its_reference_and_reports_its_cost(pages, gen):
    page, said = pages["int8"]
    gap = float(re.search(r"int8 weights cost ([-+]\d+\.\d+) nats per character \(teacher-forced on [\d,]+ "
                          r"characters of the validation split", said)[1])
    description, blob = read_page(page.read_text(encoding="utf-8"))
    assert {t["dtype"] for name, t in description["tensors"].items() if name.endswith(".weight") and
            len(t["shape"]) == 2} == {"int8"}
    reference = dequantized(gen.model, *pack_weights(gen.model, "int8"))
    ids, _ = chargpt_greedy(reference, gen.vocab, PROMPT, 200)
    written = node_write(page, PROMPT, maxNewTokens=200, temperature=0)
    if smallest_gap(reference, gen.vocab, PROMPT, 200) > 1e-3:
        assert written == "".join(gen.vocab.chars[i] for i in ids)
    assert abs(gap) <= 0.01
    assert page.stat().st_size < pages["float32"][0].stat().st_size


def test_the_file_is_self_contained(pages):
    text = pages["float32"][0].read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", text, re.I)  # nothing loaded from anywhere
    assert "default-src 'none'" in text and text.count("<script") == 5  # the CSP forbids fetching; all inline
    assert "<link" not in text and "@import" not in text and "url(" not in text


@pytest.mark.parametrize("options", [dict(bias=False, tie_weights=False), dict(pos_emb="sinusoidal", norm="post",
                                     activation="relu", emb_scale=True), dict(softmax="adaptive", shortlist=2)],
                         ids=["nobias-untied", "2017-parts", "adaptive-softmax"])
def test_every_decoder_option_exports_and_checks(tmp_path, options):
    """The export's own check (node: the page's logits against chargpt's) passes for the options chargpt has, in
    float32 and int8 (the adaptive softmax: a shortlist of 2, two clusters, characters ranked by made-up counts)."""
    ckpt = save_random(tmp_path, **options)
    for weights in ("float32", "int8"):
        lines = []
        webpage.export_web(ckpt, tmp_path / f"{weights}.html", weights=weights, log=lines.append)
        assert "reproduces" in lines[-1] and (tmp_path / f"{weights}.html").is_file()


VOCAB = Vocab("\n abcdefghij")
PAIRS_VOCAB = Vocab(sorted("\n abcdefghij" + SEP + END))  # a pairs run's vocabulary holds its markers


def save_random(tmp_path, task="text", **options):
    vocab = PAIRS_VOCAB if task == "pairs" else VOCAB
    cfg = ModelConfig(vocab_size=len(vocab), block_size=16, n_layer=2, n_head=2, n_embd=16, dropout=0.0, **options)
    torch.manual_seed(0)
    model = build_model(cfg.validate())
    if cfg.softmax == "adaptive":
        model.lm_head.set_frequencies(torch.randint(1, 100, (len(vocab),)))
    ckpt = tmp_path / "model.safetensors"
    save_model(ckpt, model, vocab, TrainConfig(task=task) if task != "text" else None, step=3, val_loss=2.0)
    return ckpt


def test_what_the_page_cannot_compute_is_one_line_and_writes_nothing(tmp_path):
    ckpt = save_random(tmp_path, arch="encoder-decoder", task="pairs")
    before = snapshot(tmp_path)
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "out" / "x.html"])
    assert_one_line_error(r, r"--arch encoder-decoder cannot be exported as a web page")
    ckpt = save_random(tmp_path, task="pairs")
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "out" / "x.html"])
    assert_one_line_error(r, r"sentence pairs .* --format hf")
    r = invoke(export_cli, ["--checkpoint", ckpt, "--to", tmp_path / "hf", "--web-weights", "int8"])
    assert_one_line_error(r, r"--web-weights is for --format web")
    assert snapshot(tmp_path).keys() == before.keys()


def test_a_model_too_large_for_a_page_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(webpage, "MAX_WEIGHT_BYTES", 10_000)  # the model's 28 KB in float32, 7 KB in int8
    ckpt = save_random(tmp_path)
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "page.html"])
    assert_one_line_error(r, r"weights are 28 KB as float32, more than a web page can hold \(10 KB\); export it "
                             r"with --web-weights int8")
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "page.html", "--web-weights",
                            "int8"])
    assert r.exit_code == 0 and (tmp_path / "page.html").is_file()


def test_to_is_checked_and_force_replaces_only_a_page(tmp_path, pages):
    ckpt = save_random(tmp_path)
    for to, pattern in [("page.txt", r"one \.html file"), (".", r"is a folder")]:
        assert_one_line_error(invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / to]),
                              pattern)
    mine = tmp_path / "mine.html"
    mine.write_text("<p>my own page</p>")
    for force, pattern in [([], r"exists; pass --force"), (["--force"], r"not a page an earlier web export wrote")]:
        r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", mine, *force])
        assert_one_line_error(r, pattern)
    assert mine.read_text() == "<p>my own page</p>"
    earlier = tmp_path / "earlier.html"
    shutil.copyfile(pages["int8"][0], earlier)
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", earlier, "--force"])
    assert r.exit_code == 0 and r.stdout.strip() == str(earlier)
    assert read_page(earlier.read_text(encoding="utf-8"))[0]["chars"] == VOCAB.chars


def test_a_failed_check_or_a_signal_leaves_nothing(tmp_path, monkeypatch):
    ckpt = save_random(tmp_path)
    before = snapshot(tmp_path)

    def broken(path, reference, vocab):
        assert path.is_file()  # the page was written, under its temporary name
        raise chargpt.ChargptError("the page's logits differ from chargpt's by 3 (allowed 1e-4); nothing was written")
    monkeypatch.setattr(webpage, "check_page", broken)
    r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "new" / "page.html"])
    assert_one_line_error(r, r"logits differ")
    assert snapshot(tmp_path) == before  # no page, no temporary file, no folder made for it

    def killed(path, reference, vocab):
        os.kill(os.getpid(), signal.SIGTERM)
    monkeypatch.setattr(webpage, "check_page", killed)
    old = signal.signal(signal.SIGTERM, lambda *a: None)  # were it not handled, pytest would go on
    try:
        r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / "page.html"])
    finally:
        signal.signal(signal.SIGTERM, old)
    assert r.exit_code == 128 + signal.SIGTERM and "SIGTERM: stopped before the page was written" in r.stderr
    assert snapshot(tmp_path) == before


def test_without_node_the_weights_are_checked_in_python(tmp_path, monkeypatch):
    monkeypatch.setattr(webpage.check.shutil, "which", lambda name: None)
    lines = []
    webpage.export_web(save_random(tmp_path), tmp_path / "page.html", weights="int8", log=lines.append)
    assert "node was not found, so the page's decoder was not run here" in lines[-1]
    assert "int8's cost in loss was not measured: this checkpoint records no training run" in lines[0]


# --- in a browser --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def browser():
    sync_api = need("playwright.sync_api")
    if not CHROMIUM:
        if os.environ.get("CI") == "true":
            pytest.fail("CI needs Chromium: apt-get install chromium")
        pytest.skip("Chromium is not installed (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        b = launch_chromium(p)
        yield b
        b.close()


def test_the_page_in_chromium_from_file_offline(browser, pages, gen, tmp_path):
    context = browser.new_context(viewport={"width": 1000, "height": 800})
    refused, errors = [], []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else (refused.append(route.request.url), route.abort()))
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(pages["float32"][0].as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert page.text_content("#name") == "tiny" and "1 layers x 16 wide" in page.text_content("#facts")
    assert page.evaluate("chargpt.info.simd") is True  # the page's policy lets its WebAssembly kernel run
    page.fill("#prompt", PROMPT)
    page.fill("#temperature", "0")
    page.fill("#length", "200")
    page.click("#generate")
    page.wait_for_selector("body[data-state='done']")
    assert page.text_content("#output .gen") == gen.generate(PROMPT, max_new_tokens=200, temperature=0)[0]
    twice = page.evaluate("""async () => {
        const opts = {maxNewTokens: 80, temperature: 1.0, topK: 20, seed: 11};
        return [await chargpt.generate("To", opts), await chargpt.generate("To", opts)];
    }""")
    assert twice[0] == twice[1] and len(twice[0]) == 80
    if NODE:
        assert twice[0] == node_write(pages["float32"][0], "To", maxNewTokens=80, temperature=1.0, topK=20, seed=11)
    page.fill("#length", "1000000")
    page.click("#generate")
    page.wait_for_selector("body[data-state='running']")
    page.click("#stop")
    page.wait_for_selector("body[data-state='done']")
    assert page.text_content("#status").startswith("stopped: ")
    page.fill("#prompt", "ROMEO: 😀")
    page.click("#generate")
    assert "never saw this character" in page.text_content("#status")
    page.screenshot(path=str(tmp_path / "page.png"))
    context.close()
    assert not refused and not errors, (refused, errors)


def test_a_page_named_like_markup_loads_and_writes_a_form_offline(browser, run, tmp_path):
    """A run named "<!--<script>" (which once hid the page's scripts from the parser: no window.chargpt): the page
    loads, shows the name as text, and writes a form from its controls and from a script; an aborted signal writes
    nothing."""
    named = tmp_path / "<!--<script>"
    shutil.copytree(run, named)
    html = webpage.export_web(named, tmp_path / "named.html", log=lambda line: None)
    context = browser.new_context()
    refused, errors = [], []
    context.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file:")
                  else (refused.append(route.request.url), route.abort()))
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(html.as_uri())
    page.wait_for_selector("body[data-ready='1']")
    assert page.text_content("#name") == "<!--<script>" and page.title() == "<!--<script>"
    page.select_option("#form", "pattern")
    page.fill("#form-pattern", "_____ *.\\n_____ *.")
    page.fill("#ban", "q")
    page.fill("#seed", "3")
    page.click("#generate")
    page.wait_for_selector("body[data-state='done']")
    assert re.fullmatch(r"[^\W\d_]{5} [^\n]*\.\n[^\W\d_]{5} [^\n]*\.", page.text_content("#output .gen"))
    assert "q" not in page.text_content("#output .gen")
    out = page.evaluate("""async () => {
        const aborted = new AbortController();
        aborted.abort();
        let pieces = 0, error = null;
        try { await chargpt.stream("To", {signal: aborted.signal}, () => pieces++); } catch (e) { error = e.name; }
        let typed = null;
        try { await chargpt.generate(123); } catch (e) { typed = e.message; }
        return [await chargpt.generate("", {form: "_,_,_\\n", temperature: 1, seed: 2}), error, pieces, typed];
    }""")
    assert re.fullmatch(r"[^\W\d_],[^\W\d_],[^\W\d_]\n", out[0]) and out[1:3] == ["AbortError", 0]
    assert out[3].startswith("the prompt must be a string")
    context.close()
    assert not refused and not errors, (refused, errors)


def test_force_replaces_an_earlier_page_by_its_structure_not_a_quoted_tag(tmp_path, pages):
    """A notes file that quotes the page's generator tag (in a <pre>, or a page's head copied into it) is not a page
    an earlier export wrote: --force refuses it and leaves it as it was."""
    ckpt = save_random(tmp_path)
    tag = '<meta name="generator" content="chargpt export --format web">'
    head = pages["float32"][0].read_text(encoding="utf-8")[:400]
    for name, text in [("notes.html", f"<!DOCTYPE html>\n<html><head>{tag}</head><body><pre>{tag}</pre></body></html>"),
                       ("copied.html", head + "\n<p>my notes on the page's head</p></body></html>\n")]:
        (tmp_path / name).write_text(text, encoding="utf-8")
        r = invoke(export_cli, ["--format", "web", "--checkpoint", ckpt, "--to", tmp_path / name, "--force"])
        assert_one_line_error(r, r"not a page an earlier web export wrote")
        assert (tmp_path / name).read_text(encoding="utf-8") == text
