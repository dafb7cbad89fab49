"""Decoding: sample_next against plain references, cached against uncached decoding, stop strings, the
unknown-character policies and the Generator API. Models are tiny and built in memory."""

import inspect
import random
from dataclasses import fields

import pytest
import torch
from helpers import MODEL_ALPHABET, MODEL_BLOCK, VOCAB, counter_gen, counter_model, need, random_model

from chargpt import runtime
from chargpt.config import SampleSettings
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, ConfigError
from chargpt.model.transformer import KVCache
from chargpt.runtime import DECODE_COMPILE_MIN_CHARS, cpp_compiler, pick_decode_compile
from chargpt.sampling.constraints import NgramBan, plan, repetition_penalty
from chargpt.sampling.decode import StepRunner, StopFilter, decode, sample_next
from chargpt.sampling.engine import Generator
from chargpt.sampling.options import SampleOptions


def run(model, ctx, seed=0, use_cache=True, runner=None, **settings):
    """decode() collected into (B, N) ids."""
    steps = decode(model, ctx, SampleSettings(**settings), torch.Generator().manual_seed(seed), use_cache=use_cache,
                   runner=runner)
    return torch.stack(list(steps), dim=1)


SETTINGS = [dict(temperature=0.0), dict(temperature=1.0), dict(temperature=1.0, top_k=5),
            dict(temperature=1.0, top_p=0.9), dict(temperature=0.7, top_k=8, top_p=0.8)]


# --- cached against uncached -----------------------------------------------------------------------------
@pytest.mark.parametrize("kernel", ["fused", "manual"])
@pytest.mark.parametrize("settings", SETTINGS, ids=str)
def test_cached_equals_uncached_within_block(kernel, settings):
    model = random_model()
    model.set_attention(kernel)
    for seed, T in enumerate((1, 5, 12)):
        ctx = torch.randint(len(MODEL_ALPHABET), (2, T), generator=torch.Generator().manual_seed(seed))
        within = MODEL_BLOCK - T + 1  # the last of these is chosen from a full window of MODEL_BLOCK characters
        cached = run(model, ctx, seed, use_cache=True, max_new_tokens=within, **settings)
        assert torch.equal(cached, run(model, ctx, seed, use_cache=False, max_new_tokens=within, **settings))
        # crossing block_size: identical up to the window's edge, and decoding goes on
        long = run(model, ctx, seed, use_cache=True, max_new_tokens=3 * MODEL_BLOCK, **settings)
        assert long.shape == (2, 3 * MODEL_BLOCK) and torch.equal(long[:, :within], cached)


