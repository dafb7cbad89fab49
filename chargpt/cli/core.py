"""The two main commands: train (`python train.py`, `chargpt train`) and sample (`python sample.py`,
`chargpt sample`); and bench's entry point."""

import os
from dataclasses import replace

import click
from click.core import ParameterSource

from chargpt import textio
from chargpt.cli.common import (
    BEST_OF_MEMORY_HINT,
    CHECKPOINT,
    CONTEXT,
    DEVICE,
    MIN_SPAN,
    NO_CACHE,
    NOVELTY_DATA,
    SAMPLE_MEMORY_HINT,
    SEED,
    THREADS,
    TRAIN_MEMORY_HINT,
    UNKNOWN,
    _log,
    _sample_settings,
    _seed,
    _stderr,
    _warn,
    config_options,
    next_step_hint,
    run_guarded,
)
from chargpt.config import ModelConfig, SampleSettings, TrainConfig
from chargpt.errors import ChargptError
from chargpt.sampling.options import SampleOptions
from chargpt.training.interrupt import work_begins


class TrainCommand(click.Command):
    """train's --help ends with the presets and their sizes (computed when help is shown, not at every start)."""

    def format_epilog(self, ctx, formatter):
        from chargpt.config.helptext import preset_table
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
    from chargpt import STARTED
    from chargpt.training.trainer import train
    summary = run_guarded(lambda: train(log=_log, started=STARTED, **overrides), TRAIN_MEMORY_HINT)
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


@click.command(context_settings=CONTEXT, params=[
    CHECKPOINT,
    click.Option(["--prompt"], default=None, help="text to continue; \\n and \\t mean newline and tab, as in --stop "
                 "and --ban (\\\\ a backslash); '-' reads stdin, as it is but for the one newline at its end that echo "
                 "adds [default: a newline; with --form, where the run's text starts text of its shape]"),
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
    THREADS,
    click.Option(["--speculate"], default="off", show_default=True, type=click.Choice(["auto", "on", "off"]),
                 help="check drafts of the next characters (from the text so far and the training text's novelty "
                      "index) in one forward each: the same text, faster where the drafts are right (greedy or low "
                      "temperature, text near the training text; off by default: at 0.8 it can be slower); auto: one "
                      "sample at a time on a CPU, drafting from the training text once its index is built, and pausing "
                      "where the drafts do not pay; on also builds the index; more samples decode plainly"),
    NO_CACHE,
    click.Option(["--novelty"], is_flag=True, help="say how much of each sample is copied from the training text: one "
                 "line per sample on stderr, or a `novelty` object in each --json record (chargpt novelty)"),
    MIN_SPAN,
    NOVELTY_DATA,
    click.Option(["--forms", "list_forms"], is_flag=True, help="list the named forms --form takes, and exit"),
    click.Option(["--new-only"], is_flag=True, help="a run trained with --items: leave out copies of the list's items"),
])
def sample_cli(checkpoint_path, prompt, prompt_file, num_samples, seed, unknown, output, as_json, interactive,
               device, dtype, quantize, compile_mode, threads, speculate, no_cache, novelty, min_span, novelty_data,
               list_forms, **flags):
    """Write text in the style of a trained run. The text goes to stdout (with a separator line above each
    sample when there are several); everything else goes to stderr. Under a constraint (--form, --ban, ...) or
    --best-of, each sample's scores follow on stderr (in --json, its `score`)."""
    def main():
        from chargpt.cli.writers import Target, check_items, write_items, write_samples
        from chargpt.runs.rundir import latest_run
        from chargpt.sampling.engine import load
        from chargpt.sampling.forms import shape_lines
        from chargpt.tools.novelty import check_options, sample_scorer
        if list_forms:
            return click.echo("\n".join(shape_lines()))
        new_only = flags.pop("new_only")
        options = SampleOptions(_sample_settings(flags), num_samples=num_samples, seed=seed, unknown=unknown,
                                use_cache=not no_cache, min_span=min_span)  # every sampling flag, checked here
        best_of = options.settings.best_of
        if interactive:
            _check_interactive(prompt, prompt_file, output, as_json, num_samples)
        text = textio.read_prompt(prompt, prompt_file)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device, dtype=dtype, quantize=quantize, compile=compile_mode, threads=threads,
                   speculate=speculate)
        click.echo(f"loaded {path} ({gen.describe()}) on {gen.device}, {gen.precision}"
                   + (f", threads {gen.threads.choice()}" if gen.threads else "")
                   + (f", {gen.speculation()}" if gen.speculation() else ""), err=True)
        runner, reason = gen.decode_runner(options.settings.max_new_tokens * (best_of or num_samples))
        if compile_mode != "auto" or runner is not None:  # said when it is not the usual
            click.echo(reason, err=True)
        if (gen.items_run or new_only) and not interactive:  # a list: refused before best-of's index is built
            check_items(gen, text, options)
        check_options(novelty, None if best_of else min_span, None if best_of else novelty_data, interactive)
        # the index loads before any sample is written, so that a missing corpus fails first
        scorer = sample_scorer(gen.meta, str(path), min_span, novelty_data, log=_stderr) if novelty else None
        gen.log = _stderr  # best-of without the training text says so, once
        copies = gen.copy_check(min_span, novelty_data, str(path)) if best_of and not interactive else None
        textio.tolerant_stdout()
        if interactive:
            from chargpt.cli.repl import repl
            return repl(gen, options)
        text, warning = gen.prompt_text(text, unknown), gen.unknown_warning(text, unknown)  # 'error' raises here
        _warn(warning)
        # greedy text and a beam's do not depend on the seed
        searched = options.settings.temperature == 0 or options.settings.beam is not None
        options = replace(options, seed=_seed(seed, shown=not searched))
        target = Target(output, as_json, _stderr, scorer)
        if gen.items_run or new_only:  # a list: N items, one a line (chargpt/data/items.py)
            return write_items(gen, text, options, target, new_only, novelty_data, path)
        write_samples(gen, text, options, target, copies)

    run_guarded(main, BEST_OF_MEMORY_HINT if flags.get("best_of") else SAMPLE_MEMORY_HINT)  # what sets the rows


def bench_cli():
    from chargpt.bench import main
    work_begins()
    main()

