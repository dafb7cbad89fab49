"""A run's report card: `chargpt report RUN` -> RUN/report.md and RUN/report.html (self-contained, opens offline).

    build_report("checkpoints/pydoc-topics")          # -> dict (what `chargpt report --json` prints)
    write_report("checkpoints/pydoc-topics", report)  # -> (report.md, report.html)

What it holds, each figure with how it was measured:
1. the run: corpus, model, training, the machine, the command that trains it again (runs/info.py's facts);
2. compression: the validation split's loss in nats and bits per character and per UTF-8 byte, with a standard
   error from the per-window losses (tools/evaluate.py scores it), beside zlib, bz2, xz (and zstd where installed)
   at their strongest settings on the same bytes (measures.py); the loss curve (runs/plot.py, where matplotlib is);
3. samples at several temperatures, fixed seeds: their log-probability under the model, distinct-n, self-BLEU,
   repetition, what they copy from the training text (tools/novelty/), and the temperature suggested from them;
4. what bf16, int8 and the exports cost: KL divergence from the float32 model and top-1 agreement on validation
   windows, and decode speed (agreement.py).
render.py writes it as Markdown and HTML.
"""

import math
import platform
import sys
import time
from pathlib import Path

import torch

from chargpt import __version__
from chargpt.config.architecture import describe_model
from chargpt.errors import ChargptError, CheckpointError
from chargpt.runs.checkpoint import load_model
from chargpt.runs.info import run_info
from chargpt.runs.rundir import CONFIG, holds_run, resolve, write_text_atomic
from chargpt.runtime import pick_device
from chargpt.sampling.engine import Generator
from chargpt.tools.evaluate import run_split, score_ids, score_pieces
from chargpt.tools.report import agreement, measures, render

TEMPERATURES = (0.5, 0.8, 1.0, 1.2)
SAMPLES = 4  # samples a temperature, written together (one batch) from one seed
SAMPLE_CHARS = 500  # characters a sample: 2,000 a temperature
SEED = 1
MAX_VAL_CHARS = 200_000  # validation characters scored and compressed (the first ones, whole stretches): the
# Tang poems' 467k took 1.8 min of a report's 1.9 on 2 cores; 200k gives bits a character to about 0.02
MAX_TEMPERATURES = 8
MAX_SAMPLE_CHARS = 20_000
MAX_SAMPLES = 32
REPORT_MD, REPORT_HTML = "report.md", "report.html"
LN2 = math.log(2)


def parse_temperatures(text):
    """'0.5,0.8,1.0' -> (0.5, 0.8, 1.0), or the one-line error."""
    try:
        return tuple(float(t) for t in text.split(","))
    except ValueError:
        raise ChargptError(f"--temperatures takes numbers separated by commas, such as 0.5,0.8,1.0,1.2 (got "
                           f"{text[:40]!r})") from None


def check_options(temperatures, samples, chars):
    if not temperatures or len(temperatures) > MAX_TEMPERATURES or any(not 0 < t <= 5 for t in temperatures):
        raise ChargptError(f"--temperatures takes 1 to {MAX_TEMPERATURES} temperatures above 0 and at most 5, such as "
                           f"0.5,0.8,1.0,1.2 (got {','.join(map(str, temperatures)) or 'none'})")
    if not 2 <= samples <= MAX_SAMPLES:
        raise ChargptError(f"--samples must be 2 to {MAX_SAMPLES} (self-BLEU compares samples), got {samples}")
    if not 1 <= chars <= MAX_SAMPLE_CHARS:
        raise ChargptError(f"--chars must be 1 to {MAX_SAMPLE_CHARS:,}, got {chars}")


def run_folder(run):
    """RUN must be a run directory (the report is written into it): -> its Path, or the one-line error."""
    p = Path(run).expanduser()
    if not p.exists():
        raise CheckpointError(f"run not found: {run}; pass a run directory (as chargpt train writes it)")
    if not p.is_dir():
        raise CheckpointError(f"{run} is not a run directory (the report is written into one); pass the folder that "
                              f"holds it")
    if not holds_run(p):
        raise CheckpointError(f"{run} is not a run directory (no best.safetensors or latest.safetensors in it); pass "
                              f"one that chargpt train wrote")
    return p


