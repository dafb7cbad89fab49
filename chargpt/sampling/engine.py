"""The engine: a loaded model and its vocabulary, ready to write text or translate (chargpt.load -> Generator).

    import chargpt
    gen = chargpt.load("checkpoints/tinyshakespeare")
    print(gen.generate("ROMEO:", max_new_tokens=200, temperature=0.8, seed=1)[0])

It sits above the pure parts, as nanochat's engine.py and gpt-fast's generate.py do: chargpt/sampling/decode.py
(next-character choice, the decode loop, stop strings), chargpt/sampling/constraints.py and chargpt/sampling/forms.py
(what a sample may write, and its scores) and chargpt/sampling/translate.py (the searches and scores).

    gen.generate("", form="五言绝句", acrostic="春夏秋冬", seed=1)      # forms, acrostics, --ban, --allow, ...
    for s in gen.samples("The ", best_of=8, num_samples=2):          # scored: constraints.Sample
        print(s.logprob, s.text)

Every entry point takes (prompt, options, ...): options is one chargpt.sampling.options.SampleOptions, checked when it
was made, and keyword overrides (as above) make one from the defaults (or from the options given), checked there once.
"""

import dataclasses
import sys

import numpy as np
import torch

from chargpt.config import SampleSettings
from chargpt.config.flags import param
from chargpt.data.corpus import share_compile_cache
from chargpt.data.fim import FimMarkers
from chargpt.data.items import acrostic_items, check_item_options, corpus_items, is_items_run, sample_items
from chargpt.data.labels import LabelSet
from chargpt.data.pairs import END, SEP
from chargpt.data.tokenizer import describe_chars
from chargpt.errors import ChargptError, ConfigError
from chargpt.model.quantize import check_precision, inference_model, uses_dynamic_int8
from chargpt.model.transformer import CharGPT
from chargpt.runs.checkpoint import load_model, run_settings, unwrap
from chargpt.runtime import pick_decode_compile, pick_device
from chargpt.sampling import constraints, forms, infill
from chargpt.sampling import suggest as suggestions
from chargpt.sampling.beam import TextSteps
from chargpt.sampling.decode import StepRunner, StopFilter, decode, guided, mixed_labels, through_filters
from chargpt.sampling.options import sample_options
from chargpt.sampling.speculate import CorpusLookup, Drafts, Meter, PromptLookup, TrainingText, decode_speculative
from chargpt.sampling.translate import beam_hypotheses, iter_sample_search, make_steps, source_ids, translate
from chargpt.threads import ThreadTuner, parse_threads

MAX_FORM_SEARCH = 5_000_000  # characters of a run's text searched for where a form's shape starts (form_start): the
# Tang poems whole (0.2 s, once per form and model); a larger text's first 5M characters hold its shapes too


