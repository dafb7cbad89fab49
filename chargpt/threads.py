"""Threads from the cores that are free: how many torch threads a repeated step (a decode step, a training step)
runs fastest with on this machine now, measured while it runs rather than assumed.

torch's CPU threads meet at every operator, and OpenMP's spin while they wait: where another process holds one of
the cores, every step waits for the thread that shares it. Measured on 2 cores beside one busy process, a 4 x 192
Tang model wrote 30-73 characters a second with 2 threads and 620-1,290 with 1 (750-800 either way on the quiet
machine); a 2 x 64 training step took 413-1,052 ms with 2 threads against 54 ms quiet. So `--threads auto` tries
the counts in turn on the run's own steps (nothing extra is computed: the steps are the ones the command takes
anyway), keeps the fastest, and tries again when the steps become much slower than the choice was, or, less and
less often, when it has held a while (the other process may have ended).

    tuner = ThreadTuner.of("auto")           # or ThreadTuner.of(4): four threads, never changed
    for out in tuner.run(steps): ...         # each next() timed at the count the tuner sets; torch's own count
                                             # is restored when the iteration ends
    tuner.choice()                           # "1 of 2 (measured: 1 thread 1.1 ms a step, 2 threads 14 ms)"

The thread count does not change what is computed here (a sample is the same text at 1 and 2 threads, float32 and
bf16, tested), only how fast.
"""

import threading
import time
from contextlib import contextmanager

import torch

from chargpt.config.flags import param
from chargpt.errors import ConfigError
from chargpt.runtime import check_threads, cpu_count

# A count's speed is the mean of its steps, not the fastest: beside a busy process many steps at 2 threads are as
# fast as at 1 and a few wait a whole time slice for a core, 1.7 ms against 1.6 at the fastest, 12 ms on the mean.
TRY_STEPS = 3  # steps timed at each count when trying (after one untimed: a new count wakes or starts threads)...
TRY_S = 0.05  # ...and more, up to TRY_MAX_STEPS, until they add up to this many seconds (cheap steps vary more)
TRY_MAX_STEPS = 32
GIVE_UP = 3.0  # a count whose steps so far take this many times the best count's on the mean is tried no further
SLOWER = 2.0  # steps this many times slower than the choice measured (their mean over WINDOW) try again
WINDOW = 16
RETRY_S = 10.0  # the choice is tried again after this many seconds of steps, and twice as long each time it holds
RETRY_MAX_S = 160.0


def counts_to_try(cpus):
    """1, 2, 4, ... up to the CPUs, and the CPUs themselves: the counts auto tries, fewest first."""
    counts, n = [], 1
    while n < cpus:
        counts.append(n)
        n *= 2
    return counts + [cpus]


def parse_threads(value):
    """--threads as given (None, 'auto', a number or its text) -> 'auto' or an int, checked; ConfigError else."""
    if value is None or value == "auto":
        return "auto"
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{param('threads')} takes auto or a number of threads, got {value!r}") from None
    check_threads(n)
    return n


def mean(values):
    return sum(values) / len(values)  # statistics.mean is exact and slow: 20 us, a twentieth of a decode step


