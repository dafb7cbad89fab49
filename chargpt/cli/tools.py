"""The other commands of `chargpt`: eval, novelty, info, translate, export, plot, bench, data and serve."""

import json
import sys

import click

from chargpt import textio
from chargpt.cli.common import (
    CHECKPOINT,
    CONTEXT,
    DEVICE,
    JSON,
    MIN_SPAN,
    NO_CACHE,
    NOVELTY_DATA,
    SEED,
    UNKNOWN,
    _sample_settings,
    _seed,
    _stderr,
    _warn,
    field_option,
    run_guarded,
    say,
)
from chargpt.config import (
    ExportSettings,
    SampleSettings,
    TrainConfig,
)
from chargpt.data.corpora import DATA_DIR
from chargpt.errors import ChargptError
from chargpt.sampling.options import check_sample_options
from chargpt.training.interrupt import work_begins


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
    click.Option(["--against"], default=None, metavar="RUN2|bf16|int8|hf", help="instead of the loss: how far this "
                 "precision (bf16, int8), the Hugging Face export (hf) or another run of the same alphabet is from "
                 "the float32 model: KL divergence and top-1 agreement on the run's validation windows"),
    JSON,
])
def eval_cli(checkpoint_path, device, data, target_data, encoding, encoding_errors, stride, batch_size, against,
             as_json):
    """Loss, bits per character and bits per UTF-8 byte of a checkpoint on any text (every character scored once,
    with a sliding window). Characters the model never saw are counted and reported, not scored. A run trained on
    sentence pairs scores pairs (--data PAIRS.tsv, or --data SOURCES --target-data TARGETS): each target given its
    source. --against compares the model with a precision, an export or another run instead."""
    def run():
        from chargpt.runs.rundir import latest_run
        if against is not None:
            from chargpt.tools.report.compare import evaluate_against, format_against
            if any(v is not None for v in (data, target_data, stride, batch_size)):
                raise ChargptError("--against compares on the run's own validation windows; drop --data, "
                                   "--target-data, --stride and --batch-size")
            result = evaluate_against(checkpoint_path or latest_run(), against, device=device)
            click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_against(result))
            return
        from chargpt.tools.evaluate import evaluate, format_result
        result = evaluate(checkpoint_path or latest_run(), data, encoding=encoding, encoding_errors=encoding_errors,
                          stride=stride, batch_size=batch_size, device=device, target_data=target_data)
        click.echo(json.dumps(result, ensure_ascii=False) if as_json else format_result(result))
    run_guarded(run, "lower --batch-size (windows per forward pass)")


@click.command("report", context_settings=CONTEXT, params=[
    click.Argument(["run"], required=False),
    click.Option(["--temperatures"], default="0.5,0.8,1.0,1.2", show_default=True,
                 help="the temperatures samples are written at, comma-separated"),
    click.Option(["--samples"], type=int, default=4, show_default=True, help="samples at each temperature"),
    click.Option(["--chars"], type=int, default=500, show_default=True, help="characters a sample"),
    DEVICE,
    JSON,
])
def report_cli(run, temperatures, samples, chars, device, as_json):
    """How good is this run? Writes RUN/report.md and RUN/report.html (self-contained, opens offline): the run;
    its validation text in bits per character and per byte with a standard error, beside zlib, bz2 and xz; samples
    across temperatures (distinct-n, self-BLEU, copying, repetition) and a suggested temperature; what bf16, int8
    and the exports cost against float32. RUN: a run directory [default: the most recent run under checkpoints/]."""
    def make():
        from chargpt.runs.rundir import latest_run
        from chargpt.tools.report import build_report, parse_temperatures, write_report
        folder = run or latest_run(pass_run="name one: chargpt report RUN")
        report = build_report(folder, parse_temperatures(temperatures), samples, chars, device=device, log=_stderr)
        md, page = write_report(folder, report)
        if as_json:
            report["curve"] = {k: v for k, v in report["curve"].items() if k != "png"}  # the picture is in the page
            click.echo(json.dumps(report, ensure_ascii=False))
        else:
            click.echo(f"{md}\n{page}")
        _stderr(f"report written in {report['took_s']:.1f} s")
    run_guarded(make)


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
        from chargpt.runs.rundir import latest_run
        from chargpt.tools import novelty
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
        from chargpt.runs.info import format_info, info_json, run_info
        from chargpt.runs.rundir import latest_run
        info = run_info(run or latest_run(pass_run="name one: chargpt info RUN"))
        click.echo(textio.visible_json(info_json(info)) if as_json else format_info(info))  # no raw terminal escapes
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
        from chargpt.data.tokenizer import Unknowns
        from chargpt.runs.rundir import latest_run
        from chargpt.sampling.engine import load
        from chargpt.sampling.translate import check_translate_options
        settings = _sample_settings({"temperature": temperature, "top_k": top_k, "top_p": top_p})
        check_sample_options(1, seed)
        check_translate_options(beam, alpha, settings.temperature, top_k, top_p, batch_size)
        lines, name = textio.source_lines(sources, input_path)
        path = checkpoint_path or latest_run()
        gen = load(path, device=device)
        click.echo(f"loaded {path} ({gen.describe()}) on {gen.device}", err=True)
        if gen.task != "pairs":
            raise ChargptError(f"{path} was trained on plain text, not sentence pairs, so it does not translate; "
                               f"write with it (chargpt sample), or train a translator with --task pairs")
        seen = Unknowns(gen.vocab, lines, unknown)  # counted as the lines go by: read as they are translated
        options = dict(beam=beam, alpha=alpha, unknown=unknown, batch_size=batch_size, use_cache=not no_cache,
                       temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p)
        if settings.temperature > 0:
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
    field_option(ExportSettings, "web_weights"),
    field_option(ExportSettings, "precision"),
])
def export_cli(checkpoint_path, to, format, force, web_weights, precision):
    """Write a run as a Hugging Face transformers folder (a GPT-2 model, its character tokenizer, a model card) that
    AutoModelForCausalLM and AutoTokenizer load without custom code; the folder is checked against chargpt's logits
    before it appears. Needs transformers: pip install -e ".[export]". Prints the folder on stdout.
    --format web writes one .html page that writes with the model in any browser, offline (chargpt/tools/webpage), its
    decoder checked under node first where node is installed; prints the file. --format gguf writes a .gguf file for
    llama.cpp and Ollama, and an Ollama Modelfile beside it (pip install -e ".[gguf]"); --format onnx a folder for
    ONNX Runtime (pip install -e ".[onnx]")."""
    def run():
        from chargpt.runs.rundir import latest_run
        checkpoint = checkpoint_path or latest_run()
        if web_weights != "float32" and format != "web":
            raise ChargptError("--web-weights is for --format web; drop it, or add --format web")
        if precision != "f32" and format != "gguf":
            raise ChargptError("--precision is for --format gguf; drop it, or add --format gguf")
        if format == "web":
            from chargpt.tools.webpage import export_web
            return click.echo(export_web(checkpoint, to, force, web_weights, log=say))
        if format == "gguf":
            from chargpt.tools.gguf import export_gguf
            return click.echo(export_gguf(checkpoint, to, force, precision, log=say))
        if format == "onnx":
            from chargpt.tools.onnx import export_onnx
            return click.echo(export_onnx(checkpoint, to, force, log=say))
        from chargpt.tools.export import export
        click.echo(export(checkpoint, to, format, force=force, log=say))
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
        from chargpt.runs.plot import plot_runs
        from chargpt.runs.rundir import latest_run
        runs_ = list(runs) or [latest_run(pass_run="name them: chargpt plot RUN...")]
        click.echo(f"wrote {plot_runs(runs_, output, unit)}", err=True)
    run_guarded(draw)