class Generator:
    """A loaded model and its vocabulary, ready to write text. Build it with chargpt.load(path).

    A model trained on sentence pairs (task 'pairs', either architecture) answers a prompt with its translation:
    the prompt is the source, and the text written is the target alone (see stream)."""

    def __init__(self, model, vocab, device, dtype=torch.float32, meta=None, compile="auto", quantized=False,
                 log=None, threads="auto", speculate="off"):
        # decode with the plain module: no DDP sync, no recompiles per length
        self.model, self.vocab, self.device, self.dtype = unwrap(model).eval(), vocab, torch.device(device), dtype
        self.meta = meta or {}
        self.log = log or (lambda message: print(message, file=sys.stderr))  # notes (best-of without its corpus)
        self.novelty = None  # the run's novelty index for best-of: found on first use (False: not to be found)
        self.task = self.meta.get("task", "text")
        self.precision = str(dtype).removeprefix("torch.")  # what the model computes in, in words (load says more)
        self.compile, self.quantized = compile, quantized  # --compile auto|on|off; torch's dynamic int8 modules?
        self.runner = None  # the compiled StepRunner, once one is asked for: compiled once and kept
        self.labels = LabelSet.from_meta(self.meta)  # a run trained with --labels: its labels (chargpt/data/labels.py)
        self.fim = FimMarkers.from_meta(self.meta)  # a run trained with --fim: its markers (chargpt/data/fim.py)
        self.items_run = is_items_run(self.meta)  # a run trained with --items: it writes items (see items())
        self.form_starts = {}  # form -> where the run's text starts text of its shape (form_start)
        # a CPU's decode steps run at the thread count measured fastest as they run (chargpt/threads.py): on a
        # machine where another process holds a core, one thread writes many times faster than two
        self.threads = ThreadTuner.of(threads) if self.device.type == "cpu" else None
        self.suggest_threads = None  # suggest()'s own ThreadTuner, made on first use
        self.speculate = check_speculate(speculate)  # auto|on|off: drafts checked in one forward (speculate.py)
        self.draft_index = None  # the training text's suffix array for drafts, found on first use (False: none)
        self.drafted = None  # speculate.Meter: what the calls learned of whether drafting pays here
        self.speculated = None  # the last call's Meter (.stats(): its drafts in counts), None where it decoded plainly

    def decode_runner(self, new_chars):
        """-> (the StepRunner that decodes new_chars characters (all samples together) after the prefill, or None
        for the model's own forward with its growing cache; the choice in words). A decoder-only text model gets the
        compiled static step where --compile (runtime.pick_decode_compile) says it pays. Eager, the growing cache
        stays: it reads only the positions written so far, where the static step reads the whole window."""
        if not isinstance(self.model, CharGPT) or self.task == "pairs":
            return None, "decode step: the model's forward"
        compiled, reason = pick_decode_compile(self.compile, self.device, new_chars, self.quantized)
        if not compiled:
            return None, reason
        if self.runner is None:
            self.runner = StepRunner(self.model, compiled=True)  # compiled once, on its first call
        return self.runner, reason

    def speculation(self):
        """Speculative decoding in words, for the line a command prints when it loads a run ("" where it is off)."""
        if self.speculate == "off" or not self._speculative_model():
            return ""
        if self.speculate == "auto" and self.device.type != "cpu":
            return f"speculation off (auto: not measured on {self.device.type.upper()})"
        return f"speculation {self.speculate} (one sample at a time; more decode plainly)"

    def _speculative_model(self):
        return isinstance(self.model, CharGPT) and self.task != "pairs"

    def speculates(self, rows=1, guided=False, use_cache=True):
        """Whether a call decodes with drafts (chargpt/sampling/speculate.py): one sample, with the cache, a
        decoder-only text model, no classifier-free guidance (its 2 rows); auto only on a CPU, where it was
        measured. Other calls decode plainly, as fast as before."""
        return (self.speculate == "on" or self.speculate == "auto" and self.device.type == "cpu") and rows == 1 \
            and not guided and use_cache and self._speculative_model()

    def _drafts(self, ids):
        """The draft sources of one sample continuing `ids`: the text so far, and the training text where its
        index is found."""
        sources = [PromptLookup(ids)]
        found = self._draft_index()
        if found:
            sources.append(CorpusLookup(found, ids))
        return Drafts(sources)

    def _draft_index(self):
        """-> the training split of the run's novelty index as a speculate.TrainingText, or False: the index already
        loaded (copy_check) or found in the cache; --speculate on builds it where it is missing (once per corpus),
        auto drafts without it."""
        if self.draft_index is None:
            from chargpt.tools.novelty import CorpusMissing, NotIndexed, for_meta
            self.draft_index, novelty = False, self.novelty or None
            try:
                if novelty is None and run_settings(self.meta):
                    quiet = self.speculate != "on"
                    novelty = for_meta(self.meta, log=(lambda m: None) if quiet else self.log, build=not quiet)
            except (CorpusMissing, NotIndexed, ChargptError, OSError) as e:
                if self.speculate == "on":
                    self.log(f"note: speculation drafts from the text so far only (the training text: {e})")
            if novelty:
                corpus = novelty.vocab.stoi
                to_corpus = np.array([corpus.get(c, -1) for c in self.vocab.chars], np.int64)
                from_corpus = np.array([self.vocab.stoi.get(c, -1) for c in novelty.vocab.chars], np.int64)
                split = novelty.splits["train"]
                self.draft_index = TrainingText(split.text, split.sa, to_corpus, from_corpus)
        return self.draft_index

    def describe(self):
        """The run in a few words, for the line a command prints when it loads one: its task, step, validation
        loss and vocabulary."""
        step, loss = self.meta.get("step"), self.meta.get("val_loss")
        facts = [f"step {step}"] if step is not None else []
        if self.task == "pairs":
            facts.insert(0, f"sentence pairs, {self.model.config.arch}")
        facts += [f"val loss {loss:.4f}"] if isinstance(loss, (int, float)) else []
        facts += ["a list: it writes items"] if self.items_run else []
        facts += [f"labels: {', '.join(list(self.labels.names)[:8])}" + (" ..." if len(self.labels.names) > 8 else "")
                  ] if self.labels else []
        return ", ".join(facts + [f"{len(self.vocab)} characters"])

    def start_text(self):
        """What an empty prompt conditions on: a newline (as if a new paragraph started), else a space."""
        for c in ("\n", " "):
            if c in self.vocab.stoi:
                return c
        return self.vocab.chars[0]

    def form_start(self, form, generator):
        """What a --form without a prompt is conditioned on: the text before one of the places where the run's
        training text starts text of the form's shape (forms.shape_starts; chosen with the sample's generator),
        not shown. None (a newline then, start_text) without a form, or where the text is not to be found or has
        nothing of that shape: said once, with the way round it."""
        if not form:
            return None
        if form not in self.form_starts:
            starts, why = [], "the run's training text is not to be found"
            from chargpt.tools.novelty import CorpusMissing, run_corpus
            try:
                if run_settings(self.meta):
                    corpus = run_corpus(self.meta, log=self.log)
                    ids = corpus.ids()[:MAX_FORM_SEARCH]
                    text = "".join(np.asarray(corpus.vocab.chars, dtype=object)[ids])
                    room = min(forms.START_CONTEXT, self.model.config.block_size // 4)  # the window is the form's
                    starts = forms.shape_starts(form, text, room)
                    why = "the run's training text has no text of its shape"
            except (CorpusMissing, ChargptError) as e:
                why = f"{why} ({str(e).split(';')[0]})" if str(e) else why
            starts = [s for s in starts if not self.vocab.unknown(s)]
            if not starts:
                self.log(f"note: the form starts after a newline ({why}); a {param('prompt')} that ends where "
                         f"text of its shape starts (an author's line before a poem) steers it there")
            self.form_starts[form] = starts
        starts = self.form_starts[form]
        return starts[int(torch.randint(len(starts), (1,), generator=generator))] if starts else None

    def prompt_text(self, prompt, unknown="error", what="prompt"):
        """The prompt as the model will see it after the unknown-character policy: 'error' raises naming
        each unknown character and its position, 'skip' drops them, 'replace' maps them to the first of
        U+FFFD, '?' or a space that the vocabulary has (else its first character). A run with labels refuses its
        label characters in a prompt (a label there would be read as a change of style mid-text), as a translator
        refuses its pair markers."""
        reserved = set(self.reserved())
        forged = next((c for c in prompt if c in reserved), None) if reserved else None
        if forged is not None and self.labels and forged in self.labels.chars():
            raise ChargptError(f"the {what} holds U+{ord(forged):04X}, a private-use character this run reserves for "
                               f"its labels; remove it (a label is chosen with {param('label')})")
        if forged is not None:
            raise ChargptError(f"the {what} holds U+{ord(forged):04X}, a private-use character this run reserves for "
                               f"filling in the middle; remove it (the gap is where {param('prompt')} ends and "
                               f"{param('suffix')} starts)")
        return self.vocab.decode(self.vocab.encode(prompt, unknown=unknown, what=what))

    def reserved(self, infilling=False):
        """The characters a sample never writes and a prompt never holds: a labelled run's label characters, a FIM
        run's markers (END aside when `infilling`: writing it ends the middle)."""
        markers = [c for c in self.fim.chars() if not (infilling and c == self.fim.end)] if self.fim else []
        return "".join([*(self.labels.chars() if self.labels else []), *markers])

    def unknown_warning(self, prompt, unknown):
        """One line for stderr saying what 'skip' or 'replace' did to the prompt, or '' if nothing."""
        found = self.vocab.unknown(prompt)
        if not found or unknown == "error":
            return ""
        what = "dropped" if unknown == "skip" else f"replaced with {self.vocab.replacement()!r}"
        return f"{len(found)} prompt character(s) the model never saw were {what}: {describe_chars(found)}"

    def stream(self, prompt="", options=None, *, copies=None, **overrides):
        """Yield (sample index, text) pieces as they are decoded; options: a SampleOptions (sample.py's flags), or
        keyword overrides of its fields (max_new_tokens=200, seed=1). All samples decode together in one batch, so
        `seed` with the same `num_samples` reproduces them. For a pairs model the prompt is a source and the pieces
        are its translation (see _stream_pairs). Constraints (ban, allow, form, acrostic, repetition_penalty,
        no_repeat_ngram: chargpt/sampling/constraints.py) mask the logits; best_of=N decodes N samples and yields the
        best num_samples, each as one piece once all are ranked. decoding() and samples() also give each sample's
        scores. A run trained with --labels writes in the style of `label` (None: unconditioned), held to it more
        strongly by guidance > 1. copies: best-of's copy check (see decoding)."""
        yield from self.decoding(prompt, options, copies=copies, **overrides)

    def decoding(self, prompt="", options=None, *, copies=None, score=False, **overrides):
        """A Decoding: iterate it for (sample index, piece) as stream() does; once it ends, its .samples hold each
        sample's text and scores (constraints.Sample). score=True scores the samples even without a constraint (the
        plain decode path does not); copies: best-of's copy check, text -> a novelty Report (None: the run's own,
        found through copy_check; False: none)."""
        options = sample_options(options, **overrides)
        settings, rows = options.settings, options.settings.best_of or options.num_samples
        prompt_seen = self.prompt_text(prompt, options.unknown)
        self.speculated = None
        if settings.suffix is not None and self.fim is None:
            raise infill.no_fim()
        generator = torch.Generator()  # its own RNG: sampling never touches torch's global one
        if options.seed is None:
            generator.seed()
        else:
            generator.manual_seed(options.seed)
        if self.task == "pairs":
            if constraints.given(settings) or settings.min_p:
                raise ConfigError("this model translates (it was trained on sentence pairs); forms, acrostics, "
                                  "patterns, banned and allowed characters, min-p, the repetition controls and best-of "
                                  "are for text models")
            if settings.label:  # (guidance needs a label: SampleSettings)
                raise ConfigError(f"this model translates (it was trained on sentence pairs) and has no labels; drop "
                                  f"{param('label')}")
            scored = [] if settings.beam is not None else None  # a beam's texts come with their log-probability
            pieces = self._stream_pairs(prompt_seen, settings, options.num_samples, generator, options.use_cache,
                                        scored)
            return Decoding(pieces, rows=options.num_samples, scored=scored)
        gap = None if settings.suffix is None else infill.plan(
            self.fim, self.vocab, prompt_seen, self.prompt_text(settings.suffix, options.unknown, "suffix"),
            self.model.config.block_size, 1 if self.labels else 0)
        if gap is not None and gap.note:
            self.log(gap.note)
        context = prompt_seen or (None if gap else self.form_start(settings.form, generator)) or self.start_text()
        if gap is not None and settings.allow:  # END closes the middle: --allow keeps it writable
            settings = dataclasses.replace(settings, allow=settings.allow + gap.end)
        rules = constraints.plan(settings, self.vocab, context, score=score, reserved=self.reserved(gap is not None))
        if rules and rules.program and rules.program.need[0] > settings.max_new_tokens:
            self.log(f"note: the form needs at least {rules.program.need[0]} characters; "
                     f"{param('max_new_tokens', settings.max_new_tokens)} cuts it short")
        if rules and rules.pattern and rules.pattern.unproven:
            self.log(rules.pattern.unproven)
        ids = gap.ids if gap is not None else self.vocab.encode(context)
        if settings.beam is not None:
            return self._beam(ids, prompt_seen, rules, settings, options.num_samples)
        steer = rules.steer(ids, rows, settings.max_new_tokens, self.device) if rules else None
        # what decoding will write: a form ends its sample (--compile auto weighs that, not --max-new-tokens)
        writes = min(settings.max_new_tokens, rules.program.most) if rules and rules.program else \
            settings.max_new_tokens
        steps = self._steps(ids, settings, rows, generator, options.use_cache, steer, writes,
                            pin=len(ids) if gap is not None else 0)
        stops = (*settings.stop, gap.end) if gap is not None else settings.stop  # the middle ends at END
        filters = [StopFilter(prompt_seen, stops) for _ in range(rows)]
        pieces = through_filters(filters, self._chosen(steps, steer))
        if settings.best_of:
            if copies is None:
                copies = self.copy_check(options.min_span)
            return Decoding(pieces, steer, rows, best_of=(settings.best_of, options.num_samples, copies or None))
        return Decoding(pieces, steer, rows)

    def _steps(self, ids, settings, rows, generator, use_cache, steer, writes, pin=0):
        """sampling.decode over `rows` copies of the context's ids: each step's ids (rows,), a run with labels
        reading its label first (and, guided or mixed, beside each row the same under NULL or the other labels); the
        first `pin` ids (an infill's context) stay in the window as it slides, after the label."""
        heads, combine = self._heads(settings)
        ctx = torch.tensor([[h] + ids for h in heads] if heads else [ids], dtype=torch.long,
                           device=self.device).repeat_interleave(rows, dim=0)  # (G rows, T): head by head
        runner = self.decode_runner(writes * rows * max(1, len(heads)))[0] if use_cache else None
        labelled = dict(pin=pin + (1 if heads else 0), never=self._never(settings))
        if heads:  # the label stays first in the window
            labelled.update(extra=ctx[rows:] if len(heads) > 1 else None, combine=combine)
        if self.speculates(rows, len(heads) > 1, use_cache):
            always = self.speculate == "on"
            if self.drafted is None or self.drafted.always != always:
                self.drafted = Meter(always=always)
            meter = self.drafted = self.drafted.next_call()  # what earlier calls learned goes on, in its own Meter
            self.speculated = meter  # its counts fill in as the call decodes (sample.py's --json `drafts`)
            drafts = self._drafts(ctx[0].tolist())
            return self._threaded(decode_speculative(self.model, ctx, settings, generator, drafts, meter,
                                                     dtype=self.dtype, runner=runner, steer=steer,
                                                     pin=labelled.get("pin", 0), never=labelled.get("never")))
        return self._threaded(decode(self.model, ctx[:rows], settings, generator, use_cache=use_cache,
                                     dtype=self.dtype, runner=runner, steer=steer, **labelled))

    def _threaded(self, steps):
        return steps if self.threads is None else self.threads.run(steps)

    def _never(self, settings):
        """The ids a sample never writes (a long tensor), or None: the reserved characters (a FIM run's END aside
        while it fills a gap: writing it ends the middle)."""
        unwritten = [self.vocab.stoi[c] for c in self.reserved(settings.suffix is not None)]
        return torch.tensor(unwritten, device=self.device) if unwritten else None

    def _heads(self, settings):
        """-> (the label id each head reads first: [] for a run without labels, one for a label, the label and NULL
        for guidance, one per label of a mix; the combine that makes one row's logits of the heads'
        (sampling.decode.guided or mixed_labels), or None)."""
        mix = settings.label_mix
        if self.labels is None:
            if mix:
                raise ConfigError(f"this run was trained without {param('labels')}, so it has no labels; drop "
                                  f"{param('label')}")
            return [], None
        stoi = self.vocab.stoi
        if mix is not None and mix.single is None:
            heads = [stoi[self.labels.token(name)] for name in mix.names]
            return heads, mixed_labels(torch.tensor(mix.weights))
        label = stoi[self.labels.token(mix.single if mix else None)]
        if (settings.guidance or 1.0) != 1.0:
            return [label, stoi[self.labels.null]], guided(settings.guidance)
        return [label], None

    def _beam(self, ids, prompt_seen, rules, settings, keep):
        """--beam: the `keep` likeliest continuations of the context's ids (chargpt/sampling/beam.py), a Decoding
        whose pieces come once the search has ended, each sample whole."""
        heads, combine = self._heads(settings)
        never = self._never(settings)
        ctx = torch.tensor([[h] + ids for h in heads] if heads else [ids], dtype=torch.long, device=self.device)
        steer = rules.steer(ids, 1, settings.max_new_tokens, self.device) if rules else None
        step = TextSteps(self.model, ctx, combine=combine, pin=1 if heads else 0, never=never, steer=steer,
                         stops=settings.stop, before=prompt_seen, chars=self.vocab.chars, dtype=self.dtype)
        samples = []

        def pieces():
            found = beam_hypotheses(step, 1, len(self.vocab), settings.max_new_tokens, settings.beam,
                                    settings.length_penalty, keep)[0]
            if len(found) < keep:  # the constraints left fewer texts than were asked for
                self.log(f"note: the beam found {len(found)} distinct text(s) under these constraints, not "
                         f"{param('num_samples', keep)}")
            for k, (_, hyp, logp) in enumerate(found):
                cut = StopFilter(prompt_seen, settings.stop)
                text = cut.feed(self.vocab.decode(hyp)) + cut.flush()
                samples.append(constraints.Sample(text, logp / len(hyp) if hyp else None, row=k))
                if text:
                    yield k, text
        return Decoding(self._threaded(pieces()), rows=keep, scored=samples)

    def suggest(self, text="", k=5, words=3, *, label=None, unknown="error"):
        """-> the suggestions after `text` (chargpt/sampling/suggest.py: Suggestions): the k likeliest next characters
        with their probabilities at temperature 1, and the `words` likeliest word completions (2-4 ideographs for
        Chinese). A run trained with --labels suggests in `label`'s style (None: unconditioned); unknown: the
        prompt's policy for characters the model never saw."""
        query = suggestions.Query(text, k, words, label)
        if self.task == "pairs":
            raise ChargptError("this model translates (it was trained on sentence pairs); suggestions are for text "
                               "models")
        seen = self.prompt_text(query.text, unknown)
        heads = self._heads(SampleSettings(label=query.label))[0]
        if len(heads) > 1:
            raise ConfigError(f"suggestions follow one label's style, not a mix; give {param('label')} one name")
        if self.threads is not None and self.suggest_threads is None:  # its own: a suggestion's steps are not
            self.suggest_threads = ThreadTuner(self.threads.counts)  # decoding's, and are timed apart from them
        never = [self.vocab.stoi[c] for c in self.reserved()]  # labels' and a FIM run's markers
        return suggestions.suggest(self.model, self.vocab.chars, self.vocab.encode(seen or self.start_text()), query,
                                   text=seen, head=heads, never=never, dtype=self.dtype,
                                   run=self.suggest_threads.run if self.suggest_threads else None)

    def items(self, n=1, prompt="", options=None, *, new_only=False, known=None, **overrides):
        """A run trained with --items: n items (each cut at its first newline), each starting with `prompt` (one
        line), or under an acrostic with its k-th character, from the start of an item (a newline) ->
        chargpt.data.items.ItemSamples. known: the list's items (known_items()), to
        count copies of and, with new_only, to leave out; options and overrides: stream()'s (num_samples aside: n
        says how many)."""
        options = sample_options(options, **overrides)
        check_item_options(options.settings, prompt)
        each = options.replace(stop=(*options.settings.stop, "\n"))

        def generate(count, round_seed, opts=each):
            return [prompt + t for t in self.generate("\n" + prompt, opts.replace(num_samples=count, seed=round_seed))]
        if options.settings.acrostic:  # item k starts with the acrostic's k-th character (cycling)
            def letter_items(letter, count, seed):
                return sample_items(lambda c, s: generate(c, s, each.replace(acrostic=letter)), count, seed, known,
                                    new_only)
            return acrostic_items(letter_items, n, options.settings.acrostic, options.seed)
        return sample_items(generate, n, options.seed, known, new_only)

    def known_items(self, data=None, run="the run"):
        """The items of the list the run trained on (a set), or None (said in one line) when it is not to be found."""
        from chargpt.tools.novelty import CorpusMissing
        from chargpt.tools.novelty.runs import run_corpus
        try:
            return corpus_items(run_corpus(self.meta, data, run=run, log=self.log))
        except CorpusMissing as e:
            self.log(f"copies of the list are not counted: {e}")
            return None

    def _chosen(self, steps, steer):
        """Each step's ids -> [(sample index, character)], and (index, None) for a sample whose form ended or that
        ended before this character (steer.stuck_now)."""
        for nxt in steps:
            stuck = set(steer.stuck_now) if steer is not None else ()  # ended before this character: not written
            chosen = [(i, None if i in stuck else self.vocab.chars[c]) for i, c in enumerate(nxt.tolist())]
            yield chosen + [(i, None) for i in steer.ended_now] if steer is not None else chosen

    def samples(self, prompt="", options=None, *, copies=None, **overrides):
        """-> a constraints.Sample (text and scores) per sample, scored even without a constraint; the options are
        stream()'s."""
        decoding = self.decoding(prompt, options, copies=copies, score=True, **overrides)
        for _ in decoding:
            pass
        return decoding.samples

    def copy_check(self, min_span=None, data=None, run="the run"):
        """For best-of: a function text -> novelty Report against the run's training text (data: where it is now,
        if it moved; checked by its hash), or None where that text is not to be found (said once, through
        self.log)."""
        from chargpt.tools.novelty import CorpusMissing, check_min_span, for_meta
        if min_span is not None:  # None: the default for the run's alphabet (novelty.default_min_span)
            check_min_span(min_span)
        if self.novelty is None:
            try:
                if not run_settings(self.meta):
                    raise CorpusMissing("this model has no record of its training text", "")
                self.novelty = for_meta(self.meta, run, data, log=self.log)
            except CorpusMissing as e:
                self.log(f"best-of ranks without dropping copies of the training text: {e}")
                self.novelty = False
        return (lambda text: self.novelty.score(text, min_span)) if self.novelty else None

    def _stream_pairs(self, source, settings, num_samples, generator, use_cache, scored=None):
        """A pairs model continues `source SEP` (or encodes the source) and stops at the end marker: the pieces are
        the target alone, decoded as `chargpt translate` does (its greedy or sampled search, one character per
        step), at most the context's worth or max_new_tokens."""
        if not source:
            raise ChargptError(f"this model was trained on sentence pairs: its prompt is the sentence to translate; "
                               f"give {param('prompt')} some text")
        ids = source_ids(self.model, self.vocab, [source], name="the prompt")
        if settings.beam is not None:  # translation's beam search, its best num_samples each as one piece
            step, room = make_steps(self.model, self.vocab, ids, use_cache, self.dtype)
            found = beam_hypotheses(step, 1, self.vocab.stoi[END], min(room, settings.max_new_tokens),
                                    settings.beam, settings.length_penalty, num_samples)[0]
            for k, (_, hyp, logp) in enumerate(found):  # scored: each text with its mean log-prob a character
                cut = StopFilter("", settings.stop)
                text = cut.feed(self.vocab.decode(hyp).replace(SEP, "")) + cut.flush()
                scored.append(constraints.Sample(text, logp / len(hyp) if hyp else None, row=k))
                if text:
                    yield k, text
            return
        step, room = make_steps(self.model, self.vocab, ids * num_samples, use_cache, self.dtype)
        filters = [StopFilter("", settings.stop) for _ in range(num_samples)]
        found = self._threaded(iter_sample_search(step, num_samples, self.vocab.stoi[END],
                                                  min(room, settings.max_new_tokens), generator, settings.temperature,
                                                  settings.top_k, settings.top_p))
        yield from through_filters(filters, ([(i, self.vocab.chars[tok].replace(SEP, "")) for i, tok in chosen]
                                              for chosen in (found if settings.max_new_tokens else ())))

    def translate(self, sources, **options):
        """Source strings -> their translations, for a pairs model; options as chargpt.sampling.translate.translate
        (beam, alpha, temperature, top_k, top_p, generator, unknown, batch_size, max_len, use_cache)."""
        if self.task != "pairs":
            raise ChargptError("this model was trained on plain text, not sentence pairs, so it does not translate; "
                               "write with it instead (sample.py), or train one with --task pairs")
        return translate(self.model, self.vocab, list(sources), dtype=self.dtype, **options)

    def generate(self, prompt="", options=None, *, include_prompt=False, copies=None, **overrides):
        """-> list of the generated texts, one per sample: the continuation alone, or with include_prompt=True the
        prompt (as the model saw it, after --unknown) followed by it, as sample.py prints and transformers' generate
        returns. A translator's texts are the translations either way. Options as for stream()."""
        options = sample_options(options, **overrides)
        start = self.prompt_text(prompt, options.unknown) if include_prompt and self.task != "pairs" else ""
        out = [start] * options.num_samples
        for i, piece in self.stream(prompt, options, copies=copies):
            out[i] += piece
        return out


class Decoding:
    """One call's samples as they are decoded (Generator.decoding). Iterate it for (sample index, text piece); when
    it has ended, `samples` holds a constraints.Sample per sample (text and scores). With best_of = (N, keep,
    copies) the N samples are decoded first, ranked (constraints.rank: copies(text) -> a novelty Report, or None for
    no copy check), and the best `keep` yielded, each as one piece."""

    def __init__(self, pieces, steer=None, rows=0, best_of=None, scored=None):
        self.steer, self.rows, self.best_of, self.samples = steer, rows, best_of, None
        self.scored = scored  # the samples as the pieces' source scored them (a beam search), filled as it ends
        self._pieces = self._ranked(pieces) if best_of else self._kept(pieces)

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._pieces)

    def _kept(self, pieces):
        texts = [""] * self.rows
        for i, piece in pieces:
            if self.rows:
                texts[i] += piece
            yield i, piece
        if self.scored is not None:
            self.samples = self.scored
            return
        self.samples = constraints.samples_of(texts, *(self.steer.scores() if self.steer else (None, None)),
                                              ended=self.steer.ended_of(texts) if self.steer else None)

    def _ranked(self, pieces):
        for _ in self._kept(pieces):
            pass
        n, keep, copies = self.best_of
        self.samples = constraints.rank(self.samples, keep, copies)
        for k, s in enumerate(self.samples):
            if s.text:
                yield k, s.text


