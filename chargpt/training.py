"""train(): data, model, optimizer, schedule, evaluation, checkpoints, and the loop that ties them.

    python train.py --data corpus.txt          # the CLI; or from Python:
    chargpt.train(data="corpus.txt", max_iters=500)
    chargpt.train(data="pairs.tsv", task="pairs", arch="encoder-decoder")      # sentence pairs (chargpt.pairs)

Setup (Trainer.__init__) claims the run directory, settles the configs, prepares the corpus (plain text, or
sentence pairs with a loss mask), then builds the model (build_model: CharGPT or EncoderDecoder) once, with the
corpus's vocabulary; either kind of batch reaches the model as its keyword arguments. The loop (Trainer.run)
reads top to bottom: evaluate and checkpoint, forward/backward (with gradient accumulation), agree on whether
the loss was finite and whether to stop, step, log, and now and then a sample. Under torchrun every rank runs
it; all decisions to stop (the budget, --patience, a signal) are taken together. Where the settings come from is
chargpt/settings.py.
"""

import json
import math
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpoint as ckpt
from . import errors, init_from, rundir, sizing
from .cadence import EVALS_PER_BUDGET, RunningLoss, eval_period, time_to_evaluate
from .components.interrupt import Aborted, SignalFlag, StopRequested
from .components.state import RunState, resumed_state
from .config import (
    UNLIMITED,
    ModelConfig,
    TrainConfig,
    check_model_fits,
    check_task,
    describe_model,
    param,
    split_overrides,
)
from .data import corpus_sources
from .errors import ChargptError, CheckpointError, ConfigError, Interrupted
from .model import build_model
from .optim import describe_numerics, low_precision_copies, make_optimizer
from .rundir import CONFIG, LOSSES, METRICS, SAMPLES, STATE
from .runtime import (
    autocast,
    broadcast_str,
    configure_threads,
    device_memory,
    enable_fast_math,
    gather_rng_state,
    init_distributed,
    pick_compile,
    pick_device,
    pick_dtype,
    restore_rng_state,
    stream_seed,
)
from .schedules import describe_budget, finished, lr_at
from .settings import (
    FLAGS,
    HARDWARE,
    Settings,
    absolute_paths,
    config_toml,
    init_settings,
    resolve,
    resume_settings,
    spelled,
)
from .tasks import make_task
from .tokenizer import describe_chars

LN2 = math.log(2)
LOG_EVERY = 10  # steps between progress-bar updates (each reads the loss: a host sync on a GPU)
GPU_SYNC_EVERY = 10  # steps between the host syncs that read the stop flags on a GPU (every step on a CPU)
NO_BAD_STEP = 2**62  # Trainer.first_bad while every loss so far was finite


# --- the pieces: batches as the model's inputs, evaluation ---------------------------------------------------
def model_inputs(batch):
    """A batch as the model's keyword arguments: text batches come as (x, y), pairs batches as a dict already."""
    return batch if isinstance(batch, dict) else {"idx": batch[0], "targets": batch[1]}


