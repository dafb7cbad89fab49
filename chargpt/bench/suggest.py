"""Benchmark: how fast the playground's suggestions answer (POST /api/suggest) as a person types.

    python -m chargpt.bench suggest --checkpoint checkpoints/pydoc-topics            # 50 requests of varied text
    python -m chargpt.bench suggest --checkpoint checkpoints/pydoc-topics --write    # ... added to RESULTS.md

Starts `python -m chargpt.serve` on the run's folder in another process (as bench.serve does), loads the model with a
few requests, then sends --requests texts one after another over one connection, as the page does (one request in
flight): prefixes of a paragraph of English cut at points spread through it, so that some end inside a word and some
after a space, and they run from a few characters to past the model's window. Reports the median and 95th
percentile of the round trip (what the page waits for) and of the server's own time for the suggestions (the reply's
`ms`). Not a timed test: measure on a quiet machine.
"""

import argparse
import http.client
import json
import math
import statistics
import time
from pathlib import Path
from urllib.parse import urlsplit

import torch

from chargpt.bench.serve import start_server
from chargpt.bench.speed import machine, machine_kind
from chargpt.runtime import configure_threads, pick_device

PARAGRAPH = (
    "Return a new list containing all items from the iterable in ascending order. A custom key function can be "
    "supplied to customize the sort order, and the reverse flag can be set to request the result in descending "
    "order. The built-in functions are always available; the modules of the standard library must be imported "
    "first. If the argument is a string, the value of the expression is converted to an integer, and an exception "
    "is raised when the string does not represent a number. Dictionaries map keys to values: a key may be any "
    "immutable object, and the method keys returns a view of them. The class statement defines a new type, whose "
    "instances have the attributes and methods that the class body gives them.")
K, WORDS = 5, 3  # what the page asks for


def texts(n):
    """n prefixes of PARAGRAPH, cut at points spread through it (some inside a word, some after a space)."""
    return [PARAGRAPH[:max(1, (i + 1) * len(PARAGRAPH) // n - (i % 2) * 3)] for i in range(n)]


def measure(url, run, n):
    """-> [(round trip s, the server's ms)] for n requests, after three that load and warm the model."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)

    def ask(text):
        body = json.dumps({"run": run, "text": text, "k": K, "words": WORDS, "unknown": "replace"})
        start = time.perf_counter()
        conn.request("POST", "/api/suggest", body, {"Content-Type": "application/json"})
        response = conn.getresponse()
        reply = json.loads(response.read())
        if response.status != 200:
            raise SystemExit(f"the server refused the benchmark request: {reply.get('error', reply)!s:.200}")
        return time.perf_counter() - start, reply["ms"]
    for text in ("The", "Return a new l", PARAGRAPH):
        ask(text)
    out = [ask(text) for text in texts(n)]
    conn.close()
    return out


def percentile(values, q):
    """The q-th percentile (0-100) of values, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q / 100 * len(ordered)))) - 1]


def report(results, run, device, n):
    trips = [t * 1000 for t, _ in results]
    server = [ms for _, ms in results]
    lines = [f"{machine()}; device {device}; checkpoint {run}; {n} requests of k={K} next characters and {WORDS} "
             f"completions, texts of 1 to {len(PARAGRAPH)} characters, one at a time over one connection", "",
             "| | median | 95th percentile | slowest |", "|---|---|---|---|"]
    for name, values in (("round trip (what the page waits for)", trips), ("the server's suggestions (`ms`)", server)):
        lines.append(f"| {name} | {statistics.median(values):.1f} ms | {percentile(values, 95):.1f} ms | "
                     f"{max(values):.1f} ms |")
    return "\n".join(lines)


def main(argv=None, prog=None, write=None):
    """write: chargpt.bench.write_results, handed in by the command (this module is below it)."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="a run directory (its folder is served)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=50, help="texts sent, after three that load the model")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch in the server [default: one per "
                                                            "core]")
    p.add_argument("--write", action="store_true", help="add the results to benchmarks/RESULTS.md, in this machine "
                                                        "kind's section")
    args = p.parse_args(argv)
    if not 1 <= args.requests <= 10_000:
        p.error(f"--requests must be from 1 to 10000, got {args.requests}")
    run = Path(args.checkpoint).resolve()
    if not run.is_dir():
        p.error(f"--checkpoint {args.checkpoint}: no such run directory")
    device = pick_device(args.device)
    if device.type == "cpu":
        configure_threads(args.threads)
    threads = torch.get_num_threads() if device.type == "cpu" else None
    proc, url = start_server(run.parent, device, threads)
    try:
        text = report(measure(url, run.name, args.requests), args.checkpoint, device, args.requests)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    print(text)
    if args.write:
        write(text, machine_kind(device), f"{prog or 'python -m chargpt.bench suggest'} "
                                          f"--checkpoint {args.checkpoint} --requests {args.requests}")
