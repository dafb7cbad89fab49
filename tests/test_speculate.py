"""Speculative decoding (chargpt/sampling/speculate.py): drafts checked in one forward write exactly the text plain
decoding writes (greedy, sampled with a seed, under constraints), the next-character distribution is the model's
(a chi-square test with drafts forced to be likely and unlikely characters), the KV cache's rollback leaves the cache
plain decoding leaves, the draft sources, auto's meter, and the batches that decode plainly."""

import math
import random

import numpy as np
import pytest
import torch
from helpers import CORPUS_TEXT, MODEL_ALPHABET, TINY_RUN_KW, VOCAB, invoke, random_model

import chargpt
from chargpt.config import SampleSettings
from chargpt.errors import ConfigError
from chargpt.model.transformer import KVCache
from chargpt.sampling import engine
from chargpt.sampling.constraints import plan
from chargpt.sampling.decode import decode
from chargpt.sampling.engine import Generator
from chargpt.sampling.speculate import (
    MATCH_CAP,
    MIN_CHARS_PER_VERIFY,
    PAUSE,
    PROBE,
    REPROBE,
    WINDOW,
    CorpusLookup,
    Drafts,
    Meter,
    PromptLookup,
    TrainingText,
    check_costs,
    decode_speculative,
    id_chars,
    measured_costs,
)
from chargpt.tools.novelty import for_meta, suffix_array


