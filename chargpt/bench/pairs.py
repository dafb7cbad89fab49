"""The pairs benchmark: decoder-only against encoder-decoder at about the same size, the same time each, on
Tang-poem couplets (first line -> second): val loss, chrF, exact match, chars/s (`python -m chargpt.bench pairs`)."""

import re
import sys
from pathlib import Path

import numpy as np

from chargpt.bench.speed import machine, parse_sets

# pairs: decoder-only against encoder-decoder at about the same size (a decoder block has 12 C^2 weights, an encoder
# block 12 C^2, a cross-attending decoder block 16 C^2: 5 layers = 60 C^2 against 2 + 2 = 56 C^2)
PAIRS_ARCHS = {"decoder-only": dict(arch="decoder", n_layer=5),
               "encoder-decoder": dict(arch="encoder-decoder", n_layer=2, n_enc_layer=2)}
# evaluations during training only at the start and the end, on few batches: the scores come after, the same for both
PAIRS_SETTINGS = dict(task="pairs", n_embd=128, n_head=4, block_size=32, dropout=0.0, batch_size=64,
                      learning_rate=2e-3, warmup_iters=100, eval_interval=10**9, eval_iters=5, eval_pairs=0,
                      sample_chars=0)
# one couplet: a first line, its punctuation (mostly a comma), a second line, its end punctuation
COUPLET = re.compile(r"([^，。？！；：\t]+)[，？！；]([^，。？！；：\t]+)[。？！]")


def couplets(poems, out):
    """Tang poems (chargpt's tang_poems.txt: title, author, then one couplet per line, `first，second。`) -> a TSV
    of first line -> second line (punctuation dropped) at `out`; lines that are not one couplet are skipped.
    -> number of pairs."""
    n = 0
    with open(poems, encoding="utf-8") as f, open(out, "w", encoding="utf-8") as w:
        for line in f:
            m = COUPLET.fullmatch(line.strip())
            if m:
                w.write(f"{m[1]}\t{m[2]}\n")
                n += 1
    return n


def pairs(args):
    """Both architectures, --max-time seconds of training each on the same couplets; -> a Markdown table of val loss,
    chrF and exact match (greedy) on the same --eval-pairs validation pairs, and training chars/s."""
    import tempfile

    from chargpt.data.pairs import encode_pairs, split_pairs
    from chargpt.sampling.engine import load
    from chargpt.sampling.translate import chrf, exact_match
    from chargpt.tools.evaluate import score_pairs
    from chargpt.training.trainer import train
    if not args.data:
        raise SystemExit("pairs needs --data: the Tang poems (chargpt data get tang -> data/tang_poems.txt)")
    work = Path(args.out_dir or tempfile.mkdtemp(prefix="chargpt-pairs-"))
    work.mkdir(parents=True, exist_ok=True)
    n = couplets(args.data, work / "couplets.tsv")
    enc = encode_pairs(str(work / "couplets.tsv"), log=lambda m: None)
    _, val = split_pairs(enc.n_pairs, 0.1)
    block = PAIRS_SETTINGS["block_size"]  # scored on pairs both architectures can hold (the decoder-only's limit)
    fits = [p for p in map(enc.pair, np.random.default_rng(0).permutation(val)) if len(p[0]) + len(p[1]) < block]
    sample = fits[:args.eval_pairs]
    rows = [f"{n:,} couplets of {Path(args.data).name} (first line -> second), {args.max_time:g} s of training each "
            f"on {machine()}", "", "| model | parameters | steps | train chars/s | val loss (nats/char) | chrF | "
            "exact match |", "|---|---|---|---|---|---|---|"]
    for name, arch in PAIRS_ARCHS.items():
        out = work / name
        overrides = {**PAIRS_SETTINGS, **arch, **parse_sets(args.set), "max_time": args.max_time}
        summary = train(data=str(work / "couplets.tsv"), out_dir=str(out), device=args.device, **overrides,
                        log=lambda m: print(m, file=sys.stderr))  # stdout: the table alone
        gen = load(out, device=args.device)  # its best checkpoint
        cfg = gen.model.config
        name += f" {cfg.n_enc_layer}+{cfg.n_layer}" if cfg.n_enc_layer else f" {cfg.n_layer}"
        name += f" x {cfg.n_embd}"
        hyps, refs = gen.translate([s for s, _ in sample]), [t for _, t in sample]
        total, scored = score_pairs(gen.model, gen.vocab, sample, dtype=gen.dtype)[:2]
        score = chrf(hyps, refs)
        shown = "n/a" if score is None else f"{score:.1f}"
        rows.append(f"| {name} | {gen.model.num_params() / 1e6:.2f}M | {summary['step']:,} | "
                    f"{summary['chars_per_s']:,.0f} | {total / scored:.4f} | {shown} | {exact_match(hyps, refs):.1%} |")
    return "\n".join(rows + ["", f"(on the same {len(sample)} validation pairs: val loss of the target characters "
                                 f"given the source, and chrF and exact match of greedy translations; chars/s: "
                                 f"characters of the examples, source and target, per second of training)"])
