"""--init-from RUN: a new run from a trained run's weights. Old characters keep their rows exactly, new ones get a
fresh model's rows, a tied head stays tied, the lineage is recorded and shown, mismatches are one-line errors,
and a resumed fine-tuned run continues bit for bit."""

import shutil

import pytest
import torch
from click.testing import CliRunner
from helpers import TINY_FLAGS, run_chargpt, write_cipher
from safetensors.torch import load_file, save_file

import chargpt
from chargpt.cli import train_cli
from chargpt.config import ModelConfig
from chargpt.data.pairs import END, SEP
from chargpt.errors import DataError
from chargpt.model.transformer import build_model
from chargpt.runs import rundir
from chargpt.runs.checkpoint import load_model, read_meta, save_model
from chargpt.runs.info import format_info, run_info
from chargpt.tools.evaluate import evaluate
from chargpt.training.init_from import transplant
from chargpt.training.trainer import start_run

# the model of conftest's tiny_run; float32 and AdamW pinned so that exact comparisons mean the same everywhere
KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
          threads=1, sample_chars=0, dtype="float32", optimizer="adamw", curves=False, warmup_iters=0)
NEW_TEXT = "".join(f"def f{i}(x): return [x * {i}]  # QZ!\n" for i in range(80))  # '#()*QZ[]fx!' are new


def train(**kw):
    return chargpt.train(log=lambda msg: None, **{**KW, **kw})


@pytest.fixture
def new_text(tmp_path):
    path = tmp_path / "code.txt"
    path.write_text(NEW_TEXT, encoding="utf-8")
    return path


def started(**kw):
    """The model of a new run as set up, before its first step -> (model, vocabulary)."""
    run = start_run({**KW, "max_iters": 1, **kw}, log=lambda msg: None)
    run.release()
    return run.model, run.corpus.vocab


def fresh_model(mcfg, seed=1337):
    """A model as a new run builds it before any training (the run's seed, before anything else draws)."""
    torch.manual_seed(seed)
    return build_model(mcfg)


def test_old_characters_keep_their_weights_and_new_ones_start_like_a_fresh_model(tmp_path, tiny_run, new_text):
    model, vocab = started(data=str(new_text), out_dir="ft", init_from=str(tiny_run))
    base, base_vocab, _ = load_model(tiny_run / rundir.BEST)
    n_old = len(base_vocab)
    assert vocab.chars[:n_old] == base_vocab.chars  # every old id keeps its character
    assert sorted(vocab.chars[n_old:]) == sorted(set(NEW_TEXT) - set(base_vocab.chars))
    assert vocab.chars[n_old:] == sorted(vocab.chars[n_old:])  # appended in a stable (code point) order
    sd, old = model.state_dict(), base.state_dict()
    assert torch.equal(sd["wte.weight"][:n_old], old["wte.weight"])
    fresh = fresh_model(model.config).state_dict()
    assert torch.equal(sd["wte.weight"][n_old:], fresh["wte.weight"][n_old:])
    for name in sd:
        if name not in ("wte.weight", "lm_head.weight"):
            assert torch.equal(sd[name], old[name]), name
    assert model.lm_head.weight is model.wte.weight  # tied as the base was
    assert vocab.encode("QZ")  # a prompt may use the new characters


def test_an_untied_head_copies_old_rows_and_initialises_new_ones_like_a_fresh_model(tmp_path, corpus, new_text):
    train(data=str(corpus), out_dir="base", tie_weights=False, max_iters=2, eval_interval=2)
    model, _ = started(data=str(new_text), out_dir="ft", init_from="base")
    base, base_vocab, _ = load_model("base")
    n_old, sd, fresh = len(base_vocab), model.state_dict(), fresh_model(model.config).state_dict()
    assert not model.config.tie_weights and model.lm_head.weight is not model.wte.weight
    for name in ("wte.weight", "lm_head.weight"):
        assert torch.equal(sd[name][:n_old], base.state_dict()[name])
        assert torch.equal(sd[name][n_old:], fresh[name][n_old:])


