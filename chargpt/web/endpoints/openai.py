"""An OpenAI-compatible API, so that any OpenAI client (the openai package, LangChain, scripts written for OpenAI)
can write with a run: a model is a run, by the name GET /api/runs and the run picker give it, and a token is a
character.

  POST /v1/completions  {model, prompt, max_tokens, temperature, top_p, n, best_of, stop, seed, stream,
                        stream_options, user; chargpt's own, beside OpenAI's (the openai client's extra_body):
                        top_k, unknown, the constraints form, acrostic, ban, allow, min_p, repetition_penalty,
                        no_repeat_ngram and best-of's min_span, for a run trained with --labels label and
                        guidance; suffix, for a run trained with --fim: the completion fills the gap between the
                        prompt and it (chargpt/sampling/infill.py; "" is no suffix); a pattern by vLLM's names,
                        guided_regex, guided_grammar (Lark) or guided_json (a JSON schema), or OpenAI's
                        response_format (json_object or json_schema)}
                        -> a text_completion {id, object, created, model, choices [{text, index, logprobs: null,
                        finish_reason}], usage}; with stream: true its chunks as server-sent events (`data: {chunk}`
                        lines, then `data: [DONE]`; stream_options.include_usage adds a last chunk with usage)
  GET  /v1/models       every run as a model: {object: list, data: [{id, object: model, created, owned_by}]}
  GET  /v1/models/{id}  one of them

The text is sample.py's and the playground's (it starts as /api/generate does: write.start): a field means
sample.py's flag of the same name (max_tokens is --max-new-tokens, n --num-samples: one batch, one seed), and an
absent one OpenAI's default, two of which differ from sample.py's: temperature 1 (sample.py's is 0.8) and max_tokens
16 (500). top_p 1 is off, as in sample.py. best_of is OpenAI's and sample.py's alike: write best_of completions and
return the n with the highest log-probability per character (sample.py also ranks a copy of the training text or
a near-duplicate last); 1 is off. A list of prompts is written prompt by prompt, each as sample.py writes
it, prompt k's choices numbered k*n to k*n+n-1. A stop string is cut as sample.py cuts it (it may begin in the
prompt), not included; a stream never sends the start of one that may yet complete. finish_reason is "length"
when a choice wrote max_tokens characters, else "stop" (a stop string; a translation's end). usage counts
characters (each prompt once, as seen after `unknown`).

OpenAI's fields this server does not support are 400s naming them, unless absent or at OpenAI's default: logprobs
(any value but null), echo, logit_bias (but {}), frequency_penalty and presence_penalty
(but 0: OpenAI's are additive penalties by count, not sample.py's --repetition-penalty, so they are not mapped to
it); so is a prompt of token ids. The Authorization header carries the server's key where it asks for one
(chargpt serve --api-key: middleware.ApiKey, a 401 in OpenAI's shape), and is ignored otherwise. Errors have
OpenAI's shape, {"error": {message, type, param, code}}, with the playground's statuses and limits
(chargpt/web/limits.py), so the openai client raises its typed errors (BadRequestError, NotFoundError, ...).
"""

import asyncio
import json
import time
from typing import Annotated, Literal

from pydantic import Field, ValidationError, model_validator
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from chargpt.data.tokenizer import UNKNOWN_POLICIES
from chargpt.errors import ChargptError
from chargpt.web.body import RequestError, read_json
from chargpt.web.endpoints.write import start
from chargpt.web.limits import (
    MAX_GUIDANCE,
    MAX_LABEL_CHARS,
    MAX_NEW_CHARS,
    MAX_NOVELTY_CHARS,
    MAX_PROMPT_CHARS,
    MAX_SAMPLES,
    MAX_STOP_CHARS,
    MAX_STOPS,
    MAX_TEMPERATURE,
    MAX_TOP_K,
)
from chargpt.web.schemas import GenerateRequest, Request, one_line

DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE = 16, 1.0  # OpenAI's, for an absent (or null) field

# OpenAI's fields that are not supported: accepted only absent, null or at these values (OpenAI's defaults)
UNSUPPORTED = {"logprobs": (), "echo": (False,), "logit_bias": ({},), "frequency_penalty": (0,),
               "presence_penalty": (0,)}
# chargpt's own fields: /api/generate's of the same names and meaning (GenerateRequest checks them)
SAME = ("top_k", "unknown", "form", "acrostic", "ban", "allow", "min_p", "repetition_penalty", "no_repeat_ngram",
        "min_span", "label", "guidance")