def check_speculate(value):
    """--speculate as given -> auto, on or off; ConfigError else."""
    if value not in ("auto", "on", "off"):
        raise ConfigError(f"{param('speculate')} takes auto, on or off, got {value!r:.40}")
    return value


def load(path, device="auto", dtype="auto", quantize=None, compile="auto", threads="auto", speculate="off"):
    """Checkpoint file or run directory -> Generator. dtype: auto (bf16 where the device computes it natively,
    else float32: runtime.pick_decode_dtype), float32 or bfloat16; quantize='int8': int8 weights for decoding on
    a CPU (chargpt.model.quantize); compile: auto|on|off, torch.compile of the decode step (auto: where it pays,
    runtime.pick_decode_compile); threads: a CPU's threads for decoding, auto (measured as it writes:
    chargpt/threads.py) or a number; speculate: auto|on|off, drafts from the text so far and the training text
    checked in one forward each, the text as without them (chargpt/sampling/speculate.py; auto: one sample at a
    time on a CPU, while the drafts pay)."""
    check_speculate(speculate)
    device = pick_device(device)
    check_precision(device, dtype, quantize)  # a bad choice fails before the checkpoint is read
    parse_threads(threads)
    pick_decode_compile(compile, device, 0)  # so does a bad --compile
    if compile != "off":
        share_compile_cache()  # before loading imports torch's dynamo (sampling.StepRunner says why)
    model, vocab, meta = load_model(path, device)
    model, torch_dtype, precision = inference_model(model, device, dtype, quantize)
    gen = Generator(model, vocab, device, torch_dtype, meta, compile=compile, quantized=uses_dynamic_int8(model),
                    threads=threads, speculate=speculate)
    gen.precision = precision
    return gen
