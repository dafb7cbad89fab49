"""The web playground's server (`chargpt serve`, `python -m chargpt.serve`) for the runs in a checkpoints folder.

    pip install -e ".[web]"
    python -m chargpt.serve                                   # http://127.0.0.1:8000, runs from checkpoints/
    python -m chargpt.serve --checkpoints runs/ --port 8080

One page (chargpt/web/, plain HTML and JavaScript, no build step, nothing from the internet) with three views:
Write streams text from a run (from a run trained on sentence pairs: the translation of a source sentence);
Look inside shades each character by the model's surprise and draws its attention maps (chargpt.inside); Runs
overlays loss curves from metrics.jsonl and follows runs still training.
The server is a thin layer over the library: chargpt.load for models, Generator.stream for text, so a seed
gives the same text as sample.py. Starlette and uvicorn come with the optional `web` extra.

Safe by default: it binds 127.0.0.1 and answers only requests addressed to localhost (no DNS rebinding);
runs are chosen by name from a fresh listing of the served folder, so no request path reaches the
filesystem; every request is checked against the limits below, with one JSON error {"error": ...} and a
4xx status; at most MAX_BUSY generations or analyses run at once (the next gets 429), each in a worker
thread so the event loop stays free; Stop, or leaving the page, cancels a generation at its next character.

API (JSON in, JSON out; generation as server-sent events):
  GET  /api/runs                  every run: name, corpus, task, architecture, parameters, steps, best val loss
  GET  /api/runs/{name}           one run in full: model and training config, vocabulary, files, and the
                                  samples it wrote while training (samples.jsonl rows: step, prompt, text)
  GET  /api/runs/{name}/metrics   its metrics.jsonl rows and running training loss (train_loss.jsonl rows,
                                  thinned), ?since=MTIME: only if changed since
  POST /api/generate              {run, prompt, max_new_tokens, temperature, top_k, top_p, num_samples, seed,
                                  unknown, stop} -> events: start {id, seed, prompt, task}, text [[sample, piece]...],
                                  done {stopped, chars, seconds, error}; for a pairs run the prompt is the source
                                  and the text its translation alone
  POST /api/stop                  {id}: cancel that generation
  POST /api/inside                {run, text, top, end} -> surprise, expected characters, attention maps (of the
                                  context window ending before position `end`, by default the text's end);
                                  decoder-only runs (an encoder-decoder is refused with 400)
  POST /api/novelty               {run, text, min_span} -> how much of text is copied from the run's training text
                                  (chargpt.novelty): copied_fraction, longest, longest_line, summary (one line), and
                                  `segments` to shade [{start, end, line, excerpt, context}] (character offsets)
  GET  /api/status                generations running and the limit
"""

import asyncio
import base64
import contextlib
import ipaddress
import json
import math
import secrets
import socket
import sys
import threading
import time
import traceback
from collections import OrderedDict
from pathlib import Path

import torch

# run-directory knowledge comes through this one line (to repoint when it moves to chargpt/rundir.py, issue #9)
from ..config import SampleSettings
from ..errors import ChargptError
from ..inside import look_inside
from ..platforms import claim_port
from ..rundir import BEST, LATEST, LOSSES, METRICS, SAMPLES, lock_holder, read_metrics
from ..runinfo import escape, run_info
from ..tokenizer import UNKNOWN_POLICIES, describe_chars

try:  # the optional web extra; serve() names it when it is missing
    import uvicorn
    from starlette.applications import Starlette
    from starlette.concurrency import run_in_threadpool
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.requests import ClientDisconnect
    from starlette.responses import FileResponse, JSONResponse, StreamingResponse
    from starlette.routing import Route
    WEB_MISSING = None
except ImportError as e:
    WEB_MISSING = e.name

WEB = Path(__file__).parent  # index.html, app.js, style.css: shipped as package data

