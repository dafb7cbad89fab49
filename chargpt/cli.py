"""The command lines: `python train.py` / `chargpt-train` and `python sample.py` / `chargpt-sample`.

Thin by design: flags -> one call into the package. Flags are generated from the config dataclasses
(config.flag_specs), so every setting has exactly one name, default and help line, in chargpt/config.py.
Output: results on stdout (sample.py's text; train.py's run directory, one line when it ends), everything
else (progress, logs, warnings, errors) on stderr. Errors a user can fix print one line on stderr and exit 1;
Ctrl-C exits 130 (SIGTERM 143) after saving.
"""

import codecs
import io
import itertools
import json
import os
import random
import re
import sys
from dataclasses import asdict, replace
from pathlib import Path

import click
from click.core import ParameterSource
from tqdm import tqdm

from .config import ModelConfig, SampleSettings, TrainConfig, check_sample_options, cli_names, flag_specs
from .errors import ChargptError, Interrupted
from .tokenizer import describe_chars

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
TRAIN_MEMORY_HINT = "lower --batch-size (--grad-accum keeps the global batch), --block-size or the model size " \
                    "(--n-embd, --n-layer)"
SAMPLE_MEMORY_HINT = "lower --num-samples (the samples decode together, each with its own cache)"


def spec_option(spec, default=None):
    """The click option of one generated flag. Non-boolean flags default to None unless given a default, so the
    commands can tell the flags a user typed from the ones left alone."""
    if spec.type is bool:
        return click.option(f"--{spec.name}/--no-{spec.name}", spec.dest, default=spec.default, show_default=True,
                            help=spec.help)
    ptype = click.Choice(spec.choices) if spec.choices else spec.type
    if spec.switch:
        return _switch_option(spec, ptype, default)
    return click.option(f"--{spec.name}", spec.dest, type=ptype, default=default, multiple=spec.multiple,
                        help=spec.help)


def _switch_option(spec, ptype, default):
    """`--NAME [VALUE]` (alone: the switch's first value) plus `--no-NAME` (its second), for a setting that grew
    from an on/off switch into choices (--compile auto|on|off), so that the old spellings keep working."""
    bare, negative = spec.switch

    def negate(ctx, param, given):
        if given:
            ctx.params[spec.dest] = negative
            ctx.set_parameter_source(spec.dest, ParameterSource.COMMANDLINE)

    def decorate(fn):
        fn = click.option(f"--no-{spec.name}", f"no_{spec.dest}", is_flag=True, expose_value=False, callback=negate,
                          help=f"the same as --{spec.name} {negative}")(fn)
        return click.option(f"--{spec.name}", spec.dest, type=ptype, default=default, is_flag=False,
                            flag_value=bare, help=spec.help)(fn)
    return decorate


def config_options(cls):
    """Decorator adding one click option per flag of dataclass `cls`; its help is the field's help metadata."""
    def decorate(fn):
        for spec in reversed(flag_specs(cls)):
            fn = spec_option(spec)(fn)
        return fn
    return decorate


def say(message):
    """One line on stderr; under torchrun only rank 0 speaks, so N processes do not print N copies."""
    if int(os.environ.get("RANK", 0)) == 0:
        click.echo(message, err=True)


def run_guarded(fn, memory_hint="lower the batch or model size"):
    """Run fn, turning user-fixable errors into one line on stderr and a non-zero exit (no traceback). Messages
    raised inside name settings as flags (config.cli_names); `memory_hint` says what to lower when memory runs out."""
    try:
        with cli_names():
            return fn()
    except Interrupted as e:
        say(str(e))
        sys.exit(128 + (e.signum or 2))
    except ChargptError as e:
        say(f"error: {e}")
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.stderr.close()
        sys.exit(0)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        click.echo(f"error: out of memory{_allocation(e)}; {memory_hint}", err=True)  # every rank that fails says so
        sys.exit(1)


def out_of_memory(e):
    """Whether `e` is a failed allocation. By type where there is one: torch.OutOfMemoryError (CUDA, MPS) and
    MemoryError (Python, numpy). Torch's CPU allocator raises a plain RuntimeError (checked with torch 2.13 under
    `ulimit -v`), recognised by the allocator's fixed message."""
    torch = sys.modules.get("torch")
    if isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.cuda.OutOfMemoryError)):
        return True
    return isinstance(e, RuntimeError) and ("can't allocate memory" in str(e) or "out of memory" in str(e).lower())


