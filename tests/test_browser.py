"""The playground in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright) against a
server on a free localhost port with a tiny run trained here. It writes with a fixed seed and checks the text
against the library, stops a generation, shows unknown characters, draws the inside view (surprise shading,
a causal attention map), the runs view (curves that follow a run still training; 20 runs of 20 samples each in a
page of bounded height, in 20 colours) and the copied text of a sample (chargpt.tools.novelty) shaded with its source
line, with the span length the page sends. Each view is saved as a
screenshot under the test's tmp dir. Skipped only where Chromium or Playwright is missing outside CI."""

import json
import os
import shutil

import pytest
from helpers import TINY_WEB_KW, need, train_pairs, train_tiny, write_cipher

import chargpt

need("starlette")
need("uvicorn")
sync_api = need("playwright.sync_api")
from chargpt.web import server as serve  # noqa: E402

CHROMIUM = os.environ.get("CHARGPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
if not CHROMIUM and os.environ.get("CI") != "true":
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
WAIT_MS = 60_000  # generous: CI machines are small and shared


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, run directory) of a server with one tiny run."""
    root = tmp_path_factory.mktemp("browser")
    run = train_tiny(root)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        yield url, run


@pytest.fixture(scope="module")
def browser():
    assert CHROMIUM, "CI needs Chromium: apt-get install chromium"
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield b
        b.close()


@pytest.fixture
def page(browser, site):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    # console errors, such as CSP violations; a refused request (which tests provoke) is checked where it happens
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "Failed to load resource" not in m.text
            else None)
    page.goto(site[0])
    page.wait_for_selector("body[data-ready='1']")
    yield page
    page.close()
    assert not errors, errors


def write(page, prompt, **fields):
    page.fill("#prompt", prompt)
    for name, value in fields.items():
        page.fill(f"#{name}", str(value))
    page.click("#generate")
    page.wait_for_selector("body[data-state='done']")


def sample_text(page, i):
    return page.text_content(f".sample[data-i='{i}'] .gen")


def test_write_streams_the_text_the_library_writes(page, site, tmp_path):
    write(page, "To be", temperature=0.9, **{"top-k": 12}, length=80, seed=5, samples=2)
    expected = chargpt.load(site[1], device="cpu").generate("To be", temperature=0.9, top_k=12, max_new_tokens=80,
                                                           seed=5, num_samples=2)
    assert [sample_text(page, 0), sample_text(page, 1)] == expected
    assert page.text_content(".sample[data-i='0'] .prompt") == "To be"
    assert page.inner_text("#write-status").startswith("done · 160 characters")
    page.screenshot(path=tmp_path / "write.png", full_page=True)


def test_write_takes_a_form_an_acrostic_banned_characters_and_best_of_and_shows_the_scores(page, site, tmp_path):
    write(page, "", form="_____ *.\\n", acrostic="T", ban="e", **{"best-of": 3}, samples=2, seed=4, length=60)
    want = chargpt.load(site[1], device="cpu").samples("", form="_____ *.\\n", acrostic="T", ban="e", best_of=3,
                                                      num_samples=2, seed=4, max_new_tokens=60)
    assert [sample_text(page, 0), sample_text(page, 1)] == [s.text for s in want]
    assert all(t.startswith("T") and "e" not in t for t in (s.text for s in want))
    scores = [page.text_content(f".sample[data-i='{i}'] .scores") for i in (0, 1)]
    assert scores[0].startswith(f"best 1 of 3 (row {want[0].row}) · mean log-prob {want[0].logprob:.3f} nats/char")
    assert f"the constraints removed {want[1].removed:.3f} nats/char" in scores[1]
    page.screenshot(path=str(tmp_path / "write-form.png"))
    page.fill("#form", "")
    page.fill("#acrostic", "")
    page.fill("#ban", "")
    page.fill("#best-of", "")
    write(page, "To be", length=10, seed=1)
    assert page.query_selector(".sample .scores") is None  # no constraint: no scores


def test_write_takes_a_regular_expression(page, site):
    need("llguidance")
    write(page, "ROMEO:", regex=" [A-Z]{2,5}", samples=2, seed=3, length=10)
    want = chargpt.load(site[1], device="cpu").samples("ROMEO:", regex=" [A-Z]{2,5}", num_samples=2, seed=3,
                                                      max_new_tokens=10)
    assert [sample_text(page, 0), sample_text(page, 1)] == [s.text for s in want]
    assert "the constraints removed" in page.text_content(".sample[data-i='0'] .scores")
    page.fill("#regex", "")


def test_stop_ends_a_long_generation(page):
    page.fill("#length", "5000")
    page.fill("#samples", "8")
    page.click("#generate")
    page.wait_for_function("() => document.querySelector(\".sample[data-i='0'] .gen\")?.textContent.length > 0")
    page.click("#stop-button")
    page.wait_for_selector("body[data-state='done']")
    assert page.inner_text("#write-status").startswith("stopped")
    assert len(sample_text(page, 0)) < 5000


def test_unknown_prompt_characters_are_marked_then_replaced(page, site):
    write(page, "To bé")
    assert "never saw" in page.inner_text("#write-status")
    assert page.text_content("#prompt-marks .unknown") == "é"
    page.select_option("#unknown", "replace")
    write(page, "To bé", seed=2, length=20)
    gen = chargpt.load(site[1], device="cpu")
    assert page.text_content(".sample[data-i='0'] .prompt") == gen.prompt_text("To bé", "replace")
    assert sample_text(page, 0) == gen.generate("To bé", unknown="replace", seed=2, max_new_tokens=20)[0]
    assert "replaced" in page.inner_text("#write-status")


ATTENTION_PIXELS = """() => {
  const c = document.getElementById('attn'), ctx = c.getContext('2d');
  const cell = +c.dataset.cell, m = +c.dataset.margin, W = Math.round((c.width - m) / cell);
  const px = (q, k) => Array.from(ctx.getImageData(m + k * cell + cell / 2, m + q * cell + cell / 2, 1, 1).data);
  const white = (p) => p[0] === 255 && p[1] === 255 && p[2] === 255;
  let above = 0, dark = 0;
  for (let q = 0; q < W; q++) for (let k = 0; k < W; k++) {
    if (k > q && !white(px(q, k))) above++;
    if (k === 0 && q === 0 && px(q, k)[0] < 100) dark++;
  }
  return {W, above, dark};
}"""


def test_look_inside_shades_surprise_and_draws_causal_attention(page, site, tmp_path):
    write(page, "To be", seed=3, length=40)
    text = "To be" + sample_text(page, 0)
    page.click("#to-inside")
    page.wait_for_selector("body[data-inside='done']")
    assert page.input_value("#inside-text") == text
    chars = page.locator("#surprise .c")
    assert chars.count() == len(text)
    assert int(page.get_attribute("#surprise", "data-shaded")) == len(text) - 1  # all but the first character
    colours = {chars.nth(i).evaluate("s => getComputedStyle(s).backgroundColor") for i in range(1, len(text))}
    assert len(colours) > 3 and "rgb(255, 255, 255)" not in colours  # shaded, and by different amounts
    chars.nth(7).hover()
    assert page.inner_text("#expected").startswith("Position 7:") and page.locator("#expected .cand").count() == 5
    assert page.get_attribute("#attn", "data-drawn") == "0,0"
    pixels = page.evaluate(ATTENTION_PIXELS)
    assert pixels == {"W": 16, "above": 0, "dark": 1}  # the causal triangle: nothing above the diagonal
    assert page.get_attribute("#heads", "data-drawn") == "2"  # 1 layer x 2 heads
    page.locator("#heads canvas").nth(1).click()
    assert page.get_attribute("#attn", "data-drawn") == "0,1"
    # a character before the window (which holds the last 16): clicking it moves the window to hold it
    assert "attention over characters 29 to 44" in page.inner_text("#inside-status")
    chars.nth(3).click()
    page.wait_for_function("() => document.getElementById('inside-status').textContent.includes('characters 0 to 15')")
    assert page.locator("#surprise .pinned").count() == 1 and page.get_attribute("#attn", "data-drawn") == "0,1"
    page.screenshot(path=tmp_path / "inside.png", full_page=True)


def test_runs_view_draws_curves_that_follow_a_run_still_training(page, site, tmp_path):
    page.click(".tab[data-view='runs']")
    page.wait_for_selector("#chart[data-curves='2']")  # train and val of the one run
    val = page.locator("#chart path.curve.val")
    assert val.get_attribute("d").count("L") == 3  # evaluations at steps 0, 10, 20, 30
    assert page.locator("#chart path.curve.running").get_attribute("d").count("L") == 2  # steps 1, 11, 21
    assert page.inner_text("#chart-title").startswith("tiny: corpus browser")  # the run, its corpus, its model
    assert "1 layer × 16, 2 heads, context 16" in page.inner_text("#chart-title")
    assert page.locator("#runs-table tbody tr").count() == 1
    page.screenshot(path=tmp_path / "runs.png", full_page=True)
    page.check("input[name=unit][value=nats]")
    assert page.locator("#chart path.curve").count() == 3
    # training goes on: a new evaluation appears without reloading the page
    with open(site[1] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 40, "train_loss": 2.9, "val_loss": 3.0, "train_bpc": 4.18, "val_bpc": 4.33}) + "\n")
    points = "() => document.querySelector('#chart path.curve.val').getAttribute('d').split('L').length"
    page.wait_for_function(f"{points} === 5")
    # and its sample: what training prints at the end, from the same validation line and seed
    prompt = chargpt.load(site[1], device="cpu").meta["closing_prompt"]
    assert prompt and prompt in page.inner_text("#run-detail")
    page.click("#run-detail button")
    want = len(prompt) + 300
    page.wait_for_function(f"() => document.querySelector('#run-detail pre').textContent.length === {want}")
    expected = chargpt.load(site[1], device="cpu").generate(prompt, max_new_tokens=300, temperature=0.8, seed=1337)[0]
    assert page.text_content("#run-detail pre") == prompt + expected


def test_runs_view_lists_the_samples_written_while_training(page, site):
    rows = [{"step": 10, "prompt": "To ", "text": "bee <b>not</b>"}, {"step": 20, "prompt": "To ", "text": "be, or"}]
    path = site[1] / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    try:
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#run-detail .sample.during")
        shown = page.locator("#run-detail .sample.during")
        assert shown.count() == 2 and "Samples while training (2)" in page.inner_text("#run-detail")
        assert [shown.nth(i).locator("h3").inner_text() for i in range(2)] == ["step 20", "step 10"]  # newest first
        assert shown.nth(1).locator("pre").text_content() == "To bee <b>not</b>"  # text, never markup
        assert shown.nth(1).locator(".prompt").text_content() == "To "
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def pairs_site(tmp_path_factory):
    """(base URL, served folder) with one short pairs run of each architecture (tests/helpers.py)."""
    root = tmp_path_factory.mktemp("pairs-site")
    data = write_cipher(root.parent / f"{root.name}.tsv", n=300)
    for arch in ("decoder", "encoder-decoder"):
        train_pairs(data, root / arch, arch, steps=20, cache_dir=root.parent / f"{root.name}-cache", eval_pairs=0)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        yield url, root


def test_write_becomes_a_translation_box_for_pairs_runs(browser, pairs_site, tmp_path):
    """Source in, translation out (greedy, as chargpt translate), without the source echoed; Look inside is offered
    for the decoder-only run only."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(pairs_site[0])
    page.wait_for_selector("body[data-ready='1']")
    for arch in ("encoder-decoder", "decoder"):
        page.select_option("#run", arch)
        assert page.text_content("#generate") == "Translate" and page.input_value("#temperature") == "0"
        assert "Sentence to translate" in page.inner_text("#view-write")
        write(page, "hgfe", length=10)
        want = chargpt.load(pairs_site[1] / arch, device="cpu").translate(["hgfe"], max_len=10)[0]
        assert sample_text(page, 0) == want and page.text_content(".sample[data-i='0'] .prompt") == ""
        assert page.text_content(".sample h3") == "translation"
        assert page.is_visible("#to-inside") == (arch == "decoder")
    page.screenshot(path=tmp_path / "translate.png", full_page=True)
    page.close()
    assert not errors, errors


