"""The page itself: index.html at /, and its own files (the view modules and the style sheet) under /static/."""

from pathlib import Path

from starlette.responses import FileResponse
from starlette.routing import Route

from chargpt.web.body import RequestError, clipped

WEB = Path(__file__).parent.parent  # index.html and PAGE_FILES: shipped as package data
# what /static/ serves: the page's own files, never the package's Python (main.js imports the other modules)
PAGE_FILES = ("main.js", "common.js", "api.js", "write.js", "inside.js", "runs.js", "train.js", "style.css",
              "suggest.js")


async def index(request):
    return FileResponse(WEB / "index.html")


async def static_file(request):
    name = request.path_params["name"]
    if name not in PAGE_FILES:
        raise RequestError(404, f"no file {clipped(name, 80)!r} here; the page uses {', '.join(PAGE_FILES)}")
    return FileResponse(WEB / name)


def routes():
    return [Route("/", index), Route("/static/{name}", static_file)]
