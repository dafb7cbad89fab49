"""Threads from the cores that are free (chargpt/threads.py): the tuner keeps the count its steps run fastest at,
tries again when they slow down, and leaves torch's own count as it found it; the text does not depend on it."""

import pytest
import torch
from helpers import run_cli, train_tiny

from chargpt.errors import ConfigError
from chargpt.threads import ThreadTuner, counts_to_try, parse_threads


class Machine:
    """A stand-in CPU: a step takes cost[threads] seconds (a function of the step number, to change mid-run), on a
    clock that only the steps advance."""

    def __init__(self, cost):
        self.cost, self.now, self.threads, self.ran = cost, 0.0, 2, []

    def set_threads(self, n):
        self.threads = n

    def clock(self):
        return self.now

    def steps(self, n):
        for i in range(n):
            self.now += self.cost(self.threads, i)
            self.ran.append(self.threads)
            yield i


def tuner(machine, counts=(1, 2)):
    return ThreadTuner(counts, clock=machine.clock, set_threads=machine.set_threads,
                       get_threads=lambda: machine.threads)


def test_it_keeps_the_count_that_runs_fastest_and_spends_few_steps_finding_it():
    # beside a busy process: two threads wait for a shared core, one runs free
    busy = Machine(lambda threads, i: 0.001 if threads == 1 else 0.020)
    t = tuner(busy)
    assert list(t.run(busy.steps(500))) == list(range(500))  # every step, once, in order
    assert t.best == 1 and busy.ran[-100:] == [1] * 100
    assert busy.ran.count(2) <= 2 * 5  # the slow count is given up after a step or two, each try
    quiet = Machine(lambda threads, i: 0.010 / threads)  # a quiet machine: two threads twice as fast
    t = tuner(quiet)
    list(t.run(quiet.steps(200)))
    assert t.best == 2 and "2 of 2" in t.choice() and "1 thread 10.0 ms" in t.choice()


def test_a_count_is_judged_by_its_mean_step_not_its_luckiest():
    # two threads: mostly as fast as one, but one step in four waits a whole time slice for the shared core
    spiky = Machine(lambda threads, i: 0.001 if threads == 1 or i % 4 else 0.040)
    t = tuner(spiky)
    list(t.run(spiky.steps(300)))
    assert t.best == 1


def test_when_the_steps_slow_down_it_tries_again_and_moves():
    # quiet for the first 300 steps (two threads win), then another process takes a core
    def cost(threads, i):
        return 0.010 / threads if i < 300 else (0.010 if threads == 1 else 0.200)
    m = Machine(cost)
    t = tuner(m)
    list(t.run(m.steps(400)))
    assert m.ran[250] == 2 and m.ran[-50:] == [1] * 50


def test_a_fixed_count_is_never_changed_and_torchs_own_count_comes_back():
    m = Machine(lambda threads, i: 0.001)
    t = ThreadTuner.of(2, cpus=4)
    t.set_threads, t.clock, t.get_threads = m.set_threads, m.clock, lambda: m.threads
    list(t.run(m.steps(50)))
    assert set(m.ran) == {2} and t.choice() == "2 (threads)"
    before = torch.get_num_threads()
    real = ThreadTuner.of("auto", cpus=2)
    for _ in real.run(iter(range(40))):
        pass
    assert torch.get_num_threads() == before
    steps = real.run(iter(range(40)))
    next(steps)
    steps.close()  # a stream left part-way (Ctrl-C in the REPL, a client gone) also restores it
    assert torch.get_num_threads() == before


def test_auto_tries_powers_of_two_up_to_the_cpus_and_bad_values_are_one_line_errors():
    assert counts_to_try(1) == [1] and counts_to_try(2) == [1, 2] and counts_to_try(12) == [1, 2, 4, 8, 12]
    assert parse_threads(None) == parse_threads("auto") == "auto" and parse_threads("1") == 1
    for bad in ("x", "1.5", 0, -2, 10**6):
        with pytest.raises(ConfigError, match="--threads|threads"):
            parse_threads(bad)


def test_the_text_is_the_same_whatever_the_thread_count(tmp_path):
    import chargpt
    run = train_tiny(tmp_path / "runs")
    texts = {t: chargpt.load(run, device="cpu", dtype="float32", threads=t).generate(
        "a", max_new_tokens=120, seed=3, num_samples=2) for t in (1, 2, "auto")}
    assert texts[1] == texts[2] == texts["auto"]


def test_sample_py_takes_threads_and_names_the_choice(tmp_path):
    args = ["--checkpoint", train_tiny(tmp_path / "runs"), "--max-new-tokens", "20", "--seed", "1"]
    ok = run_cli("sample.py", *args, "--threads", "1")
    assert ok.returncode == 0 and ", threads 1 (--threads)" in ok.stderr and ok.stdout.strip()
    bad = run_cli("sample.py", *args, "--threads", "many")
    assert bad.returncode != 0 and bad.stderr.strip().count("\n") == 0 and "--threads" in bad.stderr
    assert "Traceback" not in bad.stderr
