"""The command lines: `python train.py` / `chargpt-train` and `python sample.py` / `chargpt-sample`.

Thin by design: flags -> one call into the package. Flags are generated from the config dataclasses
(flags.flag_specs), so every setting has exactly one name, default and help line, in chargpt/config.py. Each
command lists its parameters in order (click's `params`); an option several commands take is one click.Option
object (CHECKPOINT, SEED, ...), defined once.
Output: results on stdout (sample.py's text; train.py's run directory, one line when it ends), everything
else (progress, logs, warnings, errors) on stderr. Errors a user can fix print one line on stderr and exit 1;
Ctrl-C exits 130 (SIGTERM 143) after saving.
"""

import importlib
import json
import os
import random
import re
import sys
from dataclasses import asdict, replace

import click
from click.core import ParameterSource
from tqdm import tqdm

from . import __version__, textio
from .components.interrupt import interrupted, work_begins
from .config import (
    ExportSettings,
    ModelConfig,
    SampleSettings,
    TrainConfig,
    check_sample_options,
)
from .corpora import DATA_DIR
from .errors import ChargptError, Interrupted, out_of_memory, requested_memory
from .flags import cli_names, flag_specs

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
TRAIN_MEMORY_HINT = "lower --batch-size (--grad-accum keeps the global batch), --block-size or the model size " \
                    "(--n-embd, --n-layer)"
SAMPLE_MEMORY_HINT = "lower --num-samples (the samples decode together, each with its own cache)"
_NOT_GIVEN = object()


# --- options: click.Option objects, listed in each command's `params` -----------------------------------------
def spec_options(spec, default=None):
    """The click options of one generated flag (one, or two for a switch). Non-boolean flags default to None unless
    given a default, so the commands can tell the flags a user typed from the ones left alone."""
    if spec.type is bool:
        return [click.Option([f"--{spec.name}/--no-{spec.name}", spec.dest], default=spec.default,
                             show_default=True, help=spec.help)]
    ptype = click.Choice(spec.choices) if spec.choices else spec.type
    if spec.switch:
        return _switch_options(spec, ptype, default)
    return [click.Option([f"--{spec.name}", spec.dest], type=ptype, default=default, multiple=spec.multiple,
                         help=spec.help)]


def _switch_options(spec, ptype, default):
    """`--NAME [VALUE]` (alone: the switch's first value) plus `--no-NAME` (its second), for a setting that grew
    from an on/off switch into choices (--compile auto|on|off), so that the old spellings keep working."""
    bare, negative = spec.switch

    def negate(ctx, param, given):
        if given:
            ctx.params[spec.dest] = negative
            ctx.set_parameter_source(spec.dest, ParameterSource.COMMANDLINE)
    return [click.Option([f"--{spec.name}", spec.dest], type=ptype, default=default, is_flag=False,
                         flag_value=bare, help=spec.help),
            click.Option([f"--no-{spec.name}", f"no_{spec.dest}"], is_flag=True, expose_value=False,
                         callback=negate, help=f"the same as --{spec.name} {negative}")]


def config_options(cls):
    """One click option per flag of dataclass `cls`; its help is the field's help metadata."""
    return [option for spec in flag_specs(cls) for option in spec_options(spec)]


def field_option(cls, name, default=_NOT_GIVEN):
    """The click option of one config dataclass field, with the field's default filled in (or `default`, which
    then replaces the default its help line shows)."""
    spec = next(spec for spec in flag_specs(cls) if spec.dest == name)
    if default is not _NOT_GIVEN:
        shown = f" [default: {default}]" if default is not None else ""
        spec = replace(spec, default=default, help=re.sub(r" \[default: [^]]*\]$", "", spec.help) + shown)
    (option,) = spec_options(spec, default=spec.default)
    return option


# Options several commands take: one object each, so each has one definition (and one help line).
CHECKPOINT = click.Option(["--checkpoint", "checkpoint_path"], default=None,
                          help="run directory (its best checkpoint) or .safetensors file [default: the most recent run "
                               "under checkpoints/]")
SEED = click.Option(["--seed"], default=None, type=int, help="random seed, 0 to 2**63 - 1; the same seed (and "
                    "--num-samples) gives the same text [default: random, shown on stderr unless --temperature 0]")
UNKNOWN = click.Option(["--unknown"], default="error", show_default=True,
                       type=click.Choice(["error", "skip", "replace"]),
                       help="prompt characters the model never saw: error names them; skip drops them (with a "
                            "warning); replace maps them to U+FFFD, '?' or a space (the first the vocabulary has)")