# --- nothing stale: each view shows only what belongs to the run and the request on screen ---------------------
def open_page(browser, url):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    return page, errors


def test_a_refused_request_clears_the_previous_output(page, tmp_path):
    write(page, "To be", seed=1, length=30)
    assert page.locator("#outputs .sample").count() == 1
    write(page, "To bé")  # refused: é is not in the vocabulary
    assert "never saw" in page.inner_text("#write-status")
    assert page.locator("#outputs .sample").count() == 0  # the error alone, not above the last sample
    page.screenshot(path=tmp_path / "write-error.png", full_page=True)


def test_translation_box_translates_line_by_line_like_the_cli(browser, pairs_site, tmp_path):
    page, errors = open_page(browser, pairs_site[0])
    page.select_option("#run", "decoder")
    write(page, "hgfe\n\nabcd\n", length=10)  # blank lines stay blank, a final newline starts no line
    want = chargpt.load(pairs_site[1] / "decoder", device="cpu").translate(["hgfe", "abcd"], max_len=10)
    assert sample_text(page, 0) == f"{want[0]}\n\n{want[1]}"
    assert page.inner_text("#write-status").startswith("done · 3 lines")
    page.screenshot(path=tmp_path / "translate-lines.png", full_page=True)
    write(page, "hgfe\nhgzz", length=10)  # an unknown character on line 2: named, and marked where it is
    assert page.inner_text("#write-status").startswith("line 2: ")
    assert page.locator("#outputs .sample").count() == 0
    marked = page.locator("#prompt-marks .c")
    assert [marked.nth(i).text_content() for i in range(marked.count()) if "unknown" in
            marked.nth(i).get_attribute("class")] == ["z", "z"]
    assert page.locator("#prompt-marks .c.unknown").first.evaluate("s => [...s.parentNode.children].indexOf(s)") == 7
    page.close()
    assert not errors, errors


