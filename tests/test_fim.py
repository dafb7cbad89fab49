"""Fill in the middle (--fim at training, --suffix at sampling: chargpt/data/fim.py, chargpt/sampling/infill.py): the
layout of a batch, markers that step aside for a corpus holding them, a tiny run that fills gaps of a templated table
while its left-to-right validation loss stays that of the same run without FIM, sample.py and the API with a suffix,
and what a run without FIM answers, --resume and --init-from."""

import random
import re

import numpy as np
import pytest
import torch
from helpers import TINY_RUN_KW, assert_one_line_error, invoke, need

import chargpt
from chargpt.cli import sample_cli, train_cli
from chargpt.data.corpus import Batches
from chargpt.data.fim import FIRST, FimBatches
from chargpt.errors import ChargptError, ConfigError

TABLE = [("ann", 31, "oslo"), ("bob", 42, "rome"), ("cid", 27, "lima"), ("dee", 55, "kiev"),
         ("eve", 38, "bonn"), ("fay", 64, "riga"), ("gus", 19, "nice"), ("hal", 46, "metz")]
# the quality runs: two layers (one cannot learn where the middle closes), long enough to learn it
QUALITY = dict(device="cpu", n_layer=2, n_head=2, n_embd=32, block_size=48, batch_size=32, eval_iters=20,
               dropout=0.0, threads=1, sample_chars=0, dtype="float32", warmup_iters=0, curves=False,
               max_iters=1000, eval_interval=1000, learning_rate=3e-3, seed=1, verbose=True)


def line(name, age, city):
    return f"name: {name}; age: {age}; city: {city}\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same tiny run on a templated table (1,500 lines drawn from 8 rows), without and with --fim 0.5."""
    root = tmp_path_factory.mktemp("fim")
    rng = random.Random(0)
    (root / "table.txt").write_text("".join(line(*rng.choice(TABLE)) for _ in range(1500)), encoding="utf-8")
    lines = {}
    for rate in (0.0, 0.5):
        said = lines[rate] = []
        chargpt.train(data=str(root / "table.txt"), out_dir=str(root / f"fim{rate}"), cache_dir=str(root / "cache"),
                      fim=rate, log=said.append, **QUALITY)
    return root, lines


def test_a_laid_out_row_is_pre_suf_suffix_mid_prefix_middle_end_and_learns_no_marker():
    text = "".join(f"line {i:03d}\n" for i in range(300))
    chars = sorted(set(text))
    pre, suf, mid, end = range(len(chars), len(chars) + 4)
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    plain = Batches(ids, 0.1, 24, 200, "cpu")
    x, y = FimBatches(plain, 1.0, [pre, suf, mid, end]).get("train", torch.Generator().manual_seed(0))
    wx, wy = plain.get("train", torch.Generator().manual_seed(0))  # the same windows, plain
    window = torch.cat([wx[:, :1], wy], dim=1)
    ends = set()
    for r in range(len(x)):
        row = torch.cat([x[r], y[r, -1:]]).tolist()  # the last target is never a masked marker
        assert row[:2] == [pre, suf] and row.count(mid) == 1 and row.count(end) == 1
        k = row.index(mid)
        suffix, rest = row[2:k], row[k + 1:]
        prefix_middle, after = rest[:rest.index(end)], rest[rest.index(end) + 1:]
        # prefix and middle, then the suffix, then what follows it: the window's text, in order
        assert prefix_middle + suffix + after == window[r, :len(window[r]) - 4].tolist()
        ends.add(row.index(end))
    assert ((y == pre) | (y == suf) | (y == mid)).sum() == 0 and (y == -100).sum() == 2 * len(y)  # not learned
    assert len(ends) > 10  # END anywhere in the window: where it goes is the suffix's, not the position's
    half = FimBatches(plain, 0.5, [pre, suf, mid, end])
    x, _ = half.get("train", torch.Generator().manual_seed(1))
    assert 0.4 < (x[:, 0] == pre).float().mean() < 0.6
    vx, vy = half.get("val", torch.Generator().manual_seed(1))  # validation reads plain text
    px, py = plain.get("val", torch.Generator().manual_seed(1))
    assert torch.equal(vx, px) and torch.equal(vy, py) and half.plain is plain


