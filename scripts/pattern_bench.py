"""The cost of a pattern's mask (--regex, --json-schema: chargpt/sampling/grammar.py) per decoded character, at a
10,000-character vocabulary (the Tang poems' size), on a random model: plain decoding against the same decoding
under a pattern that never ends early, one sample and eight in a batch; and llguidance's own part (each row's mask
and its step) timed alone. Prints a Markdown table for benchmarks/RESULTS.md.

    python scripts/pattern_bench.py                   # about half a minute on 2 CPU cores
    python scripts/pattern_bench.py --plain-only      # only plain decoding: run it on two checkouts for an A/B
"""

import argparse
import json
import time

import torch

from chargpt.config import ModelConfig, SampleSettings
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.sampling.constraints import plan
from chargpt.sampling.engine import Generator

V = 10_000
STEPS = 200
PATTERNS = {"none": {}, "regex [^\\n]{200,400}": {"regex": "[^\\n]{200,400}"},
            "JSON schema (an array of strings)": {"json_schema": json.dumps({"type": "array", "items": {
                "type": "string"}, "minItems": 100})}}


def vocabulary():
    ascii_ = [chr(c) for c in range(32, 127)] + ["\n"]
    return Vocab(sorted(ascii_ + [chr(0x4E00 + i) for i in range(V - len(ascii_))]))


def per_char(gen, rows, **pattern):
    """Milliseconds per decoded step (all rows together), best of 3 after a warm-up, less the pattern's compiling
    and checking (timed alone: check_ms)."""
    best = float("inf")
    for k in range(4):
        t = time.perf_counter()
        gen.generate("", max_new_tokens=STEPS, num_samples=rows, temperature=1.0, seed=k, **pattern)
        if k:
            best = min(best, (time.perf_counter() - t - check_ms(gen, pattern) / 1e3) / STEPS * 1e3)
    return best


def check_ms(gen, pattern):
    """Milliseconds to make the settings and plan them against the vocabulary (the syntax check, compiling, the
    search for a complete text): once per call, before decoding."""
    if not pattern:
        return 0.0
    t = time.perf_counter()
    plan(SampleSettings(**pattern), gen.vocab, "\n")
    return (time.perf_counter() - t) * 1e3


def mask_alone(gen, rows, pattern):
    """Milliseconds per step of llguidance's part alone: every row's mask, then its step on an allowed id."""
    rules = plan(SampleSettings(**pattern), gen.vocab, "\n")
    matchers = rules.pattern.matchers(rows)
    t = time.perf_counter()
    for _ in range(STEPS):
        fits, _ = matchers.mask()
        ids = fits.float().argmax(dim=1).tolist()  # the first character allowed: the choice costs nothing here
        matchers.advance(ids)
    return (time.perf_counter() - t) / STEPS * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plain-only", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # the mask is one thread's work; so is decoding one small model's step, measured
    vocab = vocabulary()
    model = CharGPT(ModelConfig(vocab_size=V, block_size=256, n_layer=3, n_head=4, n_embd=160, dropout=0.0)).eval()
    gen = Generator(model, vocab, "cpu", threads=1)
    print(f"vocabulary {V:,} characters, model 3 x 160 (random weights), {STEPS} characters a sample, 1 thread\n")
    print("| pattern | rows | ms per step | over plain | llguidance's mask + step alone, ms | "
          "check before decoding, ms |")
    print("|---|---|---|---|---|---|")
    for rows in (1, 8):
        plain = per_char(gen, rows)
        print(f"| none | {rows} | {plain:.2f} | | | |")
        if args.plain_only:
            continue
        for name, pattern in list(PATTERNS.items())[1:]:
            held = per_char(gen, rows, **pattern)
            alone, check = mask_alone(gen, rows, pattern), check_ms(gen, pattern)
            print(f"| {name} | {rows} | {held:.2f} | {held / plain:.2f}x | {alone:.2f} | {check:.0f} |")


if __name__ == "__main__":
    main()
