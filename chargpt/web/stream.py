"""The stream bridge: a generation decoded in a worker thread (Generator.stream), its pieces handed to the event
loop through a queue and sent as server-sent events: start, text (the pieces that piled up, as one), done."""

import asyncio
import contextlib
import json
import secrets
import threading
import time
import traceback

from chargpt.errors import ChargptError


def sse(event, data):
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"


class Generation:
    """One streamed request. A worker thread decodes with Generator.stream(prompt, options: the request's
    SampleOptions) and hands the pieces to the event loop through a queue; the stream ends with a `done` event.
    Cancelled (Stop, or the client went away) at the next character; the worker frees its slot when it ends,
    however it ends."""

    def __init__(self, gen, prompt, options, on_end):
        self.id = secrets.token_urlsafe(12)
        self.gen, self.prompt, self.options, self.on_end = gen, prompt, options, on_end
        self.cancel = threading.Event()
        self.queue = asyncio.Queue()
        self.result = None  # the `done` event's data, once the worker has ended
        self.failed = False  # whether it ended in an unexpected exception (its `error`), not a ChargptError

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
            async for pieces, end in self.updates():
                if pieces:
                    yield sse("text", pieces)
                if end is not None:
                    yield sse("done", end)
        finally:
            self.cancel.set()  # a client that disconnects lands here too

    async def updates(self):
        """(pieces, end) as the worker hands them over, in no wire format (events() frames them for the page,
        /v1/completions as OpenAI's chunks): the [sample, text] pieces that piled up since the last, and the `done`
        data once the worker has ended, else None. Leaving early cancels the generation."""
        try:
            while True:
                items = [await self.queue.get()]
                while not self.queue.empty():  # what piled up while the last event was sent goes as one
                    items.append(self.queue.get_nowait())
                ends = [data for kind, data in items if kind == "done"]
                yield [data for kind, data in items if kind == "text"], (ends[0] if ends else None)
                if ends:
                    return
        finally:
            self.cancel.set()

    def _work(self, put):
        t0, chars, error = time.perf_counter(), 0, None
        try:
            for i, piece in self.gen.stream(self.prompt, self.options):
                if self.cancel.is_set():
                    break
                chars += len(piece)
                put(("text", [i, piece]))
        except ChargptError as e:
            error = str(e)
        except Exception as e:  # a bug, or out of memory: tell the page, keep the server up
            traceback.print_exc()
            self.failed = True  # the server's fault, not the request's (/v1 answers 500, not 400)
            error = f"generation failed: {type(e).__name__}: {str(e)[:200]}"
        finally:
            self.result = {"stopped": self.cancel.is_set(), "chars": chars, "error": error,
                           "seconds": round(time.perf_counter() - t0, 4)}
            self.on_end(self)
            put(("done", self.result))