# --- the static decode step: the same shapes at every position ----------------------------------------------
def step_logits(model, idx, runner):
    """Prefill idx[:, :3] with the model's forward, then each next column through `runner` -> (B, T-3, V)."""
    cache = KVCache(model.config, idx.size(0))
    with torch.no_grad():
        out = [model(idx[:, :3], cache=cache)[0][:, -1]]
        out += [runner(idx[:, t:t + 1], cache) for t in range(3, idx.size(1) - 1)]
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kernel", ["fused", "manual"])
def test_static_step_gives_the_growing_caches_logits_and_text(kernel):
    """CharGPT.decode_step attends over the whole cache with the unfilled positions masked: the logits of the
    cached forward, and so the same text, within the window and across its rebuilds."""
    model = random_model()
    model.set_attention(kernel)
    idx = torch.randint(len(MODEL_ALPHABET), (2, MODEL_BLOCK), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(idx)[0][:, 2:-1]  # the logits after positions 2 .. MODEL_BLOCK-2
    torch.testing.assert_close(step_logits(model, idx, StepRunner(model)), full, rtol=1e-5, atol=1e-5)
    for seed, settings in enumerate(SETTINGS):
        ctx = torch.randint(len(MODEL_ALPHABET), (2, 3), generator=torch.Generator().manual_seed(seed))
        want = run(model, ctx, seed, max_new_tokens=3 * MODEL_BLOCK, **settings)
        assert torch.equal(run(model, ctx, seed, runner=StepRunner(model), max_new_tokens=3 * MODEL_BLOCK, **settings),
                           want)


@pytest.mark.skipif(cpp_compiler() is None, reason="torch.compile on a CPU needs a C++ compiler")
def test_compiled_step_computes_what_the_eager_step_does():
    """torch.compile'd once, the step serves every position (the same logits as eager, to rounding) and a new
    KVCache, without compiling again."""
    model = random_model()
    idx = torch.randint(len(MODEL_ALPHABET), (1, MODEL_BLOCK), generator=torch.Generator().manual_seed(2))
    eager, compiled = StepRunner(model), StepRunner(model, compiled=True)
    want = step_logits(model, idx, eager)
    torch.testing.assert_close(step_logits(model, idx, compiled), want, rtol=1e-4, atol=1e-4)
    torch._dynamo.utils.counters.clear()
    torch.testing.assert_close(step_logits(model, idx, compiled), want, rtol=1e-4, atol=1e-4)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 0  # nothing compiled the second time


def test_the_generator_compiles_the_static_step_only_when_asked_or_when_it_pays(monkeypatch):
    """Eager decoding keeps the growing cache (it reads only the positions so far); a compiled step is made once."""
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: "/usr/bin/g++")
    auto = Generator(random_model(), VOCAB, "cpu")
    assert auto.decode_runner(500) == (None, pick_decode_compile("auto", torch.device("cpu"), 500)[1])
    runner, reason = auto.decode_runner(DECODE_COMPILE_MIN_CHARS)
    assert runner.compiled and "repay compiling" in reason and auto.decode_runner(10**6)[0] is runner
    on = Generator(random_model(), VOCAB, "cpu", compile="on")
    assert on.decode_runner(1)[0].compiled  # made, not yet compiled: that happens on its first call
    assert Generator(random_model(), VOCAB, "cpu", compile="off").decode_runner(10**6)[0] is None


def test_compile_auto_compiles_the_decode_step_only_where_it_pays(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: "/usr/bin/g++")
    assert not pick_decode_compile("auto", cpu, 500)[0]  # sample.py's default length: eager
    assert pick_decode_compile("auto", cpu, DECODE_COMPILE_MIN_CHARS)[0]
    assert not pick_decode_compile("auto", cpu, DECODE_COMPILE_MIN_CHARS, quantized=True)[0]
    assert not pick_decode_compile("auto", cuda, 10**6)[0]  # not measured there
    assert pick_decode_compile("on", cpu, 1)[0] and not pick_decode_compile("off", cpu, 10**6)[0]
    with pytest.raises(ConfigError, match="int8"):
        pick_decode_compile("on", cpu, 1, quantized=True)
    monkeypatch.setattr(runtime, "cpp_compiler", lambda: None)
    assert not pick_decode_compile("auto", cpu, 10**6)[0]
    with pytest.raises(ConfigError, match="C\\+\\+ compiler"):
        pick_decode_compile("on", cpu, 1)


def test_uncached_decode_is_the_plain_loop():
    """The reference path is nanoGPT's generate: a full forward over the last block_size characters."""
    model, ctx = random_model(), torch.tensor([[3, 4, 5]])
    gen, seq = torch.Generator().manual_seed(3), ctx
    for _ in range(2 * MODEL_BLOCK):
        with torch.no_grad():
            logits = model(seq[:, -MODEL_BLOCK:])[0][:, -1, :]
        seq = torch.cat([seq, sample_next(logits, gen, 1.0, top_k=6)[:, None]], dim=1)
    assert torch.equal(run(model, ctx, 3, use_cache=False, max_new_tokens=2 * MODEL_BLOCK, top_k=6, temperature=1.0),
                       seq[:, 3:])


