"""The command lines: `python train.py` / `chargpt-train` and `python sample.py` / `chargpt-sample`.

Thin by design: flags -> one call into the package. Flags are generated from the config dataclasses
(flags.flag_specs), so every setting has exactly one name, default and help line, in chargpt/config/__init__.py. Each
command lists its parameters in order (click's `params`); an option several commands take is one click.Option
object (CHECKPOINT, SEED, ...), defined once.
Output: results on stdout (sample.py's text; train.py's run directory, one line when it ends), everything
else (progress, logs, warnings, errors) on stderr. Errors a user can fix print one line on stderr and exit 1;
Ctrl-C exits 130 (SIGTERM 143) after saving.

Where they are: cli/common.py (shared options, run_guarded), cli/core.py (train, sample), cli/tools.py (every
other `chargpt` command); this module is the `chargpt` group.
"""

import click

from chargpt import __version__
from chargpt.cli.common import CONTEXT, run_guarded, say  # noqa: F401 (used by the commands' callers)
from chargpt.cli.core import bench_cli, sample_cli, train_cli  # noqa: F401
from chargpt.cli.tools import (  # noqa: F401
    bench_command,
    data_cli,
    data_get_cli,
    data_list_cli,
    eval_cli,
    export_cli,
    info_cli,
    novelty_cli,
    plot_cli,
    report_cli,
    serve_cli,
    translate_cli,
)


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
      chargpt report
      chargpt export --to my-model-hf
      chargpt serve

    `chargpt COMMAND --help` lists a command's flags.
    """


for _name, _command in {"train": train_cli, "sample": sample_cli, "translate": translate_cli, "eval": eval_cli,
                        "info": info_cli, "novelty": novelty_cli, "plot": plot_cli, "report": report_cli,
                        "bench": bench_command, "data": data_cli, "serve": serve_cli, "export": export_cli}.items():
    main.add_command(_command, _name)
