"""Export a run as one web page that writes with it: `chargpt export --format web --checkpoint RUN --to FILE.html`.

    export_web("checkpoints/tinyshakespeare", "shakespeare.html")                    # -> Path("shakespeare.html")
    export_web("checkpoints/tinyshakespeare", "shakespeare.html", weights="int8")   # a quarter of the bytes

The file holds everything: the page (page.html, page.css, page.js), the decoder (decoder.js: chargpt's CharGPT in
plain JavaScript with a KV cache, its sampling and its sliding window), the vocabulary and the weights (base64 of
little-endian float32, or int8 with a float32 scale per row: pack.py). It opens from file:// in any browser, offline,
and fetches nothing (its Content-Security-Policy forbids it). window.chargpt.generate / .stream write from scripts.

The page writes with sample.py's constraints (a form, an acrostic, banned and allowed characters: sampling.js), from
forms.py's own table of named forms and, per form, where the run's text starts text of its shape (form_starts: what a
form without a prompt is conditioned on, as sample.py's); a run trained with --labels offers its labels, and guides with
one as sample.py does; a run trained with --fim writes left to right there, its markers never written (the page does not
fill in the middle: sample.py --suffix does). What the decoder does not compute is refused by name before anything is
read: the encoder-decoder and a run trained on sentence pairs (it translates; the page writes text). int8 prints what it
costs in loss, teacher-forced on the run's validation text (check.loss_gap). Before the file appears, the page's own
decoder is run under node on the written file and must reproduce chargpt's logits step by step (check.py; without node
the weights are read back and checked in Python, and it says so). The file is written under a temporary name beside --to
and renamed into place, with export.py's handling of SIGTERM and failed writes: a broken or half-written page is never
left.
"""

import contextlib
import math
import os
from pathlib import Path

import torch

from chargpt import __version__
from chargpt.config import ExportSettings, SampleSettings
from chargpt.config.architecture import describe_model
from chargpt.config.flags import param
from chargpt.data.fim import FimMarkers
from chargpt.data.labels import LabelSet
from chargpt.errors import ChargptError, ConfigError
from chargpt.platforms import STOP_SIGNALS, replace
from chargpt.runs.checkpoint import load_model, read_meta
from chargpt.runs.rundir import BEST, LATEST, remove_stale_temps, resolve, temp_suffix
from chargpt.sampling import forms
from chargpt.tools.export import (
    TERM_SIGNALS,
    Stopped,
    _fsync,
    _plain_mode,
    _raise_stopped,
    make_folders,
    stopped_error,
    write_error,
)
from chargpt.tools.webpage.check import check_page, loss_gap
from chargpt.tools.webpage.pack import dequantized, pack_weights, page_tensors
from chargpt.tools.webpage.page import is_export, render
from chargpt.training.interrupt import handling

# The weights a page may hold: a browser keeps the page's text, its base64 and the bytes in memory at once, and
# V8 refuses strings over 2**29 characters; 256 MB (a 64M-parameter model in float32) keeps far below.
MAX_WEIGHT_BYTES = 256 * 10**6
SUFFIXES = (".html", ".htm")
PAGE_STARTS = 64  # a named form's starts the page carries (each at most forms.START_CONTEXT characters)


def size_text(n):
    """Bytes in words: '27 KB', '67.6 MB'."""
    return f"{n / 1e6:,.1f} MB" if n >= 100_000 else f"{n / 1e3:,.0f} KB"


def check_exportable(cfg, task):
    """Refuse, naming the option, what the page's decoder does not compute."""
    if cfg.arch != "decoder":
        raise ConfigError(f"{param('arch', cfg.arch)} cannot be exported as a web page: its decoder is chargpt's "
                          f"decoder-only model (no encoder, no cross-attention); only {param('arch', 'decoder')} "
                          f"runs export to the web")
    if task != "text":
        raise ConfigError(f"a run trained on sentence pairs ({param('task', task)}) translates, and the web page "
                          f"writes text; export it with {param('format', 'hf')}, or a run trained on text")


def weight_bytes(model, weights):
    """The bytes `weights` (float32 or int8) make of the page's tensors (before base64)."""
    tensors = page_tensors(model).values()
    if weights == "int8":
        return sum(t.numel() + 4 * t.shape[0] if t.dim() == 2 else 4 * t.numel() for t in tensors)
    return sum(4 * t.numel() for t in tensors)