def gens(model=None):
    """The same model with speculation forced on and off."""
    model = model or random_model()
    return (Generator(model, VOCAB, "cpu", speculate="on", threads=1),
            Generator(model, VOCAB, "cpu", speculate="off", threads=1))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run trained here (about a second) on a repetitive corpus, whose samples copy it: corpus drafts are kept."""
    root = tmp_path_factory.mktemp("speculate")
    (root / "corpus.txt").write_text(CORPUS_TEXT, encoding="utf-8")
    kw = {**TINY_RUN_KW, "block_size": 32, "n_embd": 32}
    chargpt.train(data=str(root / "corpus.txt"), out_dir=str(root / "run"), cache_dir=str(root / "cache"),
                  max_iters=150, eval_interval=150, log=lambda *a: None, curves=False, **kw)
    return root / "run"


# --- the text is plain decoding's -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=0.0, ban="e"),
                                dict(temperature=0.0, form="____ ___ _____\\n", ban="a"),
                                dict(temperature=1.0), dict(temperature=0.8, top_k=5, top_p=0.9, min_p=0.05),
                                dict(temperature=1.0, repetition_penalty=1.3, no_repeat_ngram=4)], ids=str)
def test_speculation_writes_the_text_plain_decoding_writes(kw):
    on, off = gens()
    kept = drafted = 0
    for seed, prompt in enumerate(("abcab", "the cat the cat the", "\n")):
        # 60 characters in a 16-character window: drafts kept and dropped, and the window rebuilt on the way
        opts = dict(max_new_tokens=60, seed=seed, **kw)
        assert on.generate(prompt, **opts) == off.generate(prompt, **opts), (prompt, seed)
        kept, drafted = kept + on.drafted.kept, drafted + on.drafted.drafted
    assert kept > 0 or "no_repeat_ngram" in kw  # (that rule bans what a text-so-far draft proposes)


@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=0.0, ban="e", no_repeat_ngram=3),
                                dict(temperature=1.0, repetition_penalty=1.3, top_k=8)], ids=str)
def test_drafts_kept_and_dropped_leave_the_text_and_the_scores_of_plain_decoding(kw):
    model = random_model()
    ctx = torch.tensor([VOCAB.encode("the cat")])
    settings = SampleSettings(max_new_tokens=40, **kw)
    rules = plan(settings, VOCAB, VOCAB.decode(ctx[0].tolist()), score=True)
    plain_steer, spec_steer = (rules.steer(ctx[0].tolist(), 1, 40, "cpu") for _ in range(2))
    plain = list(decode(model, ctx, settings, torch.Generator().manual_seed(1), steer=plain_steer))
    meter = Meter(always=True)
    forced = Drafts([Oracle([int(c) for c in plain])])
    spec = list(decode_speculative(model, ctx, settings, torch.Generator().manual_seed(1), forced, meter,
                                   steer=spec_steer))
    assert torch.equal(torch.cat(spec), torch.cat(plain))
    assert 0 < meter.kept < meter.drafted  # drafts kept and dropped
    for a, b in zip(plain_steer.scores(), spec_steer.scores()):  # the constraints saw the same characters
        assert a is None and b is None or torch.allclose(a, b, atol=1e-5)


def test_a_trained_model_copies_with_drafts_from_its_training_text_and_writes_the_same(run):
    for_meta(chargpt.load(run, device="cpu").meta, log=lambda m: None)  # its novelty index, as --novelty builds it
    on = chargpt.load(run, device="cpu", dtype="float32", speculate="on", threads=1)
    off = chargpt.load(run, device="cpu", dtype="float32", speculate="off", threads=1)
    assert on._draft_index()  # the training text drafts
    for opts in (dict(temperature=0.0), dict(temperature=0.8, seed=3), dict(temperature=0.0, ban="q")):
        text = on.generate("To be", max_new_tokens=120, **opts)
        assert text == off.generate("To be", max_new_tokens=120, **opts)
    stats = on.drafted.stats()
    assert stats["kept"] > 0.5 * stats["chars"], stats  # most characters came from drafts


def test_a_seed_reproduces_a_speculative_sample():
    on, _ = gens()
    opts = dict(max_new_tokens=50, temperature=0.9)
    assert on.generate("abcab", seed=5, **opts) == on.generate("abcab", seed=5, **opts)
    assert on.generate("abcab", seed=5, **opts) != on.generate("abcab", seed=6, **opts)


def test_a_generator_shared_by_calls_is_left_where_plain_decoding_leaves_it():
    """Each drafted position's choice uses the uniform plain decoding would use there, drawn for all of a check's
    positions at once: the ones past a dropped draft character are handed back, so the next call (sharing the
    generator, as a REPL does without --seed) writes what plain decoding's next call writes."""
    model = random_model()
    ctx = torch.tensor([VOCAB.encode("the cat")])
    settings = SampleSettings(max_new_tokens=40, temperature=1.0)
    plain_gen, spec_gen = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    for _ in range(3):
        plain = torch.cat(list(decode(model, ctx, settings, plain_gen)))
        meter = Meter(always=True)
        spec = torch.cat(list(decode_speculative(model, ctx, settings, spec_gen, Drafts([Oracle(plain.tolist())]),
                                                 meter)))
        assert torch.equal(spec, plain)
        assert 0 < meter.kept < meter.drafted  # drafts kept and dropped
    assert torch.equal(plain_gen.get_state(), spec_gen.get_state())


def test_a_consumer_that_stops_mid_check_leaves_the_generator_where_plain_decoding_leaves_it():
    """A check's uniforms are drawn at once; where the consumer stops before the check's last character (a stop
    string), the ones after the character it took are handed back as it closes the steps."""
    model = random_model()
    ctx = torch.tensor([VOCAB.encode("the cat")])
    settings = SampleSettings(max_new_tokens=30, temperature=1.0)
    text = torch.cat(list(decode(model, ctx, settings, torch.Generator().manual_seed(4)))).tolist()
    for took in range(1, 30):
        plain_gen, spec_gen = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
        for steps in (decode(model, ctx, settings, plain_gen),
                      decode_speculative(model, ctx, settings, spec_gen, Drafts([Oracle(text)]), Meter(always=True))):
            assert [int(c) for _, c in zip(range(took), steps)] == text[:took]
            steps.close()
        assert torch.equal(plain_gen.get_state(), spec_gen.get_state()), took
    gen = torch.Generator().manual_seed(4)  # closed only after the generator drew for something else: left alone
    steps = decode_speculative(model, ctx, settings, gen, Drafts([Oracle(text)]), Meter(always=True))
    next(steps), next(steps)  # the second: the first of a check's characters
    torch.rand(3, generator=gen)
    drawn = gen.get_state()
    steps.close()
    assert torch.equal(gen.get_state(), drawn)


