"""Screenshots of the web playground for the README, from real runs.

    python train.py && python scripts/web_screenshots.py     # -> docs/web-write.png, web-inside.png, web-runs.png,
                                                             #    web-suggest.png
    python scripts/web_screenshots.py --checkpoints runs/ --out /tmp/shots
    python scripts/web_screenshots.py --only suggest         # -> docs/web-suggest.png alone

Starts the server on a free localhost port, drives headless Chromium (Debian's `chromium`, through Playwright)
through the three views on the newest run, and saves one picture of each, and one of Write's suggestions as a
prompt is typed (web-suggest.png). Needs the web and test extras.
"""

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

from chargpt.web.server import create_app, running

SHOTS = ("write", "suggest")  # --only: the three views together, or the suggestions alone
SUGGEST_PROMPT = "Return a new list of the ite"  # the built-in corpus: a word to finish, with a few likely endings


def open_page(p, url, run):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    browser = p.chromium.launch(executable_path=chromium, headless=True,
                                args=["--no-sandbox", "--disable-dev-shm-usage"])
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']")
    if run:
        page.select_option("#run", run)
    return browser, page


def shoot_suggest(url, out, prompt, run=None):
    """Write's suggestions: the prompt typed key by key, the picture taken once the chips for all of it are shown
    (the page down to the chips)."""
    with sync_playwright() as p:
        browser, page = open_page(p, url, run)
        page.click("#prompt")
        page.keyboard.type(prompt, delay=30)
        page.wait_for_function("(t) => document.getElementById('suggestions').dataset.for === t", arg=prompt)
        box = page.locator("#suggestions").bounding_box()
        page.screenshot(path=out / "web-suggest.png", clip={"x": 0, "y": 0, "width": 1280,
                                                            "height": box["y"] + box["height"] + 6})
        browser.close()


def shoot(url, out, prompt, run=None):
    with sync_playwright() as p:
        browser, page = open_page(p, url, run)
        page.fill("#prompt", prompt)
        page.fill("#seed", "1")
        page.fill("#length", "600")
        page.fill("#samples", "2")
        page.click("#generate")
        page.wait_for_selector("body[data-state='done']")
        page.screenshot(path=out / "web-write.png")

        page.fill("#samples", "1")
        page.fill("#length", "120")
        page.click("#generate")
        page.wait_for_selector("body[data-state='done']")
        page.click("#to-inside")
        page.wait_for_selector("body[data-inside='done']")
        page.locator("#heads canvas").nth(page.locator("#heads canvas").count() - 1).click()  # the last layer's head
        chars = page.locator("#surprise .c")
        chars.nth(chars.count() - 12).click()  # pin a character: its row in the map, its expectations
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=out / "web-inside.png")

        page.click(".tab[data-view='runs']")
        page.wait_for_selector("#chart[data-curves]:not([data-curves='0'])")
        page.wait_for_selector("#run-detail h2")
        page.click("#run-detail button")
        page.wait_for_selector("#run-detail button:enabled")
        page.evaluate("() => window.scrollTo(0, 0)")
        page.screenshot(path=out / "web-runs.png")
        browser.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoints", default="checkpoints")
    p.add_argument("--run", default=None, help="the run to write with [default: the newest]")
    p.add_argument("--out", default="docs")
    p.add_argument("--prompt", default="The ")
    p.add_argument("--only", choices=SHOTS, default=None, help="write: the three views; suggest: web-suggest.png "
                                                                "[default: both]")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with running(create_app(args.checkpoints)) as url:
        if args.only in (None, "write"):
            shoot(url, out, args.prompt, args.run)
            print(f"wrote {out}/web-write.png, web-inside.png, web-runs.png")
        if args.only in (None, "suggest"):
            shoot_suggest(url, out, SUGGEST_PROMPT, args.run)
            print(f"wrote {out}/web-suggest.png")


if __name__ == "__main__":
    main()
