"""The web playground's server (`chargpt serve`, `python -m chargpt.serve`) for the runs in a checkpoints folder.

    pip install -e ".[web]"
    python -m chargpt.serve                                   # http://127.0.0.1:8000, runs from checkpoints/
    python -m chargpt.serve --checkpoints runs/ --port 8080

One page (chargpt/web/, plain HTML and JavaScript modules, no build step, nothing from the internet) with four
views: Write streams text from a run (from a run trained on sentence pairs: the translation of a source sentence);
Look inside shades each character by the model's surprise and draws its attention maps (chargpt.model.inside); Runs
overlays loss curves from metrics.jsonl and follows runs still training; New run trains one (chargpt train in a
process of its own: training.py), off with --no-training.
The server is a thin layer over the library: chargpt.load for models, Generator.stream for text, so a seed
gives the same text as sample.py. Starlette, uvicorn and pydantic come with the optional `web` extra.

Safe by default: it binds 127.0.0.1 and answers only requests addressed to localhost (no DNS rebinding); bound to
any other address it asks every request but the page's own files for a key (--api-key, or one it makes and prints
as an address to open) and the page does not train unless --training says so; a request that changes something is
refused when a page on another site sends it (CSRF);
runs are chosen by name from a fresh listing of the served folder, so no request path reaches the
filesystem; every request is checked against the limits in chargpt/web/limits.py, with one JSON error
{"error": ...} and a 4xx status; at most MAX_BUSY generations or analyses run at once (the next gets 429), each in
a worker thread so the event loop stays free; Stop, or leaving the page, cancels a generation at its next character.

Where things are (chargpt/web/):
  server.py      this file: create_app (the app and its shared state) and serving it (bind, running, serve)
  limits.py      every limit a request is checked against, named together
  body.py        a request body read safely: JSON, size-capped; RequestError, the one way a request is refused
  schemas.py     the requests' fields, declared as pydantic models, and their errors as one line
  runs.py        the runs in the served folder, by name (Runs)
  cache.py       loaded models (Models), novelty indexes, and the count of work in flight (Busy)
  stream.py      a generation in a worker thread, sent as server-sent events (Generation)
  middleware.py  the Host check, the API key, the cross-site refusal and the security headers
  training.py    trainings started from the page: one child `chargpt train` process at a time (Trainings)
  corpora.py     the texts and folders of texts a training from the page may read, listed by name
  endpoints/     the API, one module per feature, each with routes(); its header gives each endpoint's fields

The API (JSON in, JSON out; generation as server-sent events), by the endpoints module that serves it:
  GET  /  and  /static/{name}       page.py     the page and its own files, nothing else
  GET  /api/runs                    runs.py     every run: name, corpus, task, architecture, size, best val loss
  GET  /api/runs/{name}             runs.py     one run in full: configs, vocabulary, files, samples while training
  GET  /api/runs/{name}/metrics     runs.py     its metrics.jsonl and running-loss rows, ?since=MTIME
  POST /api/generate                write.py    text as server-sent events: start, text, done
  POST /api/stop                    write.py    {id}: cancel that generation
  GET  /api/status                  write.py    generations running and the limit
  POST /api/inside                  inside.py   surprise, expected characters, attention maps (decoder-only runs)
  POST /api/novelty                 novelty.py  how much of a text is copied from the run's training text
  POST /api/suggest                 suggest.py  the likeliest next characters and word completions of a text
  GET  /api/corpora, /api/train     train.py    the texts to train on; the training running or last finished
  POST /api/train, /api/train/upload  train.py  start a training; upload a text (its bytes, checked to be UTF-8)
  POST /api/train/stop, .../resume  train.py    stop it (it saves, as Ctrl-C); resume a run
  POST /v1/completions              openai.py   OpenAI's completions protocol, for any OpenAI client: a run is a
                                                model, a stream is OpenAI's chunks, an error OpenAI's shape
  GET  /v1/models, /v1/models/{id}  openai.py   the runs, as OpenAI's models
A new feature (an OpenAI-compatible /v1 API, training started from the page) is a new module in endpoints/ with its
routes(), added to endpoints.FEATURES.
"""

import contextlib
import ipaddress
import logging
import os
import secrets
import socket
import sys
import threading
import time
from pathlib import Path

