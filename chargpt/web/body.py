"""A request body read safely: JSON, no larger than a limit, with one clear 4xx error for everything else (a wrong
Content-Type, a body cut short, NaN, deep nesting, huge integers, lone surrogates). What its fields must be is
declared in chargpt/web/schemas.py."""

import json

from starlette.requests import ClientDisconnect

from chargpt.runs.rundir import no_constant
from chargpt.web.limits import MAX_BODY_BYTES, MAX_INT_DIGITS


class RequestError(Exception):
    """A request the server refuses: an HTTP status and one line for the user (plus optional JSON fields)."""

    def __init__(self, status, message, **extra):
        super().__init__(message)
        self.status, self.extra = status, extra


async def read_capped(request, limit, what="request body"):
    """The raw body, refused with a 413 past `limit` bytes, whether declared (Content-Length) or sent: nothing past
    the limit is read into memory. what: the body, as the errors name it."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"{what} is {int(declared)} bytes; the limit is {limit}")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > limit:
                raise RequestError(413, f"{what} is over {limit} bytes")
    except ClientDisconnect:  # the client left mid-body: no one to answer (a 400 that is never read, not a traceback)
        raise RequestError(400, f"the client disconnected before sending the whole {what}") from None
    return bytes(body)


async def read_json(request, limit=MAX_BODY_BYTES):
    """The body as a JSON object, read no further than `limit` bytes."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise RequestError(415, "send the request body as JSON with Content-Type: application/json")
    body = await read_capped(request, limit)
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=no_constant, parse_int=_bounded_int)
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