DEVICE = click.Option(["--device"], default="auto", show_default=True, help="auto, cpu, cuda, cuda:N or mps")
NO_CACHE = click.Option(["--no-cache"], is_flag=True, help="decode without the KV cache (the slow reference path)")
MIN_SPAN = click.Option(["--min-span"], type=int, default=None, help="copied text is in spans of at least this many "
                        "characters that occur verbatim in the training text; shorter ones are chance [default: 20, "
                        "or 10 for an alphabet of 1,000 characters or more (Chinese)]")
NOVELTY_DATA = click.Option(["--data", "novelty_data"], default=None, help="the run's training text, for --novelty "
                            "and chargpt novelty when the path it trained on has moved (checked to be the same corpus "
                            "by its hash)")
JSON = click.Option(["--json", "as_json"], is_flag=True, help="print one JSON object (for scripts)")


def say(message):
    """One line on stderr; under torchrun only rank 0 speaks, so N processes do not print N copies."""
    if int(os.environ.get("RANK", 0)) == 0:
        click.echo(message, err=True)


def run_guarded(fn, memory_hint="lower the batch or model size", heavy=("torch",)):
    """Run fn, turning user-fixable errors into one line on stderr and a non-zero exit (no traceback). Messages
    raised inside name settings as flags (config.cli_names); `memory_hint` says what to lower when memory runs out.
    The `heavy` modules the command will need are imported first, still under the quiet start: a Ctrl-C inside a
    C extension's import would leave it half-loaded ("cannot load module more than once"), so it exits at once."""
    for name in heavy:
        importlib.import_module(name)
    work_begins()  # Ctrl-C raises KeyboardInterrupt from here on (chargpt/components/interrupt.py)
    try:
        with cli_names():
            result = fn()
        if interrupted():  # a Ctrl-C whose KeyboardInterrupt something swallowed still stops the command
            raise KeyboardInterrupt
        return result
    except Interrupted as e:
        say(str(e) + resume_hint(e))
        sys.exit(128 + (e.signum or 2))
    except ChargptError as e:
        say("\ninterrupted" if interrupted() else f"error: {e}")
        sys.exit(130 if interrupted() else 1)
    except KeyboardInterrupt:
        click.echo("\ninterrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # e.g. `python sample.py | head`
        sys.stderr.close()
        sys.exit(0)
    except (MemoryError, RuntimeError) as e:
        if not out_of_memory(e):
            raise
        # every rank that fails says so
        click.echo(f"error: out of memory{requested_memory(e)}; {memory_hint}", err=True)
        sys.exit(1)


def resume_hint(e: Interrupted):
    """'. Resume with: python train.py --out-dir RUN --resume' for a training that was interrupted after saving."""
    if e.out_dir is None:
        return ""
    how = "the same torchrun command (any number of processes) plus" if e.distributed else "python train.py"
    return f". Resume with: {how} --out-dir {e.out_dir} --resume"


def next_step_hint(summary):
    """The command that uses a run training just saved: sample from it, or translate with it."""
    if summary.get("task") == "pairs":
        return f"more with: chargpt translate --checkpoint {summary['out_dir']} \"...\""
    return f"more with: python sample.py --checkpoint {summary['out_dir']} --prompt \"...\""


def _stderr(message):
    click.echo(message, err=True)


def _warn(warning):
    """'warning: ...' on stderr, when there is one."""
    if warning:
        click.echo(f"warning: {warning}", err=True)


def _log(message):
    """Training's log lines, on stderr above the progress bar (tqdm.write keeps the bar intact)."""
    tqdm.write(message, file=sys.stderr)


class TrainCommand(click.Command):
    """train's --help ends with the presets and their sizes (computed when help is shown, not at every start)."""

    def format_epilog(self, ctx, formatter):
        from .helptext import preset_table
        formatter.write_paragraph()
        formatter.write("\n".join(preset_table()) + "\n")


@click.command(cls=TrainCommand, context_settings=CONTEXT,
               params=[*config_options(ModelConfig), *config_options(TrainConfig)])
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
        _log(next_step_hint(summary))
        click.echo(summary["out_dir"])


# --- sampling ------------------------------------------------------------------------------------------
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
    given["stop"] = tuple(map(textio.unescape, flags.get("stop") or ()))
    given.update({k: textio.unescape(given[k]) for k in ("ban", "allow") if k in given})  # --ban '\n'
    return asdict(SampleSettings(**given).validate())


@click.command(context_settings=CONTEXT, params=[
    CHECKPOINT,
    click.Option(["--prompt"], default=None, help="text to continue; '-' reads stdin (without the one newline at its "
                 "end that echo adds) [default: a newline]"),
    click.Option(["--prompt-file"], default=None, help="read the prompt from this UTF-8 file, exactly as written"),
    *config_options(SampleSettings),
    click.Option(["--num-samples"], default=1, show_default=True, type=int,
                 help="independent samples, decoded together in one batch; with more than one, a separator line "
                      "goes above each"),
    SEED,
    UNKNOWN,
    click.Option(["--output"], default=None, help="write the samples to this file (UTF-8) instead of stdout"),
    click.Option(["--json", "as_json"], is_flag=True, help="print one JSON object per sample (sample, prompt as the "
                 "model saw it, text, seed, settings) for scripts"),
    click.Option(["--interactive"], is_flag=True, help="a prompt loop that keeps the model loaded; /help lists its "
                 "commands, Ctrl-C stops a sample, Ctrl-D exits"),
    DEVICE,
    click.Option(["--dtype"], default="auto", show_default=True, type=click.Choice(["auto", "float32", "bfloat16"]),
                 help="precision of decoding: auto is bfloat16 where the device computes it natively (half the bytes "
                      "read per character), else float32"),
    click.Option(["--quantize"], default="none", show_default=True, type=click.Choice(["none", "int8", "auto"]),
                 help="int8: int8 weights for faster decoding on a CPU (torch's dynamic quantisation; `chargpt bench "
                      "--only decode` measures its speed and its cost in loss); auto: int8 where, measured at load "
                      "(about a second), it decodes 1.15x faster here at a cost of at most 0.01 nats per character"),
    click.Option(["--compile", "compile_mode"], default="auto", show_default=True,
                 type=click.Choice(["auto", "on", "off"]), help="torch.compile the decode step (compiled once per "
                 "batch size, kept in torch's on-disk cache): auto compiles on a CPU with a C++ compiler from "
                 "30,000 new characters, where it repays compiling"),
    NO_CACHE,
    click.Option(["--novelty"], is_flag=True, help="say how much of each sample is copied from the training text: one "
                 "line per sample on stderr, or a `novelty` object in each --json record (chargpt novelty)"),
    MIN_SPAN,
    NOVELTY_DATA,
    click.Option(["--forms", "list_forms"], is_flag=True, help="list the named forms --form takes, and exit"),
])
def sample_cli(checkpoint_path, prompt, prompt_file, num_samples, seed, unknown, output, as_json, interactive,
               device, dtype, quantize, compile_mode, no_cache, novelty, min_span, novelty_data, list_forms, **flags):
    """Write text in the style of a trained run. The text goes to stdout (with a separator line above each
    sample when there are several); everything else goes to stderr. Under a constraint (--form, --ban, ...) or
    --best-of, each sample's scores follow on stderr (in --json, its `score`)."""
    def main():
        from .constraints import given, write_scored
        from .engine import load
        from .forms import shape_lines
        from .novelty import check_options, sample_records, sample_scorer, scored_line
        from .rundir import latest_run
        if list_forms:
            return click.echo("\n".join(shape_lines()))
        settings = _sample_settings(flags)
        best_of = settings["best_of"]
        check_sample_options(num_samples, seed, best_of)
        if interactive:
            _check_interactive(prompt, prompt_file, output, as_json, num_samples)
        text = textio.read_prompt(prompt, prompt_file)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device, dtype=dtype, quantize=quantize, compile=compile_mode)
        click.echo(f"loaded {path} ({gen.describe()}) on {gen.device}, {gen.precision}", err=True)
        runner, reason = gen.decode_runner(settings["max_new_tokens"] * (best_of or num_samples))
        if compile_mode != "auto" or runner is not None:  # said when it is not the usual
            click.echo(reason, err=True)
        check_options(novelty, None if best_of else min_span, None if best_of else novelty_data, interactive)
        # the index loads before any sample is written, so that a missing corpus fails first
        scorer = sample_scorer(gen.meta, str(path), min_span, novelty_data, log=_stderr) if novelty else None
        gen.log = _stderr  # best-of without the training text says so, once
        copies = gen.copy_check(min_span, novelty_data, str(path)) if best_of and not interactive else None
        textio.tolerant_stdout()
        if interactive:
            from .repl import repl
            return repl(gen, settings, seed, unknown)
        text, warning = gen.prompt_text(text, unknown), gen.unknown_warning(text, unknown)  # 'error' raises here
        _warn(warning)
        use_seed = _seed(seed, shown=settings["temperature"] > 0)  # greedy text does not depend on the seed
        if given(settings):
            return write_scored(gen, text, num_samples, use_seed, settings, unknown, as_json, output, not no_cache,
                                copies, scorer, _stderr)
        if not (as_json or output):
            texts = textio.stream_samples(gen, text, num_samples, use_seed, settings, unknown, sys.stdout,
                                          use_cache=not no_cache)
            for i, t in enumerate(texts if scorer else ()):
                click.echo(scored_line(scorer(t), i, num_samples), err=True)
            return
        body = textio.all_samples(gen, text, num_samples, use_seed, settings, unknown, as_json,
                                  use_cache=not no_cache, ascii_json=not output and not textio.utf_stream(sys.stdout),
                                  novelty=sample_records(scorer, num_samples, as_json, _stderr))
        if output:
            textio.write_output(output, body)
            click.echo(f"wrote {num_samples} sample(s) to {output}", err=True)
        else:
            sys.stdout.write(body)

    run_guarded(main, SAMPLE_MEMORY_HINT)