def test_cached_decode_follows_the_documented_window_strategy():
    """Past block_size the cache is rebuilt from the last `keep` characters; until the next rebuild each step
    sees the text from that point on. Checked against full forwards over exactly those windows."""
    model, ctx, keep = random_model(), torch.tensor([[1, 2, 3, 4, 5]]), 10
    gen, seq, start = torch.Generator().manual_seed(5), ctx, 0
    for _ in range(4 * MODEL_BLOCK):
        if seq.size(1) - start > MODEL_BLOCK:
            start = seq.size(1) - keep
        with torch.no_grad():
            logits = model(seq[:, start:])[0][:, -1, :]
        seq = torch.cat([seq, sample_next(logits, gen, 1.0)[:, None]], dim=1)
    steps = decode(model, ctx, SampleSettings(max_new_tokens=4 * MODEL_BLOCK, temperature=1.0),
                   torch.Generator().manual_seed(5), keep=keep)
    assert torch.equal(torch.stack(list(steps), dim=1), seq[:, 5:])


def test_long_prompt_and_long_generation_stay_exact_for_a_markov_model():
    gen = counter_gen()  # depends on the last character only, so every window gives the same text
    prompt = MODEL_ALPHABET[2:] * 2  # 52 characters, over three windows
    text = gen.generate(prompt, max_new_tokens=100, temperature=0)[0]
    expected = "".join(MODEL_ALPHABET[(MODEL_ALPHABET.index(prompt[-1]) + 1 + i) % len(MODEL_ALPHABET)]
                       for i in range(100))
    assert text == expected
    assert gen.generate(prompt, max_new_tokens=100, temperature=0, use_cache=False)[0] == expected


# --- sample_next against references ------------------------------------------------------------------------
def draws(n=40, seed=0, **kw):
    logits = torch.randn(6, 12, generator=torch.Generator().manual_seed(99))
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([sample_next(logits, gen, **kw) for _ in range(n)]), logits


def test_top_p_one_and_top_k_zero_or_large_equal_plain_sampling():
    plain, _ = draws()
    assert torch.equal(draws(top_p=1.0)[0], plain)
    assert torch.equal(draws(top_k=0)[0], plain)
    assert torch.equal(draws(top_k=1000)[0], plain)  # clamped to the vocabulary
    assert not torch.equal(draws(seed=1)[0], plain)


def test_greedy_limits_equal_argmax():
    ids, logits = draws()
    greedy = logits.argmax(dim=-1).expand_as(ids)
    assert not torch.equal(ids, greedy)  # plain sampling does vary
    assert torch.equal(draws(temperature=0.0)[0], greedy)
    assert torch.equal(draws(top_k=1)[0], greedy)
    assert torch.equal(draws(top_p=1e-6)[0], greedy)
    assert torch.equal(draws(temperature=0.0, top_k=5, top_p=0.5)[0], greedy)
    assert torch.equal(draws(temperature=1e-40)[0], greedy)  # a vanishing temperature tends to greedy, not NaN


def test_top_k_and_top_p_keep_only_their_sets():
    ids, logits = draws(n=200, top_k=3)
    top3 = logits.topk(3, dim=-1).indices
    assert all(int(ids[s, r]) in top3[r].tolist() for s in range(200) for r in range(6))
    ids, logits = draws(n=200, top_p=0.6)
    probs = torch.softmax(logits, dim=-1)
    for r in range(6):
        order = probs[r].argsort(descending=True).tolist()
        mass, nucleus = 0.0, []
        while mass < 0.6:
            nucleus.append(order[len(nucleus)])
            mass += probs[r, nucleus[-1]].item()
        assert set(ids[:, r].tolist()) <= set(nucleus) and len(set(ids[:, r].tolist())) > 1


def test_sampling_follows_the_softmax_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 0.5]])
    ids = sample_next(logits.expand(20000, 5), torch.Generator().manual_seed(0), temperature=1.0)
    freq = torch.bincount(ids, minlength=5).float() / 20000
    assert torch.allclose(freq, torch.softmax(logits[0], dim=-1), atol=0.015)