def check_target(target, checkpoint, force):
    """--to must be an .html file that does not exist, or with --force a page an earlier web export wrote."""
    try:
        if target.is_dir():
            raise ChargptError(f"--to {target} is a folder; name the file to write, e.g. {target / 'model.html'}")
        if target.suffix.lower() not in SUFFIXES:
            raise ChargptError(f"--to {target}: a web export is one .html file; give a name ending in .html")
        above = next(p for p in target.parents if p.exists())
        if not above.is_dir():
            raise ChargptError(f"--to {target}: {above} is a file, not a folder; choose a --to that is not inside a "
                               f"file")
        if not target.exists():
            if target.is_symlink():
                raise ChargptError(f"--to {target} is a symbolic link to {os.readlink(target)}, which does not "
                                   f"exist; choose another --to")
            return
    except OSError as e:
        raise ChargptError(f"--to {target}: {e.strerror or e}; choose another --to") from None
    if not force:
        raise ChargptError(f"--to {target} exists; pass --force to replace it, or choose another --to")
    if Path(checkpoint).resolve() == target.resolve() or not is_export(target):
        raise ChargptError(f"--to {target} is not a page an earlier web export wrote, and --force replaces only "
                           f"those; choose another --to")


def form_table():
    """forms.py's rules as the page reads them (sampling.js): the named forms, their aliases and the rules'
    characters, written from Python so the two cannot drift."""
    return {"shapes": {name: list(v) for name, v in forms.SHAPES.items()}, "aliases": dict(forms.ALIASES),
            "free_span": forms.FREE_SPAN, "line_ends": forms.LINE_ENDS, "line_breaks": forms.LINE_BREAKS,
            "escapes": dict(forms.ESCAPES)}


def form_starts(gen, vocab):
    """{a named form's pattern: up to PAGE_STARTS of the places the run's text starts text of its shape} for the named
    forms this vocabulary can write (sample.py's Generator.form_start, searched once here; the page has no corpus)."""
    out = {}
    for name, (pattern, _) in forms.SHAPES.items():
        fixed = {c for kind, t in forms.parse(pattern) if kind == "fixed" for c in t}
        if not fixed <= vocab.stoi.keys():
            continue
        gen.form_start(name, torch.Generator())
        starts = gen.form_starts.get(name) or []
        if starts:
            out[pattern] = starts[::math.ceil(len(starts) / PAGE_STARTS)]  # spread over the text, not its first ones
    return out


def describe(model, vocab, meta, tensors, weights, name):
    """The page's model description (JSON): its shape, vocabulary, tensors, sampling defaults, the form table and the
    run's facts (its labels, if any)."""
    from chargpt.sampling.engine import Generator
    gen = Generator(model, vocab, "cpu", meta=meta, log=lambda message: None)  # form_starts' notes are not the export's
    labels = LabelSet.from_meta(meta)
    cfg = model.config
    corpus, loss, step = meta.get("corpus"), meta.get("val_loss"), meta.get("step")  # untrusted: checked
    return {
        "format": "chargpt-web", "version": 1, "weights": weights, "tensors": tensors,
        "config": {"vocab_size": cfg.vocab_size, "block_size": cfg.block_size, "n_layer": cfg.n_layer,
                   "n_head": cfg.n_head, "n_embd": cfg.n_embd, "norm": cfg.norm, "activation": cfg.activation,
                   "emb_scale": cfg.emb_scale, "eps": model.h[0].ln_1.eps, "softmax": cfg.softmax},
        "chars": vocab.chars, "start_text": gen.start_text(), "replacement": vocab.replacement(),
        "letters": "".join("1" if c.isalpha() else "0" for c in vocab.chars),  # forms' _: Python's str.isalpha
        "forms": form_table(), "form_starts": form_starts(gen, vocab),
        "labels": labels.to_meta() if labels else None,
        "fim": fim.to_meta() if (fim := FimMarkers.from_meta(meta)) else None,  # never written: the page writes on
        "defaults": {"temperature": SampleSettings.temperature, "max_new_tokens": SampleSettings.max_new_tokens,
                     "guidance": SampleSettings.guidance or 1.0},
        "info": {"name": name[:200], "corpus": corpus[:200] if isinstance(corpus, str) else None,
                 "size": describe_model(cfg), "params": model.num_params(),
                 "val_loss": loss if isinstance(loss, (int, float)) and math.isfinite(loss) else None,
                 "step": step if isinstance(step, int) and not isinstance(step, bool) else None,
                 "weights": weights, "chargpt": __version__},
    }


