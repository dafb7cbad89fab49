"""DistributedDataParallel on CPU with the Gloo backend: real torchrun jobs of train.py, and in-process ranks
(torch.multiprocessing) checked against a single process fed the same data.

Every run pins --device cpu, so the tests mean the same on a machine with a GPU. No test picks a free port
ahead of time (another process could take it first): torchrun --standalone lets the kernel choose, and the
in-process ranks meet through a rendezvous file."""

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import ROOT, TINY_FLAGS, run_cli
from safetensors.torch import load_file, save_file

from chargpt.data.corpus import Batches
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir
from chargpt.training.trainer import Trainer, start_run, train

pytestmark = pytest.mark.skipif(sys.platform == "win32" or not torch.distributed.is_available(),
                                reason="needs torch.distributed and POSIX process groups")

# TINY_FLAGS as keyword arguments, for runs inside this process and in spawned ranks
TINY_KW = dict(device="cpu", n_layer=1, n_head=2, n_embd=16, block_size=16, batch_size=4, eval_iters=2, dropout=0.0,
               threads=1, sample_chars=0, dtype="float32", curves=False, verbose=True)
RUN_FILES = ["best.safetensors", "config.toml", "latest.safetensors", "metrics.jsonl", "state.safetensors",
             "status.json", "train.log", "train_loss.jsonl"]


def quiet(msg):
    pass


def torchrun_cmd(*args):
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(ROOT / "train.py"), "--device", "cpu", *map(str, args)]


def torchrun_env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}


def metric_steps(run):
    return [json.loads(line)["step"] for line in (run / rundir.METRICS).read_text().splitlines()]


def assert_one_checkpoint_set(run):
    """Exactly the files of one run: no second copy, no temporary file left behind."""
    assert sorted(p.name for p in run.iterdir() if p.name != "curves.png") == RUN_FILES  # curves: with matplotlib
    steps = metric_steps(run)
    assert steps == sorted(set(steps)), f"metrics written more than once: {steps}"