# the request's names for the patterns (pattern()), by /api/generate's
NAMES = {"regex": "guided_regex", "grammar": "guided_grammar", "json_schema": "guided_json or response_format"}
STREAM_OPTIONS = ("include_usage", "include_obfuscation")  # the second asks for padding against side channels:
# there is none here to leave out

Prompt = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]
Stop = Annotated[str, Field(max_length=MAX_STOP_CHARS)]


class CompletionRequest(Request):
    model: str
    prompt: Prompt | Annotated[list[Prompt], Field(min_length=1, max_length=MAX_SAMPLES)] = Field(
        "", description=f"a string of at most {MAX_PROMPT_CHARS:,} characters, or a list of 1 to {MAX_SAMPLES} of "
                        f"them (token ids mean nothing to a character model)")
    max_tokens: int | None = Field(DEFAULT_MAX_TOKENS, ge=0, le=MAX_NEW_CHARS)
    temperature: float | None = Field(DEFAULT_TEMPERATURE, le=MAX_TEMPERATURE)
    top_p: float | None = None  # None and 1: off
    n: int | None = Field(1, ge=1, le=MAX_SAMPLES)
    stop: Stop | Annotated[list[Stop], Field(max_length=MAX_STOPS)] | None = Field(
        None, description=f"a string or a list of at most {MAX_STOPS} strings, each of at most {MAX_STOP_CHARS} "
                          f"characters")
    seed: int | None = None  # None: a random one
    stream: bool | None = False
    stream_options: dict | None = None
    user: str | None = None  # accepted, unused
    best_of: int | None = Field(1, ge=1, le=MAX_SAMPLES)  # 1 (OpenAI's default) and None: off
    # chargpt's own, sent in the openai client's extra_body (SAME): the limits are /api/generate's
    top_k: int | None = Field(None, le=MAX_TOP_K)
    unknown: Literal[UNKNOWN_POLICIES] = "error"
    form: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    acrostic: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    ban: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    allow: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    min_p: float | None = None
    repetition_penalty: float | None = None
    no_repeat_ngram: int | None = Field(None, le=MAX_NEW_CHARS)
    min_span: int | None = Field(None, ge=1, le=MAX_NOVELTY_CHARS)
    label: str | None = Field(None, max_length=MAX_LABEL_CHARS)  # --labels: GenerateRequest checks both
    guidance: float | None = Field(None, le=MAX_GUIDANCE)
    # OpenAI's: the text after the completion, for a run trained with --fim ("" and null: none; a run without FIM
    # given one is a 400 naming --fim, write.check_suffix)
    suffix: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    # a pattern, by vLLM's names (its extra_body fields), or OpenAI's response_format for JSON: pattern() maps them
    guided_regex: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    guided_grammar: str | None = Field(None, max_length=MAX_PROMPT_CHARS)
    guided_json: dict | str | None = None
    response_format: dict | None = None

    @model_validator(mode="after")
    def _fits(self):
        self.pattern()  # a response_format it cannot take, or two patterns: a 400 naming them
        count = len(self.prompts()) * self.choices_per_prompt()
        if count > MAX_SAMPLES:
            raise ValueError(f"{len(self.prompts())} prompts with n={self.n} ask for {count} completions; the limit "
                             f"is {MAX_SAMPLES} per request")
        options = self.stream_options or {}
        if any(k not in STREAM_OPTIONS or not isinstance(v, bool) for k, v in options.items()):
            raise ValueError(f"stream_options may hold include_usage (true or false), got "
                             f"{json.dumps(options)[:80]}")
        return self

    def prompts(self):
        return self.prompt if isinstance(self.prompt, list) else [self.prompt]

    def choices_per_prompt(self):
        return 1 if self.n is None else self.n

    def pattern(self):
        """vLLM's guided_regex, guided_grammar and guided_json, and OpenAI's response_format ({"type": "json_object"}:
        any JSON object; {"type": "json_schema", "json_schema": {"schema": {...}}}: that schema; {"type": "text"}:
        none) -> /api/generate's regex, grammar and json_schema fields (those given). Two patterns are a 400."""
        fmt, schema = self.response_format, None
        if fmt is not None:
            kind, inner = fmt.get("type"), fmt.get("json_schema")
            if kind == "json_object":
                schema = {"type": "object"}
            elif kind == "json_schema" and isinstance(inner, dict) and isinstance(inner.get("schema"), dict):
                schema = inner["schema"]
            elif kind != "text":
                raise ValueError('response_format must be {"type": "text"}, {"type": "json_object"} or {"type": '
                                 '"json_schema", "json_schema": {"name": ..., "schema": {...}}}, got '
                                 f"{json.dumps(fmt)[:80]}")
        given = {"regex": self.guided_regex, "grammar": self.guided_grammar, "json_schema": self.guided_json}
        if schema is not None and self.guided_json is not None:
            raise ValueError("guided_json and response_format both give a JSON schema; send one")
        given["json_schema"] = schema if schema is not None else self.guided_json
        given = {k: v for k, v in given.items() if v is not None}
        if len(given) > 1:
            raise ValueError(f"{' and '.join(NAMES[k] for k in given)} each give the completion a pattern; send one")
        return given

    def playground(self):
        """The same request in /api/generate's fields: GenerateRequest checks them by config's rules, gives them
        sample.py's meaning and becomes the engine's SampleOptions."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return GenerateRequest.parse({
            "run": self.model, "prompt": self.prompts()[0], "top_p": self.top_p, "stop": stop, "seed": self.seed,
            "max_new_tokens": DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens,
            "temperature": DEFAULT_TEMPERATURE if self.temperature is None else self.temperature,
            "num_samples": self.choices_per_prompt(), "best_of": None if self.best_of == 1 else self.best_of,
            "suffix": self.suffix or None, **{k: getattr(self, k) for k in SAME}, **self.pattern()})


def parse(body):
    """A JSON body -> its CompletionRequest, or a 400 naming the field that does not fit (and as `param`)."""
    refused = {k: body[k] for k in UNSUPPORTED if k in body and not _default(body[k], UNSUPPORTED[k])}
    if refused:
        shown = ", ".join(f"{k}={json.dumps(v)[:40]}" for k, v in refused.items())
        raise RequestError(400, f"not supported by this server (chargpt): {shown}; leave {', '.join(refused)} out "
                                f"(supported: {', '.join(CompletionRequest.model_fields)})", param=next(iter(refused)))
    try:
        return CompletionRequest.model_validate({k: v for k, v in body.items() if k not in UNSUPPORTED})
    except ValidationError as e:
        errors = e.errors()
        raise RequestError(400, one_line(CompletionRequest, errors),
                           param=str(errors[0]["loc"][0]) if errors[0]["loc"] else None) from None


def _default(value, defaults):
    """Whether a refused field's value asks for nothing: null, or OpenAI's default (0 as a number, not false)."""
    return value is None or any(type(value) is type(d) and value == d or
                                (type(d) is int and type(value) is float and value == d) for d in defaults)


# --- the endpoints ----------------------------------------------------------------------------------------------
async def completions(request):
    s = request.app.state
    req = parse(await read_json(request))
    like = req.playground()
    path = checkpoint(s, req.model)
    try:
        job, _ = await start(s, path, like, prompts=req.prompts())
    except RequestError as e:
        if "unknown_chars" not in e.extra:
            raise
        said = str(e).rpartition("; remove them")[0] or str(e)  # the page's advice names its own control
        raise RequestError(400, f'{said}; remove them, or send "unknown": "skip" or "replace"', param="prompt") \
            from None
    reply = Reply(job, req.model, like.max_new_tokens, len(req.prompts()) * like.num_samples)
    if req.stream:
        usage = bool((req.stream_options or {}).get("include_usage"))
        return StreamingResponse(reply.chunks(usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    return JSONResponse(await reply.whole(request))


class Reply:
    """One completion's choices as the Generation writes them, sent whole or as OpenAI's stream chunks. A client
    that leaves cancels its generation either way, so abandoned requests do not hold the server's slots."""

    def __init__(self, job, model, max_tokens, count):
        self.job, self.max_tokens, self.texts = job, max_tokens, [""] * count
        self.head = {"id": f"cmpl-{job.id}", "object": "text_completion", "created": int(time.time()), "model": model}

    def add(self, pieces):
        """[sample, text] pieces -> {choice index: its new text}, each choice's pieces joined."""
        new = {}
        for i, piece in pieces:
            self.texts[i] += piece
            new[i] = new.get(i, "") + piece
        return new

    def finish_reason(self, i):
        # a choice ends short of max_tokens only where it stopped: at a stop string, or a translation's end
        return "length" if len(self.texts[i]) >= self.max_tokens else "stop"

    def choice(self, i, text, finish_reason):
        return {"text": text, "index": i, "logprobs": None, "finish_reason": finish_reason}

    def usage(self):
        prompt, completion = sum(map(len, self.job.prompt)), sum(map(len, self.texts))  # the prompts as seen
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def failure(self, end):
        """The `done` data -> a RequestError if the generation did not finish, else None."""
        if end["error"]:
            return RequestError(500 if self.job.failed else 400, end["error"])
        if end["stopped"]:  # cancelled: the server is stopping (a client that left reads nothing)
            return RequestError(503, "the server is shutting down")
        return None

    async def whole(self, request):
        async def watch():  # the body is read: the next message is the client's leaving (or the reply's end)
            while (await request.receive())["type"] != "http.disconnect":
                pass
            self.job.cancel.set()
        watcher = asyncio.create_task(watch())
        try:
            async for pieces, _ in self.job.updates():
                self.add(pieces)
        finally:
            watcher.cancel()
        failed = self.failure(self.job.result)
        if failed:
            raise failed
        return {**self.head, "choices": [self.choice(i, t, self.finish_reason(i)) for i, t in enumerate(self.texts)],
                "usage": self.usage()}

    async def chunks(self, include_usage):
        extra = {"usage": None} if include_usage else {}
        try:
            async for pieces, end in self.job.updates():
                new = self.add(pieces)
                if new:
                    yield data({**self.head, "choices": [self.choice(i, t, None) for i, t in sorted(new.items())],
                                **extra})
                if end is None:
                    continue
                failed = self.failure(end)
                if failed:  # the status is sent: the error goes as a chunk, which the openai client raises
                    yield data(error_body(failed.status, str(failed)))
                    return
                yield data({**self.head, "choices": [self.choice(i, "", self.finish_reason(i))
                                                     for i in range(len(self.texts))], **extra})
                if include_usage:
                    yield data({**self.head, "choices": [], "usage": self.usage()})
                yield "data: [DONE]\n\n"
        finally:
            self.job.cancel.set()  # the client left mid-stream