def build_report(run, temperatures=TEMPERATURES, samples=SAMPLES, chars=SAMPLE_CHARS, device="auto",
                 compare=agreement.PRECISIONS, speed=True, log=lambda m: print(m, file=sys.stderr)):
    """A run directory -> the report as a dict (JSON-ready; the curve's PNG under "curve" as base64)."""
    t0 = time.perf_counter()
    check_options(temperatures, samples, chars)
    folder = run_folder(run)
    device = pick_device(device)
    info = run_info(folder)
    model, vocab, meta = load_model(resolve(folder), device)
    if meta["task"] != "text":
        raise ChargptError(f"{run} was trained on sentence pairs; chargpt report is for text runs (chargpt eval scores "
                           f"a translator)")
    ids, split, label = run_split(meta, vocab, model.config.block_size)
    pieces = first_chars(split.pieces(ids, "val"), MAX_VAL_CHARS)
    log("scoring the validation text and compressing it")
    report = {"run": run_facts(folder, info, meta, split, len(ids), label),
              "compression": compression(model, vocab, pieces, split.size("val"))}
    report["curve"] = curve(folder)
    log(f"writing {samples} samples at each of {len(temperatures)} temperatures")
    report["samples"] = sample_table(model, vocab, meta, device, folder, temperatures, samples, chars, log)
    log("comparing precisions and exports with float32")
    rows = agreement.against(model, vocab, meta, device, compare, pieces, speed=speed, strict=False, log=log)
    rows.append({"name": "web page", "note": agreement.WEB_PAGE_NOTE})
    report["precision"] = {"rows": rows, "decode_chars": min(agreement.DECODE_CHARS, model.config.block_size - 1)}
    report["took_s"] = round(time.perf_counter() - t0, 1)
    return report


def first_chars(pieces, most):
    """The first whole stretches holding at most `most` characters (at least one, cut to `most`)."""
    out, total = [], 0
    for p in pieces:
        if total + len(p) > most:
            if not out:
                out.append(p[:most])
            break
        out.append(p)
        total += len(p)
    return out


def run_facts(folder, info, meta, split, n_chars, label):
    """Item 1: what the run is, from run_info, the hardware its checkpoint recorded, and its split."""
    train_chars = split.size("train")
    seen = info["characters_seen"]
    hardware = meta.get("hardware") if isinstance(meta.get("hardware"), dict) else None
    data = info["train_config"].data if info["train_config"] else None
    return {
        "path": str(folder), "corpus": info["corpus"], "data": data or "the built-in corpus",
        "characters": n_chars, "alphabet": info["vocab_size"], "split": label,
        "train_chars": train_chars, "val_chars": split.size("val"),
        "model": describe_model_dict(info), "parameters": info["parameters"],
        "steps": info["steps"], "training_time_s": info["training_time_s"], "characters_seen": seen,
        "passes": seen / train_chars if seen and train_chars else None,
        "trained_on": hardware, "best_val_loss": info["best_val_loss"],
        "machine": machine(), "chargpt": __version__, "torch": torch.__version__,
        "reproduce": f"chargpt train --config {folder / CONFIG}" if (folder / CONFIG).is_file() else None,
    }


def describe_model_dict(info):
    from chargpt.config import ModelConfig
    return describe_model(ModelConfig(**info["model_config"]))


def machine():
    """This machine's processor and threads, in words (the report's timings are of it)."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    gpu = f", GPU {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{cpu}, {torch.get_num_threads()} threads{gpu}; Python {platform.python_version()}"


def compression(model, vocab, pieces, val_chars):
    """Item 2: the model's loss on the validation text with its standard error, beside the compressors."""
    windows = []
    total, scored, n_bytes = score_pieces(model, vocab, pieces, windows=windows)
    if not scored:
        raise ChargptError("the validation split has fewer than 2 characters, so nothing can be scored; train with a "
                           "longer text")
    loss, se = measures.ratio_se(windows)
    data = "".join(vocab.decode(p) for p in pieces).encode("utf-8", "surrogatepass")
    per_byte = scored / n_bytes / LN2  # nats per character -> bits per byte
    comp = measures.compressed_sizes(data)
    for c in comp.values():
        c["bpb"] = 8 * c["bytes"] / len(data)
        c["bpc"] = 8 * c["bytes"] / sum(map(len, pieces))
    return {"loss": loss, "loss_se": se, "bpc": loss / LN2, "bpc_se": se / LN2 if se is not None else None,
            "bpb": loss * per_byte, "bpb_se": se * per_byte if se is not None else None,
            "scored": scored, "scored_bytes": n_bytes, "chars": sum(map(len, pieces)), "bytes": len(data),
            "val_chars": val_chars, "windows": len(windows), "block_size": model.config.block_size,
            "compressors": comp, "zstd": "zstd" in comp}