def test_a_tied_head_stays_tied_while_training():
    base = build_model(ModelConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=8))
    model = build_model(ModelConfig(vocab_size=7, block_size=4, n_layer=1, n_head=2, n_embd=8))
    fresh = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(transplant(base.state_dict(), fresh, 5))
    assert model.lm_head.weight is model.wte.weight
    assert torch.equal(model.wpe.weight, base.wpe.weight[:4])  # a shorter context keeps the first positions
    model.wte.weight.grad = torch.ones_like(model.wte.weight)
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert torch.equal(model.lm_head.weight, model.wte.weight)


def test_lineage_is_recorded_and_shown_by_info_and_the_playground(tmp_path, tiny_run, new_text):
    logs = []
    chargpt.train(log=logs.append, **{**KW, "data": str(new_text), "out_dir": "ft", "init_from": str(tiny_run),
                                      "max_iters": 2, "eval_interval": 2})
    base_meta = read_meta(tiny_run / rundir.BEST)[0]
    line = read_meta("ft/best.safetensors")[0]["init_from"]
    assert line["path"] == str((tiny_run / rundir.BEST).resolve()) and line["weights"] == "best"
    assert (line["step"], line["corpus"], line["val_loss"]) == (base_meta["step"], "corpus", base_meta["val_loss"])
    assert any(m.startswith(f"starting from {line['path']} (best weights") for m in logs)
    assert any(f"{line['added_chars']} characters the base never saw" in m for m in logs)
    info = run_info("ft")
    assert info["init_from"] == line
    assert "lm_head.weight" not in load_file("ft/best.safetensors")  # a tied head is stored once, as always
    assert f"started from     {line['path']}" in format_info(info)
    assert run_info(tiny_run)["init_from"] is None
    shown = run_chargpt("info", "ft")
    assert shown.returncode == 0 and "started from" in shown.stdout and "characters added" in shown.stdout

    from starlette.testclient import TestClient

    from chargpt.web.server import create_app
    details = TestClient(create_app(tmp_path, device="cpu"), base_url="http://127.0.0.1").get("/api/runs/ft").json()
    assert details["init_from"]["path"] == f"{tiny_run.name}/{rundir.BEST}"  # the run and file: no server path


def test_latest_weights_on_request_and_eval_of_the_run_s_own_split(tmp_path, tiny_run, new_text):
    train(data=str(new_text), out_dir="ft", init_from=str(tiny_run / rundir.LATEST), max_iters=2, eval_interval=2)
    assert read_meta("ft/best.safetensors")[0]["init_from"]["weights"] == "latest"
    result = evaluate("ft", device="cpu", progress=False)  # the corpus is re-read in the run's vocabulary
    assert result["data"].startswith("validation split of code") and result["characters"] > 0


def test_dropout_may_change_and_training_settings_are_the_new_run_s_own(tmp_path, tiny_run, new_text):
    logs = []
    summary = chargpt.train(log=logs.append, **{**KW, "data": str(new_text), "out_dir": "ft", "dropout": 0.1,
                                                "init_from": str(tiny_run), "max_iters": 3, "eval_interval": 3,
                                                "learning_rate": 1e-4})
    meta = read_meta("ft/state.safetensors")[0]
    assert meta["model_config"].dropout == 0.1 and "dropout 0.1 (base: 0.0)" in logs
    assert summary["step"] == 3 and meta["run_state"]["step"] == 3  # its own budget, counted from 0
    assert meta["train_config"].learning_rate == 1e-4 and meta["train_config"].data == str(new_text)


def cli(*args):
    return CliRunner().invoke(train_cli, [*TINY_FLAGS, "--max-iters", "2", *map(str, args)])


