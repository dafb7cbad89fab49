"""The playground in a real browser: headless Chromium (Debian's `chromium`, driven by Playwright) against a
server on a free localhost port with a tiny run trained here. It writes with a fixed seed and checks the text
against the library, stops a generation, shows unknown characters, draws the inside view (surprise shading,
a causal attention map), the runs view (curves that follow a run still training) and the copied text of a sample
(chargpt.novelty) shaded with its source line. Each view is saved as a
screenshot under the test's tmp dir. Skipped only where Chromium or Playwright is missing outside CI."""

import json
import os
import shutil

import pytest
import webutil
from webutil import need, train_tiny

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
    assert page.locator("#runs-table tbody tr").count() == 1
    page.screenshot(path=tmp_path / "runs.png", full_page=True)
    page.check("input[name=unit][value=nats]")
    assert page.locator("#chart path.curve").count() == 2
    # training goes on: a new evaluation appears without reloading the page
    with open(site[1] / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 40, "train_loss": 2.9, "val_loss": 3.0, "train_bpc": 4.18, "val_bpc": 4.33}) + "\n")
    points = "() => document.querySelector('#chart path.curve.val').getAttribute('d').split('L').length"
    page.wait_for_function(f"{points} === 5")
    # and its sample: what training prints at the end, from the same seed
    page.click("#run-detail button")
    page.wait_for_function("() => document.querySelector('#run-detail pre').textContent.length === 300")
    expected = chargpt.load(site[1], device="cpu").generate("", max_new_tokens=300, temperature=0.8, seed=1337)[0]
    assert page.text_content("#run-detail pre") == expected


def test_runs_view_lists_the_samples_written_while_training(page, site):
    rows = [{"step": 10, "prompt": "To ", "text": "bee <b>not</b>"}, {"step": 20, "prompt": "To ", "text": "be, or"}]
    path = site[1] / "samples.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    try:
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#run-detail .sample.during")
        shown = page.locator("#run-detail .sample.during")
        assert shown.count() == 2 and "Samples while training (2)" in page.inner_text("#run-detail")
        assert [shown.nth(i).locator("h3").inner_text() for i in range(2)] == ["step 10", "step 20"]
        assert shown.nth(0).locator("pre").text_content() == "To bee <b>not</b>"  # text, never markup
        assert shown.nth(0).locator(".prompt").text_content() == "To "
    finally:
        path.unlink()


@pytest.fixture(scope="module")
def pairs_site(tmp_path_factory):
    """(base URL, served folder) with one short pairs run of each architecture (tests/pairsutil.py)."""
    from pairsutil import train_pairs, write_cipher
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


def test_runs_view_says_which_run_a_run_started_from(browser, tmp_path_factory):
    """A run trained with --init-from names its base (path, weights, step, corpus, val loss) and the characters it
    added; a run from scratch shows no such line."""
    root = tmp_path_factory.mktemp("lineage")
    base = train_tiny(root.parent / "lineage-base", steps=10)
    new = root.parent / "lineage-code.txt"
    new.write_text("".join(f"def f{i}(x): return [x * {i}]  # QZ!\n" for i in range(80)), encoding="utf-8")
    chargpt.train(data=str(new), out_dir=str(root / "ft"), init_from=str(base), max_iters=2, eval_interval=2,
                  log=lambda *a: None, **webutil.TINY)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(WAIT_MS)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#run-detail .lineage")
        text = page.inner_text("#run-detail .lineage")
    assert text.startswith(f"started from {(base / 'best.safetensors').resolve()} (best weights, step 10 on ")
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
                  **webutil.TINY)
    with serve.running(serve.create_app(root, device="cpu")) as url:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(WAIT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        page.check("#novelty")
        write(page, "a", temperature=0, length=60)
        page.wait_for_selector("#outputs[data-novelty='done']")
        marks = page.locator(".sample[data-i='0'] .gen mark.copied")
        assert marks.count() == 1 and marks.first.text_content() == "a" * 60
        assert "copied from line 1 of the training text" in marks.first.get_attribute("title")
        assert sample_text(page, 0) == "a" * 60  # the text itself is unchanged
        assert page.inner_text(".sample[data-i='0'] .novelty").startswith("copied: 100% in spans of 20+")
        page.screenshot(path=tmp_path / "copied.png", full_page=True)
        page.uncheck("#novelty")
        write(page, "a", temperature=0, length=30)
        assert page.locator("mark.copied").count() == 0
        page.close()
        assert not errors, errors