def test_a_label_stays_first_in_a_laid_out_row():
    ids = np.tile(np.arange(1, 9, dtype=np.uint16), 500)
    labelled = FimBatches(Batches(ids, 0.1, 16, 64, "cpu"), 1.0, [20, 21, 22, 23], keep=1)
    x, y = labelled.get("train", torch.Generator().manual_seed(0))
    assert (x[:, 1] == 20).all() and (x[:, 2] == 21).all() and (y[:, 0] == -100).all()


def test_gaps_are_filled_and_left_to_right_loss_is_kept(runs):
    """Measured (this test's settings, float32 on one thread): the FIM run fills 16 of the 16 age and city gaps
    exactly, greedy, and closes each middle itself (END); the name gaps, which only the suffix decides (which
    person is 38 and in Bonn), 2 of 8. Its validation loss (left to right) was within 0.002 nats of the same run
    without FIM (0.1149 against 0.1134); 0.02 is the bound asserted."""
    root, lines = runs
    gen = chargpt.load(root / "fim0.5", device="cpu", dtype="float32")
    right = 0
    for row in TABLE:
        text = line(*row)
        for field, value in (("age", str(row[1])), ("city", row[2])):
            i = text.index(value, text.index(field))
            got = gen.generate("\n" + text[:i], suffix=text[i + len(value):], temperature=0, max_new_tokens=10)[0]
            right += got == value
    assert right >= 14, right
    val = {rate: chargpt.load(root / f"fim{rate}", device="cpu").meta["val_loss"] for rate in (0.0, 0.5)}
    assert abs(val[0.5] - val[0.0]) < 0.02, val
    assert any(s.startswith("fill in the middle: 50% of training windows") for s in lines[0.5]), lines[0.5]


def test_sample_py_fills_the_gap_and_prints_the_whole_text(runs):
    root, _ = runs
    result = invoke(sample_cli, ["--checkpoint", root / "fim0.5", "--prompt", "\\nname: fay; age: ", "--suffix",
                                 "; city: riga\\n", "--temperature", "0", "--max-new-tokens", "10", "--device", "cpu",
                                 "--dtype", "float32"])
    assert result.exit_code == 0, result.output
    assert result.stdout == "\nname: fay; age: 64; city: riga\n\n"
    result = invoke(sample_cli, ["--checkpoint", root / "fim0.5", "--prompt", "\\nname: fay; age: ", "--suffix",
                                 "; city: riga\\n", "--temperature", "0", "--max-new-tokens", "10", "--device", "cpu",
                                 "--json", "--allow", "0123456789", "--best-of", "2"])
    assert result.exit_code == 0, result.output
    assert '"text": "64"' in result.stdout and '"suffix": "; city: riga\\n"' in result.stdout


def test_a_run_without_fim_says_so_in_one_line(runs):
    root, _ = runs
    result = invoke(sample_cli, ["--checkpoint", root / "fim0.0", "--prompt", "name: ", "--suffix", "; age",
                                 "--device", "cpu"])
    assert_one_line_error(result, r"trained without --fim, so it cannot fill in the middle; drop --suffix, or teach "
                                  r"it in a new run: --init-from RUN --fim 0.5$")


def test_a_marker_in_the_prompt_or_suffix_is_refused_and_never_written(runs):
    root, _ = runs
    gen = chargpt.load(root / "fim0.5", device="cpu")
    markers = gen.fim.chars()
    for where in ("prompt", "suffix"):
        kw = {"suffix": "x" + markers[1]} if where == "suffix" else {"suffix": ""}
        prompt = "a" + markers[0] if where == "prompt" else "a"
        with pytest.raises(ChargptError, match=f"the {where} holds U\\+100000|the {where} holds U\\+100001"):
            gen.generate(prompt, max_new_tokens=2, **kw)
    texts = gen.generate("\n", max_new_tokens=200, temperature=2.0, num_samples=4, seed=0)  # wild: all but uniform
    assert not any(c in t for t in texts for c in markers)