# --- the distribution is the model's --------------------------------------------------------------------------------
class Forced:
    """A draft source that proposes the same characters whatever the text: a stand-in for drafts that are right or
    wrong as often as a test needs."""

    def __init__(self, draft):
        self.draft = draft

    def add(self, c, live=True):
        pass

    def propose(self, k):
        return 99, self.draft[:k]


class Oracle:
    """A draft source that knows the text to come and drafts it with its 3rd character wrong: drafts kept and
    dropped, for sure."""

    def __init__(self, text):
        self.text, self.at = text, 0

    def add(self, c, live=True):
        self.at += 1

    def propose(self, k):
        draft = self.text[self.at:self.at + k]
        if len(draft) >= 3:
            draft[2] = (draft[2] + 1) % len(MODEL_ALPHABET)
        return 99, draft


def chi_square_critical(df, z=3.719):
    """The chi-square value a fit exceeds with probability about 1e-4 (z: the normal's 1 - 1e-4 quantile), by
    Wilson and Hilferty's cube-root approximation."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("likely", [True, False], ids=["likely-draft", "unlikely-draft"])
def test_the_characters_after_a_checked_draft_follow_the_model(likely):
    """The 2nd and 3rd characters are chosen at drafted positions; their joint distribution, over 1,000 seeds, fits
    the model's exact one (computed by one batched forward over every first two characters). Keeping a draft without
    the check, or choosing from the whole distribution after a dropped one, fails it by far."""
    model = random_model(seed=3)
    prompt = torch.tensor([VOCAB.encode("the ")])
    V, T = len(MODEL_ALPHABET), prompt.size(1)
    with torch.no_grad():
        p1 = torch.softmax(model(prompt)[0][0, -1], -1)  # (V,)
        two = torch.cat([prompt.expand(V, T), torch.arange(V)[:, None]], 1)
        p2 = torch.softmax(model(two)[0][:, -1], -1)  # (V, V): c2 given c1
        three = torch.cat([two.repeat_interleave(V, 0), torch.arange(V).repeat(V)[:, None]], 1)
        p3 = torch.softmax(model(three)[0][:, -1], -1).view(V, V, V)  # c3 given c1, c2
    joint = torch.einsum("a,ab,abc->bc", p1, p2, p3).double()  # (c2, c3), c1 summed out
    pair = torch.einsum("a,ab->b", p1, p2)
    c2 = int(pair.argmax()) if likely else int(pair.argsort()[V // 2])
    c3 = int(joint[c2].argmax()) if likely else int(joint[c2].argsort()[V // 3])
    settings = SampleSettings(max_new_tokens=4, temperature=1.0)  # after the 1st, 2 drafted and 1 more
    n, counts = 1000, torch.zeros(V, V, dtype=torch.float64)
    for seed in range(n):
        out = decode_speculative(model, prompt, settings, torch.Generator().manual_seed(seed),
                                 Drafts([Forced([c2, c3])]))
        ids = [int(t) for t in out]
        counts[ids[1], ids[2]] += 1
    expected = joint * n
    big = expected >= 5
    cells = torch.cat([counts[big], counts[~big].sum()[None]])
    want = torch.cat([expected[big], expected[~big].sum()[None]])
    chi2 = float(((cells - want) ** 2 / want).sum())
    assert chi2 < chi_square_critical(len(cells) - 1), (chi2, len(cells))


# --- the cache ------------------------------------------------------------------------------------------------------
def test_a_rolled_back_cache_is_the_cache_of_plain_decoding():
    model = random_model()
    ids = torch.tensor([VOCAB.encode("hello wor")])
    plain, spec = KVCache(model.config, 1), KVCache(model.config, 1)
    with torch.no_grad():
        model(ids[:, :4], cache=plain)
        steps = [model(ids[:, t:t + 1], cache=plain)[0][:, -1] for t in range(4, 7)]  # 3 characters kept
        model(ids[:, :4], cache=spec)
        rows = model.verify(ids[:, 4:], cache=spec)  # 5 fed: 3 kept, 2 dropped
        assert spec.pos == 9
        spec.rollback(7)
        assert spec.pos == plain.pos == 7
        for a, b in zip(plain.k + plain.v, spec.k + spec.v):
            assert torch.allclose(a, b, atol=1e-6) and not b[:, :, 7:].any()  # the dropped positions: as never written
        assert torch.allclose(torch.stack(steps, 1), rows[:, :3], atol=1e-5)  # the verify's logits: each step's
        nxt = torch.tensor([[3]])
        assert torch.allclose(model(nxt, cache=plain)[0], model(nxt, cache=spec)[0], atol=1e-5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_decoding_past_the_window_rebuilds_the_cache_as_plain_decoding_does(temperature):
    """The window rebuilt from its last characters in the same forward as the next draft's check: the text is
    plain decoding's, greedy and sampled."""
    model = random_model()
    ctx = torch.tensor([VOCAB.encode("abcabcabcabca")])  # 13 of a 16-character window: drafts meet its end
    settings = SampleSettings(max_new_tokens=70, temperature=temperature)
    plain = torch.stack(list(decode(model, ctx, settings, torch.Generator().manual_seed(0))), 1)
    meter = Meter(always=True)
    steps = decode_speculative(model, ctx, settings, torch.Generator().manual_seed(0),
                               Drafts([Oracle(plain[0].tolist())]), meter)
    assert torch.equal(torch.stack(list(steps), 1), plain)
    assert meter.kept > 20  # drafts checked across several rebuilds (every 4 characters past the 16th)


