"""Forms, acrostics, banned and allowed characters, and best-of (chargpt/sampling/forms.py,
chargpt/sampling/constraints.py): a tiny model trained here on generated five-character couplets writes every sample in
the form asked for; the pattern language and its errors; what the constraints removed; best-of's scores against a
teacher-forced evaluation, its ranking, and its copy check against the run's training text."""

import random
import re

import pytest
import torch
from helpers import TINY_RUN_KW, VOCAB, counter_gen, counter_model, train_tiny

import chargpt
from chargpt.config import SampleSettings
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError, ConfigError
from chargpt.sampling import forms
from chargpt.sampling.constraints import Sample, plan, rank
from chargpt.sampling.decode import StepRunner, decode
from chargpt.sampling.engine import Generator

CHARS = "春夏秋冬山水花月風雲江湖日夜鳥鳴白青紅綠天地人心長短高低"  # the couplets' characters


def couplets(n, seed=0):
    """Two-line poems of random five-character verses, as the Tang corpus lays them out: '春山花月夜，...。\\n'."""
    rng = random.Random(seed)

    def verse():
        return "".join(rng.choice(CHARS) for _ in range(5))
    return "".join(f"{verse()}，{verse()}。\n{verse()}，{verse()}。\n\n" for _ in range(n))


@pytest.fixture(scope="module")
def poet(tmp_path_factory):
    """A run trained here for 200 steps (under a second on one thread) on 300 generated poems, loaded."""
    root = tmp_path_factory.mktemp("poet")
    (root / "poems.txt").write_text(couplets(300) + "0123 -\n", encoding="utf-8")  # digits: not text characters
    kw = {**TINY_RUN_KW, "block_size": 64, "n_embd": 32}
    chargpt.train(data=str(root / "poems.txt"), out_dir=str(root / "run"), cache_dir=str(root / "cache"),
                  max_iters=200, eval_interval=100, log=lambda *a: None, curves=False, **kw)
    gen = chargpt.load(root / "run", device="cpu", dtype="float32")
    gen.run_dir = root / "run"  # for the tests that load it again
    return gen


def verses(text):
    return re.split("[，。]\n?", text.rstrip("，。\n"))


def is_quatrain(text):
    lines = text.split("\n")
    return len(lines) == 2 and all(re.fullmatch(r"(\w{5})，(\w{5})。", line) and
                                   all(c.isalpha() for c in line[:5] + line[6:11]) for line in lines)


# --- the model writes in the form, every time ---------------------------------------------------------------------
def test_every_sample_of_a_fixed_slot_form_fits_it(poet):
    texts = poet.generate("", form="五言绝句", num_samples=16, seed=1, temperature=1.2)
    assert all(is_quatrain(t) for t in texts), texts
    assert len(set(texts)) == 16  # sampled, not forced: the slots are the model's
    assert poet.generate("", form="_____，_____。\\n_____，_____。", num_samples=16, seed=1, temperature=1.2) == texts


def test_an_acrostic_starts_every_verse_of_the_form(poet):
    texts = poet.generate("", form="wujue", acrostic="春夏秋冬", num_samples=16, seed=2, temperature=1.0)
    for t in texts:
        assert is_quatrain(t) and [v[0] for v in verses(t)] == list("春夏秋冬"), t


def test_an_acrostic_without_a_form_starts_the_lines_the_model_writes(poet):
    texts = poet.generate("", acrostic="春夏秋冬", num_samples=16, seed=3, max_new_tokens=200)
    for t in texts:
        assert t[-1] in forms.LINE_ENDS  # the sample ends where the line of the last character ends
        lines = re.split("([，。！？；\n])", t)[::2]
        assert [line[0] for line in lines if line] == list("春夏秋冬") and len([x for x in lines if x]) == 4, t
    # a prompt that ends inside a line: that line is finished first
    for t in poet.generate("春山", acrostic="夏秋", num_samples=8, seed=4, max_new_tokens=200):
        assert re.fullmatch(r"[^，。\n]*[，。\n]夏[^，。\n]*[，。\n]秋[^，。\n]*[，。\n]", t), t


def test_every_sample_of_a_free_span_form_fits_it(poet):
    """`*` runs on its line until the model writes the next fixed part itself (or FREE_SPAN characters, then it is
    written)."""
    span = r"(?:(?!{0})[^\n]){{0,LIMIT}}{0}".replace("LIMIT", str(forms.FREE_SPAN))
    shape = re.compile(span.format("，") + span.format("。\n") + span.format("，") + span.format("。"))
    # at the window's start, as the couplets are learned there best (the corpus's starts: tests below)
    texts = poet.generate("\n", form="*，*。\\n*，*。", num_samples=16, seed=5, temperature=1.0)
    assert all(shape.fullmatch(t) for t in texts), texts
    spans = [len(v) for t in texts for v in verses(t)]
    assert spans.count(5) > len(spans) / 2  # the model ends its spans itself, where it learned to: after 5


