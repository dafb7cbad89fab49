"""--softmax adaptive (chargpt/model/adaptive.py): an exact distribution over the whole vocabulary whose cost follows
the characters the text uses. Its loss is the full distribution's cross-entropy, its gradient that loss's, the most used
characters are the shortlist, a checkpoint rebuilds the same ranking, a run trains, samples, resumes and evaluates
with it, and what cannot carry it (the GPT-2 export, --init-from, label smoothing) says so in one line.
Numbers are compared in float32, the dtype pinned."""

import math
import random

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_FLAGS, assert_one_line_error

import chargpt
from chargpt.cli import train_cli
from chargpt.config import ModelConfig
from chargpt.errors import ConfigError
from chargpt.model import adaptive
from chargpt.model.adaptive import AdaptiveSoftmax, char_counts, cutoffs, shortlist_for
from chargpt.model.transformer import build_model, estimated_params
from chargpt.runs.checkpoint import load_model
from chargpt.sampling import engine
from chargpt.training import sizing
from chargpt.training.sizing import RUNGS, Probe

V, C = 300, 16


def zipf_counts(vocab_size=V, seed=0):
    """Counts of a Zipf-like text over vocab_size characters, the most used at random ids (not 0, 1, 2, ...)."""
    g = torch.Generator().manual_seed(seed)
    counts = 1e6 / torch.arange(1, vocab_size + 1)
    return counts[torch.randperm(vocab_size, generator=g)]


def head_with_counts(shortlist=64, bias=True):
    torch.manual_seed(0)
    head = AdaptiveSoftmax(C, V, shortlist, bias=bias)
    head.set_frequencies(zipf_counts())
    return head


def test_the_distribution_is_exact_and_the_loss_is_its_cross_entropy():
    head = head_with_counts()
    x, targets = torch.randn(40, C), torch.randint(V, (40,))
    logp = head(x)  # (40, V)
    assert logp.shape == (40, V) and torch.allclose(logp.exp().sum(-1), torch.ones(40), atol=1e-5)
    assert torch.allclose(head.loss(x, targets), -logp.gather(1, targets[:, None]).mean(), atol=1e-5)
    mask = torch.rand(40) < 0.5  # counted rows only, divided by their count
    want = -(logp.gather(1, targets[:, None]).squeeze(1) * mask).sum() / mask.sum()
    assert torch.allclose(head.loss(x, targets, mask), want, atol=1e-5)
    ignored = targets.clone()
    ignored[:10] = -100  # F.cross_entropy's ignore_index counts nothing
    assert torch.allclose(head.loss(x, ignored), -logp[10:].gather(1, targets[10:, None]).mean(), atol=1e-5)


def test_the_gradient_is_the_full_distributions():
    head = head_with_counts()
    x, targets = torch.randn(32, C, requires_grad=True), torch.randint(V, (32,))
    head.loss(x, targets).backward()
    got = [x.grad.clone()] + [p.grad.clone() for p in head.parameters()]
    x.grad = None
    head.zero_grad()
    torch.nn.functional.nll_loss(head(x), targets).backward()  # through the whole (32, V) distribution
    want = [x.grad] + [p.grad for p in head.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, want))


def test_the_most_used_characters_are_the_shortlist_and_a_checkpoint_keeps_the_ranking():
    counts = zipf_counts()
    head = head_with_counts(shortlist=64)
    most_used = set(counts.argsort(descending=True, stable=True)[:64].tolist())
    assert set((head.rank < 64).nonzero().squeeze(1).tolist()) == most_used
    again = AdaptiveSoftmax(C, V, 64)
    again.load_state_dict(head.state_dict())  # the frequencies are stored; the ranking is rebuilt from them
    assert torch.equal(again.rank, head.rank)
    x = torch.randn(5, C)
    assert torch.equal(again(x), head(x))
    tied = AdaptiveSoftmax(C, 4, 1)
    tied.set_frequencies(torch.tensor([5.0, 9.0, 5.0, 5.0]))
    assert tied.rank.tolist() == [1, 0, 2, 3]  # ties by id


def test_the_shortlist_covers_most_of_the_text_and_the_clusters_grow():
    counts = zipf_counts(10_000)
    s = shortlist_for(counts)
    top = counts.sort(descending=True).values
    assert s % 64 == 0 and top[:s].sum() >= adaptive.SHORTLIST_SHARE * counts.sum() > top[:s - 64].sum()
    bounds = cutoffs(10_000, s)
    assert bounds[0] == s and bounds[-1] == 10_000 and bounds == sorted(bounds)
    assert shortlist_for(torch.ones(65)) == 64 and shortlist_for(torch.ones(2)) == 1  # always one character in a tail
    assert char_counts(torch.tensor([2, 0, 2, 2]).numpy(), 4, chunk=3).tolist() == [1, 0, 3, 0]


