"""Copied text: how much of a text (a sample from Write) occurs verbatim in the run's training text.

  POST /api/novelty  {run, text, min_span} -> copied_fraction, min_span (as used: without one, the default for the
                     run's alphabet, novelty.default_min_span), longest, longest_line, summary (one line), and
                     `segments` to shade [{start, end, line, excerpt, context}] (character offsets);
                     chargpt.tools.novelty. 422 when the run's training text is not on the server (web/cache.py
                     NoveltyIndexes)
"""

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route

from chargpt.web.body import read_json
from chargpt.web.schemas import NoveltyRequest


async def novelty(request):
    from chargpt.tools.novelty import format_summary, segments
    s = request.app.state
    req = NoveltyRequest.parse(await read_json(request))
    path = s.runs.checkpoint(req.run)
    s.busy.take()
    try:
        index = await run_in_threadpool(s.novelty.get, path)
        report = await run_in_threadpool(index.score, req.text, req.min_span)  # None: the alphabet's default
    finally:
        s.busy.give()
    return JSONResponse({**report.to_json(positions=False), "summary": format_summary(report),
                         "segments": segments(report.train.spans)})


def routes():
    return [Route("/api/novelty", novelty, methods=["POST"])]