def test_banned_characters_never_appear_and_allowed_ones_are_all_there_is(poet):
    banned = "春山花月，。\n"
    texts = poet.generate("", ban=banned, num_samples=8, seed=6, max_new_tokens=120, temperature=1.5)
    assert all(len(t) == 120 and not set(t) & set(banned) for t in texts)
    texts = poet.generate("", allow="春夏秋冬\n", num_samples=8, seed=6, max_new_tokens=60, temperature=1.5)
    assert all(set(t) <= set("春夏秋冬\n") for t in texts) and len(set("".join(texts))) == 5
    # with a form: the slots take what the ban leaves, the fixed characters are written
    for t in poet.generate("", form="五言绝句", ban="春夏秋冬山水", num_samples=8, seed=7):
        assert is_quatrain(t) and not set(t) & set("春夏秋冬山水"), t


def test_constraints_give_the_same_text_cached_uncached_static_and_in_bf16(poet):
    kw = dict(form="*，*。\\n_____，_____。", ban="春", repetition_penalty=1.3, no_repeat_ngram=3, num_samples=4,
              seed=8, temperature=0.9)
    want = poet.generate("", **kw)
    assert poet.generate("", **kw) == want  # the seed reproduces it
    assert poet.generate("", use_cache=False, **kw) == want  # within the context: the reference path
    # the static step (the compiled decode's shapes), eager
    model, ids = poet.model, poet.vocab.encode("\n")
    settings = SampleSettings(max_new_tokens=60, temperature=0.9, form=kw["form"], ban="春")
    rules = plan(settings, poet.vocab, "\n")

    def run(runner):
        steer = rules.steer(ids, 4, 60, "cpu")
        steps = decode(model, torch.tensor([ids] * 4), settings, torch.Generator().manual_seed(8), runner=runner,
                       steer=steer)
        return torch.stack(list(steps), dim=1)
    assert torch.equal(run(StepRunner(model)), run(None))
    bf16 = Generator(model, poet.vocab, "cpu", dtype=torch.bfloat16)
    for t in bf16.generate("", form="五言绝句", acrostic="春夏秋冬", ban="山", num_samples=8, seed=9):
        assert is_quatrain(t) and [v[0] for v in verses(t)] == list("春夏秋冬") and "山" not in t


def test_constraints_hold_with_int8_weights(poet):
    try:
        int8 = chargpt.load(poet.run_dir, device="cpu", quantize="int8")
    except ChargptError as e:  # no int8 engine on this CPU
        pytest.skip(str(e))
    for t in int8.generate("", form="五言绝句", acrostic="春夏秋冬", ban="山", num_samples=8, seed=9):
        assert is_quatrain(t) and [v[0] for v in verses(t)] == list("春夏秋冬") and "山" not in t


def test_stop_strings_still_cut_a_constrained_sample(poet):
    for t in poet.generate("", form="五言绝句", stop="。", num_samples=4, seed=10):
        assert re.fullmatch(r"\w{5}，\w{5}", t), t


# --- the pattern language -----------------------------------------------------------------------------------------
def test_patterns_parse_with_escapes_and_names():
    assert forms.parse(r"_\_\*\\*x\n") == [("slot", None), ("fixed", "_*\\"), ("free", None), ("fixed", "x\n")]
    assert forms.parse("*.") == [("free", None), ("fixed", ".")] and forms.parse("_*") == [("slot", None),
                                                                                              ("free", None)]
    assert forms.resolve("五言绝句") == forms.resolve("wujue") == forms.resolve("五言絕句") == \
        "_____，_____。\n_____，_____。"
    assert forms.resolve("七律").count("\n") == 3 and forms.resolve("_x_") == "_x_"
    assert len(forms.shape_lines()) == len(forms.SHAPES) and "wujue" in forms.shape_lines()[0]


@pytest.mark.parametrize("pattern,message", [
    ("abc", "neither a named form"), ("\\n", "neither a named form"), ("*_", "must be followed by fixed text"),
    ("**.", "must be followed by fixed text"), ("_\\", "escapes nothing"), ("_\\q", "escapes nothing"),
])
def test_a_malformed_pattern_is_a_one_line_error(pattern, message):
    with pytest.raises(ConfigError, match=message) as e:
        SampleSettings(form=pattern).validate()
    assert "\n" not in str(e.value)


