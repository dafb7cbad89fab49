"""The Look inside view's API: each character's surprise, the characters expected, and the attention maps.

  POST /api/inside  {run, text, top, end} -> surprise, expected characters, attention maps (of the context window
                    ending before position `end`, by default the text's end); decoder-only runs (an encoder-decoder
                    is refused with 400)
"""

import base64

import torch
from starlette.concurrency import run_in_threadpool
from starlette.responses import JSONResponse
from starlette.routing import Route

from chargpt.model.inside import look_inside
from chargpt.web.body import RequestError, read_json
from chargpt.web.schemas import InsideRequest


async def inside(request):
    s = request.app.state
    req = InsideRequest.parse(await read_json(request))
    path = s.runs.checkpoint(req.run)
    s.busy.take()
    try:
        gen = await run_in_threadpool(s.models.get, path)
        if gen.model.config.arch == "encoder-decoder":
            raise RequestError(400, "Look inside shows decoder-only models, whose attention runs over one text; this "
                                    "run is an encoder-decoder (source and target apart); translate with it in Write")
        view = await run_in_threadpool(look_inside, gen, req.text, req.top, req.end)
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


def routes():
    return [Route("/api/inside", inside, methods=["POST"])]
