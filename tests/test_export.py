"""chargpt export: a transformers folder that computes what the run computes, and says so.

Models are built in-process with every parameter drawn at random (biases and LayerNorms included, so a dropped or
misplaced one shows), saved as chargpt checkpoints, exported, and loaded back the way a user would: with the Auto
classes and no custom code. All in float32 on the CPU.
"""

import json
import math
import os
import signal
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from helpers import ROOT, assert_one_line_error, invoke, run_chargpt, snapshot
from safetensors import safe_open

import chargpt.tools.export as export_module
from chargpt.cli import export_cli
from chargpt.config import ModelConfig, TrainConfig
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import Vocab
from chargpt.errors import ChargptError
from chargpt.model.transformer import build_model
from chargpt.runs.checkpoint import read_meta, save_model
from chargpt.sampling.engine import Generator
from chargpt.tools.export import FILES, export

transformers = pytest.importorskip("transformers")  # the export extra, which the test extra installs
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline  # noqa: E402

# English with a tab, runs of spaces and a Windows line end, Chinese, emoji (one with a skin-tone modifier)
TEXT = "To be,\tor not   to be:  that is\r\nthe question.\n床前明月光，疑是地上霜。\nOK 😀👍🏽!?\n"
VOCAB = Vocab.from_text(TEXT)


def random_model(seed=0, vocab=VOCAB, scale=0.3, block_size=32, **options):
    """A float32 model whose every parameter is random: N(1, scale) for LayerNorm weights, N(0, scale) otherwise."""
    cfg = ModelConfig(vocab_size=len(vocab), block_size=block_size, n_layer=2, n_head=2, n_embd=16, dropout=0.0,
                      **options).validate()
    torch.manual_seed(seed)
    model = build_model(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0 if ".ln_" in f".{name}" and name.endswith("weight") else 0.0, scale)
    return model.eval()


def exported(tmp_path, model, vocab=VOCAB, task="text", name="hf", **meta):
    """Save `model` as a chargpt checkpoint and export it; -> the export folder."""
    ckpt = tmp_path / f"{name}.safetensors"
    save_model(ckpt, model, vocab, TrainConfig(task=task), step=7, val_loss=1.5, **meta)
    return export(ckpt, tmp_path / name, log=lambda m: None)


@pytest.mark.parametrize("options", [dict(), dict(bias=False), dict(tie_weights=False),
                                     dict(bias=False, tie_weights=False), dict(pos_emb="sinusoidal"),
                                     dict(activation="relu"), dict(emb_scale=True, tie_weights=False)],
                         ids=["bias-tied", "nobias-tied", "bias-untied", "nobias-untied", "sinusoidal", "relu",
                              "emb-scale-untied"])
@torch.no_grad()
def test_exported_logits_equal_chargpts(tmp_path, options):
    model = random_model(**options)
    folder = exported(tmp_path, model)
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()  # no trust_remote_code
    assert type(hf).__name__ == "GPT2LMHeadModel" and hf.dtype == torch.float32
    assert hf.config.activation_function == options.get("activation", "gelu")  # exact erf GELU, not gelu_new
    assert hf.config.n_positions == hf.config.n_ctx == 32 and hf.config.layer_norm_epsilon == model.h[0].ln_1.eps
    assert hf.config.tie_word_embeddings == model.config.tie_weights
    ids = torch.randint(len(VOCAB), (3, 32), generator=torch.Generator().manual_seed(1))  # (B, T): every position
    assert (hf(ids).logits - model(ids)[0]).abs().max().item() <= 1e-5


def test_weights_file_is_plain_gpt2(tmp_path):
    """No attention-mask buffers; a --no-bias run's biases are zeros; a tied head is stored once."""
    folder = exported(tmp_path, random_model(bias=False))
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        biases = {k: f.get_tensor(k) for k in names if k.endswith(".bias")}
    assert not [k for k in names if k.endswith((".attn.bias", ".attn.masked_bias"))]
    assert "lm_head.weight" not in names and "transformer.wte.weight" in names
    assert len(biases) == 2 * 6 + 1 and all((t == 0).all() for t in biases.values())  # 6 per block, and ln_f
    assert {p.name for p in folder.iterdir()} == set(FILES)