def _allocation(e):
    """' (2.0 GB requested)' from an allocator's message, or ''."""
    m = re.search(r"allocate (\d+) bytes", str(e))
    if m:
        return f" ({int(m[1]) / 1e9:,.1f} GB requested)"
    m = re.search(r"allocate ([\d.]+ [KMGT]iB)", str(e))  # CUDA: "Tried to allocate 2.00 GiB"
    return f" ({m[1]} requested)" if m else ""


def _log(message):
    """Training's log lines, on stderr above the progress bar (tqdm.write keeps the bar intact)."""
    tqdm.write(message, file=sys.stderr)


class TrainCommand(click.Command):
    """train's --help ends with the presets and their sizes (computed when help is shown, not at every start)."""

    def format_epilog(self, ctx, formatter):
        from .settings import preset_table
        formatter.write_paragraph()
        formatter.write("\n".join(preset_table()) + "\n")


@click.command(cls=TrainCommand, context_settings=CONTEXT)
@config_options(ModelConfig)
@config_options(TrainConfig)
def train_cli(**kwargs):
    """Train a character-level GPT on a text file (or directory) and save it to a run directory.

    With no --data it trains on the built-in corpus (CPython's English help topics), so it works offline
    on a fresh machine. Settings come from, each over the one before: the defaults, a --preset (by default the
    one that suits the device found), a --config file, and the flags given; the start-up log says which set
    what. Progress and logs go to stderr; when training ends, the run directory is printed on stdout (for
    scripts).
    """
    # only the flags actually given reach train(): on --resume, the others come from the checkpoint
    ctx = click.get_current_context()
    overrides = {k: v for k, v in kwargs.items()
                 if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    from .training import train
    summary = run_guarded(lambda: train(log=_log, **overrides), TRAIN_MEMORY_HINT)
    if int(os.environ.get("RANK", 0)) == 0:
        click.echo(summary["out_dir"])


# --- sampling ------------------------------------------------------------------------------------------
def unescape(text):
    """'\\n', '\\t', '\\r' and '\\\\' typed on a command line -> the characters (other text is kept as is)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def _read_prompt(prompt, prompt_file):
    """--prompt / --prompt-file / --prompt - -> the prompt text (UTF-8; a BOM is dropped). A file is taken exactly as
    written; from stdin, the one newline that `echo` adds at the end is dropped."""
    if prompt is not None and prompt_file is not None:
        raise ChargptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
        return _decode_prompt(data, "stdin (--prompt -)", drop_final_newline=True)
    if prompt_file is not None:
        try:
            data = Path(prompt_file).read_bytes()  # bytes: keep \r\n as written, in case the corpus had it
        except FileNotFoundError:
            raise ChargptError(f"prompt file not found: {prompt_file}") from None
        except OSError as e:
            raise ChargptError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
        return _decode_prompt(data, f"prompt file {prompt_file}")
    return prompt or ""


def _decode_prompt(data, source, drop_final_newline=False):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"{source} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None
    if drop_final_newline:
        text = text.removesuffix("\n").removesuffix("\r") if text.endswith("\n") else text
    if not text:
        raise ChargptError(f"{source} is empty; give some text, or drop it to start from a new line")
    return text


def _separator(i, n, seed):
    """The line above each sample when there are several (none for one). It is part of the result, on stdout:
    it tells the samples apart and gives the seed that reproduces them."""
    return f"========== sample {i + 1}/{n} (seed {seed}) ==========\n" if n > 1 else ""


def _format_sample(i, n, seed, prompt, text):
    return _separator(i, n, seed) + prompt + text + "\n"


def stream_samples(gen, prompt, n, seed, settings, unknown, out, use_cache=True):
    """Write samples to `out` as they are decoded: the prompt, then the text (a pairs model's: the translation
    alone). Samples are decoded together in one batch; the first is shown live and the others, buffered, follow
    when decoding ends. -> the texts."""
    prompt = gen.prompt_text(prompt, unknown)  # raises before anything is printed
    texts = [""] * n
    pieces = gen.stream(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings)
    first = next(pieces, None)  # the cache is allocated and the prompt read: running out of memory prints nothing
    prompt = shown_prompt(gen, prompt)
    out.write(_separator(0, n, seed) + prompt)
    out.flush()
    for i, piece in itertools.chain([first] if first else [], pieces):
        texts[i] += piece
        if i == 0:
            out.write(piece)
            out.flush()
    out.write("\n")
    for i in range(1, n):
        out.write(_format_sample(i, n, seed, prompt, texts[i]))
    out.flush()
    return texts


def shown_prompt(gen, prompt):
    """What is printed before a sample: the prompt it continues; nothing for a pairs model, whose prompt is the
    source and whose sample is its translation."""
    return "" if gen.task == "pairs" else prompt


def _all_samples(gen, prompt, n, seed, settings, unknown, as_json, use_cache=True, ascii_json=False, novelty=None):
    """Decode all samples, then -> (the text to write: as printed, or one JSON object per line (\\u escapes for
    every non-ASCII character with ascii_json, for an output that cannot hold them: still exact JSON), the
    texts). `novelty`: a function text -> Report, whose summary each JSON record gets as `novelty`."""
    prompt = gen.prompt_text(prompt, unknown)
    texts = gen.generate(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings)
    if not as_json:
        return "".join(_format_sample(i, n, seed, shown_prompt(gen, prompt), t) for i, t in enumerate(texts)), texts
    record = {**settings, "num_samples": n, "unknown": unknown}  # with the seed, enough to reproduce the text
    extra = [{"novelty": novelty(t).summary()} if novelty else {} for t in texts]
    return "".join(json.dumps({"sample": i, "prompt": prompt, "text": t, "seed": seed, "settings": record, **x},
                              ensure_ascii=ascii_json) + "\n" for i, (t, x) in enumerate(zip(texts, extra))), texts


def _novelty_scorer(gen, path, wanted, min_span, data, interactive):
    """With --novelty: a function text -> novelty Report against the run's training text (its index is built or
    loaded now, so a missing corpus fails before any sampling); else None."""
    if not wanted:
        if min_span is not None or data is not None:
            raise ChargptError("--min-span and --data go with --novelty; add --novelty, or drop them")
        return None
    if interactive:
        raise ChargptError("--novelty scores printed samples, not --interactive ones; drop one of them")
    from . import novelty
    min_span = novelty.DEFAULT_MIN_SPAN if min_span is None else min_span
    novelty.check_min_span(min_span)
    index = novelty.for_meta(gen.meta, str(path), data, log=lambda m: click.echo(m, err=True))
    return lambda text: index.score(text, min_span)


def _say_novelty(scorer, texts):
    """One line per sample on stderr: copied: 23% in spans of 20+; longest 57 chars, from line 2,317."""
    if scorer is None:
        return
    from .novelty import format_summary
    for i, t in enumerate(texts):
        click.echo(("" if len(texts) == 1 else f"sample {i + 1}: ") + format_summary(scorer(t)), err=True)


def _check_interactive(prompt, prompt_file, output, as_json, num_samples):
    given = [name for name, on in (("--prompt", prompt is not None), ("--prompt-file", prompt_file is not None),
                                   ("--output", output is not None), ("--json", as_json),
                                   ("--num-samples", num_samples != 1)) if on]
    if given:
        raise ChargptError(f"--interactive reads prompts from the terminal and shows one sample each; "
                           f"drop {', '.join(given)}")


def _sample_settings(flags):
    """The SampleSettings flags given (None: not given) -> validated settings as a dict of Generator keywords."""
    given = {k: v for k, v in flags.items() if v is not None}
    given["stop"] = tuple(map(unescape, flags.get("stop") or ()))
    return asdict(SampleSettings(**given).validate())


def _utf(stream):
    """Whether `stream` can write every character (a UTF encoding)."""
    try:
        return codecs.lookup(getattr(stream, "encoding", None) or "utf-8").name.startswith("utf")
    except LookupError:
        return False


def _tolerant_stdout():
    """Where stdout cannot show a character (an ASCII locale, a Windows code page) write an escape such as \\u4e2d
    in its place, instead of crashing half-way through a sample."""
    if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
        sys.stdout.reconfigure(errors="backslashreplace")


@click.command(context_settings=CONTEXT)
@click.option("--checkpoint", "checkpoint_path", default=None,
              help="run directory (its best checkpoint) or .safetensors file [default: the most recent run "
                   "under checkpoints/]")
@click.option("--prompt", default=None, help="text to continue; '-' reads stdin (without the one newline at its "
              "end that echo adds) [default: a newline]")
@click.option("--prompt-file", default=None, help="read the prompt from this UTF-8 file, exactly as written")
@config_options(SampleSettings)
@click.option("--num-samples", default=1, show_default=True, type=int,
              help="independent samples, decoded together in one batch; with more than one, a separator line "
                   "goes above each")
@click.option("--seed", default=None, type=int, help="random seed, 0 to 2**63 - 1; the same seed (and "
              "--num-samples) gives the same text [default: random, shown on stderr unless --temperature 0]")
@click.option("--unknown", default="error", show_default=True, type=click.Choice(["error", "skip", "replace"]),
              help="prompt characters the model never saw: error names them; skip drops them (with a warning); "
                   "replace maps them to U+FFFD, '?' or a space (the first the vocabulary has)")
@click.option("--output", default=None, help="write the samples to this file (UTF-8) instead of stdout")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object per sample (sample, prompt as the "
              "model saw it, text, seed, settings) for scripts")
@click.option("--interactive", is_flag=True, help="a prompt loop that keeps the model loaded; /help lists its "
              "commands, Ctrl-C stops a sample, Ctrl-D exits")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps")
@click.option("--dtype", default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16"]),
              help="precision of decoding: auto is bfloat16 where the device computes it natively (half the bytes "
                   "read per character), else float32")
@click.option("--quantize", default="none", show_default=True, type=click.Choice(["none", "int8"]),
              help="int8: int8 weights for faster decoding on a CPU (torch's dynamic quantisation; `chargpt bench "
                   "--only decode` measures its speed and its cost in loss)")
@click.option("--no-cache", is_flag=True, help="decode without the KV cache (the slow reference path)")
@click.option("--novelty", is_flag=True, help="say how much of each sample is copied from the training text: one "
              "line per sample on stderr, or a `novelty` object in each --json record (chargpt novelty)")
@click.option("--min-span", type=int, default=None, help="copied text is in spans of at least this many characters "
              "that occur verbatim in the training text; shorter ones are chance [default: 20]")
@click.option("--data", "novelty_data", default=None, help="the run's training text, for --novelty and chargpt "
              "novelty when the path it trained on has moved (checked to be the same corpus by its hash)")
def sample_cli(checkpoint_path, prompt, prompt_file, num_samples, seed, unknown, output, as_json, interactive,
               device, dtype, quantize, no_cache, novelty, min_span, novelty_data, **flags):
    """Write text in the style of a trained run. The text goes to stdout (with a separator line above each
    sample when there are several); everything else goes to stderr."""
    def main():
        from .rundir import latest_run
        from .sampling import load
        settings = _sample_settings(flags)
        check_sample_options(num_samples, seed)
        if interactive:
            _check_interactive(prompt, prompt_file, output, as_json, num_samples)
        text = _read_prompt(prompt, prompt_file)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device, dtype=dtype, quantize=quantize)
        click.echo(f"loaded {path} ({_describe_run(gen)}) on {gen.device}, {gen.precision}", err=True)
        scorer = _novelty_scorer(gen, path, novelty, min_span, novelty_data, interactive)  # before any sample
        _tolerant_stdout()
        if interactive:
            from .repl import repl
            return repl(gen, settings, seed, unknown)
        text, warning = gen.prompt_text(text, unknown), gen.unknown_warning(text, unknown)  # 'error' raises here
        if warning:
            click.echo(f"warning: {warning}", err=True)
        use_seed = seed if seed is not None else random.randrange(2**31)
        if seed is None and settings["temperature"] > 0:  # greedy text does not depend on the seed
            click.echo(f"seed: {use_seed}", err=True)
        if not (as_json or output):
            texts = stream_samples(gen, text, num_samples, use_seed, settings, unknown, sys.stdout,
                                   use_cache=not no_cache)
            _say_novelty(scorer, texts)
            return
        body, texts = _all_samples(gen, text, num_samples, use_seed, settings, unknown, as_json,
                                   use_cache=not no_cache, ascii_json=not output and not _utf(sys.stdout),
                                   novelty=scorer)
        if output:
            _write_output(output, body)
            click.echo(f"wrote {num_samples} sample(s) to {output}", err=True)
        else:
            sys.stdout.write(body)
        if not as_json:
            _say_novelty(scorer, texts)

    run_guarded(main, SAMPLE_MEMORY_HINT)


def _describe_run(gen):
    step, loss = gen.meta.get("step"), gen.meta.get("val_loss")
    facts = [f"step {step}"] if step is not None else []
    if gen.task == "pairs":
        facts.insert(0, f"sentence pairs, {gen.model.config.arch}")
    facts += [f"val loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
    return ", ".join(facts + [f"{len(gen.vocab)} characters"])


def _write_output(path, body):
    """Write the samples atomically: an interrupted write never leaves a half file over an older one."""
    from .rundir import write_text_atomic
    try:
        write_text_atomic(path, body)
    except OSError as e:
        raise ChargptError(f"cannot write --output {path}: {e.strerror}") from None


def bench_cli():
    from .bench import main
    main()


# --- the `chargpt` command: one group over the same click command objects as train.py and sample.py --------------
# Options shared between subcommands are the same click objects (_param) or are built from the config
# dataclasses (_field_option), so each option has exactly one definition.
_NOT_GIVEN = object()


def _param(command, name):
    """The parameter object `name` of another command."""
    return next(p for p in command.params if p.name == name)


def _with(*params):
    """Decorator (above @click.command) putting parameters of other commands first in this command."""
    def decorate(command):
        command.params[:0] = list(params)
        return command
    return decorate


def _reused(*params):
    """Decorator (below @click.command, among the options) placing parameters of other commands here, in order:
    click.command collects __click_params__ as click.option leaves them."""
    def decorate(fn):
        fn.__click_params__ = getattr(fn, "__click_params__", []) + list(reversed(params))
        return fn
    return decorate


def _field_option(cls, name, default=_NOT_GIVEN):
    """The click option of one config dataclass field, with the field's default filled in (or `default`, which
    then replaces the default its help line shows)."""
    spec = next(spec for spec in flag_specs(cls) if spec.dest == name)
    if default is _NOT_GIVEN:
        return spec_option(spec, default=spec.default)
    help_ = re.sub(r" \[default: [^]]*\]$", "", spec.help) + (f" [default: {default}]" if default is not None else "")
    return spec_option(replace(spec, default=default, help=help_), default=default)


from . import __version__  # noqa: E402  (this block is kept apart from the imports above for easy merging)
from .corpora import DATA_DIR  # noqa: E402

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="print one JSON object (for scripts)")


@_with(_param(sample_cli, "checkpoint_path"), _param(sample_cli, "device"))
@click.command("eval", context_settings=CONTEXT)
@click.option("--data", default=None, help="text file, or folder of text files, to score [default: the run's own "
              "validation split]")
@_field_option(TrainConfig, "target_data")
@_field_option(TrainConfig, "encoding")
@_field_option(TrainConfig, "encoding_errors")
@click.option("--stride", type=int, default=None, help="characters between windows; each window after the first "
              "scores its last STRIDE characters, so each sees at least context - STRIDE before it; 1: a full "
              "window for every character (slowest) [default: half the context]")
@click.option("--batch-size", type=int, default=None, help="windows per forward pass [default: up to 64, fewer "
              "for large vocabularies]")
@JSON_OPTION
def eval_cli(checkpoint_path, device, data, target_data, encoding, encoding_errors, stride, batch_size, as_json):
    """Loss and bits per character of a checkpoint on any text (every character scored once, with a sliding
    window). Characters the model never saw are counted and reported, not scored. A run trained on sentence pairs
    scores pairs (--data PAIRS.tsv, or --data SOURCES --target-data TARGETS): each target given its source."""
    def run():
        from .evaluate import evaluate, format_result
        from .rundir import latest_run
        result = evaluate(checkpoint_path or latest_run(), data, encoding=encoding, encoding_errors=encoding_errors,
                          stride=stride, batch_size=batch_size, device=device, target_data=target_data)
        click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_result(result))
    run_guarded(run, "lower --batch-size (windows per forward pass)")


NOVELTY_MAX_BYTES = 1 << 24  # text scored by `chargpt novelty` (16 MiB; its JSON lists two numbers per character)


@_with(_param(sample_cli, "checkpoint_path"))
@click.command("novelty", context_settings=CONTEXT)
@click.argument("text", required=False)
@click.option("--input", "input_path", default=None, help="score this UTF-8 file ('-': stdin) instead of TEXT")
@_reused(_param(sample_cli, "min_span"), _param(sample_cli, "novelty_data"))
@JSON_OPTION
def novelty_cli(checkpoint_path, text, input_path, min_span, novelty_data, as_json):
    """Is it writing or copying? Which spans of TEXT (or --input FILE) occur verbatim in the text the run trained
    on: the share of characters in copied spans of --min-span or more, and each span with the line it comes from;
    the same against the run's validation text. The first use builds an index of the corpus (cached beside it).
    With --json, also the longest copied span starting and ending at every position (`starting`, `ending`)."""
    def run():
        from . import novelty
        from .rundir import latest_run
        span = novelty.DEFAULT_MIN_SPAN if min_span is None else min_span
        novelty.check_min_span(span)
        body = _novelty_input(text, input_path)
        index = novelty.for_run(checkpoint_path or latest_run(), novelty_data, log=lambda m: click.echo(m, err=True))
        report = index.score(body, span)
        _tolerant_stdout()
        click.echo(json.dumps(report.to_json(), ensure_ascii=not _utf(sys.stdout)) if as_json
                   else novelty.format_report(report))
    run_guarded(run)


def _novelty_input(text, input_path):
    """TEXT, or --input FILE / '-' (stdin), read no further than NOVELTY_MAX_BYTES; UTF-8, an opening BOM dropped."""
    if (text is None) == (input_path is None):
        raise ChargptError("give the text to score as an argument or with --input FILE ('-': stdin), one of them")
    if text is not None:
        return text
    try:
        if input_path == "-":
            stream = sys.stdin.buffer if hasattr(sys.stdin, "buffer") else io.BytesIO(sys.stdin.read().encode())
            data = stream.read(NOVELTY_MAX_BYTES + 1)
        else:
            with open(input_path, "rb") as f:
                data = f.read(NOVELTY_MAX_BYTES + 1)
    except OSError as e:
        raise ChargptError(f"cannot read --input {input_path}: {e.strerror}") from None
    if len(data) > NOVELTY_MAX_BYTES:
        raise ChargptError(f"--input {input_path} is over {NOVELTY_MAX_BYTES >> 20} MiB; score a part of it")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"--input {input_path} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None


@click.command("info", context_settings=CONTEXT)
@click.argument("run", required=False)
@JSON_OPTION
def info_cli(run, as_json):
    """What a run is: model, vocabulary, steps, best validation loss, training time, files. RUN is a run
    directory or a .safetensors file [default: the most recent run under checkpoints/]. Reads headers only."""
    def show():
        from .rundir import latest_run
        from .runinfo import format_info, run_info
        info = run_info(run or latest_run())
        click.echo(json.dumps(info, ensure_ascii=False) if as_json else format_info(info))
    run_guarded(show)


# --- translate: a pairs run turns sources into targets ------------------------------------------------------------
TRANSLATE_CHUNK = 1024  # lines translated (and written to stdout) at a time: output flows, memory stays bounded


def _source_lines(sources, input_path):
    """-> (lines to translate, how to name line N in messages). Arguments, else --input FILE ('-': stdin), else
    stdin when it is piped. Lines are UTF-8 (an opening BOM is dropped), ending at \\n or \\r\\n."""
    if sources and input_path is not None:
        raise ChargptError("give sentences as arguments or with --input, not both")
    if sources:
        return list(sources), "sentence {}"
    if input_path is None and sys.stdin.isatty():
        raise ChargptError('nothing to translate: give a sentence (chargpt translate "..."), --input FILE, or pipe '
                           "lines into stdin")
    if input_path in (None, "-"):
        data, where = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode(), "stdin"
    else:
        try:
            data, where = Path(input_path).read_bytes(), input_path
        except OSError as e:
            raise ChargptError(f"cannot read --input {input_path}: {e.strerror}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"{where} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":  # the newline that ends the last line starts no new one
        lines.pop()
    return lines, f"line {{}} of {where}"


def _translations(gen, lines, name, options):
    """Yield the translation of each line, chunk by chunk; a blank line stays blank (files keep their alignment)."""
    for start in range(0, len(lines), TRANSLATE_CHUNK):
        chunk = lines[start:start + TRANSLATE_CHUNK]
        todo = [i for i, line in enumerate(chunk) if line.strip()]
        where = [name.format(start + i + 1) for i in todo]  # translate numbers its sources from 1
        done = gen.translate([chunk[i] for i in todo], name=lambda k, where=where: where[k - 1], **options)
        out = [""] * len(chunk)
        for i, text in zip(todo, done):
            out[i] = text
        yield from out


@_with(_param(sample_cli, "checkpoint_path"))
@click.command("translate", context_settings=CONTEXT)
@click.argument("sources", nargs=-1)
@click.option("--input", "input_path", default=None, help="translate this UTF-8 file, one sentence per line ('-': "
              "stdin) [default: the SOURCES arguments, else lines piped into stdin]")
@click.option("--output", default=None, help="write the translations to this file (UTF-8, one line per input line, "
              "written whole when all are done) instead of stdout")
@click.option("--beam", default=1, show_default=True, type=int, help="beam search with this many hypotheses per "
              "sentence (length-normalised); 1: greedy")
@click.option("--alpha", default=1.0, show_default=True, type=float, help="length normalisation of the beam search: "
              "a finished hypothesis scores its log-probability / length ** alpha (0: none, short outputs win)")
@_field_option(SampleSettings, "temperature", default=0.0)
@_field_option(SampleSettings, "top_k", default=None)
@_field_option(SampleSettings, "top_p", default=None)
@_reused(_param(sample_cli, "seed"), _param(sample_cli, "unknown"))
@click.option("--batch-size", default=64, show_default=True, type=int, help="sentences decoded together")
@_reused(_param(sample_cli, "device"), _param(sample_cli, "no_cache"))
def translate_cli(checkpoint_path, sources, input_path, output, beam, alpha, temperature, top_k, top_p, seed,
                  unknown, batch_size, device, no_cache):
    """Translate with a run trained on sentence pairs (--task pairs): SOURCES as arguments, or lines from --input
    or stdin, one translation per line on stdout (or --output). Greedy by default; --beam N searches, and
    --temperature above 0 samples. Blank lines stay blank."""
    def run():
        from .rundir import latest_run
        from .sampling import load
        settings = _sample_settings({"temperature": temperature, "top_k": top_k, "top_p": top_p})
        check_sample_options(1, seed)
        _check_translate_options(beam, alpha, settings["temperature"], batch_size)
        lines, name = _source_lines(sources, input_path)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device)
        click.echo(f"loaded {path} ({_describe_run(gen)}) on {gen.device}", err=True)
        if gen.task != "pairs":
            raise ChargptError(f"{path} was trained on plain text, not sentence pairs, so it does not translate; "
                               f"write with it (chargpt sample), or train a translator with --task pairs")
        _warn_unknown(gen, lines, unknown)
        options = dict(beam=beam, alpha=alpha, unknown=unknown, batch_size=batch_size, use_cache=not no_cache,
                       temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"])
        if settings["temperature"] > 0:
            import torch
            use_seed = seed if seed is not None else random.randrange(2**31)
            if seed is None:
                click.echo(f"seed: {use_seed}", err=True)
            options["generator"] = torch.Generator().manual_seed(use_seed)
        _tolerant_stdout()
        results = _translations(gen, lines, name, options)
        if output:
            from .rundir import write_text_atomic
            text = "".join(t + "\n" for t in results)
            try:
                write_text_atomic(output, text)
            except OSError as e:
                raise ChargptError(f"cannot write --output {output}: {e.strerror}") from None
            click.echo(f"wrote {len(lines)} translation(s) to {output}", err=True)
            return
        for t in results:
            sys.stdout.write(t + "\n")
            sys.stdout.flush()

    run_guarded(run, "lower --batch-size (sentences decoded together) or --beam")


def _check_translate_options(beam, alpha, temperature, batch_size):
    if not 1 <= beam <= 1000:
        raise ChargptError(f"--beam must be from 1 to 1000 (1: greedy), got {beam}")
    if not 0 <= alpha <= 10:  # also catches NaN
        raise ChargptError(f"--alpha must be from 0 to 10, got {alpha}")
    if beam > 1 and temperature > 0:
        raise ChargptError("--beam searches for the most likely translation and does not sample; drop --temperature, "
                           "or use --beam 1 to sample")
    if not 1 <= batch_size <= 1_000_000:
        raise ChargptError(f"--batch-size must be from 1 to 1000000, got {batch_size}")


def _warn_unknown(gen, lines, unknown):
    """With --unknown skip or replace: one warning line saying how many sentences had characters the model never
    saw (with 'error' translation stops at the first, naming it)."""
    affected = [i for i, line in enumerate(lines) if gen.vocab.unknown(line)]
    if affected and unknown != "error":
        what = "dropped" if unknown == "skip" else f"replaced with {gen.vocab.replacement()!r}"
        click.echo(f"warning: {len(affected)} sentence(s) had characters the model never saw, {what} (the first: "
                   f"{describe_chars(gen.vocab.unknown(lines[affected[0]]))})", err=True)


@click.command("plot", context_settings=CONTEXT)
@click.argument("runs", nargs=-1)
@click.option("-o", "--output", default="curves.png", show_default=True, help="PNG file to write")
@click.option("--unit", type=click.Choice(["nats", "bpc"]), default="nats", show_default=True,
              help="loss in nats per character, or bits per character")
def plot_cli(runs, output, unit):
    """Train (dashed) and validation (solid) loss against steps, one colour per run: RUNS are run directories
    [default: the most recent run under checkpoints/]. Needs matplotlib: pip install -e ".[plots]"."""
    def draw():
        from .plot import plot_runs
        from .rundir import latest_run
        click.echo(f"wrote {plot_runs(list(runs) or [latest_run()], output, unit)}", err=True)
    run_guarded(draw)


@click.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
               add_help_option=False)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def bench_command(args):
    """Speed and quality benchmarks (chargpt bench --help; the flags of python -m chargpt.bench)."""
    from .bench import main as bench_main
    bench_main(list(args), prog="chargpt bench")


DATA_DIR_OPTION = click.option("--dir", "data_dir", default=DATA_DIR, show_default=True, help="folder for corpora")


@click.group("data", context_settings=CONTEXT)
def data_cli():
    """Corpora to download: data list, data get NAME (checksum-verified, resumable)."""


@data_cli.command("list", context_settings=CONTEXT)
@DATA_DIR_OPTION
def data_list_cli(data_dir):
    """The corpora `data get` knows, and whether they are downloaded."""
    from .corpora import list_corpora
    for c in list_corpora(data_dir):
        where = f"downloaded: {c['path']}" if c["downloaded"] else f"not downloaded ({c['size']:,} bytes)"
        click.echo(f"{c['name']:<18} {c['about']}\n{'':<18} {where}; {c['url']}")


@data_cli.command("get", context_settings=CONTEXT)
@click.argument("name")
@DATA_DIR_OPTION
def data_get_cli(name, data_dir):
    """Download corpus NAME into --dir; an interrupted download resumes when run again."""
    def fetch():
        from .corpora import get
        path = get(name, data_dir, log=lambda m: click.echo(m, err=True))
        click.echo(f"train on it with: chargpt train --data {path}", err=True)
    run_guarded(fetch)


class CommandGroup(click.Group):
    """The chargpt group; `serve` is imported only when asked for (it loads torch and the web extra)."""

    LAZY = {"serve": ("chargpt.serve", "main")}

    def list_commands(self, ctx):
        return sorted([*self.commands, *self.LAZY])

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            import importlib
            module, attr = self.LAZY[name]
            self.add_command(getattr(importlib.import_module(module), attr), name)
        return super().get_command(ctx, name)


@click.group(cls=CommandGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="chargpt")
def main():
    """chargpt: train a character-level GPT on any text, and write, score and inspect with it; or, on sentence
    pairs, a translator.

    \b
      chargpt data get tinyshakespeare
      chargpt train --data data/tinyshakespeare.txt
      chargpt sample --prompt "ROMEO:"
      chargpt train --task pairs --data ita.tsv --arch encoder-decoder
      chargpt translate "Good morning."
      chargpt eval --data new_text.txt
      chargpt novelty "text to check for copying"
      chargpt info
      chargpt plot -o curves.png
      chargpt serve

    `chargpt COMMAND --help` lists a command's flags.
    """


for _name, _command in {"train": train_cli, "sample": sample_cli, "translate": translate_cli, "eval": eval_cli,
                        "info": info_cli, "novelty": novelty_cli, "plot": plot_cli, "bench": bench_command,
                        "data": data_cli}.items():
    main.add_command(_command, _name)
