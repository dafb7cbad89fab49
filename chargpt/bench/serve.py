"""Benchmark: text through the web playground's stream against the library and sample.py, on one checkpoint.

    python -m chargpt.bench.serve                                # a model of the device preset's size (random weights)
    python -m chargpt.bench.serve --checkpoint checkpoints/NAME   # a trained run
    python -m chargpt.bench.serve --write                        # ... appended to benchmarks/RESULTS.md

Time to first character (TTFC) and characters per second while streaming, for the same prompt, seed and
settings, through three paths:
  library    Generator.stream in this process; the model loaded and warm
  page       POST /api/generate to `python -m chargpt.serve` in another process, read as the page reads it
             (server-sent events over HTTP on localhost); the model loaded and warm (after one request)
  sample.py  a new process, as a user runs it: TTFC includes starting Python, importing torch and loading
Each figure is the median of --repeats runs. The three texts must be identical (same seed, same settings).
Not a timed test: a shared machine is noisy, so compare figures from one run of this command only.
"""

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

import torch

from chargpt.bench.speed import machine
from chargpt.config import PRESETS, ModelConfig, device_preset
from chargpt.data.tokenizer import Vocab
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import save_model
from chargpt.runtime import configure_threads, pick_device
from chargpt.sampling.engine import load

PROMPT = "The "


def random_run(root, device):
    """A checkpoint of the preset size for `device`, random weights: decoding costs the same as a trained one."""
    preset = {**asdict(ModelConfig()), **PRESETS[device_preset(device.type)]}  # shakespeare-char: the defaults
    vocab = Vocab(sorted(set("\n" + "".join(map(chr, range(32, 127))))))
    cfg = ModelConfig(vocab_size=len(vocab), **{k: preset[k] for k in ("n_layer", "n_head", "n_embd", "block_size")},
                      dropout=0.0)
    torch.manual_seed(0)
    run = Path(root) / "bench"
    run.mkdir(parents=True)
    save_model(run / "best.safetensors", CharGPT(cfg), vocab, step=0)
    return run


def timed(pieces):
    """An iterator of text pieces, started just now -> (TTFC s, chars/s from the first to the last, text)."""
    t0, first, last, text = time.perf_counter(), None, None, ""
    for piece in pieces:
        last = time.perf_counter()
        first = first or last
        text += piece
    rate = (len(text) - 1) / (last - first) if len(text) > 1 and last > first else float("nan")
    return first - t0, rate, text


def library(gen, settings):
    return timed(piece for _, piece in gen.stream(PROMPT, **settings))


def page(url, run, settings):
    """The page's path: one POST, server-sent events read line by line as they arrive."""
    parts = urlsplit(url)
    body = json.dumps({"run": run, "prompt": PROMPT, **settings})

    def pieces():
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
        conn.request("POST", "/api/generate", body, {"Content-Type": "application/json"})
        response, event = conn.getresponse(), None
        if response.status != 200:
            raise SystemExit(f"the server refused the benchmark request: {response.read().decode()[:200]}")
        for line in response:
            line = line.decode("utf-8").rstrip("\n")
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: ") and event == "text":
                yield from (piece for _, piece in json.loads(line[6:]))
        conn.close()
    return timed(pieces())


def child_env(threads):
    """The environment of the server and sample.py processes: the same torch thread count as this one."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None


def sample_py(run, settings, device, threads=None):
    """A new `sample.py` process; TTFC counts from its start to the first character after the echoed prompt."""
    args = [sys.executable, "-c", "from chargpt.cli import sample_cli; sample_cli()", "--checkpoint", str(run),
            "--prompt", PROMPT, "--seed", str(settings["seed"]), "--max-new-tokens", str(settings["max_new_tokens"]),
            "--temperature", str(settings["temperature"]), "--device", str(device)]

    def pieces():
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=child_env(threads))
        skip, pending = len(PROMPT.encode()), b""
        while chunk := os.read(proc.stdout.fileno(), 4096):
            chunk, skip = chunk[skip:], max(0, skip - len(chunk))
            pending += chunk
            text = pending.decode("utf-8", errors="ignore")  # whole characters only
            pending = pending[len(text.encode()):]
            if text:
                yield text
        proc.wait()
    ttfc, rate, text = timed(pieces())
    return ttfc, rate, text.removesuffix("\n")  # sample.py ends the sample with a newline


def start_server(root, device, threads=None):
    proc = subprocess.Popen([sys.executable, "-m", "chargpt.serve", "--checkpoints", str(root), "--port", "0",
                             "--device", str(device)], stderr=subprocess.PIPE, text=True, env=child_env(threads))
    line = proc.stderr.readline()
    if not line.startswith("chargpt playground: "):
        proc.kill()
        raise SystemExit(f"the server did not start: {line.strip()} (pip install -e \".[web]\")")
    return proc, line.split()[2]


def run_all(run, device, chars, repeats, threads=None):
    settings = dict(max_new_tokens=chars, temperature=0.8, seed=1)
    gen = load(run, device=str(device))
    library(gen, {**settings, "max_new_tokens": 2})  # warm-up
    results = {"library": [library(gen, settings) for _ in range(repeats)]}
    proc, url = start_server(run.parent, device, threads)
    try:
        page(url, run.name, {**settings, "max_new_tokens": 2})  # loads the model into the server
        results["page"] = [page(url, run.name, settings) for _ in range(repeats)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    results["sample.py"] = [sample_py(run, settings, device, threads) for _ in range(repeats)]
    return results


def report(results, run, device, chars, repeats):
    reference = results["library"][0][2]
    lines = [f"{machine()}; device {device}; checkpoint {run}; {chars} characters from {PROMPT!r}, temperature 0.8, "
             f"seed 1; median of {repeats}", "",
             "| path | time to first character | chars/s while streaming | same text as the library |",
             "|---|---|---|---|"]
    for name, runs in results.items():
        ttfc = statistics.median(r[0] for r in runs)
        rate = statistics.median(r[1] for r in runs)
        same = "yes" if all(r[2] == reference for r in runs) else "NO"
        lines.append(f"| {name} | {ttfc * 1000:,.1f} ms | {rate:,.0f} | {same} |")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", default=None, help="a run directory [default: a random-weight model of the "
                                                      "device preset's size, in a temporary folder]")
    p.add_argument("--device", default="auto")
    p.add_argument("--chars", type=int, default=500, help="characters per generation")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch, in every process measured "
                                                            "[default: one per core]")
    p.add_argument("--write", action="store_true", help="append the results to benchmarks/RESULTS.md")
    args = p.parse_args(argv)
    device = pick_device(args.device)
    if device.type == "cpu":
        configure_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.checkpoint).resolve() if args.checkpoint else random_run(tmp, device)
        threads = torch.get_num_threads() if device.type == "cpu" else None
        text = report(run_all(run, device, args.chars, args.repeats, threads),
                      run if args.checkpoint else "random weights", device, args.chars, args.repeats)
    print(text)
    if args.write:
        path = Path("benchmarks/RESULTS.md")
        path.parent.mkdir(exist_ok=True)
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"\n## {time.strftime('%Y-%m-%d %H:%M')} — python -m chargpt.bench.serve\n\n{text}\n")


if __name__ == "__main__":
    main()
