"""The command lines: `python train.py` / `chargpt-train` and `python sample.py` / `chargpt-sample`.

Thin by design: flags -> one call into the package. Training flags are generated from the config
dataclasses, so every hyperparameter has exactly one name, default and help line (in chargpt/config.py).
Errors a user can fix print one line on stderr and exit 1; Ctrl-C exits 130 (SIGTERM 143) after saving.
"""

import json
import os
import random
import re
import sys
from dataclasses import asdict, fields
from pathlib import Path

import click
from click.core import ParameterSource
from tqdm import tqdm

from .config import PRESETS, ModelConfig, SampleSettings, TrainConfig, flag
from .errors import ChargptError, Interrupted

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}


def _field_type(f):
    t = f.type
    for cand in (bool, int, float, str):  # `int | None` and friends
        if t is cand or cand in getattr(t, "__args__", ()):
            return cand
    return str


def config_options(cls):
    """Decorator adding one click option per dataclass field; its help is the field's help metadata."""
    def decorate(fn):
        for f in reversed(fields(cls)):
            if f.metadata.get("flag") is False:
                continue
            typ, name = _field_type(f), flag(f.name)
            if f.name in PRESETS["cpu"]:
                default = f"{PRESETS['cpu'][f.name]} on CPU, {PRESETS['gpu'][f.name]} on GPU"
            else:
                default = f.default if f.default is not None else None
            help_ = f.metadata["help"] + (f" [default: {default}]" if default is not None and typ is not bool
                                          and "[default" not in f.metadata["help"] else "")
            if typ is bool:
                fn = click.option(f"--{name}/--no-{name}", f.name, default=f.default, show_default=True,
                                  help=help_)(fn)
            else:
                ptype = click.Choice(f.metadata["choices"]) if "choices" in f.metadata else typ
                fn = click.option(f"--{name}", f.name, type=ptype, default=None, help=help_)(fn)
        return fn
    return decorate


def say(message):
    """One line on stderr; under torchrun only rank 0 speaks, so N processes do not print N copies."""
    if int(os.environ.get("RANK", 0)) == 0:
        click.echo(message, err=True)


def run_guarded(fn):
    """Run fn, turning user-fixable errors into one line on stderr and a non-zero exit (no traceback)."""
    try:
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
    except MemoryError:
        click.echo("error: out of memory; lower --batch-size or --block-size", err=True)
        sys.exit(1)
    except RuntimeError as e:
        if "out of memory" in str(e).lower():
            click.echo("error: out of device memory; lower --batch-size, --block-size or the model size", err=True)
            sys.exit(1)
        raise


@click.command(context_settings=CONTEXT)
@config_options(ModelConfig)
@config_options(TrainConfig)
def train_cli(**kwargs):
    """Train a character-level GPT on a text file (or directory) and save it to a run directory.

    With no --data it trains on the built-in corpus (CPython's English help topics), so it works offline
    on a fresh machine. Sizes default to what suits the device found (printed at start).
    """
    # only the flags actually given reach train(): on --resume, the others come from the checkpoint
    ctx = click.get_current_context()
    overrides = {k: v for k, v in kwargs.items()
                 if ctx.get_parameter_source(k) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}
    from .training import train
    run_guarded(lambda: train(log=tqdm.write, **overrides))


# --- sampling ------------------------------------------------------------------------------------------
def unescape(text):
    """'\\n', '\\t', '\\r' and '\\\\' typed on a command line -> the characters (other text is kept as is)."""
    return re.sub(r"\\([ntr\\])", lambda m: {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}[m.group(1)], text)