def test_a_large_alphabet_step_costs_less_than_the_full_heads():
    """Work, not time: the adaptive head's weights (what its products scale with) are under a third of the full
    one's at 10,000 characters with a Zipf text's shortlist, and its tails are computed only for the rows whose
    targets fall in them (a fifth of them)."""
    full = ModelConfig(vocab_size=10_000, n_layer=2, n_embd=128, n_head=4, tie_weights=False).validate()
    small = ModelConfig(vocab_size=10_000, n_layer=2, n_embd=128, n_head=4, softmax="adaptive",
                        shortlist=shortlist_for(zipf_counts(10_000))).validate()
    head_full = estimated_params(full) - estimated_params(ModelConfig(vocab_size=10_000, n_layer=2, n_embd=128,
                                                                      n_head=4).validate())
    head_small = adaptive.weights(128, 10_000, small.shortlist)
    assert head_small < head_full / 3
    model = build_model(small)
    assert abs(model.num_params() - estimated_params(small)) < 0.03 * estimated_params(small)


@pytest.fixture
def alphabet_corpus(tmp_path):
    """A text over 300 characters used as a Zipf law uses them, in lines of a repeated pattern (learnable)."""
    rng = random.Random(0)
    chars = [chr(0x4E00 + V - 1 - i) for i in range(V)]  # the most used last in the vocabulary (sorted by code point)
    weights = [1.0 / (i + 1) for i in range(V)]
    lines = ["".join(rng.choices(chars, weights, k=20)) for _ in range(40)]
    path = tmp_path / "poems.txt"
    path.write_text("\n".join(lines * 6) + "\n", encoding="utf-8")
    return path


def train(tmp_path, corpus, **kw):
    return chargpt.train(data=str(corpus), out_dir=str(tmp_path / "run"), device="cpu", n_layer=1, n_head=2,
                         n_embd=16, block_size=16, batch_size=8, eval_iters=2, dropout=0.0, threads=1,
                         sample_chars=0, dtype="float32", warmup_iters=0, curves=False, softmax="adaptive",
                         log=lambda msg: None, **kw)


def test_a_run_trains_samples_resumes_and_evaluates_with_it(tmp_path, alphabet_corpus):
    first = train(tmp_path, alphabet_corpus, max_iters=60, eval_interval=30, optimizer="adamw")
    model, vocab, meta = load_model(tmp_path / "run")
    assert meta["model_config"].softmax == "adaptive" and model.config.shortlist >= 64
    assert first["best_val_loss"] < math.log(V) - 0.5  # it learned something (uniform guessing: ln V)
    gen = engine.load(tmp_path / "run", device="cpu")
    text = gen.generate(prompt=vocab.decode([5]), max_new_tokens=40, seed=1)[0]
    assert len(text) >= 40 and set(text) <= set(vocab.chars)
    resumed = train(tmp_path, alphabet_corpus, max_iters=70, eval_interval=30, optimizer="adamw", resume=True)
    assert resumed["step"] == 70
    text = alphabet_corpus.read_text(encoding="utf-8")
    counts = torch.tensor([text.count(c) for c in vocab.chars], dtype=torch.float32)
    rank = torch.empty(len(counts), dtype=torch.long)
    rank[torch.sort(-counts, stable=True).indices] = torch.arange(len(counts))  # most used first, ties by id
    again, _, _ = load_model(tmp_path / "run")
    assert torch.equal(model.lm_head.frequency, counts) and torch.equal(again.lm_head.rank, rank)  # kept on resume
    assert not torch.equal(rank, torch.arange(len(counts)))  # (a ranking that is not the vocabulary's own order)


def test_auto_sizes_with_the_adaptive_head(tmp_path, alphabet_corpus):
    """The probe times the run's own output layer, on a batch drawn from the text's counts."""
    counts = zipf_counts()
    probe = Probe(V, chargpt.config.TrainConfig(max_time=60.0), torch.device("cpu"), torch.float32,
                  others_use=lambda s: 0.0, head=("adaptive", 64, counts))
    assert probe(RUNGS[0]) > 0 and len(probe.samples[RUNGS[0], 0.0]) >= sizing.PROBE_STEPS  # its steps ran