def test_greedy_generation_continues_as_chargpt(tmp_path):
    model = random_model(seed=3, scale=0.5, block_size=128)  # room for the prompt and 100 characters: no sliding
    folder = exported(tmp_path, model)
    prompt = "To be"
    ours = Generator(model, VOCAB, "cpu").generate(prompt, max_new_tokens=100, temperature=0)[0]
    assert len(ours) == 100 and len(set(ours)) >= 8  # a varied continuation, not one repeated character
    with torch.no_grad():  # no step is a near-tie that float rounding could flip: the verdict is the export's
        logits = model(torch.tensor([VOCAB.encode(prompt + ours)]))[0][0, len(prompt) - 1:-1]  # (100, V)
    top2 = logits.topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min() > 1e-3
    hf, tok = AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder)
    ids = tok(prompt, return_tensors="pt").input_ids
    out = hf.generate(ids, max_new_tokens=100, do_sample=False)
    assert tok.decode(out[0, ids.shape[1]:]) == ours
    piped = pipeline("text-generation", model=str(folder))(prompt, max_new_tokens=10, do_sample=False)
    assert piped[0]["generated_text"] == prompt + ours[:10]  # decoded with skip_special_tokens: nothing dropped


def test_pipeline_with_max_new_tokens_says_nothing_about_lengths(tmp_path, capfd):
    """generation_config.json holds max_new_tokens, not max_length: a pipeline given max_new_tokens (as in
    transformers' examples) used to warn that both were set. Without a length, half the context is written."""
    folder = exported(tmp_path, random_model(block_size=64))
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["max_new_tokens"] == 32 and "max_length" not in gen
    transformers.logging.set_verbosity_warning()  # as a user sees it (tests may have quietened it)
    capfd.readouterr()
    pipe = pipeline("text-generation", model=str(folder))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        asked = pipe("To be", max_new_tokens=10)[0]["generated_text"]
        default = pipe("To be")[0]["generated_text"]
    said = capfd.readouterr().err + "".join(str(w.message) for w in caught)
    assert "seem to have been set" not in said and "max_length" not in said, said
    assert len(asked) == len("To be") + 10 and len(default) == len("To be") + 32


def test_exported_and_run_files_are_readable_as_plain_files_are(tmp_path, tiny_run):
    """safetensors writes 0600 files; an export (meant for sharing) and a run's files get what open() would give."""
    old = os.umask(0o027)
    try:
        folder = exported(tmp_path, random_model())
        run = tmp_path / "run"
        import chargpt
        chargpt.train(data=str(tiny_run.parent / "corpus.txt"), out_dir=str(run), max_iters=2, eval_interval=1,
                      device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=1,
                      threads=1, sample_chars=0, dtype="float32", log=lambda *a: None)
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in folder.iterdir()}
    assert modes == {name: 0o640 for name in FILES} and folder.stat().st_mode & 0o777 == 0o750
    files = {p.name: p.stat().st_mode & 0o777 for p in run.iterdir() if p.is_file()}
    assert {"best.safetensors", "latest.safetensors", "metrics.jsonl"} <= set(files)
    assert files == {name: 0o640 for name in files}


def test_tokenizer_round_trips_with_chargpts_ids(tmp_path):
    folder = exported(tmp_path, random_model())
    tok = AutoTokenizer.from_pretrained(folder)
    ids = tok(TEXT)["input_ids"]
    assert ids == VOCAB.encode(TEXT)  # every character, \r, \n, \t and each space included, has chargpt's id
    assert tok.decode(ids) == TEXT and tok.decode(ids, skip_special_tokens=True) == TEXT
    assert tok.decode(tok("a  b . e ,")["input_ids"]) == "a  b . e ,"  # no clean-up of spaces before punctuation
    stand_in = VOCAB.replacement()  # chargpt's --unknown replace: a character of the vocabulary
    assert stand_in == "?" and tok("é")["input_ids"] == [VOCAB.stoi["?"]]
    assert tok.convert_ids_to_tokens(list(range(len(VOCAB)))) == VOCAB.chars


