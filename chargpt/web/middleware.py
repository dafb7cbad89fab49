"""Plain ASGI middlewares (none buffers a stream): HostCheck answers only requests addressed to this machine's
names (no DNS rebinding); ApiKey asks every request but the page's own files for the server's key (chargpt serve
--api-key); SameOrigin refuses requests that change something when they come from a page on another site (CSRF);
SecurityHeaders lets the page run only its own scripts and styles."""

import hmac
from urllib.parse import urlsplit

from starlette.responses import JSONResponse


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
                own = {name.lower() for name, _ in message.get("headers", [])}  # a reply's own policy stands
                message = {**message, "headers": [*message.get("headers", []),
                                                  *((k, v) for k, v in self.HEADERS if k not in own)]}
            await send(message)
        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)


def refusal(scope, status, message, code=None):
    """A refused request's one JSON line: OpenAI's error shape under /v1 (its clients raise their typed errors from
    it), the playground's {"error": message} elsewhere."""
    if scope.get("path", "").startswith("/v1/"):
        kind = "invalid_request_error"
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)
    return JSONResponse({"error": message}, status)


def is_public(path):
    """The page's own files, which hold no data and must load before the page can send its key."""
    return path == "/" or path.startswith("/static/")


class ApiKey:
    """Plain ASGI middleware: every request but for the page's own files carries `Authorization: Bearer KEY` (what
    OpenAI's clients send as their api_key; the page sends the key it was opened with), compared in constant time,
    else a 401. The key itself is never written to a reply or a log."""

    def __init__(self, app, key):
        self.app, self.key = app, key.encode("utf-8")

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket") and not is_public(scope.get("path", "")):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            scheme, _, token = given.partition(b" ")
            if not (scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.key)):
                said = "a wrong key" if given else "no key"
                response = refusal(scope, 401, f"this server needs its API key and the request sent {said}: send "
                                               f"Authorization: Bearer KEY (the key chargpt serve printed, or its "
                                               f"--api-key); in a browser, open the page at the address chargpt "
                                               f"serve printed (/?token=KEY)", code="invalid_api_key")
                response.headers["WWW-Authenticate"] = "Bearer"
                return await response(scope, receive, send)
        await self.app(scope, receive, send)


SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # no endpoint changes anything on these


class SameOrigin:
    """Plain ASGI middleware against cross-site request forgery: a request that may change something (any method
    but GET, HEAD, OPTIONS) is refused when a browser says it comes from another site. The browser's own word
    is Sec-Fetch-Site (same-origin or none pass; same-site does not: another port of this host is another page);
    a browser too old to send it sends Origin, which must be this server's own (scheme aside: the Host it was
    asked for). A request with neither is not a browser's (curl, the openai client) and passes: a page cannot make
    a browser leave both out. Not a content-type rule: a plain form post reaches every endpoint's check."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method", "GET") not in SAFE_METHODS:
            headers = dict(scope.get("headers") or [])
            site = headers.get(b"sec-fetch-site", b"").decode("latin-1").strip().lower()
            origin = headers.get(b"origin", b"").decode("latin-1").strip()
            host = headers.get(b"host", b"").decode("latin-1").strip().lower()
            if site:
                cross = site not in ("same-origin", "none")
            else:
                cross = bool(origin) and urlsplit(origin.lower()).netloc != host
            if cross:
                shown = origin[:100] or f"a {site} page"
                return await refusal(scope, 403, f"refused: a page on another site ({shown}) may not "
                                                 f"{scope['method']} {scope.get('path', '')[:80]} on this server; "
                                                 f"use the playground's own page, or a client that is not a browser",
                                     code="cross_site")(scope, receive, send)
        await self.app(scope, receive, send)