# --- the Generator API ---------------------------------------------------------------------------------------
def test_same_seed_same_text_and_batches_reproducible_and_distinct():
    gen = Generator(random_model(), VOCAB, "cpu")
    kw = dict(max_new_tokens=40, temperature=1.0, seed=7)
    assert gen.generate("to be", **kw) == gen.generate("to be", **kw)
    assert gen.generate("to be", **kw) != gen.generate("to be", **{**kw, "seed": 8})
    batch = gen.generate("to be", num_samples=3, **kw)
    assert batch == gen.generate("to be", num_samples=3, **kw)
    assert len(set(batch)) == 3 and all(len(t) == 40 for t in batch)


def test_unseeded_sampling_leaves_the_global_rng_alone():
    state = torch.random.get_rng_state()
    Generator(random_model(), VOCAB, "cpu").generate("a", max_new_tokens=5)
    assert torch.equal(torch.random.get_rng_state(), state)


def test_greedy_text_and_empty_prompt():
    gen = counter_gen()
    assert gen.generate("ab", max_new_tokens=5, temperature=0) == ["cdefg"]
    assert gen.generate("", max_new_tokens=3, temperature=0) == [" ab"]  # an empty prompt starts after "\n"
    assert gen.generate("ab", max_new_tokens=0) == [""]


def test_api_exposes_every_decoding_flag_of_the_cli():
    from chargpt.cli import sample_cli
    cli_only = {"checkpoint_path", "prompt_file", "output", "as_json", "interactive", "device", "dtype", "quantize",
                "compile_mode", "threads", "speculate", "no_cache",  # load() takes device ... threads, speculate
                "novelty", "min_span", "novelty_data",  # scoring a sample is chargpt.tools.novelty's, not decoding
                "list_forms",  # --forms lists the named forms (chargpt.sampling.forms.SHAPES)
                "new_only"}  # a list's items: Generator.items takes it
    # the API's options are one SampleOptions (its fields and SampleSettings'), or keywords overriding them
    api = {f.name for f in fields(SampleOptions)} | {f.name for f in fields(SampleSettings)} | \
        set(inspect.signature(Generator.stream).parameters)
    assert {p.name for p in sample_cli.params} - cli_only <= api
    assert {"use_cache", "num_samples", "seed", "unknown", "stop", "min_span"} <= api
    assert {"ban", "allow", "form", "acrostic", "min_p", "repetition_penalty", "no_repeat_ngram", "best_of"} <= api
    assert "copies" in inspect.signature(Generator.decoding).parameters


@pytest.mark.parametrize("bad", [dict(temperature=-0.1), dict(temperature=float("nan")), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(top_k=-1), dict(max_new_tokens=-1), dict(num_samples=0),
                                 dict(stop=("",))], ids=str)
def test_api_rejects_bad_settings(bad):
    with pytest.raises(ChargptError):
        counter_gen().generate("ab", **bad)


# --- stop strings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt,stop,expected", [
    ("ab", ["ef"], "cd"),                 # inside the generated text
    ("ab", ["bcd"], ""),                  # begins in the prompt
    ("xab", ["abc", "zz"], ""),           # begins in the prompt, with a longer stop string held back
    ("abc", ["ab", "zzzz"], "defghijk"),  # wholly inside the prompt: not a stop
    ("ab", ["fgh", "de"], "c"),           # the first to complete wins
    ("ab", ["cdefg", "ef"], "cd"),        # ... even when a longer one began earlier
    ("ab", "ef", "cd"),                   # a lone string is one stop string
    ("ab", ["qq"], "cdefghij"),           # never produced
])
def test_stop_strings_cut_before_the_stop(prompt, stop, expected):
    gen = counter_gen()
    pieces = list(gen.stream(prompt, max_new_tokens=8, temperature=0, stop=stop))
    # what was streamed is exactly the final text: nothing later cut was ever released
    assert "".join(p for _, p in pieces) == expected
    assert gen.generate(prompt, max_new_tokens=8, temperature=0, stop=stop, use_cache=False) == [expected]