def _seed(seed, shown):
    """The --seed given, else a random one, said on stderr when `shown` (the text depends on it)."""
    if seed is not None:
        return seed
    seed = random.randrange(2**31)
    if shown:
        click.echo(f"seed: {seed}", err=True)
    return seed


def bench_cli():
    from .bench import main
    work_begins()
    main()


# --- the other commands of `chargpt` ------------------------------------------------------------------------
@click.command("eval", context_settings=CONTEXT, params=[
    CHECKPOINT,
    DEVICE,
    click.Option(["--data"], default=None, help="text file, or folder of text files, to score [default: the run's "
                 "own validation split]"),
    field_option(TrainConfig, "target_data"),
    field_option(TrainConfig, "encoding"),
    field_option(TrainConfig, "encoding_errors"),
    click.Option(["--stride"], type=int, default=None, help="characters between windows; each window after the first "
                 "scores its last STRIDE characters, so each sees at least context - STRIDE before it; 1: a full "
                 "window for every character (slowest) [default: half the context]"),
    click.Option(["--batch-size"], type=int, default=None, help="windows per forward pass [default: up to 64, fewer "
                 "for large vocabularies]"),
    JSON,
])
def eval_cli(checkpoint_path, device, data, target_data, encoding, encoding_errors, stride, batch_size, as_json):
    """Loss, bits per character and bits per UTF-8 byte of a checkpoint on any text (every character scored once,
    with a sliding window). Characters the model never saw are counted and reported, not scored. A run trained on
    sentence pairs scores pairs (--data PAIRS.tsv, or --data SOURCES --target-data TARGETS): each target given its
    source."""
    def run():
        from .evaluate import evaluate, format_result
        from .rundir import latest_run
        result = evaluate(checkpoint_path or latest_run(), data, encoding=encoding, encoding_errors=encoding_errors,
                          stride=stride, batch_size=batch_size, device=device, target_data=target_data)
        click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_result(result))
    run_guarded(run, "lower --batch-size (windows per forward pass)")


