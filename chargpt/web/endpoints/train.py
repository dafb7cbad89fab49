"""The New run view's API: train a run from the page, watch it, stop and resume it (chargpt/web/training.py).

  GET  /api/corpora              the texts a training can read, by name: the built-in corpus, the server's data
                                 folder's texts and folders of texts (chargpt serve --data-dir; a folder with its
                                 labels choices), the uploaded ones
  POST /api/train/upload?name=F  the file's bytes as the body (Content-Type: application/octet-stream), at most
                                 MAX_UPLOAD_BYTES, strict UTF-8 -> {corpus: its name among the uploads}
  POST /api/train                {source: builtin|data|upload, corpus, name, max_time, preset, n_layer, n_head,
                                 n_embd, block_size, batch_size, sample_every, labels} -> the status below
                                 (labels: none|folders|files|MANIFEST.tsv, for a folder: chargpt train --labels)
  GET  /api/train                {training: the one running or last finished (run, pid, state running|stopping|
                                 finished|stopped|crashed, exit_code, startup, log, error, samples, progress, resumable)
                                 or null, presets, limits}
  POST /api/train/stop           SIGTERM: it saves and ends, as Ctrl-C does
  POST /api/train/resume         {run, max_time}: --resume, with the rest of its budget or max_time seconds more
One training at a time (a second start is a 409: a training uses all the cores). Under chargpt serve --no-training
each answers 403, and so does a server that listens beyond this machine unless chargpt serve --training allows it
(its 403 has "shown": true, and the page shows the reason). A page on another site cannot make a browser send any
of the POSTs: middleware.SameOrigin refuses them, whatever their content type.
"""

from typing import Literal

from pydantic import Field, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route

from chargpt.web.body import RequestError, read_capped, read_json
from chargpt.web.corpora import LABELS, MANIFEST_SUFFIX, shown
from chargpt.web.limits import MAX_NAME_CHARS, MAX_TRAIN_SECONDS, MAX_UPLOAD_BYTES
from chargpt.web.schemas import Request
from chargpt.web.training import TEXT_PRESETS

MAX_SIZE = 1_000_000  # a model size field: train checks what fits; this bounds the command line


class TrainRequest(Request):
    source: Literal["builtin", "data", "upload"] = "builtin"
    corpus: str | None = Field(None, max_length=MAX_NAME_CHARS * 2)  # a name from GET /api/corpora
    name: str | None = Field(None, max_length=MAX_NAME_CHARS)  # the run's; default: the corpus's
    max_time: float = Field(ge=1, le=MAX_TRAIN_SECONDS)
    preset: Literal[TEXT_PRESETS] | None = Field(None, description=f"one of {', '.join(TEXT_PRESETS)}, or null "
                                                                f"(train's default: auto on a CPU)")
    n_layer: int | None = Field(None, ge=1, le=MAX_SIZE)
    n_head: int | None = Field(None, ge=1, le=MAX_SIZE)
    n_embd: int | None = Field(None, ge=1, le=MAX_SIZE)
    block_size: int | None = Field(None, ge=1, le=MAX_SIZE)
    batch_size: int | None = Field(None, ge=1, le=MAX_SIZE)
    sample_every: int | None = Field(None, ge=1, le=MAX_SIZE)  # a sample every N steps, shown as it is written
    # a folder corpus's labels (chargpt train --labels): none, folders, files, or a manifest's name among the folder's
    # files; which of them the chosen folder has is checked against its listing (corpora.TextFolder.labels_flag)
    labels: str | None = Field(None, max_length=MAX_NAME_CHARS * 2)

    @model_validator(mode="after")
    def _labels_is_a_choice(self):
        if self.labels is not None and self.labels not in LABELS and not (
                shown(self.labels) and self.labels.endswith(MANIFEST_SUFFIX) and "/" not in self.labels
                and "\\" not in self.labels):
            raise ValueError(f"labels must be {', '.join(LABELS)} or the name of a {MANIFEST_SUFFIX} manifest in the "
                             f"chosen folder (GET /api/corpora lists them), got {self.labels!r:.60}")
        return self

    def options(self):
        return {k: getattr(self, k) for k in ("preset", "n_layer", "n_head", "n_embd", "block_size", "batch_size",
                                              "sample_every")}


class ResumeRequest(Request):
    run: str
    max_time: float | None = Field(None, ge=1, le=MAX_TRAIN_SECONDS)  # None: the rest of the run's budget


def trainings(request):
    t = request.app.state.trainings
    if not t.enabled and t.off_because:  # the page shows this one in its New run view
        raise RequestError(403, f"{t.off_because}; or train in a terminal with chargpt train --data FILE",
                           shown=True)
    if not t.enabled:
        raise RequestError(403, "training from the page is off on this server (chargpt serve --no-training); "
                                "train in a terminal with chargpt train --data FILE")
    return t


async def corpora(request):
    return JSONResponse(await run_in_threadpool(trainings(request).corpora))


async def upload(request):
    t = trainings(request)
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/octet-stream":
        raise RequestError(415, "send the file's bytes as the body with Content-Type: application/octet-stream")
    name = request.query_params.get("name", "")
    if len(name) > 4 * MAX_NAME_CHARS:
        raise RequestError(400, f"the file name is {len(name)} characters; the limit is {4 * MAX_NAME_CHARS}")
    data = await read_capped(request, MAX_UPLOAD_BYTES, "the uploaded file")
    return JSONResponse({"corpus": await run_in_threadpool(t.upload, name, data)})


async def start(request):
    t = trainings(request)
    req = TrainRequest.parse(await read_json(request))
    return JSONResponse(await run_in_threadpool(t.start, req.source, req.corpus, req.name, req.max_time,
                                                req.options(), req.labels))


async def status(request):
    t = trainings(request)
    return JSONResponse({**await run_in_threadpool(t.status), "presets": list(TEXT_PRESETS),
                         "max_upload_bytes": MAX_UPLOAD_BYTES, "max_time": MAX_TRAIN_SECONDS})


async def stop(request):
    return JSONResponse(await run_in_threadpool(trainings(request).stop))


async def resume(request):
    t = trainings(request)
    req = ResumeRequest.parse(await read_json(request, limit=4096))
    run = await run_in_threadpool(request.app.state.runs.find, req.run)
    return JSONResponse(await run_in_threadpool(t.resume, run, req.max_time))


def routes():
    return [Route("/api/corpora", corpora), Route("/api/train/upload", upload, methods=["POST"]),
            Route("/api/train", start, methods=["POST"]), Route("/api/train", status),
            Route("/api/train/stop", stop, methods=["POST"]), Route("/api/train/resume", resume, methods=["POST"])]