def data(value):
    return f"data: {json.dumps(value, ensure_ascii=False)}\n\n"


def checkpoint(s, name):
    """A model name -> its run's checkpoint, or a 404 naming the runs there are."""
    names = list(s.runs.listing())
    if name not in names:
        shown = ", ".join(n[:80] for n in names[:20]) + (f" and {len(names) - 20} more" if len(names) > 20 else "")
        raise RequestError(404, f"no model named {name[:80]!r} on this server; its models are the runs in its folder: "
                                f"{shown or 'none yet (train one first)'} (GET /v1/models lists them)",
                           param="model", code="model_not_found")
    return s.runs.checkpoint(name)


def card(name, directory):
    try:
        created = int(directory.stat().st_mtime)  # the run's last save
    except OSError:
        created = 0
    return {"id": name, "object": "model", "created": created, "owned_by": "chargpt"}


async def models(request):
    runs = await run_in_threadpool(request.app.state.runs.listing)
    return JSONResponse({"object": "list", "data": [card(name, d) for name, d in runs.items()]})


async def model(request):
    s, name = request.app.state, request.path_params["id"]
    await run_in_threadpool(checkpoint, s, name)  # a 404 naming the runs
    return JSONResponse(card(name, s.runs.find(name)))


async def elsewhere(request):
    rest = request.path_params["rest"]
    if rest.startswith("models/") and request.method in ("GET", "HEAD"):  # a model id with a '/': no run has one
        await run_in_threadpool(checkpoint, request.app.state, rest.removeprefix("models/"))  # a 404 naming the runs
    if rest in ("completions", "models") or rest.startswith("models/"):
        raise RequestError(405, f"{request.method} /v1/{rest[:80]} is not allowed: use "
                                f"{'POST' if rest == 'completions' else 'GET'}")
    raise RequestError(404, f"no endpoint /v1/{rest[:80]} on this server (chargpt): it answers POST /v1/completions, "
                            f"GET /v1/models and GET /v1/models/ID; a character model continues text, so there is "
                            f"no chat")


# --- errors in OpenAI's shape -----------------------------------------------------------------------------------
def error_body(status, message, param=None, code=None):
    kind = "server_error" if status >= 500 else "requests" if status == 429 else "invalid_request_error"
    code = code or ("rate_limit_exceeded" if status == 429 else None)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_errors(handler):
    """The handler's refusals in OpenAI's error shape (the playground's is {"error": message}: server.refused)."""
    async def answer(request):
        try:
            return await handler(request)
        except RequestError as e:
            return JSONResponse(error_body(e.status, str(e), e.extra.get("param"), e.extra.get("code")), e.status)
        except ChargptError as e:  # a run whose checkpoint cannot be loaded (damaged, too new): as server.unusable
            return JSONResponse(error_body(422, str(e), "model"), 422)
    return answer


def routes():
    every = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
    return [Route("/v1/completions", openai_errors(completions), methods=["POST"]),
            Route("/v1/models", openai_errors(models)), Route("/v1/models/{id}", openai_errors(model)),
            Route("/v1/{rest:path}", openai_errors(elsewhere), methods=every)]