def test_markers_step_aside_for_a_corpus_that_holds_them(tmp_path):
    (tmp_path / "odd.txt").write_text(("private \U00100000 use\n" + "plain text here\n") * 100, encoding="utf-8")
    said = []
    chargpt.train(data=str(tmp_path / "odd.txt"), out_dir=str(tmp_path / "run"), cache_dir=str(tmp_path / "cache"),
                  fim=0.5, max_iters=2, eval_interval=2, log=said.append, **TINY_RUN_KW)
    assert "note: the text holds U+100000, a private-use character fill-in-the-middle marks with by default; its " \
           "markers are U+100001, U+100002, U+100003 and U+100004 instead" in said
    gen = chargpt.load(tmp_path / "run", device="cpu")
    assert [ord(c) for c in gen.fim.chars()] == [FIRST + 1, FIRST + 2, FIRST + 3, FIRST + 4]
    assert len(gen.generate("private \U00100000", suffix=" use", max_new_tokens=3, seed=0)[0]) <= 3  # text now


def test_bad_rates_are_one_line_errors(tmp_path):
    (tmp_path / "t.txt").write_text("some text\n" * 100, encoding="utf-8")
    for rate in ("1.5", "-0.1", "nan"):
        result = invoke(train_cli, ["--data", tmp_path / "t.txt", "--out-dir", tmp_path / "run", "--fim", rate])
        assert_one_line_error(result, r"--fim must be (in \[0, 1\]|a finite number)")
    with pytest.raises(ConfigError, match="fim is for text runs"):
        chargpt.train(data=str(tmp_path / "t.txt"), task="pairs", fim=0.5, out_dir=str(tmp_path / "p"))


