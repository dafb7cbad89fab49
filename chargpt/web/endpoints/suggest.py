"""Suggestions as a person types in Write: the next characters and word completions (chargpt/sampling/suggest.py).

  POST /api/suggest  {run, text, k, words, unknown, label} -> chars [{char, p}] (the k likeliest next characters,
                     their probabilities at temperature 1), words [{text, word, p}] (completions: the characters to
                     add, the whole word, its probability), kind ("words", or "cjk": 2-4 ideographs), ms (the time
                     the suggestions took on the server, the model already loaded). A text with characters the run
                     never saw is a 400 naming them (as /api/generate's prompt), unless unknown is skip or replace.
"""

import time

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route

from chargpt.config.decoding import LabelMix
from chargpt.errors import ChargptError, ConfigError
from chargpt.web.body import RequestError, read_json
from chargpt.web.endpoints.write import check_label, prompt_as_seen
from chargpt.web.schemas import SuggestRequest


async def suggest(request):
    s = request.app.state
    req = SuggestRequest.parse(await read_json(request))
    path = s.runs.checkpoint(req.run)
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        if gen.task == "pairs":
            raise RequestError(400, "this run translates (it was trained on sentence pairs); suggestions are for "
                                    "runs trained on text")
        prompt_as_seen(gen, req.text, req.unknown)  # a 400 that names the unknown characters, as Write's
        try:
            mix = LabelMix.parse(req.label) if req.label else None
        except ConfigError as e:
            raise RequestError(400, str(e)) from None
        check_label(gen, mix)
        found, seconds = await run_in_threadpool(timed, gen, req)
    finally:
        s.busy.give()
    return JSONResponse({**found.to_json(), "ms": round(seconds * 1000, 2)})


def timed(gen, req):
    """-> (the suggestions, the seconds they took), a ChargptError as the 400 it is."""
    start = time.perf_counter()
    try:
        found = gen.suggest(req.text, req.k, req.words, label=req.label, unknown=req.unknown)
    except ChargptError as e:
        raise RequestError(400, str(e)) from None
    return found, time.perf_counter() - start


def routes():
    return [Route("/api/suggest", suggest, methods=["POST"])]