def _read_prompt(prompt, prompt_file):
    """--prompt / --prompt-file / --prompt - -> the prompt text, exactly as given (UTF-8; a BOM is dropped)."""
    if prompt is not None and prompt_file is not None:
        raise ChargptError("pass either --prompt or --prompt-file, not both")
    if prompt == "-":
        data = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
        return _decode_prompt(data, "stdin (--prompt -)")
    if prompt_file is not None:
        try:
            data = Path(prompt_file).read_bytes()  # bytes: keep \r\n as written, in case the corpus had it
        except FileNotFoundError:
            raise ChargptError(f"prompt file not found: {prompt_file}") from None
        except OSError as e:
            raise ChargptError(f"cannot read prompt file {prompt_file}: {e.strerror}") from None
        return _decode_prompt(data, f"prompt file {prompt_file}")
    return prompt or ""


def _decode_prompt(data, source):
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ChargptError(f"{source} is not UTF-8 (byte offset {e.start}); convert it to UTF-8") from None
    if not text:
        raise ChargptError(f"{source} is empty; give some text, or drop it to start from a new line")
    return text


def _separator(i, n, seed):
    """The line above each sample when there are several (none for one)."""
    return f"========== sample {i + 1}/{n} (seed {seed}) ==========\n" if n > 1 else ""


def _format_sample(i, n, seed, prompt, text):
    return _separator(i, n, seed) + prompt + text + "\n"


def stream_samples(gen, prompt, n, seed, settings, unknown, out, use_cache=True):
    """Write samples to `out` as they are decoded: the prompt, then the text. Samples are decoded together in
    one batch; the first is shown live and the others, buffered, follow when decoding ends. -> the texts."""
    prompt = gen.prompt_text(prompt, unknown)  # raises before anything is printed
    texts = [""] * n
    out.write(_separator(0, n, seed) + prompt)
    out.flush()
    for i, piece in gen.stream(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings):
        texts[i] += piece
        if i == 0:
            out.write(piece)
            out.flush()
    out.write("\n")
    for i in range(1, n):
        out.write(_format_sample(i, n, seed, prompt, texts[i]))
    out.flush()
    return texts


def _all_samples(gen, prompt, n, seed, settings, unknown, as_json, use_cache=True):
    """Decode all samples, then -> the text to write: as printed, or one JSON object per line."""
    prompt = gen.prompt_text(prompt, unknown)
    texts = gen.generate(prompt, num_samples=n, seed=seed, use_cache=use_cache, **settings)
    if not as_json:
        return "".join(_format_sample(i, n, seed, prompt, t) for i, t in enumerate(texts))
    record = {**settings, "num_samples": n, "unknown": unknown}  # with the seed, enough to reproduce the text
    return "".join(json.dumps({"sample": i, "prompt": prompt, "text": t, "seed": seed, "settings": record},
                              ensure_ascii=False) + "\n" for i, t in enumerate(texts))


def _check_interactive(prompt, prompt_file, output, as_json, num_samples):
    given = [name for name, on in (("--prompt", prompt is not None), ("--prompt-file", prompt_file is not None),
                                   ("--output", output is not None), ("--json", as_json),
                                   ("--num-samples", num_samples != 1)) if on]
    if given:
        raise ChargptError(f"--interactive reads prompts from the terminal and shows one sample each; "
                           f"drop {', '.join(given)}")


@click.command(context_settings=CONTEXT)
@click.option("--checkpoint", "checkpoint_path", default=None,
              help="run directory (its best checkpoint) or .safetensors file [default: the most recent run "
                   "under checkpoints/]")
@click.option("--prompt", default=None, help="text to continue ('-' reads stdin) [default: a newline]")
@click.option("--prompt-file", default=None, help="read the prompt from this UTF-8 file")
@click.option("--max-new-tokens", default=SampleSettings.max_new_tokens, show_default=True, type=int,
              help="characters to generate")
@click.option("--temperature", default=SampleSettings.temperature, show_default=True, type=float,
              help="randomness: below 1 safer, above 1 wilder; 0 always picks the most likely character")
@click.option("--top-k", default=None, type=int, help="sample only from the k most likely characters "
              "(clamped to the vocabulary; 0: off) [default: off]")
