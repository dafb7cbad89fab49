"""Write's suggestions in a real browser (headless Chromium through Playwright, as tests/test_browser.py): typing in
the prompt box shows the library's word completions and next characters as chips, asked once per pause in typing;
Tab adds the first, a click adds the one clicked, and the box "Suggest as I type" switches them off. The run is a tiny
model trained on lines of six words, so its completions are those words. Skipped only where Chromium or Playwright
is missing outside CI."""

import json

import pytest
from helpers import CHROMIUM, TOY_WORDS, launch_chromium, need, train_toy_words

import chargpt

need("starlette")
need("uvicorn")
sync_api = need("playwright.sync_api")
from chargpt.web import server as serve  # noqa: E402

if not CHROMIUM and __import__("os").environ.get("CI") != "true":
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
WAIT_MS = 60_000
WORDS = TOY_WORDS
CHIPS = "() => Array.from(document.querySelectorAll('#suggestions .chip.%s')).map((b) => b.dataset.add)"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """(base URL, run directory) of a server with the six-word run."""
    root = tmp_path_factory.mktemp("suggest")
    train_toy_words(root)
    with serve.running(serve.create_app(root / "checkpoints", device="cpu")) as url:
        yield url, root / "checkpoints/toy"


@pytest.fixture
def page(site):
    with sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(WAIT_MS)
        errors, asked = [], []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("request", lambda r: asked.append(json.loads(r.post_data)) if r.url.endswith("/api/suggest") else None)
        page.goto(site[0])
        page.wait_for_selector("body[data-ready='1']")
        page.asked = asked
        yield page
        browser.close()
        assert not errors, errors


def typed(page, text):
    """Set the prompt to `text` as a burst of keystrokes, each its own input event, in one tick of the page."""
    page.evaluate("""(text) => {
      const box = document.getElementById('prompt');
      for (let n = 1; n <= text.length; n++) {
        box.value = text.slice(0, n);
        box.setSelectionRange(n, n);
        box.dispatchEvent(new Event('input', {bubbles: true}));
      }
      box.focus();
    }""", text)


def suggested_for(page, text):
    page.wait_for_function("(t) => document.getElementById('prompt').value === t && "
                           "document.getElementById('suggestions').dataset.for === t", arg=text)
    return page.evaluate(CHIPS % "word"), page.evaluate(CHIPS % "char")


def test_typing_shows_the_librarys_suggestions_and_tab_or_a_click_adds_one(page, site, tmp_path):
    gen = chargpt.load(site[1], device="cpu")
    typed(page, "dog s")
    words, chars = suggested_for(page, "dog s")
    want = gen.suggest("dog s", k=5, words=3)
    assert words == [w.text for w in want.words] and words[0] == "at"
    assert chars == [c for c, _ in want.chars]
    assert len(page.asked) == 1 and page.asked[0]["text"] == "dog s"  # five keystrokes, one pause: one request
    label = page.text_content("#suggestions .chip.first")
    assert label.startswith("sat") and label.endswith(f"{round(want.words[0].p * 100)}%")
    page.screenshot(path=str(tmp_path / "suggest.png"))

    page.keyboard.press("Tab")  # the first chip, the likeliest word
    assert page.input_value("#prompt") == "dog sat"
    assert page.evaluate("document.activeElement.id") == "prompt"  # Tab stayed in the box
    suggested_for(page, "dog sat")
    page.click("#suggestions .chip.char >> nth=0")  # after a whole word: a space, the likeliest next character
    assert page.input_value("#prompt") == "dog sat "
    words, _ = suggested_for(page, "dog sat ")
    assert set(words) <= set(WORDS) and len(words) == 3


def test_a_reply_to_an_older_text_is_never_shown_and_the_box_can_switch_it_off(page, site):
    gen = chargpt.load(site[1], device="cpu")
    page.evaluate("""() => { window.shownFor = [];
      new MutationObserver(() => { const f = document.getElementById('suggestions').dataset.for;
                                   if (f !== undefined) window.shownFor.push(f); })
        .observe(document.getElementById('suggestions'), {attributes: true}); }""")
    held = []
    # the first request is held until the text has changed; later ones go straight through
    page.route("**/api/suggest", lambda route: route.continue_() if held else held.append(route))
    typed(page, "ran m")
    while not held:
        page.wait_for_timeout(20)
    typed(page, "cat l")
    page.wait_for_timeout(300)  # past the pause: the newer text waits for the reply in flight (one at a time)
    assert len(held) == 1 and len(page.asked) == 1
    held[0].continue_()
    assert suggested_for(page, "cat l")[0] == [w.text for w in gen.suggest("cat l", words=3).words]
    assert page.evaluate("window.shownFor") == ["cat l"]  # the reply for "ran m" came, and was dropped
    assert [a["text"] for a in page.asked] == ["ran m", "cat l"]

    page.uncheck("#suggest")
    assert page.is_hidden("#suggestions")
    typed(page, "cat d")
    page.wait_for_timeout(400)  # past the pause: nothing is asked with suggestions off
    assert len(page.asked) == 2 and page.is_hidden("#suggestions")


def test_tab_before_the_chips_come_adds_the_first_of_them_when_they_come(page):
    typed(page, "cat ")
    suggested_for(page, "cat ")  # chips on screen, then the text changes: they are for an older text now
    held = []
    page.route("**/api/suggest", lambda route: route.continue_() if held else held.append(route))
    typed(page, "cat log d")
    while not held:
        page.wait_for_timeout(20)
    page.keyboard.press("Tab")  # waits for the chips of "cat log d" instead of leaving the box
    assert page.input_value("#prompt") == "cat log d" and page.evaluate("document.activeElement.id") == "prompt"
    held[0].continue_()
    page.wait_for_function("() => document.getElementById('prompt').value === 'cat log dog'")
