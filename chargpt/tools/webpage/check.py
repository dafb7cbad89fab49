"""What the export checks before a page appears, and what int8 costs.

    check_page(path, reference, vocab)   # -> one line saying what was checked; raises if the page is wrong
    loss_gap(model, reference, meta, vocab)   # -> (nats int8 costs, where measured), or (None, why not)

With node (20 or later on the PATH): check.js reads the written file's own decoder, model and weights, writes
greedily after a short prompt, and prints each step's logits; chargpt's reference model (the float32 model, or the
int8 weights dequantized) is driven along the same characters through sampling.decode (the same window slides) and
every step's logits must agree within LOGITS_TOLERANCE. Without node, the page is read back in Python and the
weights it holds must give the reference model's logits: the embedding is checked, the JavaScript arithmetic is not
(the tests run it in node and in Chromium).
"""

import json
import re
import shutil
import subprocess
from pathlib import Path

import torch

from chargpt.config import SampleSettings
from chargpt.errors import ChargptError
from chargpt.sampling.decode import decode
from chargpt.tools.evaluate import score_ids, validation_split
from chargpt.tools.webpage.pack import dequantized
from chargpt.tools.webpage.page import read_page

NODE_MIN = 18  # atob and the language features decoder.js uses
# largest |logit difference| between the page and chargpt, relative to the largest |logit| (at least 1). The page
# sums in double where torch sums in float32, and takes erf from a series: measured differences are near 1e-6.
LOGITS_TOLERANCE = 1e-4
NODE_TIMEOUT_S = 600  # a 256 MB page loads and writes its few characters in well under a minute
GAP_CHARS = 20_000  # validation characters int8's cost is measured on: enough to see 0.001 nats, seconds to score
PROBE_SEED = 0