def test_acrostic_lines_are_the_verses_of_a_couplet_line_or_the_pattern_lines():
    assert forms.with_acrostic(forms.parse("_____，_____。\n_____，_____。"), "春夏秋冬") == \
        [("fixed", "春"), ("slot", None), ("slot", None), ("slot", None), ("slot", None), ("fixed", "，"),
         ("fixed", "夏")] + [("slot", None)] * 4 + [("fixed", "。\n"), ("fixed", "秋")] + [("slot", None)] * 4 + \
        [("fixed", "，"), ("fixed", "冬")] + [("slot", None)] * 4 + [("fixed", "。")]
    assert forms.with_acrostic(forms.parse("*\n*\n"), "AB") == [("fixed", "A"), ("free", None), ("fixed", "\n"),
                                                                  ("fixed", "B"), ("free", None), ("fixed", "\n")]
    with pytest.raises(ConfigError, match="has 3 characters, but the form has only 2"):
        forms.with_acrostic(forms.parse("*\n*\n"), "ABC")


@pytest.mark.parametrize("kw,message", [
    (dict(form="_é_"), r"'é' \(U\+00E9\) is not in this model's vocabulary"),
    (dict(form="五言绝句"), r"'，' \(U\+FF0C\) is not in this model's vocabulary"),
    (dict(form="_ _", acrostic="É"), r"acrostic's character 'É'"),
    (dict(form="_ _", ban=" "), r"writes ' ', which ban or allow rules out"),
    (dict(form="_ _", allow="abc"), r"writes ' ', which ban or allow rules out"),
    (dict(allow="É"), r"allow: none of its characters"),
    (dict(ban="\n abcdefghijklmnopqrstuvwxyz"), r"leave no character"),
    (dict(best_of=2, num_samples=3), r"best_of \(2\) must be at least num_samples \(3\)"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"), (dict(repetition_penalty=0.0), r"must be from 0.01 to 100"),
    (dict(no_repeat_ngram=-1), r"must be >= 0"), (dict(best_of=0), r"best_of must be >= 1"),
], ids=str)
def test_what_the_vocabulary_or_settings_cannot_satisfy_is_one_line_before_decoding(kw, message, monkeypatch):
    gen = counter_gen()
    monkeypatch.setattr(gen.model, "forward", lambda *a, **k: pytest.fail("decoded"))
    with pytest.raises(ChargptError, match=message) as e:
        gen.generate("ab", **kw)
    assert "\n" not in str(e.value)


def test_a_form_with_slots_needs_a_text_character():
    digits = Generator(counter_model(4), Vocab("0123"), "cpu")
    with pytest.raises(ConfigError, match="_ slots for letters or ideographs, but this model's vocabulary has none"):
        digits.generate("0", form="_1")
    with pytest.raises(ConfigError, match="has no line break"):
        digits.generate("0", acrostic="1")


def test_a_free_span_is_bounded_and_fits_the_length_asked_for():
    gen = counter_gen()  # writes the alphabet in a cycle: never "qq"
    (text,) = gen.generate("a", form="*qq", temperature=0, max_new_tokens=500)
    # FREE_SPAN characters on one line (the counter's line break after z is not a span's), then the closing part
    assert len(text) == forms.FREE_SPAN + 2 and text.endswith("qq") and "qq" not in text[:-2] and "\n" not in text
    assert gen.generate("y", form="*", temperature=0) == ["z\n"]  # a * that ends the form ends with its line
    # the span ends when the model writes the fixed text up to its line break; the rest of it is written for it
    assert gen.generate("a", form="*z\\nq_", temperature=0) == ["bcdefghijklmnopqrstuvwxyz\nqr"]
    assert gen.generate("a", form="*z", temperature=0, max_new_tokens=3) == ["bcz"]  # closed to fit 3 characters
    assert gen.generate("a", form="*e", temperature=0) == ["bcde"]  # the model wrote the closing part itself
    said = []
    gen.log = said.append  # a --max-new-tokens shorter than the form cuts it, as a stop string would, with a note
    assert gen.generate("a", form="_*z_", temperature=0, max_new_tokens=2) == ["bz"]
    assert said == ["note: the form needs at least 3 characters; max_new_tokens=2 cuts it short"]


# --- what the constraints removed ---------------------------------------------------------------------------------
def test_removed_is_the_probability_the_constraints_took_away_in_nats():
    gen, model = counter_gen(), counter_model()
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([VOCAB.encode("ab")]))[0][0, -1], -1)  # after "ab": 'c' sure
    (free,) = gen.samples("ab", form="_", temperature=0, max_new_tokens=1)  # a letter: not "\n" or " "
    assert free.text == "c" and free.removed == pytest.approx(-logp[2:].logsumexp(0).item(), abs=1e-6)
    (forced,) = gen.samples("ab", form="x*", temperature=0, max_new_tokens=1)
    assert forced.text == "x" and forced.removed == pytest.approx(-logp[VOCAB.stoi["x"]].item(), rel=1e-5)
    assert forced.removed > 5 and free.removed < 1e-3  # a form that fights the model says so
    (banned,) = gen.samples("ab", ban="c", temperature=0, max_new_tokens=1)
    c = VOCAB.stoi["c"]  # -log(1 - p(c)): the model was sure of c, so this is large
    assert banned.removed == pytest.approx(-torch.cat([logp[:c], logp[c + 1:]]).logsumexp(0).item(), rel=1e-5)
    (plain,) = gen.samples("ab", temperature=0, max_new_tokens=3)
    assert plain.removed is None and plain.logprob == pytest.approx(logp.max().item(), abs=1e-4)