@click.option("--top-p", default=None, type=float, help="nucleus sampling: the smallest set of characters "
              "whose probability reaches p, in (0, 1] (1: off) [default: off]")
@click.option("--num-samples", default=1, show_default=True, type=int,
              help="independent samples, decoded together in one batch")
@click.option("--seed", default=None, type=int, help="random seed; the same seed (and --num-samples) gives "
              "the same text [default: random, printed on stderr]")
@click.option("--stop", multiple=True, help="stop a sample when it writes this string (not included); "
              "\\n and \\t mean newline and tab, so --stop '\\n\\n' stops at a blank line; repeatable")
@click.option("--unknown", default="error", show_default=True, type=click.Choice(["error", "skip", "replace"]),
              help="prompt characters the model never saw: error names them; skip drops them (with a warning); "
                   "replace maps them to U+FFFD, '?' or a space (the first the vocabulary has)")
@click.option("--output", default=None, help="write the samples to this file instead of stdout")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object per sample (sample, prompt as the "
              "model saw it, text, seed, settings) for scripts")
@click.option("--interactive", is_flag=True, help="a prompt loop that keeps the model loaded; /help lists its "
              "commands, Ctrl-C stops a sample, Ctrl-D exits")
@click.option("--device", default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps")
@click.option("--no-cache", is_flag=True, help="decode without the KV cache (the slow reference path)")
def sample_cli(checkpoint_path, prompt, prompt_file, max_new_tokens, temperature, top_k, top_p, num_samples, seed,
               stop, unknown, output, as_json, interactive, device, no_cache):
    """Write text in the style of a trained run. Text streams to stdout; diagnostics go to stderr."""
    def main():
        from .checkpoint import latest_run
        from .sampling import load
        settings = asdict(SampleSettings(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k,
                                         top_p=top_p, stop=tuple(map(unescape, stop))).validate())
        if num_samples < 1:
            raise ChargptError(f"--num-samples must be at least 1, got {num_samples}")
        if interactive:
            _check_interactive(prompt, prompt_file, output, as_json, num_samples)
        text = _read_prompt(prompt, prompt_file)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device)
        click.echo(f"loaded {path} ({_describe_run(gen)}) on {gen.device}", err=True)
        if interactive:
            from .repl import repl
            return repl(gen, settings, seed, unknown)
        text, warning = gen.prompt_text(text, unknown), gen.unknown_warning(text, unknown)  # 'error' raises here
        if warning:
            click.echo(f"warning: {warning}", err=True)
        use_seed = seed if seed is not None else random.randrange(2**31)
        if seed is None:
            click.echo(f"seed: {use_seed}", err=True)
        if not (as_json or output):
            stream_samples(gen, text, num_samples, use_seed, settings, unknown, sys.stdout, use_cache=not no_cache)
            return
        body = _all_samples(gen, text, num_samples, use_seed, settings, unknown, as_json, use_cache=not no_cache)
        if output:
            _write_output(output, body)
            click.echo(f"wrote {num_samples} sample(s) to {output}", err=True)
        else:
            sys.stdout.write(body)

    run_guarded(main)