@pytest.mark.parametrize("keep, pin", [(2, 8), (4, 6)])
def test_a_rebuilt_window_whose_pinned_start_is_longer_than_keep_leaves_room_for_the_draft(keep, pin):
    """Where the pinned start (a label, an infill's context) is longer than `keep`, the rebuilt window is that start
    (as plain decoding rebuilds it), not `keep` characters: the draft checked with it fits what is left of the
    window."""
    model = random_model()
    ctx = torch.tensor([VOCAB.encode("abcabcabcabca")])
    settings = SampleSettings(max_new_tokens=40, temperature=1.0)
    plain = torch.stack(list(decode(model, ctx, settings, torch.Generator().manual_seed(0), keep=keep, pin=pin)), 1)
    meter = Meter(always=True)
    steps = decode_speculative(model, ctx, settings, torch.Generator().manual_seed(0),
                               Drafts([Oracle(plain[0].tolist())]), meter, keep=keep, pin=pin)
    assert torch.equal(torch.stack(list(steps), 1), plain)
    assert meter.kept > 0


# --- the draft sources ----------------------------------------------------------------------------------------------
def test_prompt_lookup_drafts_what_followed_the_longest_earlier_match():
    look = PromptLookup(VOCAB.encode("the cat sat\nthe dog sat\nthe c"))
    assert VOCAB.decode(look.propose(8)[1]) == "at sat\nt"
    look = PromptLookup(VOCAB.encode("abcdef"))
    assert look.propose(8) == (0, [])  # nothing repeats
    look = PromptLookup(VOCAB.encode("xyzababab"))
    assert VOCAB.decode(look.propose(5)[1]) == "ababa"  # on past the text's end with the match's period


def test_corpus_lookup_drafts_what_most_often_followed_the_longest_match_in_the_training_text():
    corpus = np.array(VOCAB.encode("the cat sat on the mat and the cat ran and the cat sat down and the cat sat up "),
                      dtype=np.uint8)
    same = np.arange(len(VOCAB))
    look = CorpusLookup(TrainingText(corpus, suffix_array(corpus), same, same), VOCAB.encode("so the c"))
    depth, draft = look.propose(8)
    assert depth == len(" the c") and VOCAB.decode(draft).startswith("at sat ")  # 2 of 3 occurrences go on "sat"
    for c in VOCAB.encode("at r"):  # followed one character at a time
        look.add(c)
    assert VOCAB.decode(look.propose(4)[1]) == "an a"
    look.add(VOCAB.stoi["x"])  # in no occurrence: the longest suffix that occurs (none here)
    assert look.propose(4) == (0, [])
    for c in VOCAB.encode(" the mat"):  # drafting paused: found again when it resumes
        look.add(c, live=False)
    assert look.propose(4) == (len(" the mat"), VOCAB.encode(" and"))