# --- best-of --------------------------------------------------------------------------------------------------------
def teacher_forced(gen, context, text):
    """The model's mean log-probability per character of `text` after `context`, by one full forward."""
    ids = torch.tensor([gen.vocab.encode(context + text)])
    with torch.no_grad():
        logp = torch.log_softmax(gen.model(ids)[0][0].float(), -1)  # (T, V)
    n = len(context)
    return logp[torch.arange(n - 1, ids.size(1) - 1), ids[0, n:]].mean().item()


@pytest.mark.parametrize("kw", [dict(), dict(form="五言绝句"), dict(ban="春夏", no_repeat_ngram=2)], ids=str)
def test_best_of_scores_equal_a_teacher_forced_evaluation_and_rank_them(poet, kw):
    best = poet.samples("春山", best_of=6, num_samples=3, seed=11, max_new_tokens=40, copies=False, **kw)
    assert len(best) == 3 and all(s.text for s in best)
    for s in best:
        assert s.logprob == pytest.approx(teacher_forced(poet, "春山", s.text), abs=1e-4)
    kept = [s.logprob for s in best if s.dropped is None]
    assert kept == sorted(kept, reverse=True)
    everyone = poet.samples("春山", num_samples=6, seed=11, max_new_tokens=40, **kw)  # the same batch, unranked
    assert [s.text for s in best] == [everyone[s.row].text for s in best]
    assert best[0].logprob == max(s.logprob for s in everyone)
    assert poet.generate("春山", best_of=6, num_samples=3, seed=11, max_new_tokens=40, copies=False, **kw) == \
        [s.text for s in best]


def test_best_of_drops_near_duplicates_and_copies():
    same = [Sample("abcdefghij", -1.0, row=0), Sample("abcdefghij", -1.0, row=1), Sample("zyxwvutsrq", -2.0, row=2)]
    assert [(s.row, s.dropped) for s in rank(same, 2)] == [(0, None), (2, None)]
    assert [(s.row, s.dropped) for s in rank(same, 3)] == [(0, None), (2, None), (1, "near-duplicate")]

    class Report:
        min_span = 5

        def __init__(self, text):
            self.text = text

        def summary(self):
            return {"longest": 7 if self.text.startswith("abc") else 0}
    ranked = rank(same, 2, copies=Report)
    assert [(s.row, s.dropped) for s in ranked] == [(2, None), (0, "copied")] and ranked[1].copied == {"longest": 7}


def test_best_of_ranks_a_sample_that_loops_after_the_others():
    """The model's mean log-prob rewards loops (處處處 won 4 of 20 Tang best-ofs): they rank after the rest, while
    '...', '!!!' and a code line's indentation are not loops."""
    from chargpt.sampling.constraints import repetitive
    assert all(repetitive(t) for t in ("春眠處處處聞啼鳥", "la la la la", "hahaha", "ab\nab\nab\n"))
    assert not any(repetitive(t) for t in ("Wait... what?!!!", "def f():\n        return 1", "床前明月光，疑是地上霜。",
                                           "aa bb", "Mississippi"))
    samples = [Sample("處處處聞啼鳥", -0.5, row=0), Sample("夜來風雨聲", -1.5, row=1)]
    assert [(s.row, s.dropped) for s in rank(samples, 2)] == [(1, None), (0, "repetitive")]