def test_another_run_starts_write_and_look_inside_empty(browser, pairs_site, tmp_path):
    page, errors = open_page(browser, pairs_site[0])
    page.select_option("#run", "decoder")
    write(page, "hgfe", length=10)
    assert page.locator("#outputs .sample").count() == 1
    page.select_option("#run", "encoder-decoder")
    assert page.locator("#outputs .sample").count() == 0 and page.inner_text("#write-status") == ""
    # Look inside: an analysis of the decoder run, then the encoder-decoder (refused): the refusal alone shows
    page.select_option("#run", "decoder")
    page.click(".tab[data-view='inside']")
    page.fill("#inside-text", "hgfe\tEFGH")
    page.click("#analyse")
    page.wait_for_selector("body[data-inside='done']")
    assert page.is_visible("#inside-result")
    page.select_option("#run", "encoder-decoder")
    assert not page.is_visible("#inside-result") and page.inner_text("#inside-status") == ""
    page.click("#analyse")
    page.wait_for_function("() => document.getElementById('inside-status').textContent.includes('decoder-only')")
    assert not page.is_visible("#inside-result")
    page.screenshot(path=tmp_path / "inside-refused.png", full_page=True)
    page.close()
    assert not errors, errors


def test_an_analysis_for_another_run_is_never_shown(browser, pairs_site):
    """A slow analysis of run A that returns after run B was picked is dropped."""
    page, errors = open_page(browser, pairs_site[0])
    page.select_option("#run", "decoder")
    page.click(".tab[data-view='inside']")
    page.fill("#inside-text", "hgfe\tEFGH")
    page.route("**/api/inside", lambda route: (page.wait_for_timeout(1500), route.continue_()))  # slow server
    page.click("#analyse")
    page.select_option("#run", "encoder-decoder")
    page.wait_for_timeout(3000)
    assert not page.is_visible("#inside-result") and "analysing" not in page.inner_text("#inside-status")
    page.close()
    assert not errors, errors