@click.command("novelty", context_settings=CONTEXT, params=[
    CHECKPOINT,
    click.Argument(["text"], required=False),
    click.Option(["--input", "input_path"], default=None, help="score this UTF-8 file ('-': stdin) instead of TEXT"),
    MIN_SPAN,
    NOVELTY_DATA,
    JSON,
])
def novelty_cli(checkpoint_path, text, input_path, min_span, novelty_data, as_json):
    """Is it writing or copying? Which spans of TEXT (or --input FILE) occur verbatim in the text the run trained
    on: the share of characters in copied spans of --min-span or more, and each span with the line it comes from;
    the same against the run's validation text. The first use builds an index of the corpus (cached beside it).
    With --json, also the longest copied span starting and ending at every position (`starting`, `ending`)."""
    def run():
        from . import novelty
        from .rundir import latest_run
        if min_span is not None:
            novelty.check_min_span(min_span)
        body = novelty.read_input(text, input_path)
        index = novelty.for_run(checkpoint_path or latest_run(), novelty_data, log=_stderr)
        report = index.score(body, min_span)  # None: the default for the run's alphabet
        textio.tolerant_stdout()
        click.echo(json.dumps(report.to_json(), ensure_ascii=not textio.utf_stream(sys.stdout)) if as_json
                   else novelty.format_report(report))
    run_guarded(run)


