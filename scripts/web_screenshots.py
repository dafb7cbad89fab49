"""Screenshots of the web playground for the README, from real runs.

    python train.py && python scripts/web_screenshots.py     # -> docs/web-write.png, web-inside.png, web-runs.png
    python scripts/web_screenshots.py --checkpoints runs/ --out /tmp/shots

Starts the server on a free localhost port, drives headless Chromium (Debian's `chromium`, through Playwright)
through the three views on the newest run, and saves one picture of each. Needs the web and test extras.
"""

import argparse
import shutil
from pathlib import Path

from playwright.sync_api import sync_playwright

from chargpt.web.server import create_app, running


def shoot(url, out, prompt, run=None):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True,
                                    args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.set_default_timeout(120_000)
        page.goto(url)
        page.wait_for_selector("body[data-ready='1']")
        if run:
            page.select_option("#run", run)
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
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with running(create_app(args.checkpoints)) as url:
        shoot(url, out, args.prompt, args.run)
    print(f"wrote {out}/web-write.png, web-inside.png, web-runs.png")


if __name__ == "__main__":
    main()