@pytest.mark.parametrize("args,pattern", [
    (["--softmax", "adaptive", "--label-smoothing", "0.1"], r"--label-smoothing needs --softmax full"),
    (["--shortlist", "10"], r"--shortlist 10 needs --softmax adaptive"),
    (["--softmax", "adaptive", "--shortlist", "5000"], r"--shortlist must be at least 0 and below"),
    (["--softmax", "adaptive", "--shortlist", "-3"], r"--shortlist must be 0 or more \(got -3\); 0 picks it from the "
                                                     r"text$"),  # not the 1,114,112 code points of before the corpus
])
def test_what_cannot_go_with_it_is_one_line(tmp_path, alphabet_corpus, args, pattern):
    result = CliRunner().invoke(train_cli, [*TINY_FLAGS, "--max-iters", "2", "--data", str(alphabet_corpus),
                                            "--out-dir", str(tmp_path / "bad"), *args])
    assert_one_line_error(result, pattern)
    assert not (tmp_path / "bad").exists()  # nothing left behind


def test_the_gpt2_export_and_init_from_refuse_it_by_name(tmp_path, alphabet_corpus):
    """(The web page computes it: tests/test_webpage.py.)"""
    train(tmp_path, alphabet_corpus, max_iters=2, eval_interval=1)
    from chargpt.tools import export
    cfg = load_model(tmp_path / "run")[0].config
    with pytest.raises(ConfigError, match=r"softmax\W+adaptive\W+cannot be exported as GPT-2"):
        export.check_exportable(cfg)
    advice = (r"was trained with --softmax adaptive, which a new run cannot start from yet \(its clusters follow "
              r"that run's text\); train from scratch \(drop --init-from\), or start from a run trained with "
              r"--softmax full$")
    for extra in ([], ["--softmax", "full"], ["--softmax", "adaptive"]):  # one advice, whatever --softmax says
        result = CliRunner().invoke(train_cli, [*TINY_FLAGS, "--max-iters", "2", "--data", str(alphabet_corpus),
                                                "--out-dir", str(tmp_path / "more"), "--init-from",
                                                str(tmp_path / "run"), *extra])
        assert_one_line_error(result, advice)


class FixedProbe:
    """sizing.Probe's stand-in: every rung a fixed speed in proportion to its work; keeps the head it was given."""
    made = []

    def __init__(self, vocab_size, cfg, device, dtype, head=("full", 0, None), threads=None):
        self.head, self.quiet_note = head, None
        FixedProbe.made.append(self)

    def __call__(self, rung, dropout=0.0):
        return 0.01 * rung.flops() / RUNGS[0].flops()

    closer = __call__

    def busy_note(self):
        return None


@pytest.mark.parametrize("given,want", [({}, "adaptive"), ({"softmax": "adaptive"}, "adaptive"),
                                       ({"softmax": "full"}, "full"), ({"max_time": 600}, "full")])
def test_auto_sizes_the_output_layer_the_run_trains(tmp_path, monkeypatch, given, want):
    """On a large alphabet with a short budget, --softmax auto (the CPU default) takes the adaptive layer, and with a
    long one the full layer (the adaptive one lost at 600 s on the Tang poems); the layer chosen or given is what the
    probe times, the adaptive one on a batch drawn from the text's counts."""
    from chargpt.training import sizing
    from chargpt.training.trainer import start_run
    rng = random.Random(0)
    chars = [chr(0x4E00 + i) for i in range(5000)]
    text = "".join(chars) + "".join(rng.choices(chars, [1 / (i + 1) for i in range(5000)], k=30_000))
    (tmp_path / "big.txt").write_text(text, encoding="utf-8")
    monkeypatch.setattr(sizing, "Probe", FixedProbe)
    FixedProbe.made.clear()
    said = []
    run = start_run({"data": str(tmp_path / "big.txt"), "out_dir": str(tmp_path / "run"), "max_time": 60,
                     "threads": 1, "dtype": "float32", **given}, log=said.append)
    run.release()
    softmax, shortlist, counts = FixedProbe.made[0].head
    assert run.mcfg.softmax == softmax == want and (counts is not None) == (want == "adaptive")
    assert ("softmax" in given) == (not any(line.startswith("softmax: ") for line in run.sizing_lines))
    if want == "adaptive":
        assert shortlist == run.mcfg.shortlist and run.model.lm_head.frequency.sum() == len(text)


def test_auto_takes_the_adaptive_layer_only_where_it_measured_better():
    from chargpt.training.sizing import ADAPTIVE_MAX_S, ADAPTIVE_MIN_CHARS, pick_softmax
    assert pick_softmax(9728, 150.0, "cpu")[0] == "adaptive"
    assert pick_softmax(ADAPTIVE_MIN_CHARS - 1, 150.0, "cpu")[0] == "full"  # a small alphabet: little to save
    assert pick_softmax(9728, ADAPTIVE_MAX_S + 1, "cpu")[0] == "full"  # a long budget: the full layer wins
    assert pick_softmax(9728, None, "cpu")[0] == "full" and pick_softmax(9728, 150.0, "cuda")[0] == "full"
    assert pick_softmax(9728, 150.0, "cpu", ["--labels"]) == ("full", "--labels")