def test_best_of_checks_copies_against_the_runs_own_text_and_says_once_when_it_is_gone(tmp_path):
    run = train_tiny(tmp_path / "runs", steps=300)
    gen = chargpt.load(run, device="cpu", dtype="float32")
    said = []
    gen.log = said.append
    kw = dict(best_of=6, num_samples=6, seed=12, max_new_tokens=40, temperature=0.3, min_span=12)
    found = gen.samples("ROMEO: O, she", **kw)
    assert not any("without" in line for line in said) and all(s.copied is not None for s in found)
    copied = [s for s in found if s.dropped == "copied"]
    assert copied and all(s.copied["longest"] >= 12 for s in copied)  # this tiny model recites its corpus
    dropped = [s.dropped is not None for s in found]
    assert dropped == sorted(dropped)  # ... and they rank last
    # the corpus gone (file and cache): said once, ranked without the check
    (tmp_path / "runs-corpus.txt").unlink()
    for p in sorted((tmp_path / "runs-cache").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    gone = chargpt.load(run, device="cpu", dtype="float32")
    gone.log = said.append
    assert len(gone.samples("ROMEO: O, she", **kw)) == 6 and len(gone.samples("To be", **kw)) == 6
    assert [line for line in said if "without" in line] == [said[-1]] and "without dropping copies" in said[-1]


def test_compile_auto_weighs_what_a_form_writes_not_max_new_tokens(monkeypatch):
    """A five-character verse with --max-new-tokens 10000 writes about six characters a sample: --compile auto must
    not compile the decode step for 4 x 10,000 (it did, and a best-of took 60 s against 12 s eager)."""
    import chargpt.sampling.engine as engine_module
    weighed = []

    def eager(mode, device, new_chars, quantized=False):
        weighed.append(new_chars)
        return False, "eager"
    monkeypatch.setattr(engine_module, "pick_decode_compile", eager)
    gen = counter_gen()
    gen.generate("", form="_____", max_new_tokens=10_000, num_samples=4, seed=1)
    most = forms.compile_form("_____", None, gen.vocab, torch.ones(len(gen.vocab), dtype=torch.bool), "").most
    assert weighed == [4 * most] and most == 5
    gen.generate("", max_new_tokens=300, num_samples=4, seed=1)  # no form: what it may write
    assert weighed[-1] == 4 * 300


# --- a form without a prompt starts where the run's text starts text of its shape --------------------------------
NAMES = "甲乙丙丁戊己庚辛壬癸子丑寅卯辰巳午未申酉戌亥"  # titles and authors: characters no verse uses


def anthology(n, seed=0):
    """Poems laid out as the Tang corpus is: a title line, an author line, then the verses, a blank line after."""
    rng = random.Random(seed)

    def word(chars, k):
        return "".join(rng.choice(chars) for _ in range(k))
    return "".join(f"{word(NAMES, 4)}\n{word(NAMES, 3)}\n{word(CHARS, 5)}，{word(CHARS, 5)}。\n"
                   f"{word(CHARS, 5)}，{word(CHARS, 5)}。\n\n" for _ in range(n))


def test_the_text_before_a_shape_s_start_is_found_in_the_corpus():
    text = anthology(3)
    starts = forms.shape_starts("五言绝句", text)
    titles = [block.split("\n")[:2] for block in text.split("\n\n")[:3]]
    assert [s.split("\n")[-3:-1] for s in starts] == titles  # each poem's title and author: not its second verse
    assert all(s.endswith("\n") and len(s) <= forms.START_CONTEXT for s in starts)
    assert forms.shape_starts("_____，_____。", "no verse here\n") == []


def test_a_form_without_a_prompt_writes_verses_not_the_titles_and_authors_a_newline_leads_to(tmp_path):
    """Tang poems put titles and authors after a newline: a quatrain started there wrote poets' names into its
    verses (11 of 20 in a newcomer's Tang run). Started where the corpus starts verses, almost none holds a name."""
    (tmp_path / "poems.txt").write_text(anthology(400), encoding="utf-8")
    kw = {**TINY_RUN_KW, "block_size": 64, "n_embd": 32}
    chargpt.train(data=str(tmp_path / "poems.txt"), out_dir=str(tmp_path / "run"), max_iters=600,
                  eval_interval=600, log=lambda *a: None, curves=False, **kw)
    gen = chargpt.load(tmp_path / "run", device="cpu", dtype="float32")
    texts = gen.generate("", form="_____，_____。\n_____，_____。", num_samples=40, seed=1)
    named = [t for t in texts if any(c in NAMES for c in t)]
    assert len(named) <= 1, named  # 0 of 40 here, with three training seeds
    plain = gen.generate("\n", form="_____，_____。\n_____，_____。", num_samples=40, seed=1)  # after a newline
    assert sum(any(c in NAMES for c in t) for t in plain) >= 10  # what it avoids: names there (20-26 of 40 here)