def _describe_run(gen):
    step, loss = gen.meta.get("step"), gen.meta.get("val_loss")
    facts = [f"step {step}"] if step is not None else []
    facts += [f"val loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
    return ", ".join(facts + [f"{len(gen.vocab)} characters"])


def _write_output(path, body):
    try:
        Path(path).write_text(body, encoding="utf-8")
    except OSError as e:
        raise ChargptError(f"cannot write --output {path}: {e.strerror}") from None


def bench_cli():
    from .bench import main
    main()


# --- the `chargpt` command: one group over the same click command objects as train.py and sample.py --------------
# Options shared between subcommands are the same click objects (_param) or are built from the config
# dataclasses (_field_option), so each option has exactly one definition.
def _param(command, name):
    """The parameter object `name` of another command."""
    return next(p for p in command.params if p.name == name)


def _with(*params):
    """Decorator (above @click.command) putting parameters of other commands first in this command."""
    def decorate(command):
        command.params[:0] = list(params)
        return command
    return decorate


def _field_option(cls, name):
    """A click option from a config dataclass field: its flag name, type, default, choices and help."""
    f = next(f for f in fields(cls) if f.name == name)
    ptype = click.Choice(f.metadata["choices"]) if "choices" in f.metadata else _field_type(f)
    return click.option(f"--{flag(name)}", name, type=ptype, default=f.default, show_default=True,
                        help=f.metadata["help"])


from . import __version__  # noqa: E402  (this block is kept apart from the imports above for easy merging)
from .corpora import DATA_DIR  # noqa: E402

JSON_OPTION = click.option("--json", "as_json", is_flag=True, help="print one JSON object (for scripts)")


@_with(_param(sample_cli, "checkpoint_path"), _param(sample_cli, "device"))
@click.command("eval", context_settings=CONTEXT)
@click.option("--data", default=None, help="text file, or folder of text files, to score [default: the run's own "
              "validation split]")
@_field_option(TrainConfig, "encoding")
@_field_option(TrainConfig, "encoding_errors")
@click.option("--stride", type=int, default=None, help="characters between windows; each window after the first "
              "scores its last STRIDE characters, so each sees at least context - STRIDE before it; 1: a full "
              "window for every character (slowest) [default: half the context]")
@click.option("--batch-size", type=int, default=None, help="windows per forward pass [default: up to 64, fewer "
              "for large vocabularies]")
@JSON_OPTION
def eval_cli(checkpoint_path, device, data, encoding, encoding_errors, stride, batch_size, as_json):
    """Loss and bits per character of a checkpoint on any text (every character scored once, with a sliding
    window). Characters the model never saw are counted and reported, not scored."""
    def run():
        from .checkpoint import latest_run
        from .evaluate import evaluate, format_result
        result = evaluate(checkpoint_path or latest_run(), data, encoding=encoding, encoding_errors=encoding_errors,
                          stride=stride, batch_size=batch_size, device=device)
        click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_result(result))
    run_guarded(run)


@click.command("info", context_settings=CONTEXT)
@click.argument("run", required=False)
@JSON_OPTION
def info_cli(run, as_json):
    """What a run is: model, vocabulary, steps, best validation loss, training time, files. RUN is a run
    directory or a .safetensors file [default: the most recent run under checkpoints/]. Reads headers only."""
    def show():
        from .checkpoint import latest_run
        from .runinfo import format_info, run_info
        info = run_info(run or latest_run())
        click.echo(json.dumps(info, ensure_ascii=False) if as_json else format_info(info))
    run_guarded(show)


@click.command("plot", context_settings=CONTEXT)
@click.argument("runs", nargs=-1)
@click.option("-o", "--output", default="curves.png", show_default=True, help="PNG file to write")
@click.option("--unit", type=click.Choice(["nats", "bpc"]), default="nats", show_default=True,
              help="loss in nats per character, or bits per character")
def plot_cli(runs, output, unit):
    """Train (dashed) and validation (solid) loss against steps, one colour per run: RUNS are run directories
    [default: the most recent run under checkpoints/]. Needs matplotlib: pip install -e ".[plots]"."""
    def draw():
        from .checkpoint import latest_run
        from .plot import plot_runs
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


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="chargpt")
def main():
    """chargpt: train a character-level GPT on any text, and write, score and inspect with it.

    \b
      chargpt data get tinyshakespeare
      chargpt train --data data/tinyshakespeare.txt
      chargpt sample --prompt "ROMEO:"
      chargpt eval --data new_text.txt
      chargpt info
      chargpt plot -o curves.png

    `chargpt COMMAND --help` lists a command's flags.
    """


for _name, _command in {"train": train_cli, "sample": sample_cli, "eval": eval_cli, "info": info_cli,
                        "plot": plot_cli, "bench": bench_command, "data": data_cli}.items():
    main.add_command(_command, _name)
