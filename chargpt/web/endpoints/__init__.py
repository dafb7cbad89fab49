"""The playground's endpoints, one module per feature. Each module exposes routes() -> a list of Starlette Routes,
whose handlers reach the server's shared parts through request.app.state (runs, models, busy, jobs, novelty; set up
by chargpt/web/server.py's create_app). A new feature (an OpenAI-compatible API, training started from the page)
is a new module here, added to FEATURES; nothing else in the server changes for its routes."""

from chargpt.web.endpoints import inside, novelty, openai, page, runs, suggest, train, write

FEATURES = (page, runs, write, inside, novelty, openai, train, suggest)


def routes():
    """Every feature's routes, in FEATURES order."""
    return [route for feature in FEATURES for route in feature.routes()]