def node_binary():
    """-> (path to node 18+, its version), or (None, why not)."""
    node = shutil.which("node")
    if not node:
        return None, "node was not found"
    try:
        version = subprocess.run([node, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        return None, f"node did not run ({e})"
    m = re.match(r"v(\d+)", version)
    if not m or int(m[1]) < NODE_MIN:
        return None, f"node {version or '(unknown version)'} is older than {NODE_MIN}"
    return node, version


def check_steps(cfg):
    """Characters the check writes: 24, or past the context (so the window slides) where that is cheap."""
    return max(24, min(64, cfg.block_size + 8))


def check_prompt(vocab):
    return "The " if all(c in vocab.stoi for c in "The ") else ""


def run_node(node, path, request):
    """check.js on the page at `path` -> its JSON answer; a failure is the one-line error that no page was written."""
    script = Path(__file__).with_name("check.js")
    try:
        done = subprocess.run([node, str(script), str(path), json.dumps(request)], capture_output=True, text=True,
                              timeout=NODE_TIMEOUT_S, encoding="utf-8")
    except subprocess.TimeoutExpired:
        raise ChargptError(f"checking the page under node took over {NODE_TIMEOUT_S} s; nothing was written; report "
                           f"it") from None
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1][:300]
        raise ChargptError(f"the page's decoder failed under node ({why}); nothing was written; report it")
    return json.loads(done.stdout)


class Recorder:
    """A sampling.decode steer that keeps the logits of every step; with `forced` ids, it makes decode write those
    instead of its own choices."""

    def __init__(self, forced=None):
        self.forced, self.seen = forced, []

    def logits(self, logits):
        self.seen.append(logits[0].float().clone())
        if self.forced is None:
            return logits
        forced = torch.full_like(logits, float("-inf"))
        forced[:, self.forced[len(self.seen) - 1]] = 0.0
        return forced

    def chose(self, ids):
        pass


@torch.no_grad()
def chargpt_greedy(model, vocab, prompt, steps, forced=None):
    """chargpt's greedy decoding after `prompt` (its empty-prompt start as the Generator's); forced: ids to write
    instead of its choices. -> (ids written, logits of each step)."""
    from chargpt.sampling.engine import Generator
    context = prompt or Generator(model, vocab, "cpu").start_text()
    steer = Recorder(forced)
    ctx = torch.tensor([vocab.encode(context)])
    settings = SampleSettings(max_new_tokens=steps, temperature=0)
    ids = [int(i) for i in decode(model, ctx, settings, torch.Generator(), steer=steer)]
    return ids, steer.seen


def check_with_node(node, version, path, reference, vocab):
    prompt, steps = check_prompt(vocab), check_steps(reference.config)
    page = run_node(node, path, {"prompt": prompt, "steps": steps})
    if not len(page["ids"]) == len(page["logits"]) == steps:
        raise ChargptError(f"the page's decoder wrote {len(page['ids'])} of {steps} characters; nothing was written; "
                           f"report it")
    _, want = chargpt_greedy(reference, vocab, prompt, steps, forced=page["ids"])
    got = torch.tensor(page["logits"], dtype=torch.float32)
    want = torch.stack(want)
    diff = (got - want).abs().max().item()
    allowed = LOGITS_TOLERANCE * max(1.0, want.abs().max().item())
    if not diff <= allowed:
        raise ChargptError(f"the page's logits differ from chargpt's by {diff:.2g} (allowed {allowed:.2g}); nothing "
                           f"was written; report it")
    # along the page's characters, chargpt's own choice at each step: where all agree, so do the two greedy texts
    ours = want.argmax(dim=-1).tolist()
    same = next((i for i, (a, b) in enumerate(zip(ours, page["ids"])) if a != b), steps)
    text = f"writes chargpt's greedy text ({steps} characters)" if same == steps else \
        f"writes chargpt's greedy text for {same} of {steps} characters (then a near-tie: equal logits to rounding)"
    return f"the page's decoder, run in node {version}, {text} and reproduces its logits (largest difference " \
           f"{diff:.1g})"


@torch.no_grad()
def check_in_python(path, reference, vocab, why):
    description, blob = read_page(Path(path).read_text(encoding="utf-8"))
    if description["chars"] != vocab.chars:
        raise ChargptError("the page's vocabulary is not the run's; nothing was written; report it")
    back = dequantized(reference, blob, description["tensors"])
    g = torch.Generator().manual_seed(PROBE_SEED)
    ids = torch.randint(len(vocab), (1, reference.config.block_size), generator=g)
    want, got = reference(ids)[0], back(ids)[0]
    diff = (got - want).abs().max().item()
    if not diff <= LOGITS_TOLERANCE * max(1.0, want.abs().max().item()):
        raise ChargptError(f"the weights in the page give logits {diff:.2g} away from chargpt's; nothing was "
                           f"written; report it")
    return f"{why}, so the page's decoder was not run here (install node 18+ to check it); the weights read back " \
           f"from the page reproduce chargpt's logits (largest difference {diff:.1g})"


def check_page(path, reference, vocab):
    """Check the page written at `path` computes `reference` (a float32 CharGPT) -> what was checked, in words."""
    node, version = node_binary()
    if node:
        return check_with_node(node, version, path, reference, vocab)
    return check_in_python(path, reference, vocab, version)


@torch.no_grad()
def loss_gap(model, reference, meta, vocab, limit=GAP_CHARS):
    """Mean loss per character of `reference` minus `model`'s, teacher-forced on the first `limit` characters of
    the run's validation split (evaluate.score_ids, with chargpt eval's windows) -> (nats, where), or (None, why
    it could not be measured)."""
    try:
        pieces, label = validation_split(meta, vocab, model.config.block_size)
    except ChargptError as e:  # its advice (pass --data) is chargpt eval's: the reason alone
        return None, str(e).split("; ")[0]
    taken, left = [], limit
    for piece in pieces:
        if left < 2:
            break
        taken.append(piece[:left])
        left -= len(taken[-1])
    losses = []
    for m in (model, reference):
        scored = [score_ids(m, p) for p in taken if len(p) >= 2]
        total, count = sum(s[0] for s in scored), sum(s[1] for s in scored)
        if not count:
            return None, f"the {label} is empty"
        losses.append(total / count)
    return losses[1] - losses[0], f"{limit - left:,} characters of the {label}"