def claim(tmp, target, force):
    """Rename the checked page `tmp` to target; signals wait until it is done. Without --force a target that
    appeared meanwhile (another export to it) is left alone: a hard link creates only a new name."""
    caught = []
    with handling(STOP_SIGNALS, lambda signum, frame: caught.append(signum)):
        if force:
            replace(tmp, target)
        else:
            try:
                os.link(tmp, target)
            except FileExistsError:
                raise ChargptError(f"--to {target} was created by another program while this export ran (another "
                                   f"export to it?); it was left as it is; choose another --to, or pass --force to "
                                   f"replace it") from None
            except OSError:  # no hard links here (FAT, some network filesystems): check, then rename
                if os.path.lexists(target):
                    raise
                replace(tmp, target)
        _fsync(target.parent)
    if caught:
        raise Stopped(caught[0], done=True)


def write_files(files, check, force):
    """files: [(target, write)], write(path) writing what goes to target. Each is written beside its target under
    a temporary name (.NAME.tmp<pid>-<host>) and flushed to disk, the first is `check(path)`ed, then all are renamed
    into place in order; -> what check returned. On any failure (Ctrl-C and SIGTERM included) the temporary files
    and the folders made for them are removed and the targets are as they were."""
    first = files[0][0]
    tmps, created, done = [t.with_name(f".{t.name}{temp_suffix()}") for t, _ in files], [], False
    try:
        make_folders(first.parent, created)
        remove_stale_temps(first.parent, tuple(f".{t.name}.tmp*" for t, _ in files))  # what killed exports left
        for tmp, (_, write) in zip(tmps, files):
            write(tmp)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.chmod(tmp, _plain_mode(0o666))
        result = check(tmps[0])
        for tmp, (target, _) in zip(tmps, files):
            claim(tmp, target, force)
        done = True
        return result
    except OSError as e:
        raise ChargptError(write_error(first, e)) from None
    finally:
        for tmp in tmps:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
        for folder in reversed(created if not done else []):
            with contextlib.suppress(OSError):
                folder.rmdir()


def write_page(target, text, check, force):
    """The page `text` written to target through write_files (checked, then renamed into place)."""
    return write_files([(target, lambda path: path.write_text(text, encoding="utf-8", newline=""))], check, force)


def export_web(checkpoint, to, force=False, weights="float32", log=print):
    """Checkpoint file or run directory -> the page `to` (an .html file), its weights float32 or int8; -> its Path."""
    settings = ExportSettings(to=to, format="web", force=force, web_weights=weights)  # checked as it is made
    target = Path(settings.to).expanduser()
    if target.is_symlink() and target.exists():
        target = Path(os.path.realpath(target))  # written through: the link stays
    path = resolve(checkpoint)
    check_target(target, path, settings.force)
    header, _ = read_meta(path)  # the header alone: what cannot be exported is refused before anything heavy
    check_exportable(header["model_config"], header.get("task", "text"))
    model, vocab, meta = load_model(path, "cpu")
    model.float().eval()
    size = weight_bytes(model, settings.web_weights)
    if size > MAX_WEIGHT_BYTES:
        smaller = settings.web_weights == "float32" and size // 4 < MAX_WEIGHT_BYTES
        raise ChargptError(f"the model's weights are {size_text(size)} as {settings.web_weights}, more than a web "
                           f"page can hold ({size_text(MAX_WEIGHT_BYTES)}); " +
                           (f"export it with {param('web_weights', 'int8')}" if smaller else "export a smaller model"))
    blob, tensors = pack_weights(model, settings.web_weights)
    reference = dequantized(model, blob, tensors) if settings.web_weights == "int8" else model
    name = path.resolve().parent.name if path.name in (BEST, LATEST) else path.stem  # the run's, or the file's
    text = render(describe(model, vocab, meta, tensors, settings.web_weights, name), blob)
    with handling(TERM_SIGNALS, _raise_stopped):
        try:
            if settings.web_weights == "int8":
                gap, where = loss_gap(model, reference, meta, vocab)
                log(f"int8 weights cost {gap:+.4f} nats per character (teacher-forced on {where})" if gap is not None
                    else f"int8's cost in loss was not measured: {where}")
            checked = write_page(target, text, lambda tmp: check_page(tmp, reference, vocab), settings.force)
        except Stopped as e:
            raise stopped_error(e, target, "page") from None
    log(f"exported {path} ({describe_model(model.config)}, {len(vocab)} characters, {settings.web_weights} weights) "
        f"to {target}, {size_text(target.stat().st_size)}; {checked}")
    return target