def test_resume_draws_the_same_batches(tmp_path):
    (tmp_path / "t.txt").write_text("".join(line(*row) for row in TABLE * 40), encoding="utf-8")
    kw = dict(data=str(tmp_path / "t.txt"), cache_dir=str(tmp_path / "cache"), fim=0.5, lr_decay_iters=6,
              eval_interval=3, log=lambda _: None, **{**TINY_RUN_KW, "warmup_iters": 0})
    chargpt.train(out_dir=str(tmp_path / "whole"), max_iters=6, **kw)
    chargpt.train(out_dir=str(tmp_path / "split"), max_iters=3, **kw)
    chargpt.train(out_dir=str(tmp_path / "split"), max_iters=6, resume=True, **kw)
    from safetensors.torch import load_file
    a, b = (load_file(tmp_path / run / "latest.safetensors") for run in ("whole", "split"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert chargpt.load(tmp_path / "split", device="cpu").fim == chargpt.load(tmp_path / "whole", device="cpu").fim


def test_init_from_teaches_a_base_without_fim_and_resume_cannot(runs, tmp_path):
    root, _ = runs
    base = chargpt.load(root / "fim0.0", device="cpu")
    result = invoke(train_cli, ["--out-dir", root / "fim0.0", "--resume", "--fim", "0.5", "--max-iters", "1001",
                                "--device", "cpu", "--cache-dir", root / "cache"])
    assert_one_line_error(result, r"--resume: the run in .* trained without --fim, so its vocabulary has no "
                                  r"fill-in-the-middle markers; teach it in a new run: --init-from .* --fim 0.5$")
    chargpt.train(data=str(root / "table.txt"), init_from=str(root / "fim0.0"), out_dir=str(tmp_path / "taught"),
                  cache_dir=str(root / "cache"), fim=0.5, log=lambda _: None,
                  **{**QUALITY, "max_iters": 4, "eval_interval": 4, "eval_iters": 2})
    taught = chargpt.load(tmp_path / "taught/latest.safetensors", device="cpu")
    assert taught.vocab.chars[:len(base.vocab)] == base.vocab.chars  # the base's ids kept, the markers after
    assert taught.vocab.chars[len(base.vocab):] == taught.fim.chars()
    assert len(taught.generate("name: ", suffix="; age: 31", max_new_tokens=4, seed=0)[0]) <= 4
    chargpt.train(data=str(root / "table.txt"), out_dir=str(tmp_path / "taught"), resume=True, max_iters=6,
                  cache_dir=str(root / "cache"), log=lambda _: None, device="cpu", threads=1)  # it goes on
    assert chargpt.load(tmp_path / "taught/latest.safetensors", device="cpu").vocab == taught.vocab


def test_the_completions_api_fills_the_gap_and_refuses_a_run_without_fim(runs):
    need("starlette")
    openai = need("openai")
    import sys
    need("httpx2" if sys.version_info >= (3, 11) else "httpx")
    from starlette.testclient import TestClient

    from chargpt.web import server as serve
    root, _ = runs
    client = openai.OpenAI(base_url="http://localhost/v1", api_key="unused", max_retries=0,
                           http_client=TestClient(serve.create_app(root, device="cpu"), base_url="http://localhost"))
    got = client.completions.create(model="fim0.5", prompt="\nname: fay; age: ", suffix="; city: riga\n",
                                    temperature=0, max_tokens=10)
    assert got.choices[0].text == "64" and got.choices[0].finish_reason == "stop"
    plain = client.completions.create(model="fim0.0", prompt="name: ", suffix="", max_tokens=2)  # "": no suffix
    assert len(plain.choices[0].text) == 2
    with pytest.raises(openai.BadRequestError, match=r"trained without fim, so it cannot fill in the middle") as e:
        client.completions.create(model="fim0.0", prompt="name: ", suffix="; age")
    assert e.value.body["param"] == "suffix"
    assert re.search(r"drop suffix", e.value.body["message"])
    marker = chargpt.load(root / "fim0.5", device="cpu").fim.chars()[0]
    with pytest.raises(openai.BadRequestError, match=r"private-use character this run reserves") as e:
        client.completions.create(model="fim0.5", prompt=f"name{marker}", max_tokens=2)  # a marker: the prompt's fault
    assert e.value.body["param"] == "prompt"
    http = TestClient(serve.create_app(root, device="cpu"), base_url="http://localhost")
    for path, body in (("/api/generate", {"run": "fim0.5", "prompt": f"a{marker}"}),
                       ("/api/suggest", {"run": "fim0.5", "text": f"a{marker}"})):
        reply = http.post(path, json=body)
        assert reply.status_code == 400 and "reserves" in reply.json()["error"], (path, reply.text)


def test_the_exports_keep_the_markers_as_vocabulary_entries(runs, tmp_path):
    """Hugging Face: the markers are characters of its tokenizer, and greedy transformers fills the gap as chargpt
    does, ended by END as eos_token_id; GGUF, ONNX and the web page export the run (each checks its logits)."""
    need("transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from chargpt.tools.export import export
    root, _ = runs
    gen = chargpt.load(root / "fim0.5", device="cpu", dtype="float32")
    export(root / "fim0.5", to=tmp_path / "hf", log=lambda _: None)
    assert "it fills in the middle (trained with --fim): the prompt U+100000 U+100001 SUFFIX U+100002 PREFIX" in \
        (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    model, tok = AutoModelForCausalLM.from_pretrained(tmp_path / "hf"), AutoTokenizer.from_pretrained(tmp_path / "hf")
    ids = tok(gen.fim.context("\nname: fay; age: ", "; city: riga\n"), return_tensors="pt").input_ids
    assert ids.tolist()[0] == gen.vocab.encode(gen.fim.context("\nname: fay; age: ", "; city: riga\n"))
    out = model.generate(ids, do_sample=False, max_new_tokens=10, eos_token_id=gen.vocab.stoi[gen.fim.end])
    assert tok.decode(out[0, ids.shape[1]:]) == "64" + gen.fim.end
    need("gguf")
    need("onnx")
    need("onnxruntime")
    from chargpt.tools.gguf import export_gguf
    from chargpt.tools.onnx import export_onnx
    from chargpt.tools.webpage import export_web
    export_gguf(root / "fim0.5", tmp_path / "fim.gguf", log=lambda _: None)
    export_onnx(root / "fim0.5", tmp_path / "onnx", log=lambda _: None)
    export_web(root / "fim0.5", tmp_path / "fim.html", log=lambda _: None)
    assert (tmp_path / "fim.gguf").stat().st_size and (tmp_path / "onnx").is_dir() and (tmp_path / "fim.html").is_file()


def test_a_labelled_run_fills_in_the_middle_with_its_label_first(tmp_path):
    for label, text in (("a", "abc abc cab\n"), ("b", "xyz zyx xzy\n")):
        (tmp_path / "texts" / label).mkdir(parents=True)
        (tmp_path / "texts" / label / "t.txt").write_text(text * 150, encoding="utf-8")
    said = []
    chargpt.train(data=str(tmp_path / "texts"), labels="folders", fim=0.5, out_dir=str(tmp_path / "run"),
                  cache_dir=str(tmp_path / "cache"), max_iters=4, eval_interval=4, log=said.append, **TINY_RUN_KW)
    gen = chargpt.load(tmp_path / "run", device="cpu")
    assert gen.labels is not None and gen.fim is not None and any(s.startswith("fill in the middle") for s in said)
    for guidance in (None, 2.0):
        texts = gen.generate("abc ", suffix=" cab", label="a", guidance=guidance, max_new_tokens=30, num_samples=3,
                             seed=0)
        assert all(len(t) <= 30 and not any(c in t for c in gen.reserved()) for t in texts)


def test_the_repl_fills_in_the_middle_with_slash_suffix(runs):
    import io

    from chargpt.cli.repl import repl
    from chargpt.sampling.options import sample_options
    root, _ = runs
    session = b"/suffix ; city: riga\n/temp 0\n/len 10\nname: fay; age: \n"
    for run, fills in (("fim0.5", True), ("fim0.0", False)):
        out, err = io.StringIO(), io.StringIO()
        repl(chargpt.load(root / run, device="cpu", dtype="float32"), sample_options(None, seed=1),
             inp=io.BytesIO(session), out=out, err=err)
        text = out.getvalue()  # the prompt, the middle, the suffix (a line without the newline before it that the
        assert not fills or text.startswith("name: fay; age: 64") and text.endswith("; city: riga\n"), text  # gaps had)
        said = re.search(r"trained without (--)?fim", err.getvalue())  # said when /suffix is given, not later
        assert bool(said) == (not fills) and (fills or not text.endswith("; city: riga\n"))


def test_the_repl_keeps_the_suffix_as_typed_spaces_and_all(runs):
    import io

    from chargpt.cli.repl import repl
    from chargpt.sampling.options import sample_options
    root, _ = runs
    err = io.StringIO()
    repl(chargpt.load(root / "fim0.5", device="cpu", dtype="float32"), sample_options(None, seed=1),
         inp=io.BytesIO(b"/suffix  ; city: riga \n/show\n"), out=io.StringIO(), err=err)
    assert "'suffix': ' ; city: riga '" in err.getvalue()


def test_eval_scores_a_fim_run_on_its_own_validation_split(runs):
    from chargpt.tools.evaluate import evaluate
    root, _ = runs
    got = evaluate(root / "fim0.5", device="cpu", progress=False)
    assert abs(got["loss"] - chargpt.load(root / "fim0.5", device="cpu").meta["val_loss"]) < 0.05, got


def test_a_suffix_character_the_model_never_saw_is_named_as_the_suffixs(runs):
    root, _ = runs
    gen = chargpt.load(root / "fim0.5", device="cpu", dtype="float32")
    with pytest.raises(ChargptError, match=r"^suffix has 1 character\(s\) the model never saw: '€'"):
        gen.generate("name: ", suffix="; city: €", max_new_tokens=3)
