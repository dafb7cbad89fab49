"""What the commands share: click options made from the config dataclasses, the options several commands take
(one object each), and run_guarded, which turns a ChargptError into one line on stderr and exit 1."""

import importlib
import os
import random
import re
import sys
from dataclasses import replace

import click
from click.core import ParameterSource
from tqdm import tqdm

from chargpt import textio
from chargpt.config import SampleSettings
from chargpt.config.flags import cli_names, flag_specs
from chargpt.errors import ChargptError, Interrupted, out_of_memory, requested_memory
from chargpt.training.interrupt import interrupted, work_begins

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 110}
TRAIN_MEMORY_HINT = "lower --batch-size (--grad-accum keeps the global batch), --block-size or the model size " \
                    "(--n-embd, --n-layer)"
SAMPLE_MEMORY_HINT = "lower --num-samples (the samples decode together, each with its own cache)"
BEST_OF_MEMORY_HINT = "lower --best-of (its samples decode together, each with its own cache)"
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
THREADS = click.Option(["--threads"], default="auto", show_default=True,
                        help="CPU threads for decoding: auto measures, as it writes, which count is fastest here now "
                             "(one, where other programs keep the cores busy) and checks again when it slows; or a "
                             "number")
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
    work_begins()  # Ctrl-C raises KeyboardInterrupt from here on (chargpt/training/interrupt.py)
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


def _sample_settings(flags):
    """The SampleSettings flags given (None: not given) -> SampleSettings, checked as it is made."""
    given = {k: v for k, v in flags.items() if v is not None}
    given["stop"] = tuple(map(textio.unescape, flags.get("stop") or ()))
    given.update({k: textio.unescape(given[k]) for k in ("ban", "allow", "suffix") if k in given})  # --ban '\n'
    given.update({k: read_pattern(given[k], k) for k in ("grammar", "json_schema") if k in given})  # files
    return SampleSettings(**given)


def _seed(seed, shown):
    """The --seed given, else a random one, said on stderr when `shown` (the text depends on it)."""
    if seed is not None:
        return seed
    seed = random.randrange(2**31)
    if shown:
        click.echo(f"seed: {seed}", err=True)
    return seed


def read_pattern(path, name):
    """--grammar FILE and --json-schema FILE: the file's text (UTF-8, at most grammar.MAX_PATTERN_CHARS bytes), or
    a one-line error naming it."""
    from chargpt.sampling.grammar import MAX_PATTERN_CHARS
    what = f"--{name.replace('_', '-')} file"
    return textio.decode_utf8(textio.read_file(path, what, MAX_PATTERN_CHARS), f"{what} {path}")