# Limits: every request is checked against these, with a 4xx JSON error naming the one it broke.
MAX_BODY_BYTES = 256 * 1024  # a request body (the prompt is most of it)
MAX_PROMPT_CHARS = 10_000
MAX_NEW_CHARS = 5_000  # characters generated per sample
MAX_SAMPLES = 8  # samples per request (decoded together in one batch)
MAX_TEMPERATURE = 10.0
MAX_TOP_K = 1_000_000
MAX_SEED = 2**63 - 1
MAX_STOPS, MAX_STOP_CHARS = 4, 100
MAX_INSIDE_CHARS = 2_000  # text analysed by Look inside
MAX_NOVELTY_CHARS = MAX_PROMPT_CHARS + MAX_NEW_CHARS  # text checked for copying (a prompt and its sample)
MAX_TOP = 10  # expected characters listed per position
VOCAB_PREVIEW = 300  # vocabulary characters a run's details show
MAX_INT_DIGITS = 100  # digits of an integer in a request (a seed has at most 19; more is a range error)
MAX_BUSY = 2  # generations and analyses at once; the next request gets 429
MAX_MODELS = 2  # loaded models kept in memory
MAX_METRIC_ROWS = 20_000  # the newest rows of a metrics.jsonl that are sent
MAX_SAMPLE_ROWS = 50  # the newest samples a run wrote while training (samples.jsonl) that are sent
MAX_RUNNING_POINTS = 2_000  # running-loss rows (train_loss.jsonl) sent: evenly thinned to at most this many
MAX_VOCAB_SENT = 20_000  # vocabulary characters sent for a run's detail (its summary counts them all)
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")

REQUIRED = object()
NUMBER = (int, float)
# request fields: name -> (accepted types, default)
GENERATE = {"run": (str, REQUIRED), "prompt": (str, ""), "max_new_tokens": (int, SampleSettings.max_new_tokens),
            "temperature": (NUMBER, SampleSettings.temperature), "top_k": ((int, type(None)), None),
            "top_p": ((*NUMBER, type(None)), None), "num_samples": (int, 1), "seed": ((int, type(None)), None),
            "unknown": (str, "error"), "stop": (list, [])}
INSIDE = {"run": (str, REQUIRED), "text": (str, REQUIRED), "top": (int, 5), "end": ((int, type(None)), None)}
NOVELTY = {"run": (str, REQUIRED), "text": (str, REQUIRED), "min_span": ((int, type(None)), None)}
STOP = {"id": (str, REQUIRED)}


class RequestError(Exception):
    """A request the server refuses: an HTTP status and one line for the user (plus optional JSON fields)."""

    def __init__(self, status, message, **extra):
        super().__init__(message)
        self.status, self.extra = status, extra