@click.command("bench", context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
               add_help_option=False, params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)])
def bench_command(args):
    """Speed and quality benchmarks (chargpt bench --help; the flags of python -m chargpt.bench)."""
    from chargpt.bench import main as bench_main
    work_begins()
    bench_main(list(args), prog="chargpt bench")


DATA_DIR_OPTION = click.Option(["--dir", "data_dir"], default=DATA_DIR, show_default=True, help="folder for corpora")


@click.group("data", context_settings=CONTEXT)
def data_cli():
    """Corpora to download: data list, data get NAME (checksum-verified, resumable)."""


@data_cli.command("list", context_settings=CONTEXT, params=[DATA_DIR_OPTION])
def data_list_cli(data_dir):
    """The corpora `data get` knows, and whether they are downloaded."""
    from chargpt.data.corpora import list_corpora
    for c in list_corpora(data_dir):
        where = f"downloaded: {c['path']}" if c["downloaded"] else f"not downloaded ({c['size']:,} bytes)"
        click.echo(f"{c['name']:<18} {c['about']}\n{'':<18} {where}; {c['url']}")


@data_cli.command("get", context_settings=CONTEXT, params=[click.Argument(["name"]), DATA_DIR_OPTION])
def data_get_cli(name, data_dir):
    """Download corpus NAME into --dir; an interrupted download resumes when run again."""
    def fetch():
        from chargpt.data.corpora import get
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
                 help="where models run (and runs started from the page train): auto, cpu, cuda, cuda:N or mps"),
    click.Option(["--data-dir"], help="folder of texts the page may train on, by name [default: ./data if there]"),
    click.Option(["--training/--no-training"], default=None,
                 help="let the page train runs (New run) [default: on when --host is this machine only, else off]"),
    click.Option(["--api-key"], envvar="CHARGPT_API_KEY", show_envvar=True,
                 help="a key every request must send (Authorization: Bearer KEY; OpenAI clients' api_key) [default: "
                      "none on 127.0.0.1; on any other --host one is made and printed]"),
    click.Option(["--no-auth"], is_flag=True,
                 help="serve another --host without a key: anyone who reaches the port can use the page"),
    click.Option(["--speculate"], default="off", show_default=True, type=click.Choice(["auto", "on", "off"]),
                 help="speculative decoding for every run served, as sample.py's --speculate: one sample at a time "
                      "checks drafts from its text and the run's training text, the text the same"),
])
def serve_cli(checkpoints, host, port, device, data_dir, training, api_key, no_auth, speculate):
    """A local web playground: write with any run, look inside the model, watch runs train, train new ones."""
    def run():
        from chargpt.web.server import serve  # loads torch and the web extra only when asked for
        serve(checkpoints, host, port, device, say=_stderr, training=training, data_dir=data_dir,
              api_key=api_key, auth=not no_auth, speculate=speculate)
    run_guarded(run)

