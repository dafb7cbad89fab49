"""sample.py as a user runs it: prompts from flags, files and stdin; --output, --json, separators; the REPL;
and bad input, which must give one line on stderr and a non-zero exit, never a traceback.

The checkpoint is the "counter" model of test_sampling (the character after id i is id i+1), saved with
save_model, so expected text can be written down. Subprocess runs cost ~2 s each (importing torch), so the
error cases run in-process through click's CliRunner and a few representative ones also as real processes.
"""

import io
import json
import re

import pytest
from click.testing import CliRunner
from helpers import VOCAB, counter_gen, counter_model, random_model, run_cli, train_pairs, write_cipher

import chargpt
import chargpt.cli.repl as repl_module
from chargpt import textio
from chargpt.cli import sample_cli
from chargpt.cli.repl import repl
from chargpt.runs.checkpoint import save_model
from chargpt.sampling.engine import Generator
from chargpt.sampling.options import SampleOptions

GREEDY = ["--temperature", "0", "--seed", "1"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    run = tmp_path_factory.mktemp("ckpt") / "run"
    run.mkdir()
    save_model(run / "best.safetensors", counter_model(), VOCAB, step=42, val_loss=0.5)
    return run


def cli(*args, input=None):
    """sample.py in-process -> click Result (stdout and stderr kept apart)."""
    return CliRunner().invoke(sample_cli, [str(a) for a in args], input=input)


def assert_one_line_error(stderr, *needles):
    """The error is one 'error: ...' line, the last thing on stderr (after any 'loaded ...' notes)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert "Traceback" not in stderr
    assert lines and lines[-1].startswith("error: ") and sum("error" in line for line in lines) == 1, stderr
    for needle in needles:
        assert needle in lines[-1], lines[-1]


# --- real processes ---------------------------------------------------------------------------------------------
def test_prompt_from_stdin_with_unknown_skip_warning(ckpt):
    r = run_cli("sample.py", "--checkpoint", ckpt, "--prompt", "-", "--unknown", "skip", "--max-new-tokens", 5,
                *GREEDY, input="aÉb")
    assert r.returncode == 0, r.stderr
    assert r.stdout == "abcdefg\n"  # streamed: the prompt as the model saw it, then the text
    assert "warning:" in r.stderr and "'É' (U+00C9) at 1" in r.stderr
    assert "step 42" in r.stderr and "28 characters" in r.stderr


def test_prompt_file_to_output_file_with_separators(ckpt, tmp_path):
    (tmp_path / "prompt.txt").write_text("xy", encoding="utf-8")
    r = run_cli("sample.py", "--checkpoint", ckpt, "--prompt-file", "prompt.txt", "--output", "out.txt",
                "--num-samples", 2, "--max-new-tokens", 4, *GREEDY, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "wrote 2 sample(s) to out.txt" in r.stderr
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == (
        "========== sample 1/2 (seed 1) ==========\nxyz\n a\n"
        "========== sample 2/2 (seed 1) ==========\nxyz\n a\n")


def test_json_one_object_per_sample(ckpt):
    r = run_cli("sample.py", "--checkpoint", ckpt, "--prompt", "ab", "--json", "--num-samples", 2, "--stop", "f",
                "--max-new-tokens", 9, "--top-k", 3, *GREEDY)
    assert r.returncode == 0, r.stderr
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [rec["sample"] for rec in records] == [0, 1]
    rec = records[0]
    assert (rec["prompt"], rec["text"], rec["seed"]) == ("ab", "cde", 1)
    off = dict.fromkeys(["min_p", "repetition_penalty", "no_repeat_ngram", "ban", "allow", "form", "acrostic", "regex",
                         "grammar", "json_schema", "best_of", "label", "guidance",
                         "suffix"])  # no constraint given; no label; no suffix (fill in the middle)
    assert rec["settings"] == {"max_new_tokens": 9, "temperature": 0.0, "top_k": 3, "top_p": None, "stop": ["f"],
                               **off, "beam": None, "length_penalty": 1.0, "num_samples": 2, "unknown": "error"}


def test_interactive_repl_through_stdin(ckpt):
    session = "/len 3\nab\n/temp 0.5\n/topk 1\n/show\n/len -2\n/bogus\nst\n"  # then end of input
    too_long = "x" * (2 << 20) + "\n"  # an error for that line only
    r = run_cli("sample.py", "--checkpoint", ckpt, "--interactive", "--seed", 3, input=too_long + session)
    assert r.returncode == 0, r.stderr
    assert "error: input line 1 is longer than 1 MiB" in r.stderr
    assert r.stdout == "abcde\nstuvw\n"  # top-k 1 keeps the counter greedy at any temperature
    assert "max_new_tokens = 3" in r.stderr and "temperature = 0.5" in r.stderr and "top_k = 1" in r.stderr
    assert "invalid value for /len" in r.stderr and "unknown command /bogus" in r.stderr
    assert "Traceback" not in r.stderr


def test_bad_input_in_a_real_process(tmp_path):
    (tmp_path / "corrupt.safetensors").write_bytes(b"\x00" * 100)
    r = run_cli("sample.py", "--checkpoint", "corrupt.safetensors", cwd=tmp_path)
    assert r.returncode == 1
    assert_one_line_error(r.stderr, "corrupt.safetensors")


# --- in-process -------------------------------------------------------------------------------------------------
def test_several_samples_stream_with_separators_and_stops(ckpt):
    r = cli("--checkpoint", ckpt, "--prompt", "ab", "--num-samples", 3, "--stop", "e", "--stop", "zz",
            "--max-new-tokens", 6, *GREEDY)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "".join(f"========== sample {i}/3 (seed 1) ==========\nabcd\n" for i in (1, 2, 3))


def test_random_seed_is_reported(ckpt):
    r = cli("--checkpoint", ckpt, "--max-new-tokens", 3)
    assert r.exit_code == 0, r.stderr
    assert "seed: " in r.stderr and r.stdout == " ab\n"  # an empty prompt: the model starts after an unseen "\n"


def test_unknown_replace_and_error(ckpt):
    r = cli("--checkpoint", ckpt, "--prompt", "aÉ", "--unknown", "replace", "--max-new-tokens", 2, *GREEDY)
    assert r.exit_code == 0 and r.stdout == "a ab\n" and "replaced with ' '" in r.stderr
    r = cli("--checkpoint", ckpt, "--prompt", "aÉb!", *GREEDY)
    assert r.exit_code == 1
    assert_one_line_error(r.stderr, "'É' (U+00C9) at 1", "'!' (U+0021) at 3", "--unknown skip")


def test_prompt_file_drops_a_utf8_bom(ckpt, tmp_path):
    (tmp_path / "p.txt").write_bytes("\ufeffab".encode())
    r = cli("--checkpoint", ckpt, "--prompt-file", "p.txt", "--max-new-tokens", 1, *GREEDY)
    assert r.exit_code == 0 and r.stdout == "abc\n", r.stderr


@pytest.mark.parametrize("args,needle", [
    (["--temperature", "-0.5"], "--temperature"),
    (["--temperature", "nan"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-1"], "--top-k"),
    (["--max-new-tokens", "-1"], "--max-new-tokens"),
    (["--num-samples", "0"], "--num-samples"),
    (["--stop", ""], "--stop"),
    (["--checkpoint", "missing"], "not found"),
    (["--checkpoint", "corrupt.safetensors"], "not a readable"),
    (["--checkpoint", "truncated.safetensors"], "truncated.safetensors"),
    (["--checkpoint", "emptydir"], "no checkpoint in emptydir"),
    ([], "no trained run"),
    (["--prompt-file", "empty.txt"], "empty"),
    (["--prompt-file", "nope.txt"], "not found"),
    (["--prompt-file", "latin1.txt"], "not UTF-8"),
    (["--prompt", "a", "--prompt-file", "p.txt"], "either"),
    (["--prompt", "-"], "stdin"),  # stdin is empty
    (["--interactive", "--json"], "--json"),
    (["--checkpoint", "CKPT", "--prompt", "ab", "--output", "adir"], "cannot write"),
    (["--checkpoint", "CKPT", "--prompt", "ab\t"], "'\\t' (U+0009) at 2"),
], ids=str)
def test_bad_input_is_one_line_and_nonzero(args, needle, ckpt, tmp_path):
    (tmp_path / "corrupt.safetensors").write_bytes(b"not a checkpoint at all")
    data = (ckpt / "best.safetensors").read_bytes()
    (tmp_path / "truncated.safetensors").write_bytes(data[:len(data) // 2])
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    (tmp_path / "p.txt").write_text("ab")
    (tmp_path / "emptydir").mkdir()
    (tmp_path / "adir").mkdir()
    r = cli(*[ckpt if a == "CKPT" else a for a in args], input="")
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit)
    assert_one_line_error(r.stderr, needle)


@pytest.mark.parametrize("piped,prompt", [("ab\n", "ab"), ("ab\r\n", "ab"), ("ab\n\n", "ab\n"), ("ab", "ab")])
def test_prompt_from_stdin_drops_the_newline_echo_adds(ckpt, piped, prompt):
    r = cli("--checkpoint", ckpt, "--prompt", "-", "--max-new-tokens", 3, *GREEDY, input=piped)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == prompt + Generator(counter_model(), VOCAB, "cpu").generate(prompt, max_new_tokens=3,
                                                                                 temperature=0)[0] + "\n"


def test_help_shows_every_sampling_flag_with_its_default():
    shown = " ".join(cli("--help").stdout.split())  # click wraps lines
    for flag, default in [("--max-new-tokens", "500"), ("--temperature", "0.8"), ("--top-k", "off"),
                          ("--top-p", "off"), ("--stop", "none"), ("--num-samples", "1"), ("--unknown", "error"),
                          ("--device", "auto"), ("--dtype", "auto"), ("--quantize", "none")]:
        assert re.search(rf"{flag} \S+ .*?\[default: {default}\]", shown), flag
    for flag in ("--checkpoint", "--prompt", "--prompt-file", "--seed", "--output", "--json", "--interactive",
                 "--no-cache"):
        assert flag in shown


def test_unknown_flag_is_a_usage_error():
    r = cli("--n-layer", "2")  # a training flag
    assert r.exit_code == 2 and "No such option" in r.stderr and "Traceback" not in r.stderr


# --- the REPL in-process ------------------------------------------------------------------------------------------
def drive(lines, seed=0, unknown="error", **settings):
    out, err = io.StringIO(), io.StringIO()
    settings = {"max_new_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "stop": (), **settings}
    repl(counter_gen(), SampleOptions.of(seed=seed, unknown=unknown, **settings), inp=io.StringIO(lines), out=out,
         err=err)
    return out.getvalue(), err.getvalue()


def test_repl_commands_change_settings_between_prompts():
    out, err = drive("ab\n/len 2\nab\n/topp 1\n/topk 0\n/show\n/seed 5\n\n/quit\nnever\n")
    assert out == "abcdef\nabcd\n a\n"  # an empty line starts after "\n"; /quit ends before the last line
    assert "top_p = None" in err and "top_k = None" in err and "seed = 5" in err


def test_repl_reports_bad_prompts_and_values_and_goes_on():
    out, err = drive("aÉ\n/temp x\n/topp 2\nab\n")
    assert out == "abcdef\n"
    assert "error: prompt has 1 character(s)" in err and "usage: /temp FLOAT" in err and "/topp" in err
    out, err = drive("aÉ\n", unknown="skip")
    assert out == "abcde\n" and "warning:" in err


def test_repl_a_too_long_line_is_an_error_for_that_line_and_the_session_goes_on(monkeypatch):
    """As docs/robustness.md says: a line past the 1 MiB cap is one error line, the rest of it is skipped, and the
    next prompt is answered. A line that never ends (/dev/zero) ends the session, after a bounded read."""
    long = "a" * (textio.MAX_LINE_BYTES + 10)
    for make in (io.StringIO, lambda text: io.BytesIO(text.encode())):  # a test's text stream, and stdin's bytes
        out, err = io.StringIO(), io.StringIO()
        settings = {"max_new_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "stop": ()}
        repl(counter_gen(), SampleOptions.of(seed=0, **settings), inp=make(f"{long}\nab\n{long}"), out=out, err=err)
        assert out.getvalue() == "abcdef\n"
        errors = [line for line in err.getvalue().splitlines() if "error:" in line]
        assert len(errors) == 2 and "input line 1 is longer than 1 MiB" in errors[0] and "input line 3" in errors[1]
    monkeypatch.setattr(repl_module, "SKIP_BYTES", 4 << 20)
    ends = r"input line 1 is longer than 1 MiB.*; it has no end after 4 MiB more .*so the session ends$"
    with pytest.raises(textio.TooLarge, match=ends):
        repl(counter_gen(), SampleOptions(seed=0), inp=io.StringIO("a" * (6 << 20)), out=io.StringIO(),
             err=io.StringIO())


def test_repl_on_a_pairs_run_asks_for_a_sentence_to_translate(tmp_path):
    """A translator has no default start: an empty line says what it needs (a source sentence per line), not the
    --prompt flag of a one-shot sample; the help says what a line is; the session goes on."""
    train_pairs(write_cipher(tmp_path / "pairs.tsv", 60), tmp_path / "dec", steps=2, eval_pairs=2)
    out, err = io.StringIO(), io.StringIO()
    settings = {"max_new_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "stop": ()}
    repl(chargpt.load(tmp_path / "dec", device="cpu"), SampleOptions.of(seed=0, **settings),
         inp=io.StringIO("\nabc\n/help\n"), out=out, err=err)
    assert len(out.getvalue().splitlines()) == 1  # the translation of abc, the one sentence given
    assert "error: this model was trained on sentence pairs: type a source sentence, one per line" in err.getvalue()
    assert "--prompt" not in err.getvalue() and "prompt=" not in err.getvalue()
    assert err.getvalue().count("anything else is a sentence to translate (one per line)") == 2  # start and /help


def test_repl_session_seed_replays_and_each_prompt_gets_its_own():
    gen = Generator(random_model(), VOCAB, "cpu")
    settings = {"max_new_tokens": 12, "temperature": 1.0, "top_k": None, "top_p": None, "stop": ()}

    def session(seed):
        out = io.StringIO()
        repl(gen, SampleOptions.of(seed=seed, **settings), inp=io.StringIO("ab\nab\n"), out=out, err=io.StringIO())
        return out.getvalue()

    first = session(11)
    assert first == session(11) and first != session(12)
    a, b = first.splitlines()
    assert a != b


def test_repl_ctrl_c_stops_only_the_current_sample():
    class Interrupting(io.StringIO):
        """Input whose first read is interrupted, as Ctrl-C at the "> " prompt would be."""
        first = True

        def readline(self, size=-1):
            if self.first:
                self.first = False
                raise KeyboardInterrupt
            return super().readline(size)

    gen = counter_gen()
    real_stream = gen.stream

    def stream(prompt, *args, **kw):  # Ctrl-C after the first piece of the first sample
        for n, piece in enumerate(real_stream(prompt, *args, **kw)):
            if prompt == "ab" and n == 1:
                raise KeyboardInterrupt
            yield piece

    gen.stream = stream
    out, err = io.StringIO(), io.StringIO()
    settings = {"max_new_tokens": 4, "temperature": 0.0, "top_k": None, "top_p": None, "stop": ()}
    repl(gen, SampleOptions.of(seed=0, **settings), inp=Interrupting("ab\nst\n"), out=out, err=err)
    assert out.getvalue() == "abc\nstuvwx\n"
    assert "[stopped]" in err.getvalue() and "Ctrl-D or /quit exits" in err.getvalue()


def test_stop_understands_backslash_escapes():
    from chargpt.textio import unescape
    assert unescape(r"\n\n") == "\n\n" and unescape(r"a\tb") == "a\tb" and unescape(r"\\n") == "\\n"
    assert unescape("床前\\n") == "床前\n"  # non-ASCII text is left alone


# --- constraints and best-of on the command line ----------------------------------------------------------------
def test_forms_lists_the_named_forms_without_a_model():
    r = cli("--forms", "--checkpoint", "nowhere")
    assert r.exit_code == 0 and "五言绝句 (wujue" in r.stdout and len(r.stdout.splitlines()) == 4


def test_a_constrained_sample_streams_and_reports_what_the_constraints_removed(ckpt):
    r = cli("--checkpoint", ckpt, "--prompt", "xy", "--ban", "\\n", "--max-new-tokens", 4, *GREEDY)
    assert r.exit_code == 0, r.stderr
    assert r.stdout == "xyz ab\n"  # after z the counter wants \n: banned, so the next (all equal) is ' '
    assert re.search(r"^mean log-prob -\d+\.\d{3} nats/char; the constraints removed \d+\.\d{3} nats/char$",
                     r.stderr, re.M)
    r = cli("--checkpoint", ckpt, "--prompt", "ab", "--form", "__ _", "--json", "--num-samples", 2, *GREEDY)
    records = [json.loads(line) for line in r.stdout.splitlines()]
    assert [rec["text"] for rec in records] == ["cd a"] * 2  # the space is written, the counter goes on from it
    assert records[0]["settings"]["form"] == "__ _" and set(records[0]["score"]) == {"logprob", "chars", "removed"}
    assert records[0]["score"]["chars"] == 4 and records[0]["score"]["removed"] > 1  # the counter wanted e, not ' '


def test_best_of_prints_the_kept_samples_with_their_scores(ckpt, tmp_path):
    r = cli("--checkpoint", ckpt, "--prompt", "ab", "--best-of", 3, "--num-samples", 2, "--max-new-tokens", 5,
            "--temperature", 1.0, "--seed", 1, "--min-span", 4)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.count("========== sample") == 2
    assert "best-of ranks without dropping copies of the training text" in r.stderr  # a run saved by hand
    assert re.search(r"^best 1 of 3 \(row \d\): mean log-prob", r.stderr, re.M)
    r = cli("--checkpoint", ckpt, "--prompt", "ab", "--best-of", 3, "--json", "--max-new-tokens", 5, *GREEDY)
    (rec,) = [json.loads(line) for line in r.stdout.splitlines()]
    assert rec["score"]["best_of"] == 3 and rec["score"]["dropped"] is None and rec["text"] == "cdefg"
    r = cli("--checkpoint", ckpt, "--best-of", 2, "--num-samples", 3)
    assert_one_line_error(r.stderr, "--best-of (2) must be at least --num-samples (3)")
    r = cli("--checkpoint", ckpt, "--form", "_é", "--max-new-tokens", 4)
    assert r.stdout == "" and r.exit_code == 1
    assert_one_line_error(r.stderr, "--form: the form's character 'é' (U+00E9) is not in this model's vocabulary")


def test_repl_takes_the_constraints_and_reports_scores():
    out, err = drive("/form __ _\nab\n/ban c\nab\n/ban\n/form\nab\n/bestof 2\nab\n/form *_\n", max_new_tokens=6)
    assert out.splitlines() == ["abcd a", "abab a", "abcdefgh", "abcdefgh"]  # c banned: the first letter left
    assert err.count("the constraints removed") == 2 and "form = None" in err and "ban = None" in err
    assert "best 1 of 2" in err and "invalid value for /form" in err


def test_a_scored_sample_ends_its_line_before_its_score_line(ckpt):
    """In a terminal stdout and stderr share the screen: the score line must not glue onto the sample's text."""
    import io

    from chargpt.cli.writers import Target, write_scored
    from chargpt.sampling.engine import load
    from chargpt.sampling.options import SampleOptions
    screen = io.StringIO()
    target = Target(say=lambda line: screen.write(line + "\n"), stdout=screen)
    write_scored(load(ckpt, device="cpu"), "xy", SampleOptions.of(ban="\n", max_new_tokens=4, temperature=0.0), target)
    assert re.fullmatch(r"xyz ab\nmean log-prob -\d+\.\d{3} nats/char; the constraints removed [\d.]+ nats/char\n",
                        screen.getvalue()), screen.getvalue()


def test_prompt_escapes_follow_the_rule_of_stop_and_ban():
    """--prompt '李白\\n' is a line then a new one, as --stop '\\n' is: one rule for every flag (a file and stdin are
    taken as written)."""
    from chargpt.textio import read_prompt
    assert read_prompt("李白\\n", None) == "李白\n" and read_prompt("a\\tb\\\\n", None) == "a\tb\\n"
    assert read_prompt(None, None) == ""