class ThreadTuner:
    """The thread count of one repeated step: fixed (--threads N) or measured (auto, see above). Build it with
    ThreadTuner.of(value); keep it for the next iteration of the same kind of step (what it found holds on)."""

    def __init__(self, counts, clock=time.perf_counter, set_threads=torch.set_num_threads,
                 get_threads=torch.get_num_threads):
        self.counts, self.clock, self.set_threads, self.get_threads = list(counts), clock, set_threads, get_threads
        self.fixed = len(self.counts) == 1
        self.best = self.counts[-1]  # before any measurement: the most (torch's own default)
        self.measured = {}  # count -> seconds a step, when last tried
        self.retry_s, self.since_try = RETRY_S, 0.0  # seconds of steps since the last try, and when to try again
        self.trying, self.recent, self.untimed, self.cancel = None, [], set(), False
        self.lock = threading.Lock()  # a server decodes several requests at once, each in its own thread

    @classmethod
    def of(cls, value, cpus=None):
        value = parse_threads(value)
        return cls(counts_to_try(cpus or cpu_count()) if value == "auto" else [value])

    def run(self, steps):
        """Iterate `steps`, timing each next() at the count this tuner sets; torch's thread count is restored when
        the iteration ends (a program's own setting is its own)."""
        before = self.get_threads()
        steps = iter(steps)
        try:
            while True:
                with self.step():
                    try:
                        out = next(steps)
                    except StopIteration:
                        self.cancel = True
                        return
                yield out
        finally:
            self.set_threads(before)

    @contextmanager
    def step(self):
        """One step, timed at the count this tuner sets (torch's count stays at it after)."""
        with self.lock:
            count = self._next_count()
        if count != self.get_threads():
            self.set_threads(count)
        self.cancel = False
        t0 = self.clock()
        yield
        if not self.cancel:
            with self.lock:
                self._timed(count, self.clock() - t0)

    def settle(self, step):
        """Call step() until every count has been tried -> the count it runs fastest at (torch's count is left at
        it): for a probe that measures at the count the run will get."""
        while not self.measured:
            with self.step():
                step()
        self.set_threads(self.best)
        return self.best

    def _next_count(self):
        if self.fixed:
            return self.best
        if self.trying is None and (not self.measured or self.since_try >= self.retry_s or self._slowed()):
            # every count, the fastest known first: the slower ones are then given up after one step (GIVE_UP)
            order = sorted(self.counts, key=lambda c: self.measured.get(c, float("inf")))
            self.trying, self.untimed = {c: [] for c in order}, set(self.counts)
        if self.trying is not None:
            for count, times in self.trying.items():
                if not self._tried(times):
                    return count
        return self.best

    def _tried(self, times):
        """Whether a count's steps so far (seconds) are enough to judge it by."""
        if len(times) >= TRY_MAX_STEPS or (len(times) >= TRY_STEPS and sum(times) >= TRY_S):
            return True
        done = [mean(t) for t in self.trying.values() if t is not times and len(t) >= TRY_STEPS]
        return bool(times and done and mean(times) > GIVE_UP * min(done))

    def _slowed(self):
        if len(self.recent) < WINDOW or self.best not in self.measured:
            return False
        return mean(self.recent) > SLOWER * self.measured[self.best]

    def _timed(self, count, seconds):
        if self.fixed:
            return
        self.since_try += seconds
        if self.trying is None or count not in self.trying:
            self.recent.append(seconds)
            if len(self.recent) > WINDOW:
                del self.recent[0]
            return
        if count in self.untimed:  # a count's first step after a change wakes its threads: not timed
            self.untimed.discard(count)
            return
        self.trying[count].append(seconds)
        if all(self._tried(t) for t in self.trying.values()):
            self._decide()

    def _decide(self):
        tried = {c: mean(t) for c, t in self.trying.items() if t}
        previous = self.best
        self.best = min(tried, key=lambda c: (tried[c], c))  # a tie: fewer threads leave more to others
        self.measured.update(tried)
        # a choice that held is tried again less often; one that changed, soon
        self.retry_s = min(RETRY_MAX_S, 2 * self.retry_s) if self.best == previous else RETRY_S
        self.trying, self.recent, self.since_try = None, [], 0.0

    def choice(self):
        """The count in words, with what was measured: for a start-up or closing line."""
        if self.fixed:
            return f"{self.best} ({param('threads')})"
        if not self.measured:
            return f"auto (of {self.counts[-1]}; measured on the first steps)"
        times = ", ".join(f"{c} thread{'s' if c > 1 else ''} {self.measured[c] * 1e3:,.1f} ms"
                          for c in sorted(self.measured))
        return f"{self.best} of {self.counts[-1]} (measured a step: {times})"
