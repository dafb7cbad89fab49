"""The Write view's API: text streamed from a run as server-sent events, stopped on request.

  POST /api/generate  {run, prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed, unknown, stop,
                      form, acrostic, ban, allow, regex, grammar, json_schema, best_of, repetition_penalty,
                      no_repeat_ngram, min_p, min_span, label, guidance, suffix}
                      -> events: start {id, seed, prompt, task}, text [[sample, piece]...], done {stopped, chars,
                      seconds, error, scores}; for a pairs run the prompt is the source and the text its translation
                      alone. Under a constraint or best_of, `scores` has each sample's (constraints.Sample.record:
                      logprob, removed, and for best-of its row and why it was dropped) and `copy_check` whether
                      best-of could check for copies of the training text; best-of's samples come ranked, each as
                      one piece once all are written. A form or pattern the run's vocabulary cannot write is a 400,
                      and so is a label the run was not trained with (--labels: GET /api/runs/{name} lists its labels),
                      and a suffix (fill in the middle: the text after the gap) for a run trained without --fim.
  POST /api/stop      {id}: cancel that generation
  GET  /api/status    generations running and the limit
"""

import contextvars
import secrets
from dataclasses import replace

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from chargpt.data.tokenizer import describe_chars
from chargpt.errors import ChargptError, ConfigError
from chargpt.sampling.constraints import given, plan
from chargpt.sampling.infill import no_fim
from chargpt.web.body import RequestError, read_json
from chargpt.web.schemas import GenerateRequest, StopRequest
from chargpt.web.stream import Generation


