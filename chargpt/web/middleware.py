"""Two plain ASGI middlewares (neither buffers a stream): HostCheck answers only requests addressed to this
machine's names (no DNS rebinding); SecurityHeaders lets the page run only its own scripts and styles."""

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
                message = {**message, "headers": [*message.get("headers", []), *self.HEADERS]}
            await send(message)
        await self.app(scope, receive, send_with_headers if scope["type"] == "http" else send)
