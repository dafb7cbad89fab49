"""What sample.py prints: the samples as they are decoded or all at once, as text or JSON lines, their scores under a
constraint or best-of, and a list's items. Each writer takes the call's options (chargpt.sampling.options.SampleOptions,
checked when the flags were read) and a Target that says where the text goes; the engine below only decodes."""

import itertools
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import click

from chargpt import textio
from chargpt.config.flags import param
from chargpt.data.items import MAX_TRIES, check_item_options
from chargpt.errors import ChargptError, ConfigError, DataError
from chargpt.sampling.constraints import given
from chargpt.tools.novelty.samples import sample_records, scored_line


def _stderr(message):
    click.echo(message, err=True)


@dataclass(frozen=True)
class Target:
    """Where sample.py's samples go: stdout, or the file `path` (--output, written atomically once all are done);
    as printed or as JSON lines (--json). `say` takes the lines meant for stderr; `novelty` (--novelty: text -> a
    novelty Report, or None) reports what each sample copied; `stdout` None is sys.stdout when it is written."""
    path: str | None = None
    as_json: bool = False
    say: Callable = _stderr
    novelty: Callable | None = None
    stdout: TextIO | None = None

    def out(self):
        return self.stdout or sys.stdout

    @property
    def live(self):
        """Whether the first sample is shown as it is written (plain text on stdout)."""
        return not (self.as_json or self.path)

    @property
    def ascii_json(self):
        """JSON with \\u escapes for every non-ASCII character, for a stdout that cannot show them (still exact)."""
        return not self.path and not textio.utf_stream(self.out())

    def write(self, body, count, what="sample(s)"):
        """The text, to the file (and a line saying so) or to stdout."""
        if self.path:
            textio.write_output(self.path, body)
            self.say(f"wrote {count} {what} to {self.path}")
        else:
            self.out().write(body)
            self.out().flush()


def write_samples(gen, prompt, options, target, copies=None):
    """sample.py's samples of `prompt` (as the model sees it): scored under a constraint or best-of (write_scored,
    copies: best-of's copy check), else the first shown live with the others after it (stream_samples), or all
    written at once (--json, --output)."""
    n = options.num_samples
    if given(options.settings) or options.settings.beam is not None:  # a beam's texts come scored
        return write_scored(gen, prompt, options, target, copies)
    if target.live:
        texts = stream_samples(gen, prompt, options, target.out())
        for i, t in enumerate(texts if target.novelty else ()):
            target.say(scored_line(target.novelty(t), i, n))
        return
    target.write(all_samples(gen, prompt, options, target), n)


def stream_samples(gen, prompt, options, out):
    """Write samples to `out` as they are decoded: the prompt, then the text (a pairs model's: the translation
    alone). Samples are decoded together in one batch; the first is shown live and the others, buffered, follow
    when decoding ends. -> the texts."""
    n, seed = options.num_samples, options.seed
    prompt = gen.prompt_text(prompt, options.unknown)  # raises before anything is printed
    texts = [""] * n
    pieces = gen.stream(prompt, options)
    first = next(pieces, None)  # the cache is allocated and the prompt read: running out of memory prints nothing
    prompt = textio.shown_prompt(gen, prompt)
    out.write(textio.separator(0, n, seed) + prompt)
    out.flush()
    for i, piece in itertools.chain([first] if first else [], pieces):
        texts[i] += piece
        if i == 0:
            out.write(piece)
            out.flush()
    after = shown_suffix(options)
    out.write(after + "\n")
    for i in range(1, n):
        out.write(textio.format_sample(i, n, seed, prompt, texts[i] + after))
    out.flush()
    return texts


def all_samples(gen, prompt, options, target):
    """Decode all samples, then -> the text to write: as printed, or one JSON object per line whose `settings`
    reproduce it with the seed (with --novelty, each sample's report joins its record, or its line goes to say)."""
    n, seed = options.num_samples, options.seed
    prompt = gen.prompt_text(prompt, options.unknown)
    texts = gen.generate(prompt, options)
    novelty = sample_records(target.novelty, n, target.as_json, target.say)
    extra = [{**(novelty(i, t) if novelty else {}), **drafts_record(gen)} for i, t in enumerate(texts)]
    if not target.as_json:
        return "".join(textio.format_sample(i, n, seed, textio.shown_prompt(gen, prompt), t + shown_suffix(options))
                       for i, t in enumerate(texts))
    record = options.record()
    return "".join(json.dumps({"sample": i, "prompt": prompt, "text": t, "seed": seed, "settings": record, **x},
                              ensure_ascii=target.ascii_json) + "\n" for i, (t, x) in enumerate(zip(texts, extra)))