# --- runs: chosen by name from the served folder ---------------------------------------------------------------
class Runs:
    """The run directories directly under one folder. A name from a request is only looked up in a fresh
    listing of that folder, never joined to a path; a run or file that resolves outside the folder (a symlink
    out of it) is not listed."""

    def __init__(self, root):
        self.root = Path(root).resolve()

    def _inside(self, path):
        real = path.resolve()
        return real != self.root and real.is_relative_to(self.root)

    def _file(self, run, name):
        path = run / name
        return path if path.is_file() and self._inside(path) else None

    def listing(self):
        """{name: directory} of every run (a directory with a checkpoint) in the folder."""
        with contextlib.suppress(OSError):
            return {d.name: d for d in sorted(self.root.iterdir())
                    if d.is_dir() and self._inside(d) and (self._file(d, BEST) or self._file(d, LATEST))}
        return {}

    def find(self, name):
        """A run name from a request -> its directory, or a 404 that says how to list the runs."""
        run = self.listing().get(name) if isinstance(name, str) else None
        if run is None:
            raise RequestError(404, f"no run named {str(name)[:80]!r} in the served folder; GET /api/runs lists them")
        return run

    def checkpoint(self, name):
        """What sampling loads, as sample.py does: the best checkpoint, else the latest."""
        run = self.find(name)
        return self._file(run, BEST) or self._file(run, LATEST)

    def summaries(self):
        return [{k: v for k, v in self.summary(run).items() if k != "info"} for run in self.listing().values()]

    def summary(self, run, preview=VOCAB_PREVIEW):
        """The facts the run picker shows: chargpt info's description of the run (headers only, no weights)."""
        out = {"name": run.name, "updated": _mtime(*(run / n for n in (LATEST, BEST, METRICS, SAMPLES))),
               "training": lock_holder(run) is not None}  # a training holds the run directory's lock
        try:
            info = run_info(run, preview=preview)
        except ChargptError as e:
            return {**out, "error": str(e)}
        m, best = info["model_config"], finite(info["best_val_loss"])
        return {**out, "corpus": str(info["corpus"] or run.name), "step": info["steps"],
                "params": info["parameters"], "best_val_loss": best,
                "best_bpc": best / math.log(2) if best is not None else None, "vocab_size": info["vocab_size"],
                "block_size": m["block_size"], "layers": m["n_layer"], "heads": m["n_head"], "width": m["n_embd"],
                "task": info["task"], "arch": info["arch"], "info": info}

    def details(self, name):
        run = self.find(name)
        summary = self.summary(run, preview=MAX_VOCAB_SENT)  # the whole vocabulary (up to a bound), for its summary
        info = summary.pop("info", None)
        if info is None:
            return summary
        samples = self._file(run, SAMPLES)  # read_metrics reads any of a run's step-keyed JSON lines
        return {**summary, "model_config": info["model_config"], "train_config": finite(info["train_config"]),
                "saved_at": info["saved_at"], "vocab_preview": escape("".join(info["vocab_chars"][:VOCAB_PREVIEW])),
                "vocab_chars": info["vocab_chars"], "closing_prompt": info["closing_prompt"], "files": info["files"],
                "init_from": finite(info.get("init_from")),  # the run it started from (--init-from), or None
                "samples": read_metrics(samples)[-MAX_SAMPLE_ROWS:] if samples else []}

    def metrics(self, name):
        """-> (rows, running-loss rows, mtime of the newer of metrics.jsonl and train_loss.jsonl, or None)."""
        run = self.find(name)
        path, losses = self._file(run, METRICS), self._file(run, LOSSES)
        running = read_metrics(losses) if losses else []
        running = running[::math.ceil(len(running) / MAX_RUNNING_POINTS)] if running else []
        if not path and not losses:
            return [], [], None
        return (read_metrics(path)[-MAX_METRIC_ROWS:] if path else []), running, _mtime(*filter(None, (path, losses)))


def _mtime(*paths):
    """The newest modification time among paths that exist (0 if none)."""
    times = [0.0]
    for p in paths:
        with contextlib.suppress(OSError):
            times.append(p.stat().st_mtime)
    return max(times)


def finite(value):
    """Metadata with NaN or infinity (JSON has neither) -> the same with None there."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    return value if isinstance(value, (str, int, type(None))) else None


class Models:
    """Loaded Generators, the most recently used last; at most `size`. A checkpoint that changed on disk (a
    run still training) is loaded again. Called from worker threads; loads one at a time."""

    def __init__(self, device="auto", size=MAX_MODELS):
        self.device, self.size = device, size
        self.loaded = OrderedDict()  # (path, mtime_ns) -> Generator
        self.lock = threading.Lock()

    def get(self, path):
        from ..engine import load
        try:
            key = (str(path), path.stat().st_mtime_ns)
        except OSError:
            raise RequestError(404, f"the run {path.parent.name!r} was removed; GET /api/runs lists them") from None
        with self.lock:
            if key not in self.loaded:
                for old in [k for k in self.loaded if k[0] == key[0]]:  # an older save of the same run
                    del self.loaded[old]
                gen = load(path, device=self.device)
                warm_up = gen.vocab.chars[0] if gen.task == "pairs" else ""  # a pairs model needs a source
                gen.generate(warm_up, max_new_tokens=2, seed=0)  # torch's first-call setup is not the user's wait
                self.loaded[key] = gen
                while len(self.loaded) > self.size:
                    self.loaded.popitem(last=False)
            self.loaded.move_to_end(key)
            return self.loaded[key]


class Busy:
    """Counts generations and analyses in flight; refuses one over the limit instead of queueing it."""

    def __init__(self, limit=MAX_BUSY):
        self.limit, self.count, self.lock = limit, 0, threading.Lock()

    def take(self):
        with self.lock:
            if self.count >= self.limit:
                raise RequestError(429, f"busy: {self.count} generation(s) running, the limit is {self.limit}; "
                                        f"try again when one finishes")
            self.count += 1

    def give(self):
        with self.lock:
            self.count -= 1


# --- request checking --------------------------------------------------------------------------------------------
async def read_json(request, limit=MAX_BODY_BYTES):
    """The body as a JSON object, read no further than `limit` bytes."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise RequestError(415, "send the request body as JSON with Content-Type: application/json")
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"request body is {int(declared)} bytes; the limit is {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"request body is over {limit} bytes")
    except ClientDisconnect:  # the client left mid-body: no one to answer (a 400 that is never read, not a traceback)
        raise RequestError(400, "the client disconnected before sending the whole body") from None
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant, parse_int=_bounded_int)
    except (UnicodeDecodeError, ValueError) as e:
        raise RequestError(400, f"request body is not valid JSON ({clipped(str(e), 100)})") from None
    except RecursionError:  # the parser recurses into each nested array or object
        raise RequestError(400, "request body nests arrays or objects too deeply; send a flat JSON object") from None
    if not isinstance(value, dict):
        raise RequestError(400, "request body must be a JSON object")
    if _has_surrogate(value):  # "\ud800" is valid JSON but no character: nothing could encode it back
        raise RequestError(400, "request body holds a lone UTF-16 surrogate (\\ud800-\\udfff), which is not a "
                                "character; send the text as UTF-8")
    return value


