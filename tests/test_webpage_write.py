"""What the exported page writes with (chargpt/tools/webpage/sampling.js), under node on the exported file itself:
sample.py's forms (the named ones from forms.py's own table, a pattern, an acrostic), --ban and --allow, with the
same masks as Python's at every step; a labels run's labels, greedy text equal to Python's with and without
guidance; and a call that is wrong (a string for options, a number for the prompt, an aborted signal) refused
before anything is written."""

import json
import os
import random
import re
import shutil
import subprocess

import pytest
import torch
from helpers import TINY_RUN_KW, train_tiny

import chargpt
import chargpt.tools.webpage as webpage
from chargpt.config import SampleSettings
from chargpt.sampling import constraints, forms
from chargpt.tools.webpage.check import Recorder
from chargpt.tools.webpage.page import read_page

NODE = shutil.which("node")
CHECK_JS = webpage.Path(webpage.__file__).with_name("check.js")
pytestmark = pytest.mark.skipif(not NODE and os.environ.get("CI") != "true", reason="node is not installed")
VERSE = "春夏秋冬山水花月风云江天日夜人家"  # the made-up Tang poems' characters
STYLES = {"a": "abc", "b": "xyz"}


def node(page, prompt="", **request):
    """check.js on the page: {"text": ...} with request["text"], else the masks of each step."""
    done = subprocess.run([NODE, str(CHECK_JS), str(page), json.dumps({"prompt": prompt, **request})],
                          capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def node_error(page, prompt="", **request):
    done = subprocess.run([NODE, str(CHECK_JS), str(page), json.dumps({"prompt": prompt, "text": True, **request})],
                          capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert done.returncode == 1 and "Error" not in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    return done.stderr.strip()


@pytest.fixture(scope="module")
def english(tmp_path_factory):
    root = tmp_path_factory.mktemp("english")
    run = train_tiny(root, steps=300)
    return run, webpage.export_web(run, root / "page.html", log=lambda line: None)


def poems(n, rng):
    """Tang-like text: a title line, an author line, then a five-character quatrain a couplet a line."""
    verse = lambda: "".join(rng.choice(VERSE) for _ in range(5))  # noqa: E731
    return "".join(f"题{rng.choice(VERSE)}\n李白\n{verse()}，{verse()}。\n{verse()}，{verse()}。\n\n" for _ in range(n))


@pytest.fixture(scope="module")
def tang(tmp_path_factory):
    root = tmp_path_factory.mktemp("tang")
    (root / "tang.txt").write_text(poems(150, random.Random(0)), encoding="utf-8")
    chargpt.train(**{**TINY_RUN_KW, "curves": False}, data=str(root / "tang.txt"), out_dir=str(root / "run"),
                  cache_dir=str(root / "cache"), max_iters=200, eval_interval=200, log=lambda *a: None)
    return root / "run", webpage.export_web(root / "run", root / "page.html", log=lambda line: None)


def test_the_page_writes_a_named_form_in_its_exact_shape(tang):
    run, page = tang
    description, _ = read_page(page.read_text(encoding="utf-8"))
    assert description["forms"]["shapes"] == {k: list(v) for k, v in forms.SHAPES.items()}  # Python's own table
    starts = description["form_starts"][forms.SHAPES["五言绝句"][0]]
    assert starts and set(starts) == {"李白\n"}  # after the author's line (the context's last 4), as Python's
    verse = f"[{VERSE}]{{5}}"
    for seed in range(4):
        text = node(page, text=True, form="wujue", temperature=1.0, seed=seed)["text"]  # an alias: the same form
        assert re.fullmatch(f"{verse}，{verse}。\n{verse}，{verse}。", text), text
    text = node(page, text=True, form="五言绝句", acrostic="春夏秋冬", temperature=1.0, seed=1)["text"]
    assert [line[0] for line in re.split("[，。\n]+", text) if line] == list("春夏秋冬"), text
    assert node_error(page, form="七言律诗", acrostic="春夏秋冬春夏秋冬春") == \
        "acrostic has 9 characters, but the form has only 8 line(s) that start with _ or *"


def test_ban_and_allow_hold_and_what_they_leave_out_is_an_error(english):
    _, page = english
    for seed in range(3):
        text = node(page, "ROMEO:", text=True, ban="eo ", maxNewTokens=150, temperature=1.0, seed=seed)["text"]
        assert len(text) == 150 and not set(text) & set("eo ")
        text = node(page, "ROMEO:", text=True, allow="ab t\n", maxNewTokens=150, temperature=1.0, seed=seed)["text"]
        assert len(text) == 150 and set(text) <= set("ab t\n")
    assert node_error(page, allow="ZQ") == "allow: none of its characters is in this model's vocabulary"
    assert node_error(page, allow="ab", ban="ba") == "ban and allow leave no character this model knows"
    assert node_error(page, form="五言绝句") == "form: the form's character \"，\" (U+FF0C) is not in this model's " \
        "vocabulary (it never saw it in training)"
    assert node_error(page, form="*_") == "form: a * must be followed by fixed text (it ends when the model writes " \
        "that text) or end the form; write \\* for the character *"


CASES = [dict(form="_____ *.\n_____ *,"), dict(form="*: _\\n_*."), dict(acrostic="TRE"), dict(ban="e", form="*.\n*"),
         dict(allow="ROMEO: thes\n", acrostic="RO"), dict(form="_" * 30, maxNewTokens=12),
         dict(noRepeatNgram=3, repetitionPenalty=1.5), dict(noRepeatNgram=1, form="___ _\n"),
         dict(repetitionPenalty=0.7, ban="T")]
PYTHON_NAMES = {"maxNewTokens": "max_new_tokens", "noRepeatNgram": "no_repeat_ngram",
                "repetitionPenalty": "repetition_penalty"}


def as_tensor(rows):
    return torch.tensor([[float("-inf") if x is None else x for x in row] for row in rows])


@pytest.mark.parametrize("case", CASES, ids=[json.dumps(c, ensure_ascii=False) for c in CASES])
def test_the_page_and_python_constrain_every_step_alike(english, case):
    """Along what the page wrote (sampled, so the form's every branch is taken), Python's Steer, given the page's
    logits before the constraints, allows exactly the characters the page allowed, gives the logits the page chose
    from (penalised: to float32 rounding), and ends the form where the page did."""
    run, page = english
    gen = chargpt.load(run, device="cpu", dtype="float32")
    steps = case.get("maxNewTokens", 250)
    for seed in range(3):
        for prompt in ("", "ROMEO: O"):
            got = node(page, prompt, masks=True, logits=True, temperature=1.5, seed=seed,
                       **{"maxNewTokens": steps, **case})
            context = got["context"]
            settings = SampleSettings(**{PYTHON_NAMES.get(k, k): v for k, v in {"maxNewTokens": steps, **case}.items()})
            steer = constraints.plan(settings, gen.vocab, context).steer(gen.vocab.encode(context), 1, steps, "cpu")
            assert got["ids"] and len(got["masks"]) == len(got["ids"])
            raw, chose_from = as_tensor(got["raw"]), as_tensor(got["logits"])
            for step, (chosen, mask) in enumerate(zip(got["ids"], got["masks"])):
                ours = steer.logits(raw[step:step + 1])[0]
                js = list(range(len(gen.vocab))) if mask is None else mask  # None: every character
                assert js == torch.isfinite(ours).nonzero().flatten().tolist(), (seed, prompt, step)
                assert torch.equal(torch.isinf(ours), torch.isinf(chose_from[step]))
                finite = torch.isfinite(ours)
                assert torch.allclose(ours[finite], chose_from[step][finite], rtol=1e-6, atol=1e-6), (seed, step)
                steer.chose(torch.tensor([chosen]))
                assert bool(steer.ended_now) == (got["ended"] and step == len(got["ids"]) - 1), (seed, step)


def test_min_p_leaves_only_the_likely_characters(english):
    _, page = english
    for seed in range(3):
        text = node(page, "ROMEO:", text=True, minP=1.0, temperature=1.0, seed=seed, maxNewTokens=40)["text"]
        greedy = node(page, "ROMEO:", text=True, temperature=0, maxNewTokens=40)["text"]
        assert text == greedy  # min-p 1: only the most likely character is left


# --- a labels run ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    root = tmp_path_factory.mktemp("labels")
    rng = random.Random(0)
    for label, alphabet in STYLES.items():
        words = ("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 8))) + rng.choice(" \n")
                 for _ in range(500))
        (root / "authors" / label).mkdir(parents=True)
        (root / "authors" / label / "1.txt").write_text("".join(words))
    chargpt.train(**{**TINY_RUN_KW, "n_embd": 32, "curves": False}, data=root / "authors", labels="folders",
                  out_dir=root / "run", cache_dir=root / "cache", max_iters=300, eval_interval=300, log=lambda *a: None)
    return root / "run", webpage.export_web(root / "run", root / "page.html", log=lambda line: None)


def python_greedy(gen, label, guidance, n):
    """Python's greedy ids with a label, and the logits (mixed, labels masked) each was chosen from, (n, V)."""
    settings = SampleSettings(max_new_tokens=n, temperature=0, label=label, guidance=guidance)
    rec = Recorder()
    ids = [int(i) for i in gen._steps(gen.vocab.encode(gen.start_text()), settings, 1, torch.Generator(), True, rec, n)]
    return ids, torch.stack(rec.seen)


@pytest.mark.parametrize("guidance", [None, 2.0])
def test_a_label_writes_in_the_page_as_in_python(labelled, guidance):
    """Along Python's greedy text with each label (40 characters: past the context of 16, so the window slides and
    keeps the label first), the page chooses from the same logits (guided: the two rows mixed) to float tolerance,
    and writes Python's text wherever no near-tie could flip a choice."""
    run, page = labelled
    gen = chargpt.load(run, device="cpu", dtype="float32")
    texts = {}
    for label in STYLES:
        ids, want = python_greedy(gen, label, guidance, 40)
        text = "".join(gen.vocab.chars[i] for i in ids)
        assert text == gen.generate("", label=label, guidance=guidance, max_new_tokens=40, temperature=0)[0]
        got = node(page, masks=True, logits=True, forced=ids, label=label, guidance=guidance, maxNewTokens=40,
                   temperature=0)
        js = as_tensor(got["raw"])
        assert torch.equal(torch.isinf(js), torch.isinf(want))  # the labels' characters, never written
        finite = torch.isfinite(want)
        assert (js[finite] - want[finite]).abs().max() <= 1e-4 * max(1.0, want[finite].abs().max().item())
        texts[label] = node(page, text=True, label=label, guidance=guidance, maxNewTokens=40, temperature=0)["text"]
        top2 = want.topk(2, dim=-1).values
        if (top2[:, 0] - top2[:, 1]).min() > 1e-3:  # no near-tie that rounding could flip
            assert texts[label] == text
        letters = [c for c in texts[label] if c not in " \n"]
        assert sum(c in STYLES[label] for c in letters) > 0.8 * len(letters)
    assert texts["a"] != texts["b"]
    description, _ = read_page(page.read_text(encoding="utf-8"))
    assert set(description["labels"]["names"]) == set(STYLES)


def test_a_labels_call_that_cannot_be_written_is_an_error(labelled, english):
    _, page = labelled
    assert node_error(page, label="c").startswith('unknown label "c"; this run\'s labels: ')
    assert node_error(page, guidance=2) == "guidance steers towards a label: give label too, or guidance 1"
    assert node_error(page, "ab\U000f0001") == \
        "the prompt holds a label's own character; choose the label with the label option instead"
    assert node_error(english[1], label="a") == "this run was trained without labels, so it has no labels; drop label"


# --- calls refused before anything is written ----------------------------------------------------------------------
def run_js(page, body):
    """An async function body run under node with `gen` (the page's Generator); -> what it returns (JSON)."""
    script = f"""
const fs = require("fs"), {{scriptText, loadDecoder}} = require({json.dumps(str(CHECK_JS))});
const html = fs.readFileSync({json.dumps(str(page))}, "utf8"), decoder = loadDecoder(html);
const gen = new decoder.Generator(JSON.parse(scriptText(html, 'id="chargpt-model"')),
                                  decoder.base64Bytes(scriptText(html, 'id="chargpt-weights"').trim()));
(async () => {{ {body} }})().then((out) => process.stdout.write(JSON.stringify(out)));
"""
    done = subprocess.run([NODE, "-e", script], capture_output=True, text=True, encoding="utf-8", timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_wrong_call_is_refused_with_a_clear_error_and_writes_nothing(english):
    _, page = english
    out = run_js(page, """
        const said = async (f) => {
            try { await f(); return "no error"; } catch (e) { return `${e.name}: ${e.message}`; }
        };
        const pieces = [], aborted = new AbortController();
        aborted.abort();
        return [
            await said(() => gen.generate("ROMEO:", "maxNewTokens: 5")),
            await said(() => gen.generate(123)),
            await said(() => gen.stream("ROMEO:", {signal: aborted.signal}, (p) => pieces.push(p))),
            pieces.length,
            await said(() => gen.generate("ROMEO:", {maxTokens: 5})),
            await said(() => gen.generate("ROMEO:", {ban: 5})),
            (await gen.generate("ROMEO:", {maxNewTokens: 5, stop: "xyz"})).length,
        ];""")
    assert out[0] == "Error: the options must be an object such as {maxNewTokens: 200, temperature: 0.8}, not a string"
    assert out[1] == 'Error: the prompt must be a string, not number; give "" for none'
    assert out[2] == "AbortError: the signal was aborted before anything was written" and out[3] == 0
    assert out[4].startswith('Error: "maxTokens" is not an option; the options: maxNewTokens, ')
    assert out[5] == "Error: ban must be a string, not a number"
    assert out[6] == 5  # a lone stop string is one stop string, as sample.py's
