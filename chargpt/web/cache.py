"""What the server keeps between requests: loaded models (Models), novelty indexes (NoveltyIndexes), and the
count of generations and analyses in flight (Busy). Each is called from worker threads and locks for itself."""

import sys
import threading
from collections import OrderedDict

from chargpt.web.body import RequestError
from chargpt.web.limits import MAX_BUSY, MAX_MODELS


class Models:
    """Loaded Generators, the most recently used last; at most `size`. A checkpoint that changed on disk (a
    run still training) is loaded again. Called from worker threads; loads one at a time."""

    def __init__(self, device="auto", size=MAX_MODELS, speculate="off"):
        self.device, self.size, self.speculate = device, size, speculate  # (speculate: chargpt serve --speculate)
        self.loaded = OrderedDict()  # (path, mtime_ns) -> Generator
        self.lock = threading.Lock()

    def get(self, path):
        from chargpt.sampling.engine import load
        try:
            key = (str(path), path.stat().st_mtime_ns)
        except OSError:
            raise RequestError(404, f"the run {path.parent.name!r} was removed; GET /api/runs lists them") from None
        with self.lock:
            if key not in self.loaded:
                for old in [k for k in self.loaded if k[0] == key[0]]:  # an older save of the same run
                    del self.loaded[old]
                # Eager decoding: compiling the decode step (sample.py's --compile auto, from 30,000 characters)
                # would hold a request's first character for seconds, a minute cold, where Stop cannot reach it;
                # and a run still training would be compiled again at each save.
                gen = load(path, device=self.device, compile="off", speculate=self.speculate)
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


class NoveltyIndexes:
    """The novelty index (chargpt.tools.novelty) of each run asked about, by run directory: built or loaded in a worker
    thread (the first build of a large corpus takes a while), one at a time. As with Models, a checkpoint that
    changed on disk (its mtime or size) is read again: a run still training keeps its index, a run replaced
    under the same name (another corpus or split: novelty.corpus_identity) gets its own."""

    def __init__(self):
        self.loaded, self.lock = {}, threading.Lock()  # run directory -> (stamp, identity, Novelty)

    def get(self, path):
        from chargpt.runs.checkpoint import read_meta
        from chargpt.tools.novelty import CorpusMissing, corpus_identity, for_meta
        name = path.parent.name
        try:
            stat = path.stat()
        except OSError:
            raise RequestError(404, f"the run {name!r} was removed; GET /api/runs lists them") from None
        stamp = (stat.st_mtime_ns, stat.st_size)
        with self.lock:
            seen = self.loaded.get(path.parent)
            if seen is not None and seen[0] == stamp:
                return seen[2]
            meta, _ = read_meta(path)
            identity = corpus_identity(meta)
            if seen is not None and seen[1] == identity:  # a new save of the same run: the same text and split
                index = seen[2]
            else:
                try:
                    index = for_meta(meta, name, log=lambda m: print(m, file=sys.stderr))
                except CorpusMissing as e:  # the server's paths and the CLI's --data mean nothing to a web user
                    raise RequestError(422, f"cannot mark copied text: the training text of the run {name!r} "
                                            f"{e.web}") from None
            self.loaded[path.parent] = (stamp, identity, index)
            return index
