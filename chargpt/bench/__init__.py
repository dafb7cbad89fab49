"""Benchmarks: training and decoding speed, as ratios measured in one process (shared machines are noisy), the
profile of a small training step, and learning at a fixed time budget.

    python -m chargpt.bench                      # all speed parts; prints Markdown tables
    python -m chargpt.bench --write              # ... and adds them to benchmarks/RESULTS.md, under this machine's kind
    python -m chargpt.bench --only decode --checkpoint RUN --data FILE   # one part; decoding with its cost in loss
    python -m chargpt.bench --nanogpt ~/nanoGPT --data data/tinyshakespeare.txt   # against nanoGPT's train.py
    python -m chargpt.bench --quick              # every part on a tiny shape in seconds: a smoke test, not numbers
    python -m chargpt.bench profile              # torch.profiler on the 4x128 ctx64 b12 training loop: top items
    python -m chargpt.bench quality --data data/tinyshakespeare.txt --max-time 120 [--candidates FILE]
    python -m chargpt.bench pairs --data data/tang_poems.txt --max-time 300   # decoder vs encoder-decoder
    python -m chargpt.bench novelty --chars 1000000 [--data FILE]   # the novelty index: build and scoring cost
    python -m chargpt.bench suggest --checkpoint RUN    # the playground's suggestions: latency of POST /api/suggest
    python -m chargpt.bench.serve                # the playground's stream against the library and sample.py

The modules: speed.py (peak, train, compile, decode, vocab; profile), nanogpt.py (against nanoGPT's train.py),
quality.py (a fixed time budget per candidate setting), pairs.py (decoder-only against encoder-decoder on
couplets), novelty.py (the novelty index, its own flags: python -m chargpt.bench novelty --help), suggest.py (the
playground's suggestions as a person types, its own flags too), serve.py (the web playground's stream); this file is
the command and the results file.
"""

import argparse
import sys
import time
from pathlib import Path

RESULTS = Path("benchmarks/RESULTS.md")


def write_results(report, kind, title, path=RESULTS):
    """Add the report to RESULTS.md at the end of this machine kind's section (made if missing): numbers are
    compared within one kind of machine."""
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmark results\n"
    heading = f"## Machine kind: {kind}"
    entry = f"\n### {time.strftime('%Y-%m-%d %H:%M')} — {title}\n\n{report}\n"
    if heading not in text:
        text = text.rstrip("\n") + f"\n\n{heading}\n" + entry
    else:
        start = text.index(heading) + len(heading)
        end = text.find("\n## ", start)
        end = len(text) if end < 0 else end
        text = text[:end].rstrip("\n") + "\n" + entry + text[end:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def main(argv=None, prog=None):
    given = sys.argv[1:] if argv is None else list(argv)
    if given[:1] == ["novelty"]:  # its own flags (chargpt/bench/novelty.py)
        from chargpt.bench.novelty import main as novelty_main
        return novelty_main(given[1:], f"{prog or 'python -m chargpt.bench'} novelty")
    if given[:1] == ["suggest"]:  # its own flags (chargpt/bench/suggest.py)
        from chargpt.bench.suggest import main as suggest_main
        return suggest_main(given[1:], f"{prog or 'python -m chargpt.bench'} suggest", write=write_results)
    from chargpt.bench.speed import PARTS, machine_kind, profile, speed
    p = argparse.ArgumentParser(prog=prog or "python -m chargpt.bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", nargs="?", default="speed", choices=["speed", "profile", "quality", "pairs"])
    p.add_argument("--only", nargs="*", default=list(PARTS), choices=PARTS,
                   help="parts of the speed benchmark: " + " ".join(PARTS))
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--batch", type=int, default=None, help="speed: batch size of every training shape (a GPU needs "
                   "64 or more to be busy) [default: each shape's own]")
    p.add_argument("--checkpoint", default=None, help="decode: measure this run's model, and its val loss per "
                   "precision (on --data, or its own validation split)")
    p.add_argument("--nanogpt", default=None, metavar="PATH", help="speed: also time nanoGPT's train.py from this "
                   "checkout against ours, same recipe, same machine, steady state (on --data)")
    p.add_argument("--steps", type=int, default=200, help="profile, nanogpt: training steps to time")
    p.add_argument("--top", type=int, default=15, help="profile: operators to list")
    p.add_argument("--data", default=None, help="corpus for quality, profile, nanogpt and decode's val loss "
                   "[default: the built-in corpus; for decode, the run's validation split]")
    p.add_argument("--max-time", type=float, default=120.0, help="seconds of training (pairs: for each model)")
    p.add_argument("--eval-pairs", type=int, default=1000, help="pairs: validation pairs scored (val loss) and "
                   "translated (chrF, exact match)")
    p.add_argument("--out-dir", default=None)
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                   help="quality, profile: override a training flag, e.g. --set n-embd=192 (repeatable)")
    p.add_argument("--candidates", default=None, metavar="FILE", help="quality: one run per line of FILE, each "
                   "line NAME=VALUE pairs over the defaults (# starts a comment)")
    p.add_argument("--init-from", default=None, metavar="BASE_DATA", help="quality: train a base --base-time seconds "
                   "on BASE_DATA, then --max-time seconds on --data from the base and from scratch; compare val loss")
    p.add_argument("--base-time", type=float, default=120.0, help="quality --init-from: seconds of the base's training")
    p.add_argument("--write", action="store_true", help="add the results to benchmarks/RESULTS.md, in this "
                   "machine kind's section")
    p.add_argument("--quick", action="store_true", help="speed, profile: every part on a tiny shape in seconds, to "
                   "check that the benchmark runs (its numbers mean nothing)")
    args = p.parse_args(argv)
    from chargpt.runtime import configure_threads, pick_device
    device = pick_device(args.device)
    if device.type == "cpu":
        configure_threads(args.threads)
    if args.mode == "speed":
        report = speed(set(args.only), device, args)
    elif args.mode == "profile":
        report = profile(args, device)
    elif args.mode == "pairs":
        from chargpt.bench.pairs import pairs
        report = pairs(args)
    elif args.init_from:
        from chargpt.bench.quality import init_from_quality
        from chargpt.bench.speed import parse_sets
        report = init_from_quality(args.init_from, args.data, args.base_time, args.max_time, args.device,
                                   parse_sets(args.set), args.out_dir)
    else:
        from chargpt.bench.quality import quality
        report = quality(args)
    print(report)
    if args.write:
        shown = " ".join(argv if argv is not None else sys.argv[1:])
        write_results(report, machine_kind(device), f"python -m chargpt.bench {shown}".strip())
