"""Benchmark: the exported web page (chargpt export --format web) writing in headless Chromium.

    python -m chargpt.bench.webpage                  # the default CPU model and 6 x 384 (65 and 5,000 characters)
    python -m chargpt.bench.webpage --chars 300 --repeats 3
    python -m chargpt.bench.webpage --quick          # tiny shapes, one run each: a smoke test, not numbers

For each shape (random weights: speed does not depend on what a model learned) a checkpoint is saved and exported
as float32 and as int8 pages, each checked by the export itself (its decoder under node against chargpt's logits).
Each page is opened from file:// in Debian's Chromium through Playwright, and measured:
  file       the page's size
  ready      from navigation to the model loaded (the HTML parsed, the base64 weights decoded)
  first      from the call to chargpt.stream to its first character (the prompt's prefill and one step)
  chars/s    characters written over the whole call, --chars of them at temperature 0.8, seed 1
Each figure is the median of --repeats runs in one page. Prints a Markdown table. Not a timed test: run it on a quiet
machine, and compare figures from one run of this command only. Needs playwright (pip install -e ".[test]") and
Chromium (apt-get install chromium).
"""

import argparse
import os
import shutil
import statistics
import tempfile
from pathlib import Path

import torch

from chargpt.config import ModelConfig
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import save_model
from chargpt.tools.webpage import export_web

# (label, n_layer, n_embd, n_head, block_size, vocabulary size)
SHAPES = [("default CPU (3 x 160)", 3, 160, 4, 128, 65), ("6 x 384", 6, 384, 6, 256, 65),
          ("6 x 384, 5,000 characters", 6, 384, 6, 256, 5000)]
QUICK = [("2 x 32", 2, 32, 2, 32, 65), ("2 x 32, 500 characters", 2, 32, 2, 32, 500)]
PROMPT = "The "

MEASURE = """async ([prompt, n]) => {
    const t0 = performance.now();
    let first = null, count = 0;
    await chargpt.stream(prompt, {maxNewTokens: n, temperature: 0.8, seed: 1}, (piece) => {
        if (first === null) first = performance.now() - t0;
        count += [...piece].length;
    });
    return {first, count, seconds: (performance.now() - t0) / 1000};
}"""


SHAKESPEARE = "\n !$&',-.3:;?ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"  # tinyshakespeare's 65


def alphabet(size):
    """`size` characters: tinyshakespeare's, then CJK ideographs (as a Chinese corpus's)."""
    return Vocab(sorted((SHAKESPEARE + "".join(chr(0x4E00 + i) for i in range(size)))[:size]))


def checkpoint(folder, label, n_layer, n_embd, n_head, block_size, vocab_size):
    vocab = alphabet(vocab_size)
    cfg = ModelConfig(vocab_size=vocab_size, n_layer=n_layer, n_embd=n_embd, n_head=n_head, block_size=block_size,
                      dropout=0.0).validate()
    torch.manual_seed(0)
    path = folder / f"{n_layer}x{n_embd}-{vocab_size}.safetensors"
    save_model(path, CharGPT(cfg), vocab, None)
    return path


def measure(browser, page_path, chars, repeats):
    page = browser.new_page()
    page.set_default_timeout(600_000)
    ready = []
    for _ in range(repeats):
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-ready='1']")
        ready.append(page.evaluate("performance.now()") / 1000)  # since navigation began
    runs = [page.evaluate(MEASURE, [PROMPT, chars]) for _ in range(repeats)]
    page.close()
    return {"ready": statistics.median(ready), "first": statistics.median(r["first"] for r in runs),
            "rate": statistics.median(r["count"] / r["seconds"] for r in runs)}


def launch(playwright):
    chromium = os.environ.get("CHARGPT_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        raise ChargptError("Chromium is not installed; apt-get install chromium (or set CHARGPT_CHROMIUM)")
    return playwright.chromium.launch(executable_path=chromium, headless=True,
                                      args=["--no-sandbox", "--disable-dev-shm-usage"])


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m chargpt.bench.webpage", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chars", type=int, default=300, help="characters each measured call writes")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny shapes, one run each: checks that it works")
    args = p.parse_args(argv)
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        raise SystemExit('this benchmark needs playwright; pip install -e ".[test]"') from None
    shapes, repeats = (QUICK, 1) if args.quick else (SHAPES, args.repeats)
    rows = ["| model | parameters | weights | file | ready | first character | chars/s |",
            "|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as playwright:
        browser = launch(playwright)
        for shape in shapes:
            path = checkpoint(Path(tmp), *shape)
            params = sum(t.numel() for t in CharGPT(ModelConfig(vocab_size=shape[5], n_layer=shape[1],
                                                                n_embd=shape[2], n_head=shape[3],
                                                                block_size=shape[4])).parameters())
            for weights in ("float32", "int8"):
                page = export_web(path, Path(tmp) / f"{path.stem}-{weights}.html", weights=weights,
                                  log=lambda line: print(line, flush=True))
                m = measure(browser, page, args.chars, repeats)
                rows.append(f"| {shape[0]} | {params / 1e6:.2f}M | {weights} | {page.stat().st_size / 1e6:.1f} MB | "
                            f"{m['ready']:.2f} s | {m['first']:.0f} ms | {m['rate']:.0f} |")
        browser.close()
    print("\n" + "\n".join(rows))


if __name__ == "__main__":
    main()