def write_scored(gen, prompt, options, target, copies=None):
    """sample.py's samples under a constraint or best-of, written as the others are (the first streamed live unless
    best-of must rank them first; --json records; --output), each with its scores: score_line through target.say,
    or a `score` object in its --json record. copies: best-of's copy check (None: none)."""
    n, seed, best = options.num_samples, options.seed, options.settings.best_of
    novelty, out = target.novelty, target.out()
    run = gen.decoding(prompt, options, copies=copies or False)
    live, shown = target.live and not best, textio.shown_prompt(gen, prompt)
    first = next(run, None)  # the cache is allocated and the prompt read: running out of memory prints nothing
    out.write(textio.separator(0, n, seed) + shown if live else "")
    for i, piece in itertools.chain([first] if first else [], run):
        if live and i == 0:
            out.write(piece)
            out.flush()
    found = [novelty(s.text).summary() for s in run.samples] if novelty else [None] * n
    if target.as_json:
        record = options.record()
        body = "".join(json.dumps({"sample": i, "prompt": prompt, "text": s.text, "seed": seed, "settings": record,
                                   "score": s.record(best), **({"novelty": x} if novelty else {}),
                                   **drafts_record(gen)},
                                  ensure_ascii=target.ascii_json) + "\n"
                       for i, (s, x) in enumerate(zip(run.samples, found)))
    else:
        after = shown_suffix(options)
        body = "".join(after + "\n" if live and not i else textio.format_sample(i, n, seed, shown, s.text + after)
                       for i, s in enumerate(run.samples))
    target.write(body, n)  # the samples end their line before the scores follow (in a terminal, on the same screen)
    for i, s in enumerate(run.samples if not target.as_json else ()):
        target.say(score_line(s, i, n, best) + (f"; {novelty(s.text).line()}" if novelty else ""))


def drafts_record(gen):
    """A --json record's `drafts`: what speculative decoding did in the call (verifies, characters drafted, kept,
    and written in all), where it speculated (one sample at a time: chargpt/sampling/speculate.py); else nothing."""
    return {"drafts": gen.speculated.stats()} if gen.speculated is not None else {}


def shown_suffix(options):
    """What is printed after a sample: the text after the gap it fills (--suffix), or nothing. A --json record's
    text is the middle alone, its settings hold the suffix."""
    return options.settings.suffix or ""


DROPPED = {"copied": "copies the training text", "repetitive": "repeats itself", "near-duplicate": "a near-duplicate"}


def score_line(sample, i, n, best_of=None):
    """A sample's scores (constraints.Sample) in one line for stderr: 'sample 2: mean log-prob -1.234 nats/char;
    the constraints removed 0.456 nats/char'."""
    where = f"best {i + 1} of {best_of} (row {sample.row}): " if best_of else "" if n == 1 else f"sample {i + 1}: "
    if sample.logprob is None:
        return where + "no text"
    line = where + f"mean log-prob {sample.logprob:.3f} nats/char"
    if sample.removed is not None:
        line += f"; the constraints removed {sample.removed:.3f} nats/char"
    if sample.ended:
        line += f"; ended early: {sample.ended}"
    if sample.dropped:
        line += f" ({DROPPED.get(sample.dropped, sample.dropped)}: ranked last)"
    return line


def check_items(gen, prompt, options):
    """What sample.py cannot ask of a list (or --new-only of a run that is none), refused before any work (best-of's
    copy check builds an index first)."""
    if not gen.items_run:
        raise ConfigError(f"{param('new_only')} is for a run trained with {param('items')} (a list); drop it")
    check_item_options(options.settings, prompt)


def write_items(gen, prompt, options, target, new_only=False, data=None, run="the run"):
    """sample.py with a run trained with --items: options.num_samples items, one a line (Generator.items). target.say
    says how many are exact copies of an item of the list (found as chargpt.tools.novelty finds a run's text: `data` if
    it moved), or that the list is gone and nothing was counted; with new_only, copies are left out."""
    n = options.num_samples
    check_items(gen, prompt, options)
    known = gen.known_items(data, str(run))
    if new_only and known is None:
        raise DataError(f"{param('new_only')} needs the list the run trained on to leave copies out; pass "
                        f"{param('novelty_data')} with it")
    got = gen.items(n, prompt, options, new_only=new_only, known=known)
    if known is not None:
        target.say(f"{len(got.items)} item(s), {got.copies} of them exact copies of an item of the list"
                   + (f"; {got.dropped} {'copy' if got.dropped == 1 else 'copies'} left out ({param('new_only')})"
                      if new_only else ""))
    if got.empty:
        target.say(f"{got.empty} empty item(s) (a newline at once) were written again")
    if not got.items:  # nothing to write is a failure, not a success with no output
        why = f"every one copied the list ({param('new_only')})" if got.dropped else "every one was empty"
        raise ChargptError(f"no item in {got.tries} tries (at most {MAX_TRIES} per item): {why}; try another "
                           f"{param('seed')} or a higher {param('temperature')}")
    if len(got.items) < n:
        target.say(f"only {len(got.items)} of {n} items after {got.tries} tries (at most {MAX_TRIES} per item)")
    lines = [json.dumps({"item": t, "copy": known is not None and t in known}, ensure_ascii=False)
             if target.as_json else t for t in got.items]
    target.write("".join(line + "\n" for line in lines), len(lines), "item(s)")