@torch.no_grad()
def estimate_loss(model, batches, cfg: TrainConfig, device, dtype, dist, check_stop=lambda: None):
    """Mean loss over eval_iters batches per split: plain cross-entropy (no label smoothing), the number to compare.
    The batches come from a generator seeded the same way at every evaluation, so successive numbers compare the
    model, not the luck of the draw. check_stop() is called before each batch (it raises to abandon the
    evaluation)."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "eval", dist.rank))
        losses = torch.zeros(cfg.eval_iters, device=device)
        for k in range(cfg.eval_iters):
            check_stop()
            batch = model_inputs(batches.get(split, gen))
            with autocast(device, dtype):
                _, loss = model(**batch)
            losses[k] = loss
        mean = losses.mean()
        if dist.enabled:
            torch.distributed.all_reduce(mean)
            mean /= dist.world_size
        out[split] = mean.item()  # note: a host sync, once per split per evaluation
    model.train()
    return out


# --- setup ---------------------------------------------------------------------------------------------------
def _rank0_decides(fn, dist):
    """Run fn on rank 0 only; if it raises a ChargptError, raise it on every rank, so that all of them stop with
    the one clean line (rather than the others failing at their next collective with a traceback)."""
    error = None
    if dist.is_main:
        try:
            fn()
        except ChargptError as e:
            error = e
    message = broadcast_str(f"{type(error).__name__}\n{error}" if error else "", dist)
    if error:
        raise error
    if message:
        kind, text = message.split("\n", 1)
        raise getattr(errors, kind, ChargptError)(text)


class Trainer:
    """One run: __init__ sets it up (run directory, configs, corpus, model, optimizer), run() trains it."""

    def __init__(self, overrides, log=tqdm.write):
        self.log_fn, self.run_dir, self.notes, self.config_saved = log, None, [], False
        self.profiler = None  # a torch.profiler.profile: the loop labels its phases and steps it (chargpt.bench)
        model_kw, train_kw = split_overrides(overrides)  # unknown names and wrong types fail before any work
        if "vocab_size" in model_kw:
            raise ConfigError("vocab_size is set from the corpus, not by a setting; drop it")
        self.settings = Settings({**model_kw, **train_kw})  # reads --config: its mistakes too fail before any work
        given = self.settings.merged()
        self.dist = init_distributed(given.get("device", "auto"))
        self.device = pick_device(given.get("device", "auto"))
        try:
            self._setup(given)
        except BaseException:
            self.close()  # a failed start leaves no lock and no empty run directory behind
            raise

    def _setup(self, given):
        resume = given.get("resume", False)
        self.out_dir = self._claim_run_dir(given, resume)
        meta = ckpt.read_meta(self.out_dir / STATE)[0] if resume else None
        self.base = self.lineage = None  # --init-from: the run this one starts from, and what checkpoints record
        if resume:
            model_kw, self.cfg, notes = resume_settings(meta, self.settings, self.out_dir)
            self.state, more = resumed_state(meta, self.cfg, self.settings.merged(), self.out_dir)
            self.notes += notes + more
        elif given.get("init_from"):
            self.base = init_from.read_base(given["init_from"])
            started = init_settings(self.base.meta, self.settings, self.device.type, given["init_from"])
            model_kw, self.cfg, self.state = started.model_kw, started.cfg, RunState()
            self.cfg.out_dir = str(self.out_dir)
            self.notes += started.notes
        else:
            model_kw, self.cfg = resolve(self.settings, self.device.type)[:2]
            self.cfg.out_dir, self.state = str(self.out_dir), RunState()
        check_task(ModelConfig(**model_kw).validate().arch, self.cfg)  # before the corpus is read and cached
        self.task = make_task(self.cfg)
        self._setup_hardware()
        self.corpus = self._prepare_corpus(model_kw["block_size"])
        self.distinct = len(self.corpus.vocab)  # the corpus's own characters (an --init-from run's vocabulary grows)
        self._run_vocab(meta)
        self.sizing_lines = []
        if self.cfg.preset == "auto" and not resume and self.base is None:
            model_kw = self._auto_size(model_kw)
        if resume and meta["vocab"] != self.corpus.vocab:
            raise ConfigError(f"--resume: the corpus's vocabulary ({len(self.corpus.vocab)} characters) differs from "
                              f"the checkpoint's ({len(meta['vocab'])}); resume with the same --data")
        self.mcfg = ModelConfig(**model_kw, vocab_size=len(self.corpus.vocab)).validate()
        check_model_fits(self.mcfg, *device_memory(self.device), self._file_setting)  # before allocating for it
        self._check_sample_prompt()
        self._make_batches()
        self._build_model()
        if resume:
            self._restore(meta)
        self._wrap_model()
        self._log_start(meta)

    def _auto_size(self, model_kw):
        """--preset auto: the model for this corpus, budget and machine (chargpt/sizing.py), decided on rank 0 (its
        speed measured there) for every rank -> model_kw; self.cfg and self.sizing_lines updated."""
        if self.task.name != "text":
            self.sizing_lines = ["auto: sentence pairs keep the cpu preset's model (sizing is fitted to text)"]
            return model_kw
        given, cfg = self.settings.given(), self.cfg
        train_chars = int(self.corpus.length * (1 - cfg.val_fraction))
        decided = ""
        if self.dist.is_main:
            probe = sizing.Probe(len(self.corpus.vocab), cfg, self.device, self.dtype)
            plan = sizing.plan_run(cfg, given, train_chars, probe, self.dist.world_size)
            model_kw, train_kw, kept = sizing.apply(plan, model_kw, {}, given)
            lines = sizing.describe(plan, cfg.max_time, train_chars, kept, spelled)
            if plan.warning:
                lines.append(f"warning: {plan.warning}")
            decided = json.dumps({"model": model_kw, "train": train_kw, "lines": lines})
        decided = json.loads(broadcast_str(decided, self.dist))
        self.cfg = replace(cfg, **decided["train"]).validate()
        self.sizing_lines = decided["lines"]
        return decided["model"]

    def _run_vocab(self, meta):
        """A run started from another trains in the base's vocabulary extended by the corpus's new characters (on
        --resume, the one its checkpoint holds): the corpus's ids are remapped into it (chargpt/init_from.py)."""
        if self.base is not None:
            vocab = self.base.vocab.extended(self.corpus.vocab)
            self.lineage = init_from.lineage(self.base, vocab)
        elif meta is not None and (vocab := init_from.run_vocab(meta, self.corpus.vocab)) is not None:
            self.lineage = init_from.read_lineage(meta)
        else:
            return
        self.corpus = init_from.in_vocab(self.corpus, vocab)

    def _file_setting(self, name):
        """The config file that set `name`, or None (a flag, a preset, a default or the checkpoint did)."""
        source = self.settings.source(name)
        return source if source not in (None, FLAGS) and not source.startswith("preset ") else None

    def _check_sample_prompt(self):
        unknown = self.corpus.vocab.unknown(self.cfg.sample_prompt or "")
        if unknown:
            raise ConfigError(f"{param('sample_prompt')} has characters the corpus does not: "
                              f"{describe_chars(unknown)}; use characters of the corpus")

    def _claim_run_dir(self, flags, resume):
        """Choose the run directory; rank 0 claims it (created if new, locked for the run's lifetime)."""
        if flags.get("out_dir"):
            out_dir = Path(flags["out_dir"])
        else:  # rank 0's choice: ranks on other machines may see another checkpoints/ folder
            name, _ = corpus_sources(flags.get("data"), flags.get("encoding", "utf-8"))
            out_dir = Path(broadcast_str(str(rundir.default_out_dir(name, resume)), self.dist))
        if resume and not (out_dir / STATE).exists():
            raise CheckpointError(f"--resume: no training state in {out_dir} ({STATE} missing); "
                                  f"start without --resume, or pass the run's --out-dir")
        _rank0_decides(lambda: self._claim(out_dir, resume), self.dist)
        return out_dir

    def _claim(self, out_dir, resume):
        self.run_dir = rundir.RunDir(out_dir).claim()
        if resume:
            rundir.check_metrics(out_dir / METRICS)
        elif rundir.holds_run(out_dir):
            raise ConfigError(f"{out_dir} already holds a run; pass --resume to continue it, or another "
                              f"--out-dir for a new one (nothing was changed)")

    def _setup_hardware(self):
        self.dtype, self.dtype_reason = pick_dtype(self.cfg.dtype, self.device)
        enable_fast_math(self.device)
        self.threads = configure_threads(self.cfg.threads, self.dist.local_world_size) \
            if self.device.type == "cpu" else None

    def _hardware(self):
        """The hardware settings in effect (saved with each checkpoint, to say on --resume what changed)."""
        return {"device": str(self.device), "dtype": str(self.dtype).removeprefix("torch."),
                "threads": self.threads, "compile": self.cfg.compile, "attention": self.cfg.attention}

    def _prepare_corpus(self, block_size):
        """The corpus (text, or sentence pairs), encoded once (cached) and memory-mapped. Under torchrun one process
        per machine encodes; the others wait, then read its cache entry."""
        encoder = self.dist.local_rank == 0
        if self.dist.enabled and not encoder:
            torch.distributed.barrier()
        corpus = self.task.encode(self.cfg, block_size, self.log)
        if self.dist.enabled and encoder:
            torch.distributed.barrier()
        return corpus

    def _make_batches(self):
        """The task's batches (text windows, or whole pairs) and how many characters a step sees (for pairs, on
        average)."""
        cfg = self.cfg
        self.batches = self.task.batches(self.corpus, cfg, self.mcfg, self.device, self.log)
        self.chars_per_step = cfg.batch_size * self.task.chars_per_example * cfg.grad_accum * self.dist.world_size

    def _build_model(self):
        """Model, optimizer, loss scaler and random streams. Every rank builds the same initial weights from the
        same seed; dropout and batch order differ per rank, reproducibly (rank 0 draws what one process does)."""
        cfg, mcfg = self.cfg, self.mcfg
        torch.manual_seed(cfg.seed)
        try:
            self.model = build_model(mcfg).to(self.device)
        except (RuntimeError, MemoryError) as e:  # e.g. --n-embd 100000: torch's "can't allocate memory"
            if not isinstance(e, MemoryError) and "alloc" not in str(e).lower() and "memory" not in str(e).lower():
                raise
            n = 12 * mcfg.n_layer * mcfg.n_embd ** 2 + (mcfg.vocab_size + mcfg.block_size) * mcfg.n_embd
            raise ConfigError(f"a model of about {n / 1e6:,.0f}M parameters does not fit in {self.device} memory; "
                              f"lower --n-embd, --n-layer or --block-size") from None
        if self.base is not None:  # its weights over the fresh ones; new characters keep their fresh rows
            init_from.load_base_weights(self.model, self.base)
            self.base.weights = {}  # copied: the memory goes back
        self.model.set_attention(cfg.attention)
        self.optimizer = make_optimizer(self.model, cfg, self.device, self.dtype)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        torch.manual_seed(stream_seed(cfg.seed, "dropout", self.dist.rank))
        self.data_gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "data", self.dist.rank))

    def _wrap_model(self):
        """What the loop calls: the model, compiled and/or wrapped for DDP; self.model stays the plain one."""
        self.compiled, self.compile_reason = pick_compile(self.cfg.compile, self.device)
        self.train_model = torch.compile(self.model) if self.compiled else self.model
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.train_model = DDP(self.train_model, device_ids=ids)
        # every sync_every steps the host reads whether to stop (a sync: free on a CPU, a stall on a GPU)
        self.sync_every = 1 if self.device.type == "cpu" or self.cfg.skip_nonfinite else GPU_SYNC_EVERY
        self.copies = low_precision_copies(self.model, self.optimizer, self.device, self.dtype,
                                           self.compiled or self.dist.enabled)

    def _log_start(self, meta):
        cfg, mcfg, corpus = self.cfg, self.mcfg, self.corpus
        self.log(f"corpus: {corpus.name} — {self.task.describe_corpus(corpus)}, {self.distinct:,} distinct"
                 + (" (built-in default: the Python help topics from pydoc_data; pass --data FILE for your own "
                    "text)" if cfg.data is None else f" ({cfg.data})"))
        self.log(f"device: {self.device}, {self.dtype_reason}" + (f", {self.threads} threads" if self.threads else "")
                 + (f", {self.dist.world_size} processes" if self.dist.enabled else "") + f"; {self.compile_reason}")
        self.log(describe_numerics(self.dtype, cfg.optimizer, copies=self.copies is not None))
        for line in self.settings.describe() + self.sizing_lines:
            self.log(line)
        if cfg.optimizer == "muon":
            self.log(f"optimizer: Muon (lr {cfg.muon_lr:g}, momentum {cfg.muon_momentum:g}) for the block matrices, "
                     f"AdamW (lr {cfg.learning_rate:g}) for the rest; {cfg.lr_schedule} schedule")
        if self.base is not None:
            self.log(f"starting from {init_from.describe_lineage(self.lineage)}; model: {describe_model(mcfg)}, "
                     f"{self.model.num_params() / 1e6:.2f}M parameters; fresh optimizer and schedule")
            self.notes.insert(0, init_from.describe_added(corpus.vocab, self.lineage["base_vocab_size"]))
        elif meta is None:
            self.log(f"model: {describe_model(mcfg)}, {self.model.num_params() / 1e6:.2f}M parameters")
        else:
            s = self.state
            self.log(f"resuming {self.out_dir} at step {s.step} (best val loss {s.best_val:.4f}); model: "
                     f"{describe_model(mcfg)}, {self.model.num_params() / 1e6:.2f}M parameters")
            self.notes += self._changes_since(meta)
        global_batch = cfg.batch_size * cfg.grad_accum * self.dist.world_size
        self.log(f"global batch: {cfg.batch_size} x {cfg.grad_accum} accum x {self.dist.world_size} proc = "
                 f"{global_batch} {self.task.describe_examples(mcfg)} = {self.chars_per_step:,.0f} chars/step; "
                 f"run dir: {self.out_dir}")
        if self.dist.is_main:  # which text validates (and what only it holds): a pass over the corpus, once
            known = self.base.vocab.stoi if self.base is not None else ()  # what the base run already learned
            for line in self.task.describe_split(corpus, cfg, known):
                self.log(line)
        if not any(note.startswith("new budget") for note in self.notes):
            default = meta is None and str(self.settings.source("max_time")).startswith("preset ")
            self.log(f"budget: {describe_budget(cfg, self.state)}" + (f" (the default of --preset {cfg.preset}; "
                     f"--max-time SECONDS or --max-iters N for another)" if default else ""))
        if cfg.lr_schedule != "inverse-sqrt" and self.state.budget_lr is None and cfg.warmup_iters >= cfg.max_iters:
            self.log(f"warning: the warmup ({param('warmup_iters', cfg.warmup_iters)}) does not end before the budget "
                     f"({param('max_iters', cfg.max_iters)}): the learning rate only rises and never decays; give a "
                     f"larger {param('max_iters')} or a smaller {param('warmup_iters')}")
        self.eval_period = eval_period(cfg, self.settings.source("eval_interval"))  # None: by steps alone
        if self.eval_period:
            self.log(f"evaluating every {self.eval_period:.3g} s of training (1/{EVALS_PER_BUDGET} of --max-time); "
                     f"--eval-interval N to evaluate every N steps instead")
        for note in self.notes:
            self.log(note)

    def _changes_since(self, meta):
        """Lines saying how this session differs from the checkpoint: hardware, and dropout."""
        saved, now = meta.get("hardware"), self._hardware()
        if not isinstance(saved, dict):  # written before hardware was recorded: compare the flags
            saved, now = meta.get("train_config") or {}, {k: getattr(self.cfg, k) for k in HARDWARE}
        changed = [f"{k} {now[k]} (checkpoint: {saved[k]})" for k in HARDWARE if k in saved and saved[k] != now[k]]
        notes = [f"hardware as this command sets it: {', '.join(changed)}"] if changed else []
        if meta["model_config"].dropout != self.mcfg.dropout:
            notes.append(f"dropout {self.mcfg.dropout} (checkpoint: {meta['model_config'].dropout}) from here on")
        return notes

    def log(self, msg):
        if self.dist.is_main:
            self.log_fn(msg)

    def close(self):
        """Give the run directory up (rank 0): unlock it, and remove it if this start created it and nothing
        was saved in it."""
        if self.run_dir is not None:
            self.run_dir.release()
            self.run_dir = None

    # --- checkpoints ----------------------------------------------------------------------------------------
    def _restore(self, meta):
        """Weights, moments, random streams and loss scale from state.safetensors; metrics logged after it
        (by a run killed between a metrics line and its save) are dropped, to be logged again."""
        state_path = self.out_dir / STATE
        _, rng = ckpt.load_state(state_path, self.model, self.optimizer)
        restore_rng_state(rng, self.data_gen, self.device, self.dist, self.cfg.seed + self.state.step)
        scaler = meta.get("scaler")
        if self.scaler.is_enabled() and isinstance(scaler, dict):
            try:
                self.scaler.load_state_dict(scaler)
            except (KeyError, TypeError, ValueError, RuntimeError):
                raise CheckpointError(f"{state_path} has a corrupted loss-scaler state; re-train or re-copy it") \
                    from None
        if self.dist.is_main:
            rundir.remove_stale_temps(self.out_dir)  # left by a run that was killed while saving
            for log in (METRICS, SAMPLES, LOSSES):
                rundir.truncate_metrics(self.out_dir / log, self.state.step)

    def save(self, val_loss=None, improved=False, final=False):
        """Rank 0 writes state (resume) and latest (at every save, or with --save-state end only when training
        stops: `final`), and best when improved; each file atomically. Under DDP every rank calls this: it gathers
        the ranks' random streams first."""
        full = final or self.cfg.save_state == "eval"
        rng = gather_rng_state(self.data_gen, self.device, self.dist) if full else None
        if not self.dist.is_main or not (full or improved):
            return
        s = self.state
        extra = dict(step=s.step, val_loss=val_loss, best_val_loss=s.best_val if s.best_val < float("inf") else None,
                     corpus=self.corpus.name, corpus_key=self.corpus.key, run_state=asdict(s),
                     hardware=self._hardware(), world_size=self.dist.world_size, chars_per_step=self.chars_per_step,
                     corpus_chars=self.corpus.length,  # for model cards (chargpt export); the key: chargpt novelty
                     closing_prompt=getattr(self.task, "closing_prompt", None))  # the playground's "Write a sample"
        if self.lineage:  # the run this one started from (--init-from)
            extra[init_from.LINEAGE] = self.lineage
        if self.scaler.is_enabled():  # fp16 loss scale: part of exact resume
            extra["scaler"] = self.scaler.state_dict()
        train_cfg = absolute_paths(asdict(self.cfg))
        if not self.config_saved:  # with the first checkpoint of this session, so a failed start leaves no file
            rundir.write_text_atomic(self.out_dir / CONFIG, config_toml(self.mcfg, self.cfg))
            self.config_saved = True
        weights = ckpt.model_tensors(self.model)  # one device-to-host copy serves all three files
        if full:
            ckpt.save_state(self.out_dir / STATE, self.model, self.optimizer, rng, self.corpus.vocab, train_cfg,
                            weights=weights, **extra)
            ckpt.save_model(self.out_dir / rundir.LATEST, self.model, self.corpus.vocab, train_cfg, weights=weights,
                            **extra)
        if improved:
            ckpt.save_model(self.out_dir / rundir.BEST, self.model, self.corpus.vocab, train_cfg, weights=weights,
                            **extra)

    # --- the loop ---------------------------------------------------------------------------------------------
    def run(self):
        """Train until the budget is spent or a signal arrives (_loop, phase by phase as in nanoGPT's train.py), then
        save and sum up (_finish); -> summary dict."""
        s = self.state
        self._start_clocks()
        try:
            # the handlers stay in place until the final save is written (_finish): a signal never cuts it short
            with self.signals:
                try:
                    with self.bar:  # the bar is cleared on any exit, so an error line starts clean
                        reason, signum = self._loop()
                    return self._finish(reason, signum)
                except Aborted as e:
                    raise Interrupted(f"stopped during the save at step {s.step}; {self.out_dir} keeps the last "
                                      f"complete save", e.signum, out_dir=self.out_dir,
                                      distributed=self.dist.enabled) from None
        finally:
            self.close()

    def check_stop(self):
        """Raise StopRequested if a signal asked training to stop: called inside evaluation and scoring loops.
        Alone (not under torchrun): ranks that left an evaluation at different batches would wait on each other."""
        if self.signals.requested and not self.dist.enabled:
            raise StopRequested

    def _loop(self):
        """The steps, until the budget is spent or a signal arrives; -> (why it stopped, signal number or 0)."""
        s, signum = self.state, 0
        while True:
            lr = lr_at(s.step, s.elapsed, self.cfg, s)
            reason = finished(self.cfg, s)
            # by the clock under a time budget (cadence.py), else every eval_interval steps; both from step 0
            due = s.step % self.cfg.eval_interval == 0 if self.eval_period is None else \
                s.step == 0 or time_to_evaluate(s.elapsed, self.last_eval_at, self.eval_period)
            if (due or reason) and not s.evaluated:
                with self._phase("1 evaluate and save"):  # at the interval, by the clock, and at the end
                    try:
                        self._evaluate_and_save(lr, final=bool(reason))
                    except StopRequested:  # a signal during the evaluation: save the run as it is
                        return "signal", self.signals.signum
                reason = finished(self.cfg, s)  # --patience: this evaluation may end the run
            if reason:
                return reason, signum
            with self._phase("2 forward and backward"):  # accumulated over micro-batches
                loss = self._forward_backward()
            with self._phase("3 agree"):  # across ranks: loss finite? stop? clock?
                bad_step, signum = self._agree(loss, lr)
            with self._phase("4 optimizer step"):  # or drop a non-finite step
                self._step(bad_step, lr)
            with self._phase("5 progress"):
                self._log_progress(loss, lr)
            if self.cfg.sample_every and s.step % self.cfg.sample_every == 0:
                self._show_sample()  # 6. now and then, a sample: the model learning, in its own words
            if self.profiler is not None:
                self.profiler.step()
            if signum:
                return "signal", signum

    def _phase(self, name):
        """A labelled span for torch.profiler (`python -m chargpt.bench profile` sets self.profiler); else nothing."""
        return torch.profiler.record_function(name) if self.profiler is not None else nullcontext()

    def _start_clocks(self):
        s = self.state
        self.signals = SignalFlag(say=self.log, distributed=self.dist.enabled)
        self.bar = tqdm(total=self.cfg.max_iters if self.cfg.max_iters < UNLIMITED else None, initial=s.step,
                        disable=not self.dist.is_main, dynamic_ncols=True, unit="step", leave=False,
                        mininterval=0.1 if sys.stderr.isatty() else 5.0)  # quiet in logs
        self.session_start, self.elapsed_before, self.session_step = time.perf_counter(), s.elapsed, s.step
        self.pauses = 0.0  # seconds spent in evaluate-and-save this session: not part of training speed
        self.window = (time.perf_counter(), 0.0, s.step)  # (time, pauses, step) where the speed window began
        self.first_bad = torch.tensor(NO_BAD_STEP, device=self.device)  # first step with a non-finite loss
        self.bad_loss = torch.zeros((), device=self.device)  # its loss
        self.lrs = {}  # step -> learning rate, since the last sync (to name the rate of a bad step)
        self.last_val = None
        self.running = RunningLoss()  # the training loss since the last progress update (cadence.py)
        self.last_eval_at = s.elapsed  # the agreed clock at the last evaluation (time-budget cadence)
        self.last_scores = {}  # exact match and chrF of the last evaluation (pairs)
        self.first_step_s = None  # wall time of this session's first step: torch.compile compiles during it

    def _forward_backward(self):
        """Gradients of one optimizer step over grad_accum micro-batches; -> their mean loss (on the device).
        With one micro-batch no averaging op is issued: small models are bound by per-op overhead."""
        cfg, model = self.cfg, self.train_model
        t0, loss_sum = time.perf_counter() if self.first_step_s is None else None, None
        copies = self.copies
        if copies is not None:
            copies.refresh()  # the bf16 weights, once per step
        for micro in range(cfg.grad_accum):
            with self._phase("2a batch"):
                batch = model_inputs(self.batches.get("train", self.data_gen))
            last = micro == cfg.grad_accum - 1  # DDP: all-reduce gradients on the last micro-batch only
            with model.no_sync() if self.dist.enabled and not last else nullcontext():  # enter once
                with autocast(self.device, self.dtype):
                    kw = dict(batch, label_smoothing=cfg.label_smoothing)
                    _, loss = model(**kw) if copies is None else copies.forward(model, kw)
                self.scaler.scale(loss / cfg.grad_accum if cfg.grad_accum > 1 else loss).backward()
                if copies is not None:
                    copies.grads_to_flat()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if t0 is not None:
            self._first_step(t0)
        return loss_sum / cfg.grad_accum if cfg.grad_accum > 1 else loss_sum

    def _first_step(self, t0):
        """Time the session's first forward and backward: with torch.compile that is the compilation."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.first_step_s = time.perf_counter() - t0
        if self.compiled:
            self.log(f"torch.compile: the first step took {self.first_step_s:.1f} s (compiling)")

    def _agree(self, loss, lr):
        """-> (first step whose loss was not finite, or None; signal number or 0), agreed by all ranks.

        Reading them costs a host sync, so on a GPU it happens every sync_every steps, and on the step before
        an evaluation or the end; in between the first non-finite loss is remembered on the device. Ranks
        act only on the all-reduced clock, so they never disagree about stopping; a signal to any rank stops
        all, and the highest signal number is every rank's exit status."""
        s = self.state
        self.lrs[s.step] = lr
        if self.sync_every == 1:  # read every step (free on a CPU): no device-side bookkeeping needed
            value = loss.item()
            first_bad, self.bad_value = (s.step, value) if not math.isfinite(value) else (NO_BAD_STEP, None)
        else:
            fresh = ~torch.isfinite(loss) & (self.first_bad == NO_BAD_STEP)
            self.first_bad = torch.where(fresh, s.step, self.first_bad)
            self.bad_loss = torch.where(fresh, loss, self.bad_loss)
            ahead = s.step + 1
            if s.step % self.sync_every and ahead % self.cfg.eval_interval and ahead < self.cfg.max_iters:
                return None, 0
            first_bad = self.first_bad.item()  # note: the host sync
            self.bad_value = None
        elapsed = self.elapsed_before + time.perf_counter() - self.session_start
        if not self.dist.enabled:  # nothing to agree on: no tensor round trip
            s.elapsed = elapsed
            if first_bad != NO_BAD_STEP and self.bad_value is None:
                self.bad_value = self.bad_loss.item()
            return (None if first_bad == NO_BAD_STEP else first_bad), int(self.signals.signum or 0)
        # all MAX-reduced: -(first bad step) so that the earliest wins; -inf when every loss was finite
        flags = torch.tensor([-first_bad if first_bad != NO_BAD_STEP else -math.inf,
                              float(self.signals.signum or 0), elapsed], dtype=torch.float64)
        if self.dist.enabled:
            flags = flags.to(self.dist.device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            flags = flags.cpu()
        s.elapsed = float(flags[2])
        bad = None if flags[0] == -math.inf else int(-flags[0])
        if bad != first_bad:
            self.bad_value = "non-finite"  # another rank's value
        elif self.bad_value is None:
            self.bad_value = self.bad_loss.item()
        return bad, int(flags[1])

    def _step(self, bad_step, lr):
        """Apply the gradients; a non-finite loss stops the run (or, with --skip-nonfinite, drops the step)."""
        s, cfg = self.state, self.cfg
        if bad_step is not None:
            self.optimizer.zero_grad()
            if not cfg.skip_nonfinite:
                raise ChargptError(
                    f"loss became {self.bad_value} at step {bad_step} (learning rate {self.lrs.get(bad_step, lr):.2e})"
                    f": training diverged, most likely because the learning rate is too high; lower --learning-rate "
                    f"or pass --skip-nonfinite. The last good checkpoint in {self.out_dir} is kept.")
            s.skipped += 1
            self.first_bad.fill_(NO_BAD_STEP)
            self.log(f"step {s.step}: non-finite loss, step skipped ({s.skipped} so far)")
        else:
            parts = self.optimizer.parts.values()  # AdamW, and Muon with --optimizer muon
            for group in self.optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]  # one schedule for all: Muon's peak is --muon-lr
            if cfg.grad_clip > 0:
                for part in parts:
                    self.scaler.unscale_(part)
                self.optimizer.clip_grad_norm_(cfg.grad_clip)  # one norm over the flat gradient buffer
            for part in parts:
                self.scaler.step(part)
            self.scaler.update()
            self.optimizer.zero_grad()
        if s.step % self.sync_every == 0:
            self.lrs.clear()
        s.step += 1
        s.evaluated = False

    def _log_progress(self, loss, lr):
        """Every LOG_EVERY steps: loss, last validation loss, learning rate, speed (evaluation time excluded, as
        in the bar's own steps/s: see _evaluate_and_save) and time left."""
        s, cfg = self.state, self.cfg
        self.running.add(loss)
        if (s.step - 1) % LOG_EVERY == 0:
            value = self.running.read()  # the mean since the last read: the progress bar's one host sync
            if value is not None and self.dist.is_main:
                rundir.append_jsonl(self.out_dir / LOSSES, {"step": s.step, "train_loss": round(value, 6), "lr": lr,
                                                            "elapsed_s": round(s.elapsed, 2)}, sync=False)
            now = time.perf_counter()
            t0, pauses0, step0 = self.window
            speed = (s.step - step0) * self.chars_per_step / max(now - t0 - (self.pauses - pauses0), 1e-9)
            self.window = (now, self.pauses, s.step)
            post = {"loss": f"{value:.4f}" if value is not None else "nan",
                    "val": f"{self.last_val:.4f}" if self.last_val else "-", "lr": f"{lr:.2e}",
                    "chars/s": f"{speed:,.0f}"}
            if cfg.max_time:
                post["left"] = f"{max(0, cfg.max_time - (s.elapsed - s.budget_elapsed)):.0f}s"
            self.bar.set_postfix(post, refresh=False)
        self.bar.update(1)

    def _evaluate_and_save(self, lr, final=False):
        t0 = time.perf_counter()
        # the plain module: no DDP sync is needed under no_grad, and torch.compile would recompile for eval mode
        s = self.state
        self.signals.where = "evaluation"  # a signal abandons it (check_stop): the run is saved without it
        try:
            losses = estimate_loss(self.model, self.batches, self.cfg, self.device, self.dtype, self.dist,
                                   check_stop=self.check_stop)
            if not all(math.isfinite(v) for v in losses.values()):  # the weights are broken: never save them
                raise ChargptError(
                    f"evaluation loss became {losses['val']} at step {s.step} (learning rate {lr:.2e}): training "
                    f"diverged, most likely because the learning rate is too high; lower --learning-rate. The last "
                    f"good checkpoint in {self.out_dir} is kept.")
            scores = self.last_scores = self.task.scores(self.model, self.corpus, self.dtype, self.log,
                                                         self.check_stop) if self.dist.is_main else {}
        finally:
            self.signals.where = "step"
        improved = losses["val"] < s.best_val
        s.best_val = min(s.best_val, losses["val"])
        s.since_best = 0 if improved else s.since_best + 1
        s.evaluated = True
        record = {"step": s.step, "train_loss": round(losses["train"], 6), "val_loss": round(losses["val"], 6),
                  "train_bpc": round(losses["train"] / LN2, 6), "val_bpc": round(losses["val"] / LN2, 6),
                  "lr": lr, "elapsed_s": round(s.elapsed, 2)}
        record.update(scores)
        # the line first, then the state: a kill between the two leaves a line that --resume drops (it is
        # after the saved step), never a saved step whose line is missing
        if self.dist.is_main:
            rundir.append_jsonl(self.out_dir / METRICS, record)
        s.eval_time += time.perf_counter() - t0
        if not self.dist.enabled:  # the clock, read after the evaluation, saved with it (under torchrun the
            s.elapsed = self.elapsed_before + time.perf_counter() - self.session_start  # ranks agree it, in _agree)
        self.last_eval_at = s.elapsed
        self.save(losses["val"], improved, final)
        self.log(f"step {s.step:>6}: train {losses['train']:.4f} nats ({losses['train'] / LN2:.3f} bpc), "
                 f"val {losses['val']:.4f} nats ({losses['val'] / LN2:.3f} bpc)" + (" *" if improved else "")
                 + (f"; exact match {scores['exact_match']:.1%}" if scores else "")
                 + (f", chrF {scores['chrf']:.1f}" if scores.get("chrf") is not None else "")
                 + (f" ({len(self.task.eval_rows)} val pairs, greedy)" if scores else ""))
        self.last_val = losses["val"]
        self._pause_speed(time.perf_counter() - t0)

    def sample(self, chars, prompt=None):
        """A sample of the model as it is now: from --sample-prompt (else a newline), at temperature 0.8, with the
        run's seed, so that successive samples differ only by what the model learned. -> the text after the
        prompt. Decoding has its own random generator and no dropout: training's random streams are untouched."""
        from .engine import Generator
        gen = Generator(self.model, self.corpus.vocab, self.device)  # puts the model in eval mode
        try:
            prompt = (self.cfg.sample_prompt or "") if prompt is None else prompt
            return gen.generate(prompt, max_new_tokens=chars, seed=self.cfg.seed)[0]
        finally:
            self.model.train()

    def _show_sample(self):
        """Every --sample-every steps (rank 0): a short sample above the progress bar, and a line in samples.jsonl
        (after the state it follows: a resumed run drops lines past its step, as for metrics.jsonl)."""
        if not self.dist.is_main:
            return
        t0, s, prompt = time.perf_counter(), self.state, self.cfg.sample_prompt or ""
        text = self.sample(self.cfg.sample_chars)
        report = self._novelty(text)
        record = {"step": s.step, "prompt": prompt, "text": text, **({"novelty": report.summary()} if report else {})}
        rundir.append_jsonl(self.out_dir / SAMPLES, record)
        self.log(f"--- sample at step {s.step} ---\n{prompt}{text}\n---" + (f"\n{report.line()}" if report else ""))
        self._pause_speed(time.perf_counter() - t0)

    def _novelty(self, text):
        """How much of a sample is copied from the training text (a chargpt.novelty Report), so that samples.jsonl
        and the log show memorisation grow; the index is built at the first sample (once per corpus, then cached).
        None if it cannot be built: a sample's score is not worth stopping a training for."""
        from . import novelty
        index = getattr(self, "novelty_index", None)
        if index is False:
            return None
        try:
            if index is None:
                index = self.novelty_index = novelty.index_corpus(self.corpus, self.cfg.val_fraction, log=self.log,
                                                                  split=getattr(self.task, "split", None))
            return index.score(text)
        except (ChargptError, OSError, MemoryError) as e:
            self.log(f"warning: no novelty score for the samples ({e}); they are recorded without one")
            self.novelty_index = False
            return None

    def _pause_speed(self, seconds):
        """Leave `seconds` out of the speeds shown: chars/s (see _log_progress) and the bar's own steps/s and ETA
        (shifting its clocks, as tqdm's unpause() does, by exactly the pause)."""
        self.pauses += seconds
        if not self.bar.disable:
            self.bar.start_t += seconds
            self.bar.last_print_t += seconds

    def _finish(self, reason, signum):
        s = self.state
        training_s = time.perf_counter() - self.session_start - self.pauses  # this session, evaluations left out
        # the clock as of now: s.elapsed was last read at the last step, before the final evaluation (whose time
        # is in eval_time), so a share of it would otherwise pass 100%
        elapsed = max(s.elapsed, self.elapsed_before + time.perf_counter() - self.session_start)
        speed = (s.step - self.session_step) * self.chars_per_step / max(training_s, 1e-9)
        if reason == "signal":
            self.save(None, False, final=True)
        if reason == "patience":
            self.log(f"stopped early at step {s.step}: no improvement in {self.cfg.patience} evaluations (best val "
                     f"loss {s.best_val:.4f})")
            if self.cfg.save_state == "end":  # the evaluation that ended the run did not know it was the last
                self.save(self.last_val, False, final=True)
        if self.dist.is_main and self.cfg.curves:
            from .plot import maybe_write_curves
            maybe_write_curves(self.out_dir, self.log)
        if self.dist.enabled:
            # no rank leaves before rank 0's files are complete: the caller (or a --resume) may read them next, and
            # torchrun stops the remaining workers, mid-save, as soon as one of them exits with an error status
            torch.distributed.barrier()
        if reason == "signal":
            raise Interrupted(f"interrupted at step {s.step}; saved the run to {self.out_dir}", signum,
                              out_dir=self.out_dir, distributed=self.dist.enabled)
        return {"out_dir": str(self.out_dir), "step": s.step, "best_val_loss": s.best_val, "val_loss": self.last_val,
                "elapsed_s": elapsed, "eval_fraction": min(1.0, s.eval_time / max(elapsed, 1e-9)),
                "stopped_by": reason,
                "stopped_early": reason == "patience", "chars_per_step": self.chars_per_step, "chars_per_s": speed,
                "first_step_s": self.first_step_s, "compiled": self.compiled, "task": self.task.name,
                **self.last_scores}

    def closing_sample(self):
        """What training shows when it ends: a sample of text, or for pairs a few greedy validation translations."""
        return self.task.closing_sample(self)


def train(log=tqdm.write, **overrides):
    """Train a model (CharGPT, or with arch='encoder-decoder' the 2017 Transformer). Keyword arguments are the
    CLI's flags with underscores (data=..., max_iters=..., preset="tiny", config="run.toml"); anything not given
    comes from the config file, else the preset (by default the device's), else the dataclass default:
    chargpt/settings.py. -> summary dict."""
    trainer = None
    try:
        trainer = Trainer(overrides, log=log)
        summary = trainer.run()
        early = f" (stopped early: no improvement in {trainer.cfg.patience} evaluations)" \
            if summary["stopped_early"] else ""
        trainer.log(f"done: {summary['step']} steps{early} in {summary['elapsed_s']:.0f} s "
                    f"({summary['eval_fraction']:.0%} of it evaluating), best val loss {summary['best_val_loss']:.4f}; "
                    f"run saved in {trainer.out_dir}")
        if trainer.cfg.sample_chars and trainer.dist.is_main:
            log(trainer.closing_sample())
        return summary
    finally:
        if trainer is not None and trainer.dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