def _has_surrogate(value):
    """Whether any string in a parsed JSON value holds a lone surrogate (walked with a stack: no recursion)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if any("\ud800" <= c <= "\udfff" for c in v):
                return True
        elif isinstance(v, dict):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            todo += v
    return False


def _no_constant(name):
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(digits):
    """A JSON integer, refused past MAX_INT_DIGITS (no field takes more; Python's own limit, 4300, ends in a
    message about sys.set_int_max_str_digits)."""
    if len(digits.lstrip("-")) > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {len(digits.lstrip('-')):,} digits; the most is {MAX_INT_DIGITS}")
    return int(digits)


def clipped(text, n):
    """text cut to at most n characters at a word boundary, with an ellipsis when cut."""
    if len(text) <= n:
        return text
    return text[:n].rsplit(" ", 1)[0].rstrip(" ,;:") + " ..."


def fields(body, spec):
    """Check a JSON object against {name: (types, default)}: known names only, each of its type (a bool is
    never a number); absent ones take their default. -> dict of every field."""
    unknown = sorted(set(body) - set(spec))
    if unknown:
        raise RequestError(400, f"unknown field(s) {', '.join(map(str, unknown))[:200]}; allowed: {', '.join(spec)}")
    out = {}
    for name, (types, default) in spec.items():
        if name not in body:
            if default is REQUIRED:
                raise RequestError(400, f"{name} is required")
            out[name] = default
            continue
        value = body[name]
        if isinstance(value, bool) or not isinstance(value, types):
            raise RequestError(400, f"{name} must be {_type_words(types)}, got {json.dumps(value)[:40]}")
        out[name] = value
    return out


def _type_words(types):
    names = {str: "a string", int: "an integer", float: "a number", list: "a list", type(None): "null"}
    types = types if isinstance(types, tuple) else (types,)
    words = [names[t] for t in types if not (t is int and float in types)]
    return " or ".join(words)


def in_range(name, value, low, high):
    if not low <= value <= high:
        raise RequestError(400, f"{name} must be between {low} and {high}, got {value}")


def check_generate(req):
    """Range checks beyond fields(): the limits above and the sampling settings' own rules."""
    in_range("max_new_tokens", req["max_new_tokens"], 0, MAX_NEW_CHARS)
    in_range("temperature", req["temperature"], 0, MAX_TEMPERATURE)
    in_range("num_samples", req["num_samples"], 1, MAX_SAMPLES)
    if req["top_k"] is not None:
        in_range("top_k", req["top_k"], 0, MAX_TOP_K)
    if req["top_p"] is not None and not 0 < req["top_p"] <= 1:
        raise RequestError(400, f"top_p must be above 0 and at most 1 (1: off), got {req['top_p']}")
    if req["seed"] is not None:
        in_range("seed", req["seed"], 0, MAX_SEED)
    if len(req["prompt"]) > MAX_PROMPT_CHARS:
        raise RequestError(400, f"prompt is {len(req['prompt'])} characters; the limit is {MAX_PROMPT_CHARS}")
    if req["unknown"] not in UNKNOWN_POLICIES:
        raise RequestError(400, f"unknown must be one of {', '.join(UNKNOWN_POLICIES)}, got {req['unknown']!r:.40}")
    stops = req["stop"]
    if len(stops) > MAX_STOPS or any(not isinstance(s, str) or not 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise RequestError(400, f"stop must be a list of at most {MAX_STOPS} non-empty strings of at most "
                                f"{MAX_STOP_CHARS} characters")
    return req


def prompt_as_seen(gen, prompt, unknown):
    """The prompt after the unknown-character policy; with 'error', a 400 naming each unknown character and its
    position (the page marks them)."""
    found = gen.vocab.unknown(prompt)
    if found and unknown == "error":
        raise RequestError(400, f"the prompt has {len(found)} character(s) this model never saw: "
                                f"{describe_chars(found)}; remove them, or set unknown characters to skip or "
                                f"replace", unknown_chars=[[i, c] for i, c in found[:100]])
    return gen.prompt_text(prompt, unknown), gen.unknown_warning(prompt, unknown)


# --- generation: a worker thread feeding an event stream ---------------------------------------------------------
def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class Generation:
    """One streamed request. A worker thread decodes with Generator.stream and hands the pieces to the event
    loop through a queue; the stream ends with a `done` event. Cancelled (Stop, or the client went away) at the
    next character; the worker frees its slot when it ends, however it ends."""

    def __init__(self, gen, prompt, options, on_end):
        self.id = secrets.token_urlsafe(12)
        self.gen, self.prompt, self.options, self.on_end = gen, prompt, options, on_end
        self.cancel = threading.Event()
        self.queue = asyncio.Queue()
        self.result = None  # the `done` event's data, once the worker has ended

    def start(self):
        loop = asyncio.get_running_loop()

        def put(item):  # from the worker thread
            with contextlib.suppress(RuntimeError):  # the loop is gone: the server is shutting down
                loop.call_soon_threadsafe(self.queue.put_nowait, item)

        threading.Thread(target=self._work, args=(put,), name=f"generate-{self.id}", daemon=True).start()
        return self

    async def events(self, first):
        try:
            yield sse("start", {"id": self.id, **first})
            while True:
                items = [await self.queue.get()]
                while not self.queue.empty():  # what piled up while the last event was sent goes as one
                    items.append(self.queue.get_nowait())
                pieces = [data for kind, data in items if kind == "text"]
                if pieces:
                    yield sse("text", pieces)
                ends = [data for kind, data in items if kind == "done"]
                if ends:
                    yield sse("done", ends[0])
                    return
        finally:
            self.cancel.set()  # a client that disconnects lands here too

    def _work(self, put):
        t0, chars, error = time.perf_counter(), 0, None
        try:
            for i, piece in self.gen.stream(self.prompt, **self.options):
                if self.cancel.is_set():
                    break
                chars += len(piece)
                put(("text", [i, piece]))
        except ChargptError as e:
            error = str(e)
        except Exception as e:  # a bug, or out of memory: tell the page, keep the server up
            traceback.print_exc()
            error = f"generation failed: {type(e).__name__}: {str(e)[:200]}"
        finally:
            self.result = {"stopped": self.cancel.is_set(), "chars": chars, "error": error,
                           "seconds": round(time.perf_counter() - t0, 4)}
            self.on_end(self)
            put(("done", self.result))


# --- endpoints ----------------------------------------------------------------------------------------------------
def state(request):
    return request.app.state


PAGE_FILES = ("app.js", "style.css")  # what /static/ serves: the page's own files, not the package's Python


async def index(request):
    return FileResponse(WEB / "index.html")


async def static_file(request):
    name = request.path_params["name"]
    if name not in PAGE_FILES:
        raise RequestError(404, f"no file {clipped(name, 80)!r} here; the page uses {', '.join(PAGE_FILES)}")
    return FileResponse(WEB / name)


async def list_runs(request):
    runs = state(request).runs
    return JSONResponse({"folder": str(runs.root), "runs": await run_in_threadpool(runs.summaries)})


async def run_details(request):
    s = state(request)
    return JSONResponse(await run_in_threadpool(s.runs.details, request.path_params["name"]))


async def run_metrics(request):
    rows, running, mtime = await run_in_threadpool(state(request).runs.metrics, request.path_params["name"])
    since = request.query_params.get("since")
    if since is not None and mtime is not None and since == repr(mtime):
        return JSONResponse({"unchanged": True, "mtime": repr(mtime)})
    return JSONResponse({"rows": rows, "running": running, "mtime": repr(mtime) if mtime is not None else None})


async def generate(request):
    s = state(request)
    req = check_generate(fields(await read_json(request), GENERATE))
    path = s.runs.checkpoint(req["run"])
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        prompt, warning = prompt_as_seen(gen, req["prompt"], req["unknown"])
        if gen.task == "pairs" and not prompt:
            raise RequestError(400, "this run was trained on sentence pairs: type a sentence for it to translate")
    except BaseException:
        s.busy.give()
        raise
    seed = req["seed"] if req["seed"] is not None else secrets.randbelow(2**31)  # as sample.py: random, reported
    options = {**{k: req[k] for k in ("max_new_tokens", "temperature", "top_k", "top_p", "num_samples")},
               "stop": tuple(req["stop"]), "seed": seed}  # Generator.stream's keywords, as sample.py passes them
    if s.closing:  # Ctrl-C arrived while the model was loading
        s.busy.give()
        raise RequestError(503, "the server is shutting down")
    job = Generation(gen, prompt, options, on_end=s.finished)
    s.jobs[job.id] = job
    job.start()  # now, not when the response starts: the worker frees the slot even if no byte is ever sent
    first = {"run": req["run"], "seed": seed, "prompt": prompt, "warning": warning, "task": gen.task,
             "settings": {**options, "stop": req["stop"], "unknown": req["unknown"]}}
    return StreamingResponse(job.events(first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def stop(request):
    req = fields(await read_json(request, limit=1024), STOP)
    job = state(request).jobs.get(req["id"])
    if job is None:
        raise RequestError(404, "no generation with that id is running (it may have finished)")
    job.cancel.set()
    return JSONResponse({"stopping": req["id"]})


async def inside(request):
    s = state(request)
    req = fields(await read_json(request), INSIDE)
    if not 0 < len(req["text"]) <= MAX_INSIDE_CHARS:
        raise RequestError(400, f"text must have 1 to {MAX_INSIDE_CHARS} characters, got {len(req['text'])}")
    in_range("top", req["top"], 1, MAX_TOP)
    if req["end"] is not None:
        in_range("end", req["end"], 1, len(req["text"]))
    path = s.runs.checkpoint(req["run"])
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        if gen.model.config.arch == "encoder-decoder":
            raise RequestError(400, "Look inside shows decoder-only models, whose attention runs over one text; this "
                                    "run is an encoder-decoder (source and target apart); translate with it in Write")
        view = await run_in_threadpool(look_inside, gen, req["text"], req["top"], req["end"])
    finally:
        s.busy.give()
    return JSONResponse(inside_json(view))


def inside_json(view):
    """Attention goes as bytes (weight x 255, base64): a 6-layer, 6-head, 256-character window is 2.4 MB."""
    L, H, W, _ = view.attention.shape
    quantised = (view.attention * 255).round().clamp(0, 255).to(torch.uint8).numpy().tobytes()  # (L, H, W, W)
    known = [b for b in view.bits if b is not None]
    return {"text": view.text, "bits": [None if b is None else round(b, 3) for b in view.bits],
            "mean_bits": sum(known) / len(known) if known else None, "expected": view.expected,
            "unknown": view.unknown, "window_start": view.window_start, "layers": L, "heads": H, "window": W,
            "attention": base64.b64encode(quantised).decode("ascii")}


class NoveltyIndexes:
    """The novelty index (chargpt.novelty) of each run asked about, by run directory: built or loaded once, in a
    worker thread (the first build of a large corpus takes a while), one at a time."""

    def __init__(self):
        self.loaded, self.lock = {}, threading.Lock()

    def get(self, path):
        from ..novelty import for_run
        with self.lock:
            if path.parent not in self.loaded:
                self.loaded[path.parent] = for_run(path, log=lambda m: print(m, file=sys.stderr))
            return self.loaded[path.parent]


async def novelty(request):
    from ..novelty import DEFAULT_MIN_SPAN, format_summary, segments
    s = state(request)
    req = fields(await read_json(request), NOVELTY)
    if len(req["text"]) > MAX_NOVELTY_CHARS:
        raise RequestError(400, f"text is {len(req['text'])} characters; the limit is {MAX_NOVELTY_CHARS}")
    span = DEFAULT_MIN_SPAN if req["min_span"] is None else req["min_span"]
    in_range("min_span", span, 1, MAX_NOVELTY_CHARS)
    path = s.runs.checkpoint(req["run"])
    s.busy.take()
    try:
        index = await run_in_threadpool(s.novelty.get, path)
        report = await run_in_threadpool(index.score, req["text"], span)
    finally:
        s.busy.give()
    return JSONResponse({**report.to_json(positions=False), "summary": format_summary(report),
                         "segments": segments(report.train.spans)})


async def status(request):
    s = state(request)
    return JSONResponse({"busy": s.busy.count, "max_busy": s.busy.limit, "generations": sorted(s.jobs)})


async def refused(request, exc):
    return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status)


async def unusable(request, exc):  # a run whose checkpoint cannot be loaded (damaged, too new)
    return JSONResponse({"error": str(exc)}, status_code=422)


async def http_error(request, exc):  # Starlette's own 404 / 405 as JSON too
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


def host_name(header):
    """The host part of a Host header: 'localhost:8000' -> 'localhost', '[::1]:8000' -> '::1', lower-cased."""
    header = header.strip().lower()
    if header.startswith("["):  # an IPv6 literal, bracketed because of the port's colon
        literal, _, rest = header[1:].partition("]")
        return literal if rest == "" or (rest.startswith(":") and rest[1:].isdigit()) else ""  # nothing else after
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class HostCheck:
    """Plain ASGI middleware: answer only requests whose Host header names an allowed host, so that a web page on
    another site cannot reach the server through a DNS name pointed at this machine (DNS rebinding). Host names
    are compared without the port, IPv6 literals without their brackets."""

    def __init__(self, app, hosts):
        self.app, self.hosts = app, {h.lower().strip("[]") for h in hosts}

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            headers = dict(scope.get("headers") or [])
            if host_name(headers.get(b"host", b"").decode("latin-1")) not in self.hosts:
                response = JSONResponse({"error": "Invalid host header: this server answers only requests to "
                                                  f"{', '.join(sorted(self.hosts))}"}, status_code=400)
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


class SecurityHeaders:
    """Plain ASGI middleware (it does not buffer streams): the page runs only its own scripts and styles."""
    HEADERS = [(b"content-security-policy", b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"),
               (b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer")]

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        async def send_with_headers(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)
        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


def create_app(checkpoints, device="auto", hosts=LOOPBACK_NAMES, max_busy=MAX_BUSY, max_models=MAX_MODELS):
    """The Starlette app serving the runs under `checkpoints`. hosts: the Host names it answers (None: any)."""
    need_web()
    routes = [Route("/", index), Route("/static/{name}", static_file),
              Route("/api/runs", list_runs), Route("/api/runs/{name}", run_details),
              Route("/api/runs/{name}/metrics", run_metrics), Route("/api/generate", generate, methods=["POST"]),
              Route("/api/stop", stop, methods=["POST"]), Route("/api/inside", inside, methods=["POST"]),
              Route("/api/novelty", novelty, methods=["POST"]),
              Route("/api/status", status)]
    middleware = [Middleware(SecurityHeaders)]
    if hosts:
        middleware.append(Middleware(HostCheck, hosts=hosts))
    app = Starlette(routes=routes, middleware=middleware,
                    exception_handlers={RequestError: refused, ChargptError: unusable, HTTPException: http_error})
    app.state.runs, app.state.models, app.state.busy = Runs(checkpoints), Models(device, max_models), Busy(max_busy)
    app.state.jobs = {}  # id -> Generation in flight
    app.state.novelty = NoveltyIndexes()
    app.state.closing = False  # set by stop_all when the server is asked to stop

    def finished(job):
        app.state.jobs.pop(job.id, None)
        app.state.busy.give()
    app.state.finished = finished
    return app


def need_web():
    if WEB_MISSING:
        raise ChargptError(f'the web playground needs the web extra ({WEB_MISSING} is not installed); install it '
                           f'with pip install -e ".[web]"')


# --- the command ----------------------------------------------------------------------------------------------
def bind(host, port):
    """A listening socket on host:port (0: any free port), or a one-line error saying what to change."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError):
        raise ChargptError(f"cannot listen on --host {host}: not an address or a known host name; use 127.0.0.1 "
                           f"(this machine only) or 0.0.0.0 (every network)") from None
    sock = socket.socket(family, kind, proto)
    try:
        claim_port(sock)  # fails while another server has the port, on Windows too
        sock.bind(addr)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise ChargptError(f"cannot listen on {host} port {port} ({e.strerror}); choose another --port (0 picks a "
                           f"free one), or a --host that is an address of this machine") from None
    return sock


def is_loopback(sock):
    return ipaddress.ip_address(sock.getsockname()[0]).is_loopback


def allowed_hosts(host, sock):
    """The Host names a loopback server answers: localhost's names (IPv4 and IPv6), the --host it was asked to bind
    (127.0.0.2, a name in /etc/hosts) and the address it is bound to (the one url_of prints)."""
    return (*LOOPBACK_NAMES, host, sock.getsockname()[0])


def url_of(sock):
    host, port = sock.getsockname()[:2]
    shown = "127.0.0.1" if host == "0.0.0.0" else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def stop_all(app):
    """Refuse new generations and cancel those in flight: each stream ends with its `done` event at the next
    character, so the server can stop at once."""
    app.state.closing = True
    for job in list(app.state.jobs.values()):
        job.cancel.set()


def _server(app):
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, timeout_graceful_shutdown=5))
    exit_on_signal = server.handle_exit

    def handle_exit(sig, frame):  # Ctrl-C: end the streams first, or uvicorn waits for them and then kills them
        stop_all(app)
        exit_on_signal(sig, frame)
    server.handle_exit = handle_exit
    return server


@contextlib.contextmanager
def running(app, host="127.0.0.1", port=0, timeout=30):
    """Serve `app` from a background thread (tests, benchmarks); -> its base URL. Stopped on exit."""
    sock = bind(host, port)
    server = _server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="chargpt-serve", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.01)
    try:
        yield url_of(sock)
    finally:
        stop_all(app)
        server.should_exit = True
        thread.join(timeout)
        sock.close()


def serve(checkpoints="checkpoints", host="127.0.0.1", port=8000, device="auto", say=None):
    """Run the playground until Ctrl-C."""
    say = say or (lambda line: print(line, file=sys.stderr))
    need_web()
    if not Path(checkpoints).is_dir():
        raise ChargptError(f"no checkpoints folder {checkpoints}; train a run first with python train.py, or pass "
                           f"--checkpoints DIR")
    from ..runtime import pick_device
    pick_device(device)  # an impossible --device fails now, not on the first request
    sock = bind(host, port)
    local = is_loopback(sock)
    app = create_app(checkpoints, device, hosts=allowed_hosts(host, sock) if local else None)
    say(f"chargpt playground: {url_of(sock)}  (runs from {Path(checkpoints).resolve()}; Ctrl-C stops)")
    if not local:
        say(f"warning: serving on {host}: anyone who can reach this machine on port {sock.getsockname()[1]} can "
            f"use the playground, read your runs' configs and spend its compute; use --host 127.0.0.1 to keep it "
            f"private")
    _server(app).run(sockets=[sock])