from chargpt.errors import ChargptError
from chargpt.platforms import claim_port
from chargpt.web.limits import (
    LOOPBACK_NAMES,
    MAX_BUSY,
    MAX_MODELS,
)

try:  # the optional web extra; serve() names it when it is missing
    import pydantic  # noqa: F401 (the request models, chargpt/web/schemas.py)
    import uvicorn
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.responses import JSONResponse
    WEB_MISSING = None
except ImportError as e:
    WEB_MISSING = e.name


def create_app(checkpoints, device="auto", hosts=LOOPBACK_NAMES, max_busy=MAX_BUSY, max_models=MAX_MODELS,
               training=True, data_dir=None, train_args=(), api_key=None, training_off=None, speculate="off"):
    """The Starlette app serving the runs under `checkpoints`. hosts: the Host names it answers (None: any).
    training: whether the page may train runs (on `device`), on texts uploaded or named from data_dir; train_args:
    `chargpt train` flags every one of them gets (("--threads", "2") leaves cores to the server); training_off: why
    it may not, when that is not --no-training. api_key: the key every request but the page's files must send as
    `Authorization: Bearer KEY` (None: none asked for). Requests that change something are refused from pages on
    other sites either way. speculate: auto|on|off, speculative decoding for every run served
    (chargpt/sampling/speculate.py; the text is the one written without it)."""
    need_web()
    from chargpt.sampling.engine import check_speculate
    from chargpt.web import endpoints  # the modules below import the web extra: loaded once need_web() found it
    from chargpt.web.body import RequestError
    from chargpt.web.cache import Busy, Models, NoveltyIndexes
    from chargpt.web.middleware import ApiKey, HostCheck, SameOrigin, SecurityHeaders
    from chargpt.web.runs import Runs
    from chargpt.web.training import Trainings

    middleware = [Middleware(SecurityHeaders)]  # the first is the outermost: its headers go on every refusal too
    if hosts:
        middleware.append(Middleware(HostCheck, hosts=hosts))
    middleware.append(Middleware(SameOrigin))
    if api_key is not None:
        middleware.append(Middleware(ApiKey, key=api_key))
    app = Starlette(routes=endpoints.routes(), middleware=middleware,
                    exception_handlers={RequestError: refused, ChargptError: unusable, HTTPException: http_error})
    app.state.runs, app.state.busy = Runs(checkpoints), Busy(max_busy)
    app.state.models = Models(device, max_models, speculate=check_speculate(speculate))
    app.state.jobs = {}  # id -> Generation in flight
    app.state.novelty = NoveltyIndexes()
    app.state.closing = False  # set by stop_all when the server is asked to stop
    app.state.trainings = Trainings(checkpoints, data_dir, device, training, train_args,  # they outlive the server
                                    off_because=training_off)

    def finished(job):
        app.state.jobs.pop(job.id, None)
        app.state.busy.give()
    app.state.finished = finished
    return app


async def refused(request, exc):
    return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status)


async def unusable(request, exc):  # a run whose checkpoint cannot be loaded (damaged, too new)
    return JSONResponse({"error": str(exc)}, status_code=422)