def reference_cut(prompt, text, stops):
    """The generated text up to the start of the first stop string to be completed (clamped to the prompt)."""
    for end in range(1, len(text) + 1):
        seen = prompt + text[:end]
        starts = [len(seen) - len(s) for s in stops if seen.endswith(s)]
        if starts:
            return text[:max(0, min(starts) - len(prompt))]
    return text


def test_stop_filter_against_reference_on_random_text():
    rng = random.Random(0)
    for _ in range(400):
        prompt = "".join(rng.choice("abc") for _ in range(rng.randrange(5)))
        text = "".join(rng.choice("abc") for _ in range(rng.randrange(15)))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))]
        f, out, i = StopFilter(prompt, stops), "", 0
        while i < len(text):  # feed in random chunks; the released text must always be a prefix of the result
            n = rng.randint(1, 3)
            out += f.feed(text[i:i + n])
            i += n
            assert reference_cut(prompt, text, stops).startswith(out)
        out += f.flush()
        assert out == reference_cut(prompt, text, stops), (prompt, text, stops)


# --- unknown characters ----------------------------------------------------------------------------------------
def test_unknown_error_names_each_character_and_position():
    with pytest.raises(ChargptError) as e:
        counter_gen().generate("aÉb!", max_new_tokens=1)
    msg = str(e.value)
    assert "\n" not in msg and "'É' (U+00C9) at 1" in msg and "'!' (U+0021) at 3" in msg


def test_unknown_skip_and_replace():
    gen = counter_gen()
    assert gen.prompt_text("aÉb", "skip") == "ab"
    assert gen.generate("aÉb", unknown="skip", max_new_tokens=2, temperature=0) == ["cd"]
    assert "dropped" in gen.unknown_warning("aÉb", "skip") and "at 1" in gen.unknown_warning("aÉb", "skip")
    # replace: the first of U+FFFD, '?', ' ' that the vocabulary has
    assert gen.prompt_text("aÉ", "replace") == "a "
    assert gen.generate("aÉ", unknown="replace", max_new_tokens=2, temperature=0) == ["ab"]
    assert gen.unknown_warning("ab", "skip") == "" and gen.unknown_warning("aÉ", "error") == ""
    qgen = Generator(counter_model(29), Vocab("\n ?abcdefghijklmnopqrstuvwxyz"), "cpu")
    assert qgen.prompt_text("aÉ", "replace") == "a?"


# --- constraints: the repetition controls as transformers defines them, min-p, and nothing when none is given ------
def test_repetition_penalty_is_transformers_on_the_same_logits():
    tf = need("transformers")
    g = torch.Generator().manual_seed(0)
    for penalty in (0.7, 1.3, 2.0):
        ids, scores = torch.randint(12, (3, 9), generator=g), 3 * torch.randn(3, 12, generator=g)
        seen = torch.zeros(3, 12, dtype=torch.bool).scatter(1, ids, True)
        want = tf.RepetitionPenaltyLogitsProcessor(penalty)(ids, scores.clone())
        assert torch.equal(repetition_penalty(scores, seen, penalty), want)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_ngram_ban_is_transformers_no_repeat_ngram_at_every_step(n):
    """Kept up to date one character at a time, it bans what NoRepeatNGramLogitsProcessor bans given the whole
    text (a shared prompt, then each row's own characters)."""
    tf = need("transformers")
    g = torch.Generator().manual_seed(n)
    for prompt_len in (1, 2, 6):
        text = torch.cat([torch.randint(5, (1, prompt_len), generator=g).expand(3, -1),
                          torch.randint(5, (3, 30), generator=g)], dim=1)  # 5 characters: n-grams repeat
        ban = NgramBan(n, text[0, :prompt_len].tolist(), 3)
        for t in range(prompt_len, text.size(1)):
            want = tf.NoRepeatNGramLogitsProcessor(n)(text[:, :t], torch.zeros(3, 5)) == float("-inf")
            got = torch.zeros(3, 5, dtype=torch.bool)
            rows, ids = ban.banned()
            got[rows, ids] = True
            assert torch.equal(got, want), (prompt_len, t)
            ban.add(text[:, t].tolist())