def one_line_error(result, *words):
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in result.output, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("flags, words", [
    (["--n-layer", "2"], ["--n-layer 2 (base: 1)", "keeps its architecture"]),
    (["--block-size", "32"], ["--block-size 32 is longer than the 16 positions", "--block-size 16 or less"]),
    (["--resume"], ["--resume continues", "--init-from"]),
])
def test_mismatches_are_one_line_errors_and_create_nothing(tmp_path, tiny_run, new_text, flags, words):
    if "--resume" in flags:  # a run to resume, so that the error is about the combination
        train(data=str(new_text), out_dir="ft", max_iters=2, eval_interval=2)
    before = sorted(p.name for p in tmp_path.iterdir())
    one_line_error(cli("--data", new_text, "--out-dir", "ft", "--init-from", tiny_run, *flags), *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_file_that_is_not_a_run_is_a_one_line_error(tmp_path, new_text):
    (tmp_path / "junk.safetensors").write_bytes(b"not a checkpoint at all")
    one_line_error(cli("--data", new_text, "--init-from", "junk.safetensors"),
                   "--init-from: junk.safetensors is not a readable safetensors checkpoint")
    one_line_error(cli("--data", new_text, "--init-from", "nowhere"), "--init-from: checkpoint not found: nowhere")
    (tmp_path / "empty").mkdir()
    one_line_error(cli("--data", new_text, "--init-from", "empty"), "--init-from: no checkpoint in empty",
                   "pass a trained run's directory")
    save_file({"weight": torch.zeros(2)}, str(tmp_path / "foreign.safetensors"))
    one_line_error(cli("--data", new_text, "--init-from", "foreign.safetensors"),
                   "--init-from: foreign.safetensors is a safetensors file but not a chargpt checkpoint")
    assert not (tmp_path / "checkpoints").exists()


def test_pairs_runs_start_from_a_text_run_or_an_encoder_decoder(tmp_path, tiny_run):
    pairs = write_cipher(tmp_path / "cipher.tsv", n=200)
    # a decoder-only pairs run from a text run: its markers are new characters, the text run's rows are kept
    train(data=str(pairs), task="pairs", out_dir="dec", init_from=str(tiny_run), max_iters=2, eval_interval=2,
          eval_pairs=2)
    model, vocab, meta = load_model("dec")
    base, base_vocab, _ = load_model(tiny_run)
    assert meta["task"] == "pairs" and {SEP, END} <= set(vocab.chars[len(base_vocab):])
    assert model.config.arch == "decoder"
    assert evaluate("dec", device="cpu", progress=False)["data"].startswith("validation pairs of cipher")
    # an encoder-decoder from an encoder-decoder; the base's arch and task carry over without flags
    train(data=str(pairs), task="pairs", arch="encoder-decoder", out_dir="ed", max_iters=2, eval_interval=2,
          eval_pairs=2)
    model, vocab = started(data=str(pairs), out_dir="ed2", init_from="ed", eval_pairs=2)
    ed, ed2 = load_model("ed")[0].state_dict(), model.state_dict()
    assert model.config.arch == "encoder-decoder" and all(torch.equal(ed[k], ed2[k]) for k in ed)
    # an encoder-decoder base for a decoder or a text run: one line each
    one_line_error(cli("--data", pairs, "--task", "pairs", "--arch", "decoder", "--init-from", "ed"),
                   "--arch decoder (base: encoder-decoder)")
    one_line_error(cli("--data", tmp_path / "cipher.tsv", "--task", "text", "--init-from", "ed"),
                   "is an encoder-decoder", "--task pairs")


def test_resuming_a_fine_tuned_run_is_exact(tmp_path, tiny_run, new_text):
    """N steps, then --resume for N more == 2N steps in one go, for a run started from another (whose corpus is
    re-read in its extended vocabulary on resume). Dropout and accumulation on: random streams matter too."""
    n, kw = 4, dict(data=str(new_text), init_from=str(tiny_run), eval_interval=2, lr_decay_iters=8, dropout=0.1,
                    grad_accum=2)
    train(out_dir="whole", max_iters=2 * n, **kw)
    train(out_dir="split", max_iters=n, **kw)
    resume_kw = {k: v for k, v in kw.items() if k != "init_from"}
    train(out_dir="split", resume=True, max_iters=2 * n, **resume_kw)
    whole, split = load_file("whole/" + rundir.STATE), load_file("split/" + rundir.STATE)
    assert whole.keys() == split.keys()
    for name in whole:
        assert torch.equal(whole[name], split[name]), name
    assert read_meta("split/" + rundir.STATE)[0]["init_from"] == read_meta("whole/" + rundir.STATE)[0]["init_from"]


def test_resume_refuses_a_different_corpus_for_a_fine_tuned_run(tmp_path, tiny_run, new_text):
    train(data=str(new_text), out_dir="ft", init_from=str(tiny_run), max_iters=2, eval_interval=2)
    other = tmp_path / "other.txt"
    shutil.copy(new_text, other)
    other.write_text(NEW_TEXT + "ÆØÅ\n" * 10, encoding="utf-8")
    one_line_error(cli("--data", other, "--out-dir", "ft", "--resume", "--max-iters", "4"), "vocabulary")


def test_the_init_from_benchmark_runs_on_tiny_sizes(tmp_path, corpus, new_text):
    from chargpt.bench.quality import init_from_quality
    sets = {k: v for k, v in KW.items() if k not in ("device", "sample_chars", "curves")}
    report = init_from_quality(str(corpus), str(new_text), base_time=0.3, new_time=0.3, device="cpu",
                               sets={**sets, "eval_interval": 5}, work=tmp_path / "bench")
    rows = [r for r in report.splitlines() if r.startswith("| from")]
    assert [r.split(" | ")[0] for r in rows] == ["| from the base", "| from scratch"]
    assert all(float(r.split(" | ")[2]) > 0 for r in rows)


def test_novelty_of_a_fine_tuned_run_scores_against_its_own_training_text(tmp_path, tiny_run, new_text):
    """The run's ids live in the base's extended vocabulary, its corpus cache in the corpus's own: chargpt novelty
    finds the corpus by the key the run recorded and scores in the corpus's characters (text and pairs runs)."""
    from chargpt.tools import novelty
    train(data=str(new_text), out_dir="ft", init_from=str(tiny_run), max_iters=2, eval_interval=2)
    index = novelty.for_run(tmp_path / "ft", log=lambda m: None)
    line = NEW_TEXT.splitlines()[3] + "\n" + NEW_TEXT.splitlines()[4]
    report = index.score(line, 20)
    assert report.summary()["longest"] >= 20 and report.summary()["copied_fraction"] + report.summary()[
        "val_copied_fraction"] > 0.9
    with pytest.raises(DataError, match="hash differs"):  # another text is still refused
        novelty.for_run(tmp_path / "ft", data=str(tiny_run.parent / "corpus.txt"), log=lambda m: None)


def test_a_pairs_base_does_not_start_a_text_run(tmp_path, tiny_run):
    """A translator's vocabulary holds the pair markers: as a text run it would write them into its text."""
    pairs = tmp_path / "pairs.tsv"
    write_cipher(pairs, 60)
    train(data=str(pairs), task="pairs", out_dir="dec", init_from=str(tiny_run), max_iters=2, eval_interval=2,
          eval_pairs=2)
    with pytest.raises(chargpt.ConfigError, match="was trained on sentence pairs; it continues only on pairs"):
        train(data=str(tiny_run.parent / "corpus.txt"), task="text", out_dir="back", init_from="dec", max_iters=2)
    assert not (tmp_path / "back").exists()


def test_a_damaged_remapped_corpus_is_noticed_reported_and_rebuilt(tmp_path, tiny_run, new_text):
    """The corpus in the run's vocabulary (<key>.in-<tag>.bin beside the cache) of the right size but damaged:
    ids out of range (which crashed --resume) or wrong ids in range (which trained on the wrong text) are one log
    line each, and the file is written again from the cached corpus."""
    train(data=str(new_text), out_dir="ft", init_from=str(tiny_run), max_iters=2, eval_interval=2)
    (remapped,) = (tmp_path / "cache").glob("*.in-*.bin")
    good = remapped.read_bytes()

    def damaged(result):
        assert result.exit_code == 0, result.output
        said = [line for line in result.stderr.splitlines() if "is damaged" in line]
        assert len(said) == 1 and said[0].startswith(f"the remapped corpus {remapped} is damaged") and \
            said[0].endswith("rebuilding it"), result.stderr
        assert remapped.read_bytes() == good

    remapped.write_bytes(b"\xff" * len(good))  # ids past the vocabulary, the file's size unchanged
    damaged(cli("--data", new_text, "--out-dir", "ft", "--resume", "--max-iters", "4"))
    remapped.write_bytes(good[::-1])  # every id in range, in the wrong order
    damaged(cli("--data", new_text, "--out-dir", "ft2", "--init-from", tiny_run))
    remapped.write_bytes(good[:-1])  # a shorter file is damage too
    damaged(cli("--data", new_text, "--out-dir", "ft3", "--init-from", tiny_run))
    again = cli("--data", new_text, "--out-dir", "ft4", "--init-from", tiny_run)  # an intact one is used quietly
    assert again.exit_code == 0 and "is damaged" not in again.stderr and remapped.read_bytes() == good


def test_the_starting_from_line_shows_a_hostile_base_s_corpus_name_escaped(tmp_path, tiny_run, new_text):
    """The base's metadata is not trusted: its corpus name, with a screen clear, an OSC title and a forged line,
    is printed escaped in the start-up log."""
    model, vocab, meta = load_model(tiny_run / rundir.BEST)
    hostile = "\x1b[2J\x1b]0;owned\x07\n\rforged line\x9b"
    (tmp_path / "evil").mkdir()
    save_model(tmp_path / "evil" / rundir.BEST, model, vocab, meta["train_config"], corpus=hostile, step=5)
    logs = []
    chargpt.train(log=logs.append, **{**KW, "data": str(new_text), "out_dir": "ft", "init_from": "evil",
                                      "max_iters": 1, "eval_interval": 1})
    (line,) = [m for m in logs if m.startswith("starting from")]
    assert "\\u001b[2J\\u001b]0;owned\\u0007\\n\\rforged line\\u009b" in line
    assert not any(c in line for c in "\x1b\x07\n\r\x9b"), repr(line)


def test_a_pairs_base_on_a_text_file_without_task_says_the_task_came_from_the_base(tmp_path, tiny_run):
    """No --task: the run is --task pairs because its base was; a text file's first line has no tab, and the error
    says why this run reads pairs at all."""
    pairs = write_cipher(tmp_path / "pairs.tsv", 60)
    train(data=str(pairs), task="pairs", out_dir="dec", init_from=str(tiny_run), max_iters=2, eval_interval=2,
          eval_pairs=2)
    text = tmp_path / "new.txt"
    text.write_text(NEW_TEXT, encoding="utf-8")
    line = one_line_error(cli("--data", text, "--out-dir", "ft", "--init-from", "dec"), "new.txt:1 has no tab",
                          "the base run dec was trained on sentence pairs", "--task pairs (from the base)",
                          "pass a TSV of source<TAB>target lines", "start a text run from a text run")
    assert line.count("error") == 1 and not (tmp_path / "ft").exists()
    logs = []  # a TSV goes on as pairs, and the log says where the task came from
    chargpt.train(log=logs.append, **{**KW, "data": str(pairs), "out_dir": "ft", "init_from": "dec",
                                      "max_iters": 1, "eval_interval": 1, "eval_pairs": 2})
    assert any("task='pairs' (from the base run dec, trained on sentence pairs)" in m for m in logs), logs