# --- the runs view ---------------------------------------------------------------------------------------------
def test_samples_while_training_appear_as_the_run_writes_them(page, site):
    path = site[1] / "samples.jsonl"
    try:
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#run-detail button")
        assert page.locator("#run-detail .sample.during").count() == 0
        with open(path, "a", encoding="utf-8") as f:  # the run, still training, writes a sample
            f.write(json.dumps({"step": 10, "prompt": "To ", "text": "be or"}) + "\n")
        page.wait_for_selector("#run-detail .sample.during")
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps({"step": 20, "prompt": "To ", "text": "be, or not"}) + "\n")
        page.wait_for_function("() => document.querySelectorAll('#run-detail .sample.during').length === 2")
        assert "Samples while training (2)" in page.inner_text("#run-detail")
    finally:
        path.unlink(missing_ok=True)


def swatch(page, name):
    row = page.locator("#runs-table tbody tr", has_text=name)
    return row.locator(".swatch").get_attribute("data-colour")


def test_run_colours_stay_with_their_runs_and_a_large_vocabulary_is_summarised(browser, site, tmp_path):
    root = tmp_path / "served"
    shutil.copytree(site[1], root / "m-run")
    # a Chinese run: 600 distinct characters, trained for a time budget
    corpus = tmp_path / "han.txt"
    corpus.write_text("".join(chr(0x4E00 + (i * 7) % 600) + ("\n" if i % 20 == 19 else "") for i in range(6000)),
                      encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / "z-han"), cache_dir=str(tmp_path / "cache"), max_time=0.5,
                  seed=1, log=lambda *a: None, **{**TINY_WEB_KW, "eval_interval": 10**6})
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page, errors = open_page(browser, url)
        page.click(".tab[data-view='runs']")
        page.wait_for_function("() => document.querySelectorAll('#runs-table tbody tr').length === 2")
        before = {name: swatch(page, name) for name in ("m-run", "z-han")}
        assert before["m-run"] != before["z-han"]
        shutil.copytree(site[1], root / "a-new")  # a new run, listed first
        page.wait_for_function("() => document.querySelectorAll('#runs-table tbody tr').length === 3")
        assert {name: swatch(page, name) for name in before} == before  # nobody was recoloured
        assert swatch(page, "a-new") not in before.values()

        page.locator("#runs-table button.link", has_text="z-han").click()
        page.wait_for_selector("#run-detail[data-run='z-han'] .vocab-box")
        summary = page.inner_text("#run-detail .vocab-box .hint")
        assert summary.startswith("vocabulary: 601 characters (600 Han, 1 whitespace)")
        assert not page.locator("#run-detail details.vocab-all").evaluate("d => d.open")
        shown = page.locator("#run-detail .vocab-box > .vocab").text_content()
        assert len(shown) < 130 and shown.endswith(" …")  # the first 120, not 600 characters
        page.click("#run-detail details.vocab-all summary")
        assert len(page.locator("#run-detail details.vocab-all .vocab").text_content()) == 601 + 1  # \n as "\\n"
        detail = page.inner_text("#run-detail")
        assert "no step limit (max_time decides)" in detail and "1000000000000" not in detail
        assert "0.00 MB" not in detail and " kB" in detail
        fonts = page.evaluate("() => getComputedStyle(document.querySelector('#run-detail .vocab')).fontFamily")
        assert "Noto Sans CJK SC" in fonts and "Microsoft YaHei" in fonts and "PingFang SC" in fonts
        assert "Noto Sans CJK SC" in page.evaluate("() => getComputedStyle(document.body).fontFamily")
        page.screenshot(path=tmp_path / "runs-han.png", full_page=True)
        page.close()
        assert not errors, errors