@click.command("info", context_settings=CONTEXT, params=[click.Argument(["run"], required=False), JSON])
def info_cli(run, as_json):
    """What a run is: model, vocabulary, steps, best validation loss, training time, files. RUN is a run
    directory or a .safetensors file [default: the most recent run under checkpoints/]. Reads headers only."""
    def show():
        from .rundir import latest_run
        from .runinfo import format_info, run_info
        info = run_info(run or latest_run(pass_run="name one: chargpt info RUN"))
        click.echo(textio.visible_json(info) if as_json else format_info(info))  # no raw terminal escapes
    run_guarded(show)


# --- translate: a pairs run turns sources into targets ------------------------------------------------------------
@click.command("translate", context_settings=CONTEXT, params=[
    CHECKPOINT,
    click.Argument(["sources"], nargs=-1),
    click.Option(["--input", "input_path"], default=None, help="translate this UTF-8 file, one sentence per line "
                 "('-': stdin) [default: the SOURCES arguments, else lines piped into stdin]"),
    click.Option(["--output"], default=None, help="write the translations to this file (UTF-8, one line per input "
                 "line, written as they come and put in place when all are done) instead of stdout"),
    click.Option(["--beam"], default=1, show_default=True, type=int, help="beam search with this many hypotheses per "
                 "sentence (length-normalised); 1: greedy"),
    click.Option(["--alpha"], default=1.0, show_default=True, type=float, help="length normalisation of the beam "
                 "search: a finished hypothesis scores its log-probability / length ** alpha (0: none, short outputs "
                 "win)"),
    field_option(SampleSettings, "temperature", default=0.0),
    field_option(SampleSettings, "top_k", default=None),
    field_option(SampleSettings, "top_p", default=None),
    SEED,
    UNKNOWN,
    click.Option(["--batch-size"], default=64, show_default=True, type=int, help="sentences decoded together"),
    DEVICE,
    NO_CACHE,
])
def translate_cli(checkpoint_path, sources, input_path, output, beam, alpha, temperature, top_k, top_p, seed,
                  unknown, batch_size, device, no_cache):
    """Translate with a run trained on sentence pairs (--task pairs): SOURCES as arguments, or lines from --input
    or stdin, one translation per line on stdout (or --output). Greedy by default; --beam N searches, and
    --temperature above 0 samples. Blank lines stay blank."""
    def run():
        from .engine import load
        from .rundir import latest_run
        from .tokenizer import Unknowns
        from .translate import check_translate_options
        settings = _sample_settings({"temperature": temperature, "top_k": top_k, "top_p": top_p})
        check_sample_options(1, seed)
        check_translate_options(beam, alpha, settings["temperature"], top_k, top_p, batch_size)
        lines, name = textio.source_lines(sources, input_path)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device)
        click.echo(f"loaded {path} ({gen.describe()}) on {gen.device}", err=True)
        if gen.task != "pairs":
            raise ChargptError(f"{path} was trained on plain text, not sentence pairs, so it does not translate; "
                               f"write with it (chargpt sample), or train a translator with --task pairs")
        seen = Unknowns(gen.vocab, lines, unknown)  # counted as the lines go by: read as they are translated
        options = dict(beam=beam, alpha=alpha, unknown=unknown, batch_size=batch_size, use_cache=not no_cache,
                       temperature=settings["temperature"], top_k=settings["top_k"], top_p=settings["top_p"])
        if settings["temperature"] > 0:
            import torch
            options["generator"] = torch.Generator().manual_seed(_seed(seed, shown=True))
        textio.tolerant_stdout()
        results = textio.translations(gen, seen, name, options)
        if output:
            count = textio.write_output_lines(output, results)
            _warn(seen.warning())
            click.echo(f"wrote {count} translation(s) to {output}", err=True)
            return
        for t in results:
            sys.stdout.write(t + "\n")
            sys.stdout.flush()
        _warn(seen.warning())

    run_guarded(run, "lower --batch-size (sentences decoded together) or --beam")


