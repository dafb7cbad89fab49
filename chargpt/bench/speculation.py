"""Speculative decoding against plain decoding on a trained run (`python -m chargpt.bench --only decode --checkpoint
RUN`): characters a second at batch 1 with --speculate off, on and auto, at temperatures 0, 0.8 and 1, from an empty
prompt (the model writes in its corpus's style, where drafts from the training text are kept) and from a prompt of
random characters of its alphabet (text outside the corpus); how many characters each verify wrote and the share of
the text that came from drafts; and for how many seeds the three texts were the same (all, but for float rounding:
a forward over several positions may round a logit differently from one position's, and a draw that falls within
that rounding of a boundary between two characters then picks the other).

Random weights say nothing here (their text is noise no draft guesses), so without --checkpoint the part is one line.
The rounds interleave off, on and auto in one process and the median is kept: the ratios in a row are what to read.
"""

import random
import statistics
import time

MODES = ("off", "on", "auto")
TEMPERATURES = (0.0, 0.8, 1.0)


def outside_prompt(vocab, n=40, seed=0):
    """n characters of the run's alphabet in a random order (no newlines or private-use marks): text its corpus
    almost surely never holds."""
    chars = [c for c in vocab.chars if c.isprintable() and not 0xE000 <= ord(c) <= 0xF8FF]
    return "".join(random.Random(seed).choice(chars) for _ in range(n)) if chars else ""


def speculation_rows(args, device, n, rounds=3):
    """The table's lines (markdown), or the one line saying what the part needs."""
    if not args.checkpoint:
        return ["speculation: measured on a trained run (--checkpoint RUN): a random model's text is noise that no "
                "draft guesses", ""]
    import chargpt
    threads = args.threads or 1  # batch-1 decoding of a small model runs fastest on one thread (chargpt/threads.py)
    gens = {m: chargpt.load(args.checkpoint, device=str(device), dtype="float32", compile="off", threads=threads,
                            speculate=m) for m in MODES}
    prompts = {"empty (the corpus's style)": "", "40 random characters (outside the corpus)":
               outside_prompt(gens["off"].vocab)}
    rows = [f"speculative decoding, {n} chars, batch 1, float32, {threads} thread(s), median of {rounds} "
            f"interleaved rounds", "",
            "| prompt | T | plain chars/s | on | auto | chars per verify (on) | text from drafts (on) | on / plain | "
            "auto / plain | seeds whose 3 texts agree |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, prompt in prompts.items():
        for t in TEMPERATURES:
            speed, texts, stats = {m: [] for m in MODES}, {}, None
            for g in gens.values():  # warm: the first call loads the drafts' index and wakes the threads
                g.generate(prompt, max_new_tokens=min(n, 50), temperature=t, seed=0)
            for r in range(rounds):
                for m, g in gens.items():
                    t0 = time.perf_counter()
                    texts.setdefault(r, set()).add(g.generate(prompt, max_new_tokens=n, temperature=t, seed=r + 1)[0])
                    speed[m].append(n / (time.perf_counter() - t0))
                    if m == "on" and r == 0:
                        stats = g.speculated.stats() if g.speculated is not None else None
            med = {m: statistics.median(v) for m, v in speed.items()}
            per_verify = f"{(stats['kept'] + stats['verifies']) / stats['verifies']:.2f}" if stats and \
                stats["verifies"] else "-"  # characters a verify wrote: its drafts kept, and the model's own
            share = f"{stats['kept'] / max(1, stats['chars']):.0%}" if stats else "-"
            rows.append(f"| {name} | {t:g} | {med['off']:,.0f} | {med['on']:,.0f} | {med['auto']:,.0f} | "
                        f"{per_verify} | {share} | {med['on'] / med['off']:.2f}x | {med['auto'] / med['off']:.2f}x | "
                        f"{sum(len(found) == 1 for found in texts.values())} of {rounds} |")
    costs = gens["on"].drafted.costs  # what a check of each length cost, as the drafts measured it (check_costs)
    rows[2:2] = [f"a check of 1 .. {len(costs)} positions costs " + ", ".join(f"{c / costs[0]:.2f}" for c in costs) +
                 f" times one position's forward ({costs[0] * 1e6:,.0f} us)", ""]
    return rows + [""]
