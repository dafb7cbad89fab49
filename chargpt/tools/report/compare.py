"""`chargpt eval --against RUN2|bf16|int8|hf`: the report's comparison with float32 alone (agreement.py), on the
run's own validation windows: KL divergence and top-1 agreement, no decoding.

    evaluate_against("checkpoints/pydoc-topics", "int8")   # -> {"checkpoint", "against", "kl", "agreement", ...}
"""

from chargpt.errors import ChargptError
from chargpt.runs.checkpoint import load_model
from chargpt.runs.rundir import resolve
from chargpt.runtime import pick_device
from chargpt.tools.evaluate import run_split
from chargpt.tools.report.agreement import against, windows_of


def evaluate_against(checkpoint, kind, device="auto"):
    """A run (directory or checkpoint) against `kind` -> dict: checkpoint, against, what, kl (nats per character),
    agreement (share), positions, data (which validation text)."""
    path = resolve(checkpoint)
    device = pick_device(device)
    model, vocab, meta = load_model(path, device)
    if meta["task"] != "text":
        raise ChargptError("--against compares text models; this run was trained on sentence pairs")
    ids, split, label = run_split(meta, vocab, model.config.block_size)
    pieces = split.pieces(ids, "val")
    windows_of(pieces, model.config.block_size)  # an empty validation text fails here, in its own words
    row = against(model, vocab, meta, device, [kind], pieces, speed=False)[-1]
    return {"checkpoint": str(path), "against": kind, "what": row["what"], "kl": row["kl"],
            "agreement": row["agreement"], "positions": row["positions"], "data": label}


def format_against(r):
    kl = f"{r['kl']:.6f}" if r["kl"] >= 1e-6 or not r["kl"] else f"{r['kl']:.1e}"  # a tiny one still shows
    return (f"{r['checkpoint']} against {r['against']} ({r['what']}) on {r['positions']:,} positions of the "
            f"{r['data']}:\n  KL divergence from float32 {kl} nats/char, top-1 agreement {r['agreement']:.2%}")