def test_decoding_with_the_repetition_controls_is_transformers_processors_then_sampling():
    """The Generator's text = a plain loop: full forward, transformers' processors on the whole text so far (prompt
    included), then sample_next from the same seed."""
    tf = need("transformers")
    gen, model = Generator(random_model(), VOCAB, "cpu"), random_model()
    procs = tf.LogitsProcessorList([tf.RepetitionPenaltyLogitsProcessor(1.8), tf.NoRepeatNGramLogitsProcessor(2)])
    for seed in range(3):
        seq, rng = torch.tensor([VOCAB.encode("to be")] * 2), torch.Generator().manual_seed(seed)
        for _ in range(MODEL_BLOCK - 5):
            with torch.no_grad():
                logits = model(seq[:, -MODEL_BLOCK:])[0][:, -1, :]
            nxt = sample_next(procs(seq, logits), rng, 0.9, top_k=10)
            seq = torch.cat([seq, nxt[:, None]], dim=1)
        want = [VOCAB.decode(row[5:].tolist()) for row in seq]
        kw = dict(max_new_tokens=MODEL_BLOCK - 5, temperature=0.9, top_k=10, repetition_penalty=1.8,
                  no_repeat_ngram=2, num_samples=2, seed=seed)
        assert gen.generate("to be", use_cache=False, **kw) == want
        assert gen.generate("to be", **kw) == want  # the KV cache changes nothing within the context


def test_min_p_keeps_what_transformers_min_p_keeps():
    tf = need("transformers")
    logits = 2 * torch.randn(4, 12, generator=torch.Generator().manual_seed(3))
    for min_p, temperature in ((0.05, 1.0), (0.3, 0.7), (0.9, 1.5)):
        keep = tf.MinPLogitsWarper(min_p)(None, logits / temperature) > float("-inf")
        ids = sample_next(logits.repeat(500, 1), torch.Generator().manual_seed(0), temperature, min_p=min_p)
        drawn = torch.zeros(4, 12, dtype=torch.bool)
        drawn[torch.arange(4).repeat(500), ids] = True
        assert torch.equal(drawn, keep)  # every kept character drawn at least once, no other
    assert torch.equal(draws(min_p=0.0)[0], draws()[0])


def test_without_a_constraint_nothing_changes_in_the_decode_loop():
    """No rule and no scoring asked for: no Steer at all (the loop does what it did before constraints existed);
    each control's off value counts as not given. The text is the plain loop's."""
    off = dict(ban="", repetition_penalty=1.0, no_repeat_ngram=0, min_p=0.0)  # an empty --allow is an error
    assert plan(SampleSettings(), VOCAB, "\n") is None and plan(SampleSettings(**off), VOCAB, "\n") is None
    gen, model = Generator(random_model(), VOCAB, "cpu"), random_model()
    kw = dict(max_new_tokens=2 * MODEL_BLOCK, temperature=1.0, top_k=6, num_samples=2, seed=4)
    assert gen.generate("ab", **kw, **off) == gen.generate("ab", **kw)
    seq, rng = torch.tensor([VOCAB.encode("ab")] * 2), torch.Generator().manual_seed(4)
    for _ in range(2 * MODEL_BLOCK):
        with torch.no_grad():
            logits = model(seq[:, -MODEL_BLOCK:])[0][:, -1, :]
        seq = torch.cat([seq, sample_next(logits, rng, 1.0, top_k=6)[:, None]], dim=1)
    assert gen.generate("ab", use_cache=False, **kw) == [VOCAB.decode(row[2:].tolist()) for row in seq]