async def generate(request):
    s = request.app.state
    req = GenerateRequest.parse(await read_json(request))
    job, first = await start(s, s.runs.checkpoint(req.run), req)
    return StreamingResponse(job.events(first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def start(s, path, req, prompts=None):
    """A generation started, the one way both /api/generate and /v1/completions start one: a busy slot (429 when
    full), the model at `path` loaded in a worker thread, the request checked against it, a seed chosen when none
    was given, and the Generation running in its worker thread, registered for /api/stop. prompts: several
    prompts written in turn (InTurn), the Generation's prompt their list; None: req.prompt alone.
    -> (the Generation, the `start` event's data)."""
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        seen = [prompt_as_seen(gen, p, req.unknown, None if prompts is None or len(prompts) == 1 else k)
                for k, p in enumerate([req.prompt] if prompts is None else prompts)]
        if gen.task == "pairs" and not all(prompt for prompt, _ in seen):
            raise RequestError(400, "this run was trained on sentence pairs: type a sentence for it to translate")
        check_suffix(gen, req.suffix, req.unknown)
        options = req.options()
        check_label(gen, options.settings.label_mix)
        scored = given(options.settings) or options.settings.beam is not None  # a beam scores what it finds
        if given(options.settings):
            for prompt, _ in seen:
                check_constraints(gen, options.settings, prompt)
        copies = await run_in_threadpool(copy_check, s, path, req.min_span) if req.best_of else None
    except BaseException:
        s.busy.give()
        raise
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)  # as sample.py: random, reported
    options = replace(options, seed=seed)
    if s.closing:  # Ctrl-C arrived while the model was loading
        s.busy.give()
        raise RequestError(503, "the server is shutting down")
    scorer = Scored(gen, copies) if scored else None

    def on_end(job):  # before the `done` event is sent: its scores join it
        if scorer is not None:
            scorer.report(job.result, req.best_of)
        s.finished(job)
    prompt, warning = seen[0]
    if prompts is None:
        job = Generation(scorer or gen, prompt, options, on_end=on_end)
    else:
        job = Generation(InTurn(scorer or gen, options.num_samples), [p for p, _ in seen], options, on_end=on_end)
    s.jobs[job.id] = job
    job.start()  # now, not when the response starts: the worker frees the slot even if no byte is ever sent
    first = {"run": req.run, "seed": seed, "prompt": prompt, "warning": warning, "task": gen.task,
             "settings": shown_settings(options)}
    return job, first


def shown_settings(options):
    """The `start` event's settings: with the seed, what sample.py needs to write the same text (a constraint or
    label not given is left out)."""
    shown = {k: v for k, v in options.record().items() if v is not None or k in ("top_k", "top_p")}
    return {**shown, "stop": list(options.settings.stop), "seed": options.seed}


class InTurn:
    """Several prompts for one Generation (/v1/completions' list of prompts): each written in turn as its own
    request with the same settings and seed, so each is the text sample.py writes for it; prompt k's samples are
    numbered k * num_samples + i."""

    def __init__(self, source, num_samples):
        self.source, self.num_samples = source, num_samples

    def stream(self, prompts, options):
        for k, prompt in enumerate(prompts):
            for i, piece in self.source.stream(prompt, options):
                yield k * self.num_samples + i, piece


def check_constraints(gen, settings, prompt):
    """The constraints (SampleSettings) against the run's vocabulary (a form's fixed character it never saw...): a
    400 before any decoding, named as the JSON fields (a fresh context: `chargpt serve` runs inside
    config.cli_names)."""
    if gen.task == "pairs":
        raise RequestError(400, "this run translates (it was trained on sentence pairs): forms, acrostics, patterns, "
                                "banned and allowed characters and best-of are for runs trained on text")
    try:
        contextvars.Context().run(plan, settings, gen.vocab, prompt or gen.start_text())
    except ConfigError as e:
        raise RequestError(400, str(e)) from None


def check_label(gen, mix):
    """A label (or a label of a mix: config.decoding.LabelMix) the run was not trained with: a 400 before any
    decoding, naming the run's labels (a run without labels: that it has none)."""
    if not mix:
        return
    if gen.labels is None:
        raise RequestError(400, f"label {', '.join(mix.names)!r:.60}: this run was trained without labels; leave "
                                f"label out")
    try:
        for name in mix.names:
            gen.labels.token(name)
    except ChargptError as e:
        raise RequestError(400, str(e)) from None


def check_suffix(gen, suffix, unknown):
    """A suffix (fill in the middle) for a run trained without --fim, or one that holds a character the model never
    saw or a marker of its own: a 400 before any decoding, named as the JSON fields."""
    if suffix is None:
        return
    try:
        if gen.fim is None:
            raise contextvars.Context().run(no_fim)
        gen.prompt_text(suffix, unknown, "suffix")
    except ChargptError as e:
        raise RequestError(400, str(e), param="suffix") from None


def copy_check(s, path, min_span):
    """best-of's copy check: text -> novelty Report against the run's training text, or False where that text is
    not on this server (best-of then ranks without it, and says so)."""
    try:
        index = s.novelty.get(path)
    except RequestError:
        return False
    return lambda text: index.score(text, min_span)


class Scored:
    """The Generator as the stream bridge (web/stream.py) calls it, for a request under constraints or best-of: its
    stream is Generator.decoding, whose samples' scores report() adds to the `done` event."""

    def __init__(self, gen, copies):
        self.gen, self.copies, self.decoding = gen, copies, None

    def stream(self, prompt, options):
        self.decoding = self.gen.decoding(prompt, options, copies=self.copies)
        return self.decoding

    def report(self, result, best_of):
        samples = self.decoding.samples if self.decoding is not None else None
        result["scores"] = [s.record(best_of) for s in samples] if samples else None
        if best_of:
            result["copy_check"] = bool(self.copies)


def prompt_as_seen(gen, prompt, unknown, index=None):
    """The prompt after the unknown-character policy; with 'error', a 400 naming each unknown character and its
    position (the page marks them), and which prompt of a list (index, from 0) holds them."""
    found = gen.vocab.unknown(prompt)
    if found and unknown == "error":
        which = "the prompt" if index is None else f"prompt {index} of the list (counted from 0)"
        raise RequestError(400, f"{which} has {len(found)} character(s) this model never saw: "
                                f"{describe_chars(found)}; remove them, or set unknown characters to skip or "
                                f"replace", unknown_chars=[[i, c] for i, c in found[:100]])
    try:
        seen = gen.prompt_text(prompt, unknown)
    except ChargptError as e:  # a character the run reserves (a label's, a FIM marker): the request's fault
        raise RequestError(400, str(e), param="prompt") from None
    return seen, gen.unknown_warning(prompt, unknown)


async def stop(request):
    req = StopRequest.parse(await read_json(request, limit=1024))
    job = request.app.state.jobs.get(req.id)
    if job is None:
        raise RequestError(404, "no generation with that id is running (it may have finished)")
    job.cancel.set()
    return JSONResponse({"stopping": req.id})


async def status(request):
    s = request.app.state
    return JSONResponse({"busy": s.busy.count, "max_busy": s.busy.limit, "generations": sorted(s.jobs)})


def routes():
    return [Route("/api/generate", generate, methods=["POST"]), Route("/api/stop", stop, methods=["POST"]),
            Route("/api/status", status)]