@click.command("export", context_settings=CONTEXT, params=[
    CHECKPOINT,
    field_option(ExportSettings, "to"),
    field_option(ExportSettings, "format"),
    field_option(ExportSettings, "force"),
])
def export_cli(checkpoint_path, to, format, force):
    """Write a run as a Hugging Face transformers folder (a GPT-2 model, its character tokenizer, a model card) that
    AutoModelForCausalLM and AutoTokenizer load without custom code; the folder is checked against chargpt's logits
    before it appears. Needs transformers: pip install -e ".[export]". Prints the folder on stdout."""
    def run():
        from .export import export
        from .rundir import latest_run
        click.echo(export(checkpoint_path or latest_run(), to, format, force=force, log=say))
    run_guarded(run)


@click.command("plot", context_settings=CONTEXT, params=[
    click.Argument(["runs"], nargs=-1),
    click.Option(["-o", "--output"], default="curves.png", show_default=True, help="PNG file to write"),
    click.Option(["--unit"], type=click.Choice(["nats", "bpc", "bpb"]), default="nats", show_default=True,
                 help="loss in nats per character, bits per character, or bits per UTF-8 byte (bpb: compares "
                      "runs across alphabets)"),
])
def plot_cli(runs, output, unit):
    """Train (dashed) and validation (solid) loss against steps, one colour per run: RUNS are run directories
    [default: the most recent run under checkpoints/]. Needs matplotlib: pip install -e ".[plots]"."""
    def draw():
        from .plot import plot_runs
        from .rundir import latest_run
        runs_ = list(runs) or [latest_run(pass_run="name them: chargpt plot RUN...")]
        click.echo(f"wrote {plot_runs(runs_, output, unit)}", err=True)
    run_guarded(draw)


@click.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
               add_help_option=False, params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)])
def bench_command(args):
    """Speed and quality benchmarks (chargpt bench --help; the flags of python -m chargpt.bench)."""
    from .bench import main as bench_main
    work_begins()
    bench_main(list(args), prog="chargpt bench")


DATA_DIR_OPTION = click.Option(["--dir", "data_dir"], default=DATA_DIR, show_default=True, help="folder for corpora")


@click.group("data", context_settings=CONTEXT)
def data_cli():
    """Corpora to download: data list, data get NAME (checksum-verified, resumable)."""


@data_cli.command("list", context_settings=CONTEXT, params=[DATA_DIR_OPTION])
def data_list_cli(data_dir):
    """The corpora `data get` knows, and whether they are downloaded."""
    from .corpora import list_corpora
    for c in list_corpora(data_dir):
        where = f"downloaded: {c['path']}" if c["downloaded"] else f"not downloaded ({c['size']:,} bytes)"
        click.echo(f"{c['name']:<18} {c['about']}\n{'':<18} {where}; {c['url']}")


@data_cli.command("get", context_settings=CONTEXT, params=[click.Argument(["name"]), DATA_DIR_OPTION])
def data_get_cli(name, data_dir):
    """Download corpus NAME into --dir; an interrupted download resumes when run again."""
    def fetch():
        from .corpora import get
        path = get(name, data_dir, log=_stderr)
        click.echo(f"train on it with: chargpt train --data {path}", err=True)
    run_guarded(fetch, heavy=())  # the standard library alone


@click.command("serve", context_settings=CONTEXT, params=[
    click.Option(["--checkpoints"], default="checkpoints", show_default=True,
                 help="folder whose run directories are served, each by its folder name"),
    click.Option(["--host"], default="127.0.0.1", show_default=True,
                 help="address to listen on; anything but 127.0.0.1 lets others on the network use the page"),
    click.Option(["--port"], default=8000, show_default=True, type=click.IntRange(0, 65535),
                 help="port (0: any free one)"),
    click.Option(["--device"], default="auto", show_default=True,
                 help="where models run: auto, cpu, cuda, cuda:N or mps"),
])
def serve_cli(checkpoints, host, port, device):
    """A local web playground: write with any run, look inside the model, watch runs train."""
    def run():
        from .web.server import serve  # loads torch and the web extra only when asked for
        serve(checkpoints, host, port, device, say=_stderr)
    run_guarded(run)


@click.group(context_settings=CONTEXT)
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
      chargpt export --to my-model-hf
      chargpt serve

    `chargpt COMMAND --help` lists a command's flags.
    """


for _name, _command in {"train": train_cli, "sample": sample_cli, "translate": translate_cli, "eval": eval_cli,
                        "info": info_cli, "novelty": novelty_cli, "plot": plot_cli, "bench": bench_command,
                        "data": data_cli, "serve": serve_cli, "export": export_cli}.items():
    main.add_command(_command, _name)