def test_corpus_lookup_after_a_match_longer_than_it_searches_again_finds_the_longest_that_occurs():
    """A match grows past the MATCH_CAP characters searched again; where it then ends, the longest suffix of the
    last MATCH_CAP characters that occurs is found, not only of the characters past the match's first MATCH_CAP."""
    line = "the quick brown fox jumps over the lazy cat"  # 43 characters
    tail = line[-20:]  # the cat ... in the corpus a second time, then x (after a newline: nothing longer matches)
    corpus = np.array(VOCAB.encode(line + "\n" + tail + "x"), dtype=np.uint8)
    same = np.arange(len(VOCAB))
    look = CorpusLookup(TrainingText(corpus, suffix_array(corpus), same, same), [])
    for c in VOCAB.encode(line):
        look.add(c)
    assert look.depth == len(line) > MATCH_CAP
    look.add(VOCAB.stoi["x"])  # the whole line then x is nowhere: the tail then x is
    assert look.depth == len(tail) + 1


def test_corpus_lookup_finds_matches_in_a_vocabulary_past_the_surrogate_code_points():
    """The training text is searched as a str of one character per id (id_chars); ids from 0xD800 on skip the
    surrogates a str cannot hold and keep their order, so a vocabulary of 60,000 characters drafts as one of 60."""
    a, b, c, d = 0xD7F5, 0xD804, 0xD818, 0xD7F1  # b and c: past 0xD800
    ids = [a, b, c, a, b, c, a, b, d]
    corpus = np.array(ids, dtype=np.int64)
    same = np.arange(0xD820)
    text = id_chars(corpus)
    assert sorted(range(len(ids)), key=lambda i: text[i:]) == suffix_array(corpus).tolist()
    look = CorpusLookup(TrainingText(corpus, suffix_array(corpus), same, same), [d, a, b])
    assert look.propose(3) == (2, [c, a, b])  # a b goes on c twice, d once; then a b c a b each time



def test_a_pattern_ends_its_sample_under_speculation_as_under_plain_decoding():
    """A pattern's end is chosen as the id past the vocabulary; the constraints give back the character to feed
    instead (steer.chose), which is what the draft sources learn and what is yielded, as in plain decoding: the
    training text's lookup has no character for the end itself."""
    model = random_model()
    corpus = np.array(VOCAB.encode("abcabcab cab cabcab abcab "), dtype=np.uint8)
    same = np.arange(len(VOCAB))
    ids = VOCAB.encode("the cat")
    settings = SampleSettings(max_new_tokens=12, temperature=1.0, regex="[a-c]{3,5}")
    rules = plan(settings, VOCAB, "the cat")

    def steps(decoder, seed, *args):  # -> (the id, whether the pattern ended there) per step
        steer = rules.steer(ids, 1, 12, "cpu")
        return [(int(nxt), bool(steer.stuck_now)) for nxt in decoder(
            model, torch.tensor([ids]), settings, torch.Generator().manual_seed(seed), *args, steer=steer)]
    for seed in (1, 2, 3):  # seeds whose sample chooses the end after 3 or 4 characters
        plain = steps(decode, seed)
        spec = steps(decode_speculative, seed, Drafts([PromptLookup(ids), CorpusLookup(
            TrainingText(corpus, suffix_array(corpus), same, same), ids)]), Meter(always=True))
        assert spec == plain
        assert any(ended for _, ended in plain[:5])  # the pattern ended
