"""Benchmark of the novelty index (chargpt/tools/novelty/): index build time and peak memory, and scoring time, per
corpus, each case in a fresh Python process.

    python -m chargpt.bench novelty --chars 1000000 --chars 100000000        # synthetic English-like corpora
    python -m chargpt.bench novelty --data data/tinyshakespeare.txt --builder numpy --builder pydivsufsort

One JSON object per case on stdout (docs/novelty.md quotes them).
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from chargpt.errors import ChargptError
from chargpt.tools.novelty import matching_statistics, suffix_array
from chargpt.tools.novelty.suffixarray import pick_builder


def synthetic_ids(n, seed=0, words=5000, chunk=1 << 23):
    """(n,) uint16 ids of English-like filler: random words (2 to 9 letters of 26) from a fixed lexicon, spaces
    between them and a newline every 4 to 12 words; long repeats are as rare as in real text, short ones as
    common. Made a chunk of words at a time (bounded memory: a 100M-character corpus costs its 200 MB)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 10, words)
    lexicon = rng.integers(2, 28, int(lengths.sum())).astype(np.uint16)  # ids 2..27: letters; 0 "\n", 1 " "
    first = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    out, filled = np.empty(n, np.uint16), 0
    while filled < n:
        w = rng.integers(0, words, chunk // 6)  # words, each with the separator after it
        size = lengths[w] + 1
        end = np.cumsum(size)
        within = np.arange(int(end[-1])) - np.repeat(end - size, size)  # offset inside word + separator
        piece = np.ones(int(end[-1]), np.uint16)
        letter = within < np.repeat(size - 1, size)
        piece[letter] = lexicon[(np.repeat(first[w], size) + within)[letter]]
        line_ends = np.cumsum(rng.integers(4, 13, len(w)))
        piece[end[line_ends[line_ends <= len(w)] - 1] - 1] = 0
        take = min(n - filled, len(piece))
        out[filled:filled + take] = piece[:take]
        filled += take
    return out


def bench_one(n_chars=None, data=None, sample_chars=1000, seed=0, builder="auto"):
    """Index build time and peak memory (numpy and ctypes allocations, traced), and the time to score a
    `sample_chars` text (half a slice of the corpus, half its characters shuffled), for a synthetic corpus of
    n_chars or the text file `data` (encoded as training encodes it, into a temporary cache) -> dict.
    builder: auto (pydivsufsort when installed), numpy or pydivsufsort."""
    import tempfile
    import tracemalloc

    from chargpt.data.corpus import encode_corpus
    with tempfile.TemporaryDirectory() as tmp:
        if data is not None:
            ids, name = encode_corpus(data, cache_dir=tmp, log=lambda *a: None).ids(), Path(data).name
        else:
            ids, name = synthetic_ids(n_chars, seed), f"synthetic {n_chars:,}"
        used = pick_builder(ids, builder)
        tracemalloc.start()
        t0 = time.perf_counter()
        sa = suffix_array(ids, builder)
        build_s = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1] - sa.nbytes  # what the build needed besides its result
        tracemalloc.stop()
        rng = np.random.default_rng(seed + 1)
        at = int(rng.integers(0, max(1, len(ids) - sample_chars)))
        query = np.asarray(ids[at:at + sample_chars], dtype=np.int64).copy()
        query[len(query) // 2:] = rng.permutation(query[len(query) // 2:])
        t0 = time.perf_counter()
        starting, _ = matching_statistics(ids, sa, query)
        score_s = time.perf_counter() - t0
        return {"corpus": name, "chars": len(ids), "builder": used, "build_s": round(build_s, 3),
                "build_extra_mb": round(max(0, peak) / 2**20, 1),
                "index_mb": round(sa.nbytes / 2**20, 1), "peak_rss_mb": round(_peak_rss() / 2**20, 1),
                "score_chars": len(query), "score_s": round(score_s, 4), "longest": int(starting.max(initial=0))}


def _peak_rss():
    """This process's peak resident memory in bytes (Linux reports KiB, macOS bytes). The resource module is
    POSIX's, so it is imported here, when measuring, and not where Windows would fail to import this module."""
    import resource
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def bench(cases, sample_chars=1000, timeout=3600):
    """Each case (bench_one's keywords: {"n_chars": N} or {"data": PATH}, and "builder") in a fresh Python
    process, so that one's memory does not colour the next; -> list of result dicts."""
    results = []
    for case in cases:
        code = (f"import json; from chargpt.bench.novelty import bench_one; "
                f"print(json.dumps(bench_one(**{case!r}, sample_chars={sample_chars})))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ})
        if done.returncode:
            raise ChargptError(f"novelty benchmark of {case} failed: {done.stderr.strip().splitlines()[-1:]}")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


def main(argv=None, prog="python -m chargpt.bench novelty"):
    import argparse
    parser = argparse.ArgumentParser(prog=prog, description="novelty index benchmark: index build time and peak "
                                     "memory, and scoring time, per corpus")
    parser.add_argument("--chars", type=int, action="append", default=[], help="a synthetic corpus of this many chars")
    parser.add_argument("--data", action="append", default=[], help="a UTF-8 text file")
    parser.add_argument("--sample-chars", type=int, default=1000, help="length of the scored text")
    parser.add_argument("--builder", action="append", choices=("auto", "numpy", "pydivsufsort"), default=[],
                        help="suffix-array builder(s) to measure [default: auto, pydivsufsort when installed]")
    args = parser.parse_args(argv)
    corpora = [{"n_chars": n} for n in args.chars] + [{"data": d} for d in args.data] or [{"n_chars": 1_000_000}]
    cases = [{**c, "builder": b} for c in corpora for b in args.builder or ["auto"]]
    for r in bench(cases, args.sample_chars):
        print(json.dumps(r))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
