"""The Runs view's API: the runs in the served folder, one run in full, and its metrics (polled while it trains).

  GET  /api/runs                  every run: name, corpus, task, architecture, parameters, steps, best val loss
  GET  /api/runs/{name}           one run in full: model and training config, vocabulary, files, its labels
                                  (--labels; null for a run without), and the samples it wrote while training
                                  (samples.jsonl rows: step, prompt, text)
  GET  /api/runs/{name}/report    its report card (RUN/report.html, `chargpt report`), as a page that may not fetch
                                  anything or run a script
  GET  /api/runs/{name}/metrics   its metrics.jsonl rows and running training loss (train_loss.jsonl rows,
                                  thinned), ?since=MTIME: only if changed since
"""

from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, Response
from starlette.routing import Route


async def list_runs(request):
    runs = request.app.state.runs
    # the folder by its name alone: where the server keeps its files is not a client's business
    return JSONResponse({"folder": runs.root.name, "runs": await run_in_threadpool(runs.summaries)})


async def run_details(request):
    return JSONResponse(await run_in_threadpool(request.app.state.runs.details, request.path_params["name"]))


async def run_metrics(request):
    rows, running, mtime = await run_in_threadpool(request.app.state.runs.metrics, request.path_params["name"])
    since = request.query_params.get("since")
    if since is not None and mtime is not None and since == repr(mtime):
        return JSONResponse({"unchanged": True, "mtime": repr(mtime)})
    return JSONResponse({"rows": rows, "running": running, "mtime": repr(mtime) if mtime is not None else None})


async def run_report(request):
    page = await run_in_threadpool(request.app.state.runs.report, request.path_params["name"])
    # the page is chargpt's own, self-contained: even so it may not load anything or run a script here
    return Response(page, media_type="text/html; charset=utf-8", headers={
        "Content-Security-Policy": "default-src 'none'; img-src data:; style-src 'unsafe-inline'"})


def routes():
    return [Route("/api/runs", list_runs), Route("/api/runs/{name}", run_details),
            Route("/api/runs/{name}/report", run_report),
            Route("/api/runs/{name}/metrics", run_metrics)]