# --- when it speculates ---------------------------------------------------------------------------------------------
def test_batches_and_guidance_decode_plainly(monkeypatch):
    on, _ = gens()
    monkeypatch.setattr(engine, "decode_speculative", lambda *a, **k: pytest.fail("speculated"))
    on.generate("ab", max_new_tokens=5, num_samples=2, seed=1)
    on.generate("ab", max_new_tokens=5, best_of=2, seed=1)
    on.generate("ab", max_new_tokens=5, seed=1, use_cache=False)
    assert not on.speculates(rows=1, guided=True)
    assert not Generator(random_model(), VOCAB, "cpu", speculate="off").speculates()
    assert not Generator(random_model(), VOCAB, "cpu").speculates()  # off unless asked for
    assert Generator(random_model(), VOCAB, "cpu", speculate="auto").speculates()  # auto, on a CPU


class Clock:
    """A clock a test moves: each round of decoding takes the seconds it is told."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def rounds(meter, clock, n, seconds, drafted=4, kept=0):
    for _ in range(n):
        clock.now += seconds
        meter.record(drafted, kept)


def test_auto_judges_drafts_by_the_clock_against_plain_decoding_and_pauses_where_they_do_not_pay():
    """A plain step takes 1 s here and a verify 1.5 s: drafting pays where a verify writes more than 1.5
    characters, whatever MIN_CHARS_PER_VERIFY says (the bar only before plain decoding has been timed)."""
    clock = Clock()
    meter = Meter(clock=clock)
    rounds(meter, clock, WINDOW, 1.5, kept=0)  # 1 character per verify, nothing timed yet: below the bar
    assert not meter.on and meter.pause == PAUSE and MIN_CHARS_PER_VERIFY > 1
    rounds(meter, clock, PAUSE, 1.0, drafted=0)  # paused: plain steps, timed
    assert meter.on and meter.plain == pytest.approx(1.0)
    rounds(meter, clock, WINDOW, 1.5, kept=1)  # 2 characters per verify, below the bar, yet 0.75 s a character
    assert meter.on and meter.wait == PAUSE  # it paid: the next pause back to its shortest
    rounds(meter, clock, WINDOW, 1.5, kept=0)  # 1.5 s a character: slower than plain
    assert not meter.on and meter.pause == PAUSE and meter.wait == 2 * PAUSE
    rounds(meter, clock, PAUSE, 1.0, drafted=0)
    rounds(meter, clock, WINDOW // 2, 1.5, kept=0)  # a dip inside a block that pays on the whole does not pause
    rounds(meter, clock, WINDOW // 2, 1.5, kept=4)
    assert meter.on
    for _ in range(REPROBE - 1):
        rounds(meter, clock, WINDOW, 1.5, kept=3)
    assert not meter.on and meter.pause == PROBE  # paying blocks: plain decoding timed again, briefly
    rounds(meter, clock, PROBE, 0.5, drafted=0)  # the machine got faster: plain steps now cost 0.5 s
    assert meter.on and meter.plain == pytest.approx(0.5)
    always = Meter(always=True, clock=clock)
    rounds(always, clock, 3 * WINDOW, 1.5, kept=0)
    assert always.on


def test_auto_times_plain_decoding_before_it_judges_drafts_that_clear_the_bar():
    clock = Clock()
    meter = Meter(clock=clock)
    rounds(meter, clock, WINDOW, 1.0, kept=3)  # 4 characters per verify: above the bar, but nothing to compare
    assert not meter.on and meter.pause == PROBE and meter.wait == PAUSE
    rounds(meter, clock, PROBE, 0.2, drafted=0)  # plain steps of 0.2 s: faster than 0.25 s a drafted character
    rounds(meter, clock, WINDOW, 1.0, kept=3)
    assert not meter.on and meter.pause == PAUSE


def test_the_draft_length_is_the_one_whose_round_writes_fastest_by_measured_costs_and_kept_shares():
    """A check's cost climbs in steps of four positions here (as a CPU kernel's block of rows at a time): where
    three drafted characters in four are kept, a draft ends at a step's last position (7, not 8 to 11); where all
    are kept it is as long as allowed; where the first is never kept, within the first step; where the third never
    is, 2 or 3 (the third costs nothing more). The rest of a round's time is measured as rounds go."""
    steps = [1.0, 1.1, 1.1, 1.1] + [1.3] * 4 + [1.5] * 4  # a d-character draft: a check of d + 1 positions

    def meter_after(kept_in_rounds, seconds):
        clock = Clock()
        meter = Meter(always=True, clock=clock)
        meter.costs = steps
        for kept in kept_in_rounds:
            clock.now += seconds
            meter.record(11, kept)
        return meter
    rng = random.Random(0)
    three_in_four = [next(k for k in range(12) if k == 11 or rng.random() > 0.75) for _ in range(400)]
    meter = meter_after(three_in_four, 1.5)  # a round takes its check's time: nothing besides
    assert meter.overhead == pytest.approx(0.0, abs=1e-9)
    assert meter.draft_chars(11) == 7 and meter.draft_chars(3) == 3
    assert meter_after([11] * 64, 1.5).draft_chars(11) == 11
    assert meter_after([0] * 64, 1.5).draft_chars(11) <= 3  # within the cheapest step: no longer than it costs
    meter = meter_after([2] * 64, 2.0)  # the first two kept, never the third; half a second besides the check
    assert meter.draft_chars(11) in (2, 3)
    shares = meter.kept_shares()
    assert shares[1] > 0.9 and shares[2] > 0.9 and shares[3] < 0.1
    assert meter.overhead == pytest.approx(0.5, rel=0.2)