def test_torchrun_two_processes_write_one_checkpoint_set_that_samples(corpus):
    r = subprocess.run(torchrun_cmd("--data", corpus, "--out-dir", "run", "--max-iters", 4, "--eval-interval", 2,
                                    *TINY_FLAGS), capture_output=True, text=True, timeout=120, env=torchrun_env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert "global batch: 4 x 1 accum x 2 proc = 8 sequences of 16 chars = 128 chars/step" in r.stderr
    assert r.stderr.count("step      2:") == 1  # only rank 0 logs
    run = Path("run")
    assert_one_checkpoint_set(run)
    assert metric_steps(run) == [0, 2, 4]
    meta, shapes = ckpt.read_meta(run / rundir.STATE)
    assert {"rng.torch", "rng.data", "rng.rank1.torch", "rng.rank1.data"} <= set(shapes)  # each rank's streams
    assert meta["world_size"] == 2  # for `chargpt info`: characters seen = steps x global batch

    s = run_cli("sample.py", "--checkpoint", run, "--max-new-tokens", 20, "--seed", 1)
    assert s.returncode == 0, s.stderr
    assert len(s.stdout.strip()) > 0


# --- Ctrl-C ------------------------------------------------------------------------------------------------
def _descendants(pid):
    """All processes below pid (torchrun starts its workers in sessions of their own)."""
    children = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _kill_job(proc):
    for pid in [*_descendants(proc.pid), proc.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_ctrl_c_to_a_torchrun_job_saves_once_and_exits(corpus):
    # a run begun in one process, resumed by two, interrupted, then resumed by one again
    train(log=quiet, data=str(corpus), out_dir="run", max_iters=2, eval_interval=1, **TINY_KW)
    proc = subprocess.Popen(torchrun_cmd("--out-dir", "run", "--resume", "--max-iters", 100_000, "--eval-interval", 5),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=torchrun_env(),
                            start_new_session=True)  # its own process group, as a terminal gives a job
    lines = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    output = []
    try:
        deadline = time.monotonic() + 90
        # an evaluation after a few steps: both ranks are inside the training loop, past their setup
        while not any("step      5:" in line for line in output):
            output.append(lines.get(timeout=max(0.1, deadline - time.monotonic())))
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: torchrun forwards it to the workers
        proc.wait(timeout=60)
    except (queue.Empty, subprocess.TimeoutExpired):
        _kill_job(proc)
        pytest.fail("torchrun job hung:\n" + "".join(output))
    reader.join(timeout=10)  # the pipe is drained once every process has exited
    while not lines.empty():
        output.append(lines.get())
    text = "".join(output)
    assert proc.returncode != 0, text  # torchrun reports its workers' interruption as a failure (status 1)
    stopped = set(re.findall(r"interrupted at step (\d+); saved the run", text))
    assert len(stopped) == 1, text  # every rank stopped after the same step
    step = int(stopped.pop())
    assert step >= 5
    run = Path("run")
    assert_one_checkpoint_set(run)
    meta, shapes = ckpt.read_meta(run / rundir.STATE)
    assert meta["step"] == step and "rng.rank1.data" in shapes
    summary = train(log=quiet, out_dir="run", resume=True, max_iters=step + 2, device="cpu")  # two processes -> one
    assert summary["step"] == step + 2


# --- in-process ranks ------------------------------------------------------------------------------------------
class GlobalBatches:
    """The same global batches whatever the number of processes: the n-th draw from a split is global batch n
    (from a fixed seed), and each rank takes its share of the rows. So 2 processes x batch B see exactly what
    1 process x batch 2B sees."""

    def __init__(self, run, global_batch):
        t = run
        self.full = Batches(t.corpus.ids(), t.cfg.val_fraction, t.mcfg.block_size, global_batch, t.device,
                            t.task.split)
        self.gens = {split: torch.Generator().manual_seed(i) for i, split in enumerate(("train", "val"))}
        self.rank, self.world = t.dist.rank, t.dist.world_size

    def get(self, split, generator):
        x, y = self.full.get(split, self.gens[split])
        rows = slice(self.rank * len(x) // self.world, (self.rank + 1) * len(x) // self.world)
        return x[rows], y[rows]


# float32 and Muon pinned: the CPU default's optimizer, whose iteration computes in the run's dtype; in bf16 the
# all-reduce's other summation order would differ by 1e-4, more than the tolerance below (and the dtype of an auto run
# depends on the CPU)
EQUIV = dict(max_iters=4, eval_interval=1, grad_accum=2, warmup_iters=0, learning_rate=1e-2, optimizer="muon")


def trainer_on_global_batches(out_dir, corpus, global_batch, world):
    run = start_run({**TINY_KW, **EQUIV, "batch_size": global_batch // world, "data": corpus, "out_dir": out_dir},
                    log=quiet)
    batches = GlobalBatches(run, global_batch)
    run.validator.batches = batches  # the validator evaluates on them too
    return Trainer(replace(run, batches=batches))


def _rank_main(rank, root):
    """One of two ranks, set up as torchrun would, then the scenarios the tests below check."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2",
                      CHARGPT_CACHE_DIR=f"{root}/cache")
    torch.set_num_threads(1)
    # joined here through a file rather than a TCP port chosen in advance; chargpt's init_distributed then finds
    # the group ready and only reads the environment above
    torch.distributed.init_process_group("gloo", init_method=f"file://{root}/rendezvous", rank=rank, world_size=2)
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    corpus = f"{root}/corpus.txt"
    try:
        # 1. two processes x batch 4 on the same global batches as one process x batch 8
        t = trainer_on_global_batches(f"{root}/ddp", corpus, 8, world=2)
        syncs = []  # gradient all-reduces, counted through a DDP communication hook

        def counting_allreduce(state, bucket):
            syncs.append(bucket.index())
            return allreduce_hook(state, bucket)

        t.run.wrapped.train_model.register_comm_hook(None, counting_allreduce)
        t.train()
        save_file(ckpt.model_tensors(t.run.model), f"{root}/rank{rank}.safetensors")
        (Path(root) / f"syncs{rank}.json").write_text(json.dumps(syncs))
        # 2. per-rank random batches and dropout: stopping and resuming changes nothing
        kw = {**TINY_KW, "dropout": 0.1, "data": corpus, "eval_interval": 2}
        Trainer(start_run({**kw, "out_dir": f"{root}/straight", "max_iters": 4}, log=quiet)).train()
        Trainer(start_run({**kw, "out_dir": f"{root}/resumed", "max_iters": 2}, log=quiet)).train()
        Trainer(start_run({**kw, "out_dir": f"{root}/resumed", "resume": True, "max_iters": 4}, log=quiet)).train()
    finally:
        torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Runs both ranks once for the tests below (each start of a process costs seconds)."""
    root = tmp_path_factory.mktemp("ddp")
    (root / "corpus.txt").write_text("".join(f"To be, or not to be: that is the question {i}.\nROMEO: O, she doth "
                                             f"teach the torches.\n" for i in range(60)), encoding="utf-8")
    torch.multiprocessing.spawn(_rank_main, args=(str(root),), nprocs=2)
    return root


def test_two_processes_match_one_process_with_twice_the_batch(two_ranks):
    single = trainer_on_global_batches(str(two_ranks / "single"), str(two_ranks / "corpus.txt"), 8, world=1)
    single.train()
    curves = {}
    for name in ("single", "ddp"):
        curves[name] = [json.loads(line) for line in (two_ranks / name / rundir.METRICS).read_text().splitlines()]
    assert [m["step"] for m in curves["ddp"]] == [0, 1, 2, 3, 4]
    for one, two in zip(curves["single"], curves["ddp"], strict=True):
        assert two["train_loss"] == pytest.approx(one["train_loss"], abs=1e-5)
        assert two["val_loss"] == pytest.approx(one["val_loss"], abs=1e-5)
    assert curves["single"][-1]["train_loss"] < curves["single"][0]["train_loss"] - 0.01  # it did learn

    want = ckpt.model_tensors(single.run.model)
    ranks = [load_file(str(two_ranks / f"rank{r}.safetensors")) for r in (0, 1)]
    saved = load_file(str(two_ranks / "ddp" / rundir.LATEST))
    for name, value in want.items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # DDP kept the ranks in step
        assert torch.equal(saved[name], ranks[0][name]), name
        torch.testing.assert_close(ranks[0][name], value, atol=1e-5, rtol=1e-4)


def test_resume_under_ddp_continues_every_rank_exactly(two_ranks):
    straight = load_file(str(two_ranks / "straight" / rundir.LATEST))
    resumed = load_file(str(two_ranks / "resumed" / rundir.LATEST))
    for name, value in straight.items():
        assert torch.equal(resumed[name], value), name
    assert metric_steps(two_ranks / "resumed") == metric_steps(two_ranks / "straight") == [0, 2, 4]


def test_gradients_are_synced_once_per_step_not_per_micro_batch(two_ranks):
    for rank in (0, 1):
        syncs = json.loads((two_ranks / f"syncs{rank}.json").read_text())
        assert len(syncs) == EQUIV["max_iters"] * (max(syncs) + 1)  # every bucket once per step, with grad_accum 2