async def http_error(request, exc):  # Starlette's own 404 / 405 as JSON too
    return JSONResponse({"error": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))


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
def uvicorn_logging_kept():
    """uvicorn.Config sets up uvicorn's loggers (handlers, levels) for the whole process: a server run inside
    another program puts them back as they were when it stops, leaving that program's logging as it found it."""
    loggers = [logging.getLogger(name) for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")]
    kept = [(logger.handlers[:], logger.level, logger.propagate, logger.disabled) for logger in loggers]
    try:
        yield
    finally:
        for logger, (handlers, level, propagate, disabled) in zip(loggers, kept):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled


@contextlib.contextmanager
def running(app, host="127.0.0.1", port=0, timeout=30):
    """Serve `app` from a background thread (tests, benchmarks); -> its base URL. Stopped on exit."""
    with uvicorn_logging_kept():
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


DEFAULT_CHECKPOINTS = "checkpoints"  # serve's --checkpoints default, and train's default parent folder
KEY_ENV = "CHARGPT_API_KEY"  # serve's --api-key, from the environment (kept out of the process list and history)
MAX_KEY_CHARS = 256


def api_key_for(given, local, auth=True, environ=os.environ):
    """The key the server asks for -> (key or None, whether it was made here). Given (--api-key, else KEY_ENV): that
    one, on any bind; none given: none on loopback (only this machine reaches it), a fresh random one on any other
    bind, unless auth is off (--no-auth)."""
    key = given if given is not None else environ.get(KEY_ENV) or None
    if key is not None and not auth:
        raise ChargptError("--no-auth and an API key (--api-key or $CHARGPT_API_KEY) contradict each other; leave one "
                           "out")
    if key is not None:
        if not 0 < len(key) <= MAX_KEY_CHARS or not all("!" <= c <= "~" for c in key):
            raise ChargptError(f"the API key must be 1 to {MAX_KEY_CHARS} printable ASCII characters without spaces "
                               f"(it travels in an HTTP header); choose another --api-key")
        return key, False
    if local or not auth:
        return None, False
    return secrets.token_urlsafe(24), True


def serve(checkpoints=DEFAULT_CHECKPOINTS, host="127.0.0.1", port=8000, device="auto", say=None, training=None,
          data_dir=None, api_key=None, auth=True, speculate="off"):
    """Run the playground until Ctrl-C. data_dir: the texts the page may train on (None: ./data if there).
    training: whether the page may train (None: only when bound to loopback). api_key / auth: see api_key_for.
    speculate: see create_app."""
    say = say or (lambda line: print(line, file=sys.stderr))
    need_web()
    if not Path(checkpoints).is_dir():
        if not (training is not False and str(checkpoints) == DEFAULT_CHECKPOINTS):  # named by hand: a typo, likely
            raise ChargptError(f"no checkpoints folder {checkpoints}; train a run first with python train.py, or pass "
                               f"--checkpoints DIR")
        Path(checkpoints).mkdir(parents=True, exist_ok=True)  # a first start: the page's New run view trains into it
        say(f"no runs yet: made {checkpoints}/ for them; train one in the page's New run view, or with python train.py")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise ChargptError(f"no data folder {data_dir}; pass --data-dir a folder of text files")
    data_dir = data_dir if data_dir is not None or not Path("data").is_dir() else "data"
    from chargpt.runtime import pick_device
    from chargpt.sampling.engine import check_speculate
    pick_device(device)  # an impossible --device fails now, not on the first request
    check_speculate(speculate)  # (and a bad speculate before the port is taken)
    sock = bind(host, port)
    local = is_loopback(sock)
    try:
        key, made = api_key_for(api_key, local, auth)
    except ChargptError:
        sock.close()
        raise
    off = None if training is not None or local else (
        f"training from the page is off on this server because it listens on {host}, beyond this machine (a training "
        f"uses all of its cores); whoever started the server can allow it with chargpt serve --training")
    app = create_app(checkpoints, device, hosts=allowed_hosts(host, sock) if local else None,
                     training=training if training is not None else local, data_dir=data_dir, api_key=key,
                     training_off=off, speculate=speculate)
    url = url_of(sock)
    say(f"chargpt playground: {url}  (runs from {Path(checkpoints).resolve()}; Ctrl-C stops)")
    if speculate != "off":
        say(f"speculation {speculate}: one sample at a time checks drafts from its text and the run's training text "
            f"(the text as without it; more samples decode plainly)")
    if made:  # shown once, as Jupyter shows its token: the address carries it into the page, which keeps it
        say(f"this server asks every request for a key, made for this session: open {url}/?token={key} (OpenAI "
            f"clients: api_key={key}; set --api-key or ${KEY_ENV} to choose your own)")
    elif key is not None:
        say(f"this server asks every request for its API key: open {url}/?token=KEY (OpenAI clients: api_key=KEY)")
    if not local and key is None:
        say(f"warning: serving on {host} with --no-auth: anyone who can reach this machine on port "
            f"{sock.getsockname()[1]} can use the playground, read your runs' configs and spend its compute; use "
            f"--host 127.0.0.1 to keep it private, or leave --no-auth out")
    if off:
        say("training from the page is off (the server listens beyond this machine); --training allows it")
    _server(app).run(sockets=[sock])