def test_a_check_costs_its_positions_measured_here_once_per_model():
    model = random_model()
    costs = check_costs(model, torch.device("cpu"), most=11)  # a check of 1 .. 12 positions in a 16-character window
    assert len(costs) == 12 and all(0 < c < 1 for c in costs)
    assert len(check_costs(model, torch.device("cpu"), most=40)) == model.config.block_size - 1  # the window bounds it
    assert all(0 < c < 1 for c in check_costs(model, torch.device("cpu"), budget_s=0.0))  # one timed round at least
    first = measured_costs(model, torch.device("cpu"), torch.float32, 5)
    assert measured_costs(model, torch.device("cpu"), torch.float32, 5) is first and len(first) == 6


def test_auto_drafts_from_the_training_text_only_once_its_index_is_built(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(CORPUS_TEXT, encoding="utf-8")
    chargpt.train(data=str(corpus), out_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"), max_iters=2,
                  eval_interval=2, log=lambda *a: None, curves=False, **TINY_RUN_KW)
    before = sorted(p.name for p in (tmp_path / "cache").iterdir())
    auto = chargpt.load(tmp_path / "run", device="cpu")
    auto.generate("To", max_new_tokens=5, seed=1)
    assert auto._draft_index() is False
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == before  # nothing built or written
    said = []
    on = chargpt.load(tmp_path / "run", device="cpu", speculate="on")
    on.log = said.append
    on.generate("To", max_new_tokens=5, seed=1)
    assert on._draft_index() and any("indexing" in s for s in said)  # on builds it, once per corpus
    assert chargpt.load(tmp_path / "run", device="cpu")._draft_index()  # and auto finds it from then on


def test_a_bad_speculate_value_is_one_line_naming_the_choices(run):
    with pytest.raises(ConfigError, match="speculate.* takes auto, on or off, got 'fast'"):
        chargpt.load(run, speculate="fast")


def test_the_load_line_says_whether_it_speculates(run):
    from chargpt.cli.core import sample_cli
    result = invoke(sample_cli, ["--checkpoint", run, "--device", "cpu", "--max-new-tokens", "5", "--seed", "1",
                                 "--speculate", "on", "--threads", "1"])
    assert result.exit_code == 0, result.output
    assert "speculation on (one sample at a time; more decode plainly)" in result.stderr
    result = invoke(sample_cli, ["--checkpoint", run, "--device", "cpu", "--max-new-tokens", "5", "--seed", "1",
                                 "--speculate", "off", "--threads", "1"])
    assert "speculation" not in result.stderr


def test_a_json_sample_says_how_many_of_its_characters_came_from_drafts(run):
    import json

    from chargpt.cli.core import sample_cli
    args = ["--checkpoint", run, "--device", "cpu", "--max-new-tokens", "60", "--seed", "1", "--temperature", "0",
            "--threads", "1", "--json", "--prompt", CORPUS_TEXT[:20]]
    result = invoke(sample_cli, [*args, "--speculate", "on"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout.splitlines()[0])
    drafts = record["drafts"]
    assert drafts["chars"] == len(record["text"]) == 60 and 0 < drafts["kept"] <= drafts["drafted"]
    assert drafts["verifies"] >= 1 and drafts["kept"] + drafts["verifies"] <= drafts["chars"]
    plain = json.loads(invoke(sample_cli, [*args, "--speculate", "off"]).stdout.splitlines()[0])
    assert "drafts" not in plain and plain["text"] == record["text"]  # a plain decode has nothing to report


def test_a_labelled_run_speculates_with_its_label_kept_in_the_window(tmp_path):
    """A run trained with --labels: the label stays first in the window as it slides (pin) and its characters are
    never written (never); unguided, one sample speculates and writes plain decoding's text."""
    for label, letters in (("a", "abc "), ("b", "xyz\n")):
        (tmp_path / "authors" / label).mkdir(parents=True)
        (tmp_path / "authors" / label / "1.txt").write_text((letters * 3 + letters[::-1] * 2) * 60)
    chargpt.train(**{**TINY_RUN_KW, "n_embd": 32}, data=tmp_path / "authors", labels="folders",
                  out_dir=tmp_path / "run", cache_dir=tmp_path / "cache", max_iters=60, eval_interval=60,
                  curves=False, log=lambda *a: None)
    on = chargpt.load(tmp_path / "run", device="cpu", dtype="float32", speculate="on", threads=1)
    off = chargpt.load(tmp_path / "run", device="cpu", dtype="float32", speculate="off", threads=1)
    for opts in (dict(temperature=0.0), dict(temperature=0.9, seed=2)):
        # 50 characters: past the context of 16, so the window slides and keeps the label
        assert on.generate("", label="a", max_new_tokens=50, **opts) == off.generate("", label="a", max_new_tokens=50,
                                                                                    **opts)
        assert on.drafted.kept > 0


def test_the_decode_bench_tables_speculation_on_a_trained_run(run):
    """`chargpt bench --only decode --checkpoint RUN`'s speculation part: what a check of each length costs here, and
    a row per prompt and temperature with the speeds off, on and auto, characters per verify and whether the texts
    agreed."""
    import argparse

    from chargpt.bench.speculation import speculation_rows
    lines = speculation_rows(argparse.Namespace(checkpoint=str(run), threads=1), torch.device("cpu"), 20, rounds=1)
    costs = next(line for line in lines if line.startswith("a check of 1 .. "))
    assert costs.split(" costs ")[1].startswith("1.00, ")
    table = [line for line in lines if line.startswith("| ") and "x |" in line]
    assert len(table) == 6 and all(line.endswith("| 1 of 1 |") for line in table if "| 0 |" in line)
    assert "random" in speculation_rows(argparse.Namespace(checkpoint=None, threads=1), torch.device("cpu"), 20)[0]


def test_calls_that_decode_at_once_each_write_plain_decodings_text_and_count_their_own_rounds():
    """A server decodes several requests at once through one Generator: each call gets its own Meter (what earlier
    calls learned carried on), so the calls neither mix their rounds' counts nor their clocks, and each writes the
    text plain decoding writes."""
    import threading
    on, off = gens()
    first = on.generate("the cat", max_new_tokens=30, temperature=1.0, seed=1)
    meter = on.drafted
    on.generate("the cat", max_new_tokens=30, temperature=1.0, seed=1)
    assert on.drafted is not meter and on.drafted.costs is meter.costs and first == off.generate(
        "the cat", max_new_tokens=30, temperature=1.0, seed=1)
    texts, start = {}, threading.Barrier(4)

    def write(seed):
        start.wait()
        texts[seed] = on.generate("the cat", max_new_tokens=60, temperature=1.0, seed=seed)

    threads = [threading.Thread(target=write, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert texts == {seed: off.generate("the cat", max_new_tokens=60, temperature=1.0, seed=seed) for seed in range(4)}