def test_export_command_writes_a_model_card(tiny_run, tmp_path):
    target = tmp_path / "shared" / "tiny-hf"
    r = run_chargpt("export", "--checkpoint", tiny_run, "--to", target)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(target) and "reproduces its logits" in r.stderr
    card = (target / "README.md").read_text(encoding="utf-8")
    meta, _ = read_meta(tiny_run / "best.safetensors")  # what a run directory exports: its best checkpoint
    size = len((tiny_run.parent / "corpus.txt").read_text(encoding="utf-8"))
    assert f"on **corpus** ({size:,} characters, 10% held out for validation in blocks spread through it)" in card
    assert "1 layers x 16 wide, 2 heads, context 16" in card and f"{meta['step']:,} steps" in card
    loss = meta["val_loss"]
    assert f"{loss:.4f} nats per character ({loss / math.log(2):.4f} bits per character)" in card
    assert 'AutoModelForCausalLM.from_pretrained("tiny-hf")' in card and "AutoTokenizer.from_pretrained" in card
    gen = json.loads((target / "generation_config.json").read_text())
    assert gen["do_sample"] is True and gen["temperature"] == 0.8 and gen["top_k"] == 0 and gen["top_p"] == 1.0
    assert gen["max_new_tokens"] == 8 and "max_length" not in gen  # half the context: a prompt fits in the rest
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_pairs_decoder_stops_at_the_end_marker(tmp_path):
    vocab = Vocab.from_text(TEXT + SEP + END)
    folder = exported(tmp_path, random_model(vocab=vocab), vocab, task="pairs")
    gen = json.loads((folder / "generation_config.json").read_text())
    assert gen["do_sample"] is False and gen["eos_token_id"] == vocab.stoi[END]
    assert "U+E000" in (folder / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("options, named", [
    (dict(arch="encoder-decoder"), "arch"), (dict(norm="post"), "norm"), (dict(emb_scale=True), "emb_scale")])
def test_what_gpt2_cannot_compute_is_refused_by_name(tmp_path, options, named):
    vocab = Vocab.from_text(TEXT + SEP + END)
    task = "pairs" if options.get("arch") else "text"
    with pytest.raises(ChargptError, match=named):
        exported(tmp_path, random_model(vocab=vocab, **options), vocab, task=task)
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_cli_errors_are_one_line_and_leave_folders_alone(tmp_path):
    ckpt = tmp_path / "post.safetensors"
    save_model(ckpt, random_model(norm="post"), VOCAB, TrainConfig())
    r = run_chargpt("export", "--checkpoint", ckpt, "--to", tmp_path / "out")
    assert r.returncode == 1 and r.stderr.startswith("error: --norm post cannot be exported")
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    for force in ([], ["--force"]):  # not empty; and --force replaces only an earlier export
        r = run_chargpt("export", "--checkpoint", ckpt, "--to", busy, *force)
        assert r.returncode == 1 and r.stderr.startswith("error: --to") and len(r.stderr.splitlines()) == 1
    assert [p.name for p in busy.iterdir()] == ["notes.txt"]
    (busy / "config.json").write_text("{}")  # a config.json alone does not make a folder an export
    r = run_chargpt("export", "--checkpoint", ckpt, "--to", busy, "--force")
    assert r.returncode == 1 and "is not an earlier export" in r.stderr and (busy / "notes.txt").read_text() == "mine"
    r = run_chargpt("export", "--checkpoint", ckpt)
    assert r.returncode == 1 and r.stderr == "error: --to is required: the folder to write the export to\n"


def hidden(*folders):
    """The hidden entries of folders: what an export must never leave behind."""
    return sorted(str(p) for folder in folders for p in folder.iterdir() if p.name.startswith("."))


@torch.no_grad()
def assert_computes(folder, model):
    hf = AutoModelForCausalLM.from_pretrained(folder).eval()
    ids = torch.randint(len(VOCAB), (2, 32), generator=torch.Generator().manual_seed(1))  # (B, T)
    assert (hf(ids).logits - model(ids)[0]).abs().max().item() <= 1e-5


def test_force_replaces_an_earlier_export(tmp_path):
    first = exported(tmp_path, random_model(seed=1))
    ckpt = tmp_path / "second.safetensors"
    second = random_model(seed=2)
    save_model(ckpt, second, VOCAB, TrainConfig())
    with pytest.raises(ChargptError, match="not empty"):
        export(ckpt, first, log=lambda m: None)
    export(ckpt, first, force=True, log=lambda m: None)
    assert {p.name for p in first.iterdir()} == set(FILES) and hidden(tmp_path) == []
    assert_computes(first, second)


def test_force_writes_only_the_exports_files(tmp_path):
    """A clone of a Hub repository that holds an earlier export: --force rewrites the export's six files and leaves
    the repository's own files and folders (.git, notes, evaluations) as they were."""
    repo = exported(tmp_path, random_model(seed=1))
    (repo / ".git" / "objects").mkdir(parents=True)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (repo / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (repo / "NOTES.md").write_text("what I tried")
    (repo / "eval").mkdir()
    (repo / "eval" / "scores.json").write_text('{"bpc": 2.1}')
    theirs = {k: v for k, v in snapshot(repo).items() if k not in FILES}
    ckpt = tmp_path / "second.safetensors"
    second = random_model(seed=2)
    save_model(ckpt, second, VOCAB, TrainConfig())
    r = invoke(export_cli, ["--checkpoint", ckpt, "--to", repo, "--force"])
    assert r.exit_code == 0, r.output
    assert {k: v for k, v in snapshot(repo).items() if k not in FILES} == theirs
    assert set(snapshot(repo)) == set(theirs) | set(FILES)
    assert_computes(repo, second)
    assert hidden(tmp_path) == [] and hidden(repo) == [str(repo / ".git"), str(repo / ".gitattributes")]


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    """A full disk half-way through: the earlier export is intact and no temporary folder is left."""
    first = exported(tmp_path, random_model(seed=1))
    before = {p.name: p.read_bytes() for p in first.iterdir()}

    def full_disk(model, vocab, meta, folder, name):
        (folder / "config.json").write_text("{")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export_module, "write_hf", full_disk)
    with pytest.raises(ChargptError, match=r"could not write .*No space left on device.*nothing was changed"):
        export(tmp_path / "hf.safetensors", first, force=True, log=lambda m: None)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


class FullDiskTokenizer:
    """The tokenizer, whose save fails as tokenizers reports a full disk: a bare Exception, after a partial write."""

    def __init__(self, vocab, tokenizers, labels=None):
        self.real = CHARACTER_TOKENIZER(vocab, tokenizers, labels)

    def save(self, path, pretty=True):
        with open(path, "w") as f:
            f.write(self.real.to_str()[:10])
        raise Exception("No space left on device (os error 28)")


CHARACTER_TOKENIZER = export_module.character_tokenizer


@pytest.mark.parametrize("force", [False, True], ids=["new-folder", "force"])
def test_disk_full_while_writing_the_tokenizer_is_one_line(tmp_path, monkeypatch, force):
    first = exported(tmp_path, random_model(seed=1))
    target = first if force else tmp_path / "new" / "hf"
    before = snapshot(tmp_path)
    monkeypatch.setattr(export_module, "character_tokenizer", FullDiskTokenizer)
    r = invoke(export_cli, ["--checkpoint", tmp_path / "hf.safetensors", "--to", target, *["--force"] * force])
    assert_one_line_error(r, rf"could not write {target}.*No space left on device.*free disk space or choose "
                             rf"another --to")
    assert snapshot(tmp_path) == before  # the earlier export as it was; no folder made, nothing hidden left


def test_to_a_symlink_writes_into_the_folder_it_points_to(tmp_path):
    real = exported(tmp_path, random_model(seed=1), name="real")
    (real / "NOTES.md").write_text("mine")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    second = random_model(seed=2)
    save_model(tmp_path / "second.safetensors", second, VOCAB, TrainConfig())
    r = invoke(export_cli, ["--checkpoint", tmp_path / "second.safetensors", "--to", link, "--force"])
    assert r.exit_code == 0, r.output
    assert link.is_symlink() and link.resolve() == real.resolve() and (real / "NOTES.md").read_text() == "mine"
    assert_computes(real, second)
    assert hidden(tmp_path) == [] and hidden(real) == []
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    r = invoke(export_cli, ["--checkpoint", tmp_path / "second.safetensors", "--to", dangling])
    assert_one_line_error(r, r"--to .*dangling is a symbolic link to .*nowhere, which does not exist")
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists() and hidden(tmp_path) == []


def test_two_exports_racing_to_one_new_folder(tmp_path, monkeypatch):
    """Both are written and checked before either claims --to: one wins, the other fails and changes nothing. (The
    two threads load and check their models one after the other: transformers' loading is not thread-safe.)"""
    models = {f"m{i}": random_model(seed=i) for i in (1, 2)}
    for name, model in models.items():
        save_model(tmp_path / f"{name}.safetensors", model, VOCAB, TrainConfig())
    one_at_a_time, both_checked = threading.Lock(), threading.Barrier(2, timeout=60)
    load_model, verify = export_module.load_model, export_module.verify

    def load_in_turn(*args):
        one_at_a_time.acquire()
        return load_model(*args)

    def verify_then_wait(*args):
        try:
            return verify(*args)
        finally:
            one_at_a_time.release()
            both_checked.wait()

    monkeypatch.setattr(export_module, "load_model", load_in_turn)
    monkeypatch.setattr(export_module, "verify", verify_then_wait)
    target, results = tmp_path / "out", {}

    def run(name):
        try:
            results[name] = export(tmp_path / f"{name}.safetensors", target, log=lambda m: None)
        except ChargptError as e:
            results[name] = e

    threads = [threading.Thread(target=run, args=(name,)) for name in models]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    failed = [name for name, r in results.items() if isinstance(r, ChargptError)]
    assert len(results) == 2 and len(failed) == 1, results
    assert "was created by another" in str(results[failed[0]])
    winner = next(name for name in models if name not in failed)
    assert_computes(target, models[winner])
    assert hidden(tmp_path) == [] and {p.name for p in target.iterdir()} == set(FILES)


def test_force_into_a_folder_another_export_holds_is_refused(tmp_path):
    """While one export holds the folder (it is renaming its files into place), another is refused in one line."""
    fcntl = pytest.importorskip("fcntl")  # the folder lock is flock's: Linux and macOS
    first = exported(tmp_path, random_model(seed=1))
    before = snapshot(tmp_path)
    fd = os.open(first, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        r = invoke(export_cli, ["--checkpoint", tmp_path / "hf.safetensors", "--to", first, "--force"])
    finally:
        os.close(fd)
    assert_one_line_error(r, rf"--to {first} is being written by another export; wait for it to finish")
    assert snapshot(tmp_path) == before


def dead_pid():
    p = subprocess.Popen([sys.executable, "-c", ""])
    p.wait()
    return p.pid


@pytest.fixture
def sigterm_ignored():
    """SIGTERM does nothing unless something handles it (its default would end pytest): an export that did not
    handle it would go on as if none came."""
    old = signal.signal(signal.SIGTERM, lambda *a: None)
    yield signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, old)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_the_export_leaves_nothing(tmp_path, monkeypatch, sigterm_ignored, signum):
    """SIGTERM (what schedulers send) stops an export as Ctrl-C does: the partial folder is removed, --to is as it
    was, and the command says so in one line with the signal's exit status."""
    first = exported(tmp_path, random_model(seed=1))
    before = snapshot(tmp_path)

    def stopped_midway(folder, model, vocab, labels=None):
        assert (folder / "model.safetensors").is_file()  # written: there is something to clean up
        signal.raise_signal(signum)
        return 0.0

    monkeypatch.setattr(export_module, "verify", stopped_midway)
    r = invoke(export_cli, ["--checkpoint", tmp_path / "hf.safetensors", "--to", first, "--force"])
    assert r.exit_code == 128 + signum and "Traceback" not in r.output, r.output
    assert r.stderr.strip() == ("interrupted" if signum == signal.SIGINT else
                                f"SIGTERM: stopped before the export was written; {first} was not changed")
    assert snapshot(tmp_path) == before
    assert signal.getsignal(signal.SIGTERM) is sigterm_ignored  # export's handler was there only while it ran


def test_a_signal_while_the_files_are_renamed_waits_for_them(tmp_path, monkeypatch, sigterm_ignored):
    """--force renames the six files into place one by one: a signal among them comes after the last, so the
    folder holds one export, never a mix of two."""
    first = exported(tmp_path, random_model(seed=1))
    second = random_model(seed=2)
    save_model(tmp_path / "second.safetensors", second, VOCAB, TrainConfig())
    replace = export_module.replace

    def signalled_among_renames(src, dst):
        if dst.name == "model.safetensors":
            signal.raise_signal(signal.SIGTERM)
        return replace(src, dst)

    monkeypatch.setattr(export_module, "replace", signalled_among_renames)
    r = invoke(export_cli, ["--checkpoint", tmp_path / "second.safetensors", "--to", first, "--force"])
    assert r.exit_code == 143 and r.stderr == f"SIGTERM: stopped after the export was written to {first}\n"
    assert_computes(first, second)
    assert hidden(tmp_path) == [] and hidden(first) == []


def test_an_export_removes_what_killed_exports_left(tmp_path):
    first = exported(tmp_path, random_model(seed=1))
    dead, alive = dead_pid(), os.getppid()
    for pid in (dead, alive):
        (tmp_path / f".hf.export{pid}.abcd1234").mkdir()
        (tmp_path / f".hf.export{pid}.abcd1234" / "model.safetensors").write_bytes(b"partial")
        (first / f".model.safetensors.tmp{pid}").write_bytes(b"partial")
    (tmp_path / f".hf-2.export{dead}.abcd1234").mkdir()  # another --to's: not this export's to clean up
    export(tmp_path / "hf.safetensors", first, force=True, log=lambda m: None)
    assert hidden(tmp_path) == sorted(str(tmp_path / n) for n in (f".hf-2.export{dead}.abcd1234",
                                                                   f".hf.export{alive}.abcd1234"))
    assert hidden(first) == [str(first / f".model.safetensors.tmp{alive}")]


def test_to_inside_a_file_says_so(tmp_path):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    (tmp_path / "notes.txt").write_text("mine")
    for to in ("notes.txt/sub", "notes.txt/sub/deeper"):
        r = invoke(export_cli, ["--checkpoint", ckpt, "--to", tmp_path / to])
        assert_one_line_error(r, rf"--to {tmp_path / to}: {tmp_path / 'notes.txt'} is a file, not a folder")
        assert "disk space" not in r.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine" and hidden(tmp_path) == []


def test_missing_transformers_is_one_line(tmp_path, monkeypatch):
    ckpt = tmp_path / "m.safetensors"
    save_model(ckpt, random_model(), VOCAB, TrainConfig())
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    with pytest.raises(ChargptError, match=r'pip install -e "\.\[export\]"'):
        export(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_other_commands_do_not_import_transformers():
    code = "import sys, chargpt, chargpt.cli, chargpt.config; print(sorted({'transformers', 'tokenizers'} & " \
           "set(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "[]", r.stderr


def test_force_into_a_folder_that_is_no_export_names_only_what_it_lacks(tmp_path):
    """A folder with a config.json of its own is refused by what it lacks (not "it lacks config.json")."""
    target = tmp_path / "busy"
    target.mkdir()
    (target / "config.json").write_text("{}")
    with pytest.raises(ChargptError, match=r"is not an earlier export \(it lacks model.safetensors, tokenizer.json\), "
                                           r"and --force replaces only an export's files; choose a new folder$"):
        export_module.check_target(target, tmp_path / "run.safetensors", force=True)
