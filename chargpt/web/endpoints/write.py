"""The Write view's API: text streamed from a run as server-sent events, stopped on request.

  POST /api/generate  {run, prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed, unknown, stop}
                      -> events: start {id, seed, prompt, task}, text [[sample, piece]...], done {stopped, chars,
                      seconds, error}; for a pairs run the prompt is the source and the text its translation alone
  POST /api/stop      {id}: cancel that generation
  GET  /api/status    generations running and the limit
"""

import secrets

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from ...tokenizer import describe_chars
from ..body import RequestError, read_json
from ..schemas import GenerateRequest, StopRequest
from ..stream import Generation


async def generate(request):
    s = request.app.state
    req = GenerateRequest.parse(await read_json(request))
    path = s.runs.checkpoint(req.run)
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        prompt, warning = prompt_as_seen(gen, req.prompt, req.unknown)
        if gen.task == "pairs" and not prompt:
            raise RequestError(400, "this run was trained on sentence pairs: type a sentence for it to translate")
    except BaseException:
        s.busy.give()
        raise
    seed = req.seed if req.seed is not None else secrets.randbelow(2**31)  # as sample.py: random, reported
    options = req.options(seed)
    if s.closing:  # Ctrl-C arrived while the model was loading
        s.busy.give()
        raise RequestError(503, "the server is shutting down")
    job = Generation(gen, prompt, options, on_end=s.finished)
    s.jobs[job.id] = job
    job.start()  # now, not when the response starts: the worker frees the slot even if no byte is ever sent
    first = {"run": req.run, "seed": seed, "prompt": prompt, "warning": warning, "task": gen.task,
             "settings": {**options, "stop": req.stop, "unknown": req.unknown}}
    return StreamingResponse(job.events(first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


def prompt_as_seen(gen, prompt, unknown):
    """The prompt after the unknown-character policy; with 'error', a 400 naming each unknown character and its
    position (the page marks them)."""
    found = gen.vocab.unknown(prompt)
    if found and unknown == "error":
        raise RequestError(400, f"the prompt has {len(found)} character(s) this model never saw: "
                                f"{describe_chars(found)}; remove them, or set unknown characters to skip or "
                                f"replace", unknown_chars=[[i, c] for i, c in found[:100]])
    return gen.prompt_text(prompt, unknown), gen.unknown_warning(prompt, unknown)


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