def test_runs_view_says_which_run_a_run_started_from(browser, tmp_path_factory):
    """A run trained with --init-from names its base (path, weights, step, corpus, val loss) and the characters it
    added; a run from scratch shows no such line."""
    root = tmp_path_factory.mktemp("lineage")
    base = train_tiny(root.parent / "lineage-base", steps=10)
    new = root.parent / "lineage-code.txt"
    new.write_text("".join(f"def f{i}(x): return [x * {i}]  # QZ!\n" for i in range(80)), encoding="utf-8")
    chargpt.train(data=str(new), out_dir=str(root / "ft"), init_from=str(base), max_iters=2, eval_interval=2,
                  log=lambda *a: None, **TINY_WEB_KW)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#run-detail .lineage")
        text = page.inner_text("#run-detail .lineage")
    assert text.startswith(f"started from {base.name}/best.safetensors (best weights, step 10 on ")  # no server path
    assert "characters added to its vocabulary" in text
    page.close()


def test_write_marks_the_text_a_sample_copied_with_its_source_line(browser, tmp_path_factory, tmp_path):
    """A run trained on one repeated character writes it back (greedy): its whole sample is copied, so it is shaded,
    and each shaded span names the line it comes from."""
    root = tmp_path_factory.mktemp("parrot")
    corpus = root.parent / f"{root.name}.txt"
    corpus.write_text("a" * 3000 + "\n", encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(root / "parrot"), cache_dir=str(root.parent / f"{root.name}-cache"),
                  max_iters=40, eval_interval=20, learning_rate=1e-2, warmup_iters=2, log=lambda *a: None,
                  **TINY_WEB_KW)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page, errors = open_page(browser, url)
        page.check("#novelty")
        assert page.get_attribute("#min-span", "placeholder") == "20"  # the run's default, from its alphabet
        with page.expect_request("**/api/novelty") as asked:
            write(page, "a", temperature=0, length=60)
        assert asked.value.post_data_json["min_span"] == 20  # the page sends it
        page.wait_for_selector("#outputs[data-novelty='done']")
        marks = page.locator(".sample[data-i='0'] .gen mark.copied")
        assert marks.count() == 1 and marks.first.text_content() == "a" * 60
        assert "copied from line 1 of the training text" in marks.first.get_attribute("title")
        assert sample_text(page, 0) == "a" * 60  # the text itself is unchanged
        assert page.inner_text(".sample[data-i='0'] .novelty").startswith("copied: 100% in spans of 20+")
        page.screenshot(path=tmp_path / "copied.png", full_page=True)
        page.fill("#min-span", "61")  # the person's own choice: longer than the sample, so nothing is copied
        write(page, "a", temperature=0, length=60)
        page.wait_for_selector("#outputs[data-novelty='done']")
        assert page.inner_text(".sample[data-i='0'] .novelty").startswith("copied: 0% in spans of 61+")
        assert page.locator("mark.copied").count() == 0
        page.uncheck("#novelty")
        write(page, "a", temperature=0, length=30)
        assert page.locator("mark.copied").count() == 0
        page.close()
        assert not errors, errors