def sample_table(model, vocab, meta, device, folder, temperatures, samples, chars, log):
    """Item 3: samples at each temperature, what they say about themselves, and the suggested temperature."""
    gen = Generator(model, vocab, device, torch.float32, meta, compile="off")
    copies, copies_note = novelty_index(meta, folder, log)
    written = {t: gen.generate("", max_new_tokens=chars, temperature=t, seed=SEED, num_samples=samples)
               for t in temperatures}
    unit = measures.token_unit("".join(written[temperatures[0]]))
    bleu_note = measures.sacrebleu_note()
    start = vocab.encode(gen.start_text())
    rows = []
    for t, texts in written.items():
        toks = [measures.tokens(x, unit) for x in texts]
        row = {"temperature": t, "logprob": logprob(model, start, vocab, texts),
               "distinct": {n: measures.distinct_n(toks, n) for n in measures.NGRAM_ORDERS},
               "self_bleu": None if bleu_note else measures.self_bleu(texts, unit),
               "repetition": measures.repetition(toks), "copied_fraction": None, "longest_copied": None,
               "text": texts[0]}
        if copies is not None:
            scored = [copies.score(x) for x in texts]
            row["copied_fraction"] = sum(int(s.train.copied.sum()) for s in scored) / max(1, sum(map(len, texts)))
            row["longest_copied"] = max((s.train.longest.length if s.train.longest else 0) for s in scored)
            row["min_span"] = scored[0].min_span
        rows.append(row)
    best, why = measures.suggest_temperature(rows)
    return {"rows": rows, "unit": unit, "samples": samples, "chars": chars, "seed": SEED, "suggested": best,
            "reason": why, "rule": measures.SUGGESTION_RULE, "self_bleu_note": bleu_note, "novelty_note": copies_note}


def logprob(model, start, vocab, texts):
    """Mean log-probability per character (nats) of the samples under the model at temperature 1, each scored after
    the character it started from, as chargpt eval scores a text."""
    total = count = 0
    for text in texts:
        ids = torch.tensor(start[-1:] + vocab.encode(text)).numpy()
        if len(ids) >= 2:
            nats, n = score_ids(model, ids)
            total, count = total + nats, count + n
    return -total / count if count else None


def novelty_index(meta, folder, log):
    """-> (the run's novelty index, None) or (None, why copying is not measured)."""
    from chargpt.tools.novelty import CorpusMissing, for_meta
    try:
        return for_meta(meta, str(folder), log=log), None
    except CorpusMissing as e:
        return None, f"copying not measured: {e}"


def curve(folder):
    """The loss curve as a base64 PNG ({"png": ...}), or {"note": why there is none}."""
    import base64
    import io

    from chargpt.runs import plot
    try:
        rows = plot.require_metrics(folder)
        fig = plot.figure({folder.name: rows}, "bpc", {folder.name: plot.read_running(folder)}, plot.title_of([folder]))
    except ChargptError as e:
        return {"note": f"no loss curve: {e}"}
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return {"png": base64.b64encode(buf.getvalue()).decode("ascii"),
            "file": plot.CURVES if (folder / plot.CURVES).is_file() else None}  # report.md links the run's own


def write_report(run, report):
    """RUN/report.md and RUN/report.html, each written atomically. -> their paths."""
    folder = Path(run)
    md, page = folder / REPORT_MD, folder / REPORT_HTML
    write_text_atomic(md, render.markdown(report))
    write_text_atomic(page, render.html_page(report))
    return md, page
