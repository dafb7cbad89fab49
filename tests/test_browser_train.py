"""New run in a real browser (headless Chromium via Playwright, as tests/test_browser.py): a person uploads a text
from disk, starts a run with a short budget, watches its curve and a sample update, stops it, resumes it, and
writes with the finished run in Write. Two child trainings (`python -m chargpt train`), each a tiny model. A folder of
texts offers its labels choices, and a single text with labels is refused in one line, starting nothing."""

import contextlib
import os

import pytest
from helpers import CHROMIUM, CORPUS_TEXT, TRAIN_ARGS, launch_chromium, need

need("starlette")
need("uvicorn")
sync_api = need("playwright.sync_api")
from chargpt.web import server as serve  # noqa: E402
from chargpt.web.body import RequestError  # noqa: E402

if not CHROMIUM and os.environ.get("CI") != "true":
    pytest.skip("Chromium is not installed (apt-get install chromium)", allow_module_level=True)
WAIT_MS = 90_000  # generous: each child imports torch on a small, shared machine


@contextlib.contextmanager
def served_page(tmp_path, data_dir=None):
    (tmp_path / "checkpoints").mkdir()
    app = serve.create_app(tmp_path / "checkpoints", device="cpu", train_args=TRAIN_ARGS, data_dir=data_dir)
    with serve.running(app) as url, sync_api.sync_playwright() as p:
        browser = launch_chromium(p)
        page = browser.new_page(viewport={"width": 1280, "height": 1000})
        page.set_default_timeout(WAIT_MS)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" and "400" not in m.text else None)
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        yield page
        browser.close()
        assert not errors, errors
    if (app.state.trainings.record or {}).get("state") == "running":  # a failed test's child: saved and ended
        with contextlib.suppress(RequestError):  # unless it ended meanwhile
            app.state.trainings.stop()


@pytest.fixture
def page(tmp_path, monkeypatch):
    monkeypatch.setenv("CHARGPT_CACHE_DIR", str(tmp_path / "cache"))
    with served_page(tmp_path) as page:
        yield page


def newest_sample_step(page):
    return int(page.text_content("#train-samples .sample h3").split()[-1])


def test_a_run_uploaded_started_watched_stopped_resumed_and_written_with(page, tmp_path):
    page.click(".tab[data-view='train']")
    page.set_input_files("#train-file", files=[{"name": "verses.txt", "mimeType": "text/plain",
                                                 "buffer": CORPUS_TEXT.encode("utf-8")}])
    page.wait_for_function("() => document.getElementById('train-status').textContent.startsWith('uploaded')")
    assert page.input_value("#train-corpus") == "upload:verses.txt"
    page.fill("#train-time", "60")
    page.fill("#train-layers", "1")
    page.fill("#train-width", "16")
    page.fill("#train-sample-every", "20")
    page.click("#train-start")
    page.wait_for_selector("body[data-training='running']")
    # live: the start-up, the curve (the Runs view's chart), and a sample that is followed by a newer one
    page.wait_for_function("() => Number(document.getElementById('train-chart').dataset.curves) > 0")
    page.wait_for_selector("#train-samples .sample")
    first = newest_sample_step(page)
    page.wait_for_function(f"() => Number(document.querySelector('#train-samples .sample h3').textContent.split(' ')"
                           f".pop()) > {first}")
    assert "auto: 1 x 16" in page.text_content("#train-startup")  # what --preset auto chose around the size given
    assert "characters/s" in page.text_content("#train-facts") and "left of 60 s" in page.text_content("#train-facts")
    page.screenshot(path=tmp_path / "train-running.png")

    page.click("#train-stop")
    page.wait_for_selector("body[data-training='stopped']")
    assert "Resume trains it on" in page.inner_text("#train-status")
    steps_at_stop = int(page.text_content("#train-facts").split("step ")[1].split()[0].replace(",", ""))
    page.fill("#train-time", "2")
    page.click("#train-resume")
    page.wait_for_selector("body[data-training='running']")
    page.wait_for_selector("body[data-training='finished']")
    assert int(page.text_content("#train-facts").split("step ")[1].split()[0].replace(",", "")) >= steps_at_stop

    page.click("#train-write")  # the finished run, at once in Write
    page.wait_for_selector("body[data-view='write']")
    assert page.input_value("#run") == "verses"
    page.fill("#prompt", "To be")
    page.fill("#length", "30")
    page.fill("#seed", "3")
    page.click("#generate")
    page.wait_for_selector("body[data-state='done']")
    assert len(page.text_content(".sample[data-i='0'] .gen")) == 30


def test_a_folder_of_texts_offers_its_labels_and_a_single_text_says_why_it_has_none(tmp_path):
    data = tmp_path / "data"
    for label in ("a", "b"):
        (data / "authors" / label).mkdir(parents=True)
        (data / "authors" / label / "1.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    (data / "one.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    with served_page(tmp_path, data_dir=data) as page:
        page.click(".tab[data-view='train']")
        assert "authors/ (data folder, a folder of 2 texts" in page.inner_text("#train-corpus")
        page.select_option("#train-corpus", "data:authors")
        assert page.eval_on_selector_all("#train-labels option", "os => os.map((o) => o.value)") == [
            "none", "folders", "files"]
        page.select_option("#train-corpus", "data:one.txt")
        page.select_option("#train-labels", "folders")
        page.fill("#train-time", "5")
        page.click("#train-start")
        page.wait_for_function("() => document.getElementById('train-status').textContent.includes('Labels')")
        assert page.inner_text("#train-status") == (
            "labels 'folders' need a folder of texts, and one.txt is one text; choose a folder from the data folder "
            "for Text, or set Labels to none")
        assert page.get_attribute("body", "data-training") == "none"  # nothing was started