RGB = """(sel) => [...document.querySelectorAll(sel)].map((s) => getComputedStyle(s).backgroundColor
  .match(/\\d+/g).slice(0, 3).map(Number))"""


def test_runs_view_scales_to_twenty_runs_of_twenty_samples(browser, site, tmp_path):
    """20 runs, each with 20 samples written while training: the page stays a few screens tall (the samples in a
    scrolling box, newest first), every run has its own colour, the x axis can be training time or the share of
    each run's budget, and the header names the run picked."""
    root = tmp_path / "served"
    text = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer\n" * 4
    for i in range(20):
        run = shutil.copytree(site[1], root / f"run-{i:02d}")
        for name in ("metrics.jsonl", "train_loss.jsonl"):  # each run its own curve, a little above the last
            rows = [json.loads(line) for line in (run / name).read_text().splitlines()]
            rows = [{k: v * (1 + 0.01 * i) if "loss" in k or k.endswith(("_bpc", "_bpb")) else v
                     for k, v in r.items()} for r in rows]
            (run / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "samples.jsonl").write_text("".join(json.dumps({"step": 10 * k, "prompt": "To ", "text": text})
                                                   + "\n" for k in range(20)), encoding="utf-8")
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page, errors = open_page(browser, url)
        page.select_option("#run", "run-07")
        assert page.inner_text("#run-facts").startswith("run-07 · corpus browser")  # the run, not only its corpus
        page.click(".tab[data-view='runs']")
        page.wait_for_function("() => document.querySelectorAll('#runs-table tbody tr').length === 20")
        page.wait_for_selector("#chart[data-curves='40']")  # train and val of each
        page.wait_for_selector("#run-detail[data-run='run-07'] .during-list")
        shown = page.locator("#run-detail .sample.during")
        assert shown.count() == 20 and shown.first.locator("h3").inner_text() == "step 190"  # newest first
        box = page.locator("#run-detail .during-scroll").bounding_box()
        assert box["height"] <= 430  # scrolls inside its box
        height = page.evaluate("() => document.documentElement.scrollHeight")
        assert height < 3500, height  # was 13,639 px with 19 samples
        colours = page.evaluate(RGB, "#runs-table .swatch")
        assert len({tuple(c) for c in colours}) == 20
        closest = min(sum((a - b) ** 2 for a, b in zip(c, d)) ** 0.5
                      for i, c in enumerate(colours) for d in colours[i + 1:])
        assert closest > 20, closest  # told apart, not 20 shades of one
        strokes = {p.get_attribute("stroke") for p in page.locator("#chart path.curve.val").all()}
        assert len(strokes) == 20
        page.screenshot(path=tmp_path / "runs-20.png", full_page=True)
        page.click("#run-detail .during-list summary")  # folds away
        assert not page.is_visible("#run-detail .during-scroll")

        page.check("input[name=xaxis][value=budget]")
        page.wait_for_function("() => document.querySelector('#chart').textContent.includes('share of the run')")
        last = page.evaluate("() => document.querySelector('#chart path.curve.val').getAttribute('d')"
                             ".split('L').pop().split(',')[0]")
        assert float(last) == pytest.approx(760 - 16, abs=0.2)  # its last evaluation ended its budget: 100%
        page.check("input[name=xaxis][value=time]")
        page.wait_for_function("() => document.querySelector('#chart').textContent.includes('training time (s)')")
        page.check("input[name=unit][value=bpb]")
        page.wait_for_function("() => document.querySelector('#chart').textContent.includes('bits per UTF-8 byte')")
        assert page.locator("#chart path.curve.val").count() == 20
        bpb = page.locator("#runs-table tbody tr").first.locator("td").nth(7).inner_text()
        assert float(bpb) == pytest.approx(float(page.locator("#runs-table tbody tr").first.locator("td").nth(6)
                                                  .inner_text()), abs=0.002)  # ASCII text: a byte per character
        page.screenshot(path=tmp_path / "runs-20-time-bpb.png", full_page=True)
        page.close()
        assert not errors, errors
