"""train(): data, model, optimizer, schedule, evaluation, checkpoints, and the loop that ties them.

    python train.py --data corpus.txt          # the CLI; or from Python:
    chargpt.train(data="corpus.txt", max_iters=500)

The loop reads top to bottom: evaluate and checkpoint, forward/backward (with gradient accumulation), check
the loss, step, log. Under torchrun every rank runs it; all decisions to stop are taken together.
"""

import math
import os
import signal
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from . import checkpoint as ckpt
from .config import (
    PRESET_REASONS,
    UNLIMITED,
    ModelConfig,
    TrainConfig,
    build_configs,
    flag,
    split_overrides,
    typed_fields,
)
from .data import Batches, corpus_sources, encode_corpus, split_sizes
from .errors import ChargptError, CheckpointError, ConfigError, Interrupted
from .model import CharGPT
from .runtime import (
    Dist,
    autocast,
    broadcast_str,
    configure_threads,
    enable_fast_math,
    gather_to_main,
    init_distributed,
    pick_device,
    pick_dtype,
    stream_seed,
)

LN2 = math.log(2)


def get_lr(it, frac, cfg: TrainConfig):
    """Learning rate at step `it`, with `frac` in [0, 1] the fraction of the run done (by steps or by time):
    1) linear warmup over warmup_iters steps, 2) cosine decay from learning_rate to min_lr, 3) min_lr after."""
    min_lr = cfg.min_lr if cfg.min_lr is not None else cfg.learning_rate / 10
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    if frac >= 1:
        return min_lr
    coeff = 0.5 * (1.0 + math.cos(math.pi * frac))  # 1 -> 0
    return min_lr + coeff * (cfg.learning_rate - min_lr)


def run_fraction(it, elapsed, cfg: TrainConfig):
    """How much of the decay schedule is done: by steps (after warmup), or by wall-clock with --max-time."""
    decay_end = cfg.lr_decay_iters or cfg.max_iters
    frac = (it - cfg.warmup_iters) / max(1, decay_end - cfg.warmup_iters)
    if cfg.max_time:
        frac = max(frac, elapsed / cfg.max_time)
    return min(max(frac, 0.0), 1.0)


@torch.no_grad()
def estimate_loss(model, batches, cfg: TrainConfig, device, dtype, dist: Dist):
    """Mean loss over eval_iters batches per split. The batches come from a generator seeded the same way at
    every evaluation, so successive numbers compare the model, not the luck of the draw."""
    model.eval()
    out = {}
    for split in ("train", "val"):
        gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "eval", dist.rank))
        losses = torch.zeros(cfg.eval_iters, device=device)
        for k in range(cfg.eval_iters):
            x, y = batches.get(split, gen)
            with autocast(device, dtype):
                _, loss = model(x, y)
            losses[k] = loss
        mean = losses.mean()
        if dist.enabled:
            torch.distributed.all_reduce(mean)
            mean /= dist.world_size
        out[split] = mean.item()  # note: a host sync, once per split per evaluation
    model.train()
    return out


def make_optimizer(model: CharGPT, cfg: TrainConfig, device):
    """AdamW, fused where this torch supports it for the device (several times faster than the for-loop
    implementation: 5 ms against 31 ms per step measured for 10.7M parameters on CPU)."""
    groups = model.optimizer_groups(cfg.weight_decay)
    betas = (cfg.beta1, cfg.beta2)
    try:
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=betas, fused=device.type in ("cuda", "cpu"))
    except (RuntimeError, ValueError, TypeError):
        return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=betas)


@dataclass
class RunState:
    """What changes as training goes; saved in state.safetensors (with the weights and moments)."""
    step: int = 0
    best_val: float = float("inf")
    elapsed: float = 0.0  # training seconds over all sessions of this run
    evaluated: bool = False  # whether the evaluation at `step` is already logged
    skipped: int = 0  # non-finite steps skipped with --skip-nonfinite
    eval_time: float = 0.0  # seconds of `elapsed` spent estimating losses


def _default_out_dir(name, resume):
    """checkpoints/<name>, or checkpoints/<name>-2, -3 ... so a new run never overwrites an old one; with
    --resume, the most recent of them."""
    root = Path("checkpoints")
    candidates = [root / name] + [root / f"{name}-{i}" for i in range(2, 1000)]
    existing = [d for d in candidates if (d / ckpt.STATE).exists() or (d / ckpt.LATEST).exists()]
    if resume:
        if not existing:
            return root / name
        return max(existing, key=lambda d: (d / ckpt.STATE).stat().st_mtime if (d / ckpt.STATE).exists() else 0)
    return next(d for d in candidates if not any((d / n).exists() for n in (ckpt.STATE, ckpt.LATEST, ckpt.BEST)))


def _check_writable(out_dir, create=True):
    """Create out_dir and prove a file can be written there; with create=False only check, creating nothing
    (the nearest existing folder must be a writable directory)."""
    if not create:
        try:
            existing = next(p for p in (out_dir, *out_dir.absolute().parents) if p.exists())
            problem = f"{existing} is not a directory" if not existing.is_dir() else \
                None if os.access(existing, os.W_OK | os.X_OK) else f"{existing} is not writable"
        except OSError as e:
            problem = e.strerror
        if problem:
            raise CheckpointError(f"cannot write to --out-dir {out_dir} ({problem}); choose a writable directory")
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"cannot write to --out-dir {out_dir} ({e.strerror}); choose a writable "
                              f"directory") from None


def _resume_configs(state_path, overrides):
    """Saved configs + the flags given now. Architecture flags must agree with the checkpoint; training
    flags (iterations, learning rate, ...) may change."""
    meta, _ = ckpt.read_meta(state_path)
    saved_model: ModelConfig = meta["model_config"]
    model_kw, train_kw = split_overrides(overrides)
    clashes = [f"--{flag(k)} {v} (checkpoint: {getattr(saved_model, k)})" for k, v in model_kw.items()
               if getattr(saved_model, k) != v]
    if clashes:
        raise ConfigError(f"--resume: flags disagree with the checkpoint's model: {'; '.join(clashes)}; "
                          f"drop them to resume, or train a new run with another --out-dir")
    if train_kw.get("max_time") and "max_iters" not in train_kw:
        train_kw["max_iters"] = UNLIMITED  # as for a new run: a time budget alone decides when to stop
    tcfg = TrainConfig(**{**(meta.get("train_config") or {}), **train_kw, "resume": True})
    return saved_model, tcfg.validate(), meta


class Trainer:
    """Holds the pieces of one run; `run()` is the loop."""

    def __init__(self, overrides, log=tqdm.write):
        self.log_fn = log
        model_kw, train_kw = split_overrides(overrides)  # unknown names and wrong types fail before any work
        overrides = {**model_kw, **train_kw}
        self.dist = init_distributed(overrides.get("device", "auto"))
        self.device = pick_device(overrides.get("device", "auto"))
        preset = "gpu" if self.device.type == "cuda" else "cpu"
        resume = overrides.get("resume", False)

        # where the run lives
        if overrides.get("out_dir"):
            out_dir = Path(overrides["out_dir"])
        else:  # rank 0's choice: ranks on other machines may see another checkpoints/ folder
            name, _ = corpus_sources(overrides.get("data"), overrides.get("encoding", "utf-8"))
            out_dir = Path(broadcast_str(str(_default_out_dir(name, resume)), self.dist))
        self.out_dir = out_dir
        state_path = out_dir / ckpt.STATE
        if resume:
            if not state_path.exists():
                raise CheckpointError(f"--resume: no training state in {out_dir} ({ckpt.STATE} missing); "
                                      f"start without --resume, or pass the run's --out-dir")
            mcfg, tcfg, self.resume_meta = _resume_configs(state_path, overrides)
        elif (state_path.exists() or (out_dir / ckpt.LATEST).exists()) and overrides.get("out_dir"):
            raise ConfigError(f"{out_dir} already holds a run; pass --resume to continue it, or another --out-dir "
                              f"for a new one (nothing was changed)")
        else:
            mcfg, tcfg = build_configs(preset, {k: v for k, v in overrides.items() if k != "out_dir"}, 1)

        # hardware
        self.dtype, dtype_reason = pick_dtype(tcfg.dtype, self.device)
        enable_fast_math(self.device)
        threads = configure_threads(tcfg.threads, self.dist.local_world_size) if self.device.type == "cpu" else None

        # data: the corpus is encoded once (cached) and memory-mapped
        if self.dist.is_main:
            _check_writable(out_dir, create=False)  # fail before writing anything
        # under torchrun, one process per machine encodes; the others wait, then read its cache entry
        encoder = self.dist.local_rank == 0
        if self.dist.enabled and not encoder:
            torch.distributed.barrier()
        self.corpus = encode_corpus(tcfg.data, tcfg.encoding, tcfg.encoding_errors, tcfg.cache_dir, log=self.log,
                                    check_length=lambda n: split_sizes(n, tcfg.val_fraction, mcfg.block_size))
        if self.dist.enabled and encoder:
            torch.distributed.barrier()
        vocab_size = len(self.corpus.vocab)
        if resume:
            saved_vocab = self.resume_meta["vocab"]
            if saved_vocab != self.corpus.vocab:
                raise ConfigError(f"--resume: the corpus's vocabulary ({vocab_size} characters) differs from the "
                                  f"checkpoint's ({len(saved_vocab)}); resume with the same --data")
        else:
            mcfg = ModelConfig(**{**asdict(mcfg), "vocab_size": vocab_size}).validate()
        self.mcfg, self.cfg = mcfg, tcfg
        self.batches = Batches(self.corpus.ids(), tcfg.val_fraction, mcfg.block_size, tcfg.batch_size, self.device)
        if self.dist.is_main:
            _check_writable(out_dir)

        # model and optimizer; every rank builds the same initial weights from the same seed
        torch.manual_seed(tcfg.seed)
        try:
            self.model = CharGPT(mcfg).to(self.device)
        except (RuntimeError, MemoryError) as e:  # e.g. --n-embd 100000: torch's "can't allocate memory"
            if "alloc" not in str(e).lower() and "memory" not in str(e).lower():
                raise
            n = 12 * mcfg.n_layer * mcfg.n_embd ** 2 + (mcfg.vocab_size + mcfg.block_size) * mcfg.n_embd
            raise ConfigError(f"a model of about {n / 1e6:,.0f}M parameters does not fit in {self.device} memory; "
                              f"lower --n-embd, --n-layer or --block-size") from None
        self.model.set_attention(tcfg.attention)
        self.optimizer = make_optimizer(self.model, tcfg, self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.dtype == torch.float16)
        # dropout and batch order differ per rank, reproducibly (rank 0 draws what a single process draws)
        torch.manual_seed(stream_seed(tcfg.seed, "dropout", self.dist.rank))
        self.data_gen = torch.Generator().manual_seed(stream_seed(tcfg.seed, "data", self.dist.rank))
        self.state = RunState()
        if resume:
            self._restore(state_path)
        self.train_model = self.model
        if tcfg.compile:
            self.train_model = torch.compile(self.model)
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP
            self.train_model = DDP(self.train_model, device_ids=[self.device.index] if self.device.type == "cuda"
                                   else None)

        chars_per_step = tcfg.batch_size * mcfg.block_size * tcfg.grad_accum * self.dist.world_size
        self.chars_per_step = chars_per_step
        self.log(f"corpus: {self.corpus.name} — {self.corpus.length:,} characters, {vocab_size:,} distinct"
                 + (" (built-in default: the Python help topics from pydoc_data; pass --data FILE for your own "
                    "text)" if tcfg.data is None else f" ({tcfg.data})"))
        self.log(f"device: {self.device}, {dtype_reason}" + (f", {threads} threads" if threads else "")
                 + (f", {self.dist.world_size} processes" if self.dist.enabled else ""))
        if not resume:
            self.log(f"model: {mcfg.n_layer} layers x {mcfg.n_embd} wide, {mcfg.n_head} heads, context "
                     f"{mcfg.block_size}, {self.model.num_params() / 1e6:.2f}M parameters — {PRESET_REASONS[preset]}")
        else:
            self.log(f"resuming {out_dir} at step {self.state.step} (best val loss {self.state.best_val:.4f})")
        global_batch = tcfg.batch_size * tcfg.grad_accum * self.dist.world_size
        self.log(f"global batch: {tcfg.batch_size} x {tcfg.grad_accum} accum x {self.dist.world_size} proc = "
                 f"{global_batch} sequences of {mcfg.block_size} chars = {chars_per_step:,} chars/step; "
                 f"run dir: {out_dir}")

    def log(self, msg):
        if self.dist.is_main:
            self.log_fn(msg)

    # --- checkpoints ----------------------------------------------------------------------------------
    def _rng_state(self):
        """Every rank's random streams, gathered to rank 0 (None elsewhere): rank 0's under the names a single
        process uses (torch, data, cuda), rank r's as rank{r}.torch ... A collective under DDP."""
        local = {"torch": torch.get_rng_state(), "data": self.data_gen.get_state()}
        if self.device.type == "cuda":
            local["cuda"] = torch.cuda.get_rng_state(self.device)
        names, sizes = list(local), [v.numel() for v in local.values()]
        gathered = gather_to_main(torch.cat(list(local.values())), self.dist)  # (bytes,) per rank, same size
        if gathered is None:
            return None
        rng = dict(local)
        for r, flat in enumerate(gathered[1:], start=1):
            rng.update({f"rank{r}.{n}": part.clone() for n, part in zip(names, flat.split(sizes))})
        return rng

    def _restore_rng(self, rng):
        """Continue this rank's streams exactly where they stopped. A rank the checkpoint has none for (it was
        written by fewer processes) starts new streams, reproducibly, from the seed, its rank and the step."""
        rank, prefix = self.dist.rank, "" if self.dist.is_main else f"rank{self.dist.rank}."
        if prefix + "torch" in rng and prefix + "data" in rng:
            torch.set_rng_state(rng[prefix + "torch"])
            self.data_gen.set_state(rng[prefix + "data"])
            if prefix + "cuda" in rng and self.device.type == "cuda":
                torch.cuda.set_rng_state(rng[prefix + "cuda"], self.device)
        else:
            seed = self.cfg.seed + self.state.step
            torch.manual_seed(stream_seed(seed, "dropout", rank))
            self.data_gen.manual_seed(stream_seed(seed, "data", rank))

    def _restore(self, state_path):
        meta, rng = ckpt.load_state(state_path, self.model, self.optimizer)
        s = meta.get("run_state") or {}
        try:
            self.state = RunState(**typed_fields(RunState, s, "run state"))
        except ConfigError as e:
            raise CheckpointError(f"{state_path} has corrupted metadata ({e}); re-train or re-copy it") from None
        ckpt.remove_stale_temps(self.out_dir)  # left by a run that was killed while saving
        self._restore_rng(rng)
        scaler = meta.get("scaler")
        if self.scaler.is_enabled() and isinstance(scaler, dict):
            try:
                self.scaler.load_state_dict(scaler)
            except (KeyError, TypeError, ValueError, RuntimeError):
                raise CheckpointError(f"{state_path} has a corrupted loss-scaler state; re-train or re-copy it") \
                    from None
        metrics = self.out_dir / ckpt.METRICS
        if self.dist.is_main and metrics.exists():  # drop lines logged after the state we resume from
            lines = [ln for ln in metrics.read_text(encoding="utf-8").splitlines() if ln.strip()]
            keep = [ln for ln in lines if _json_step(ln) <= self.state.step]
            if len(keep) != len(lines):
                tmp = metrics.with_name(f".{metrics.name}.tmp")
                tmp.write_text("".join(ln + "\n" for ln in keep), encoding="utf-8")
                os.replace(tmp, metrics)

    def save(self, val_loss=None, improved=False):
        """Rank 0 writes state (resume), latest, and best when improved; each file atomically. Under DDP every
        rank calls this: it gathers the ranks' random streams first."""
        rng = self._rng_state()
        if not self.dist.is_main:
            return
        s = self.state
        extra = dict(step=s.step, val_loss=val_loss, best_val_loss=s.best_val if s.best_val < float("inf") else None,
                     corpus=self.corpus.name, run_state=asdict(s))
        if self.scaler.is_enabled():  # fp16 loss scale: part of exact resume
            extra["scaler"] = self.scaler.state_dict()
        train_cfg = asdict(self.cfg)
        weights = ckpt.model_tensors(self.model)  # one device-to-host copy serves all three files
        ckpt.save_state(self.out_dir / ckpt.STATE, self.model, self.optimizer, rng,
                        self.corpus.vocab, train_cfg, weights=weights, **extra)
        ckpt.save_model(self.out_dir / ckpt.LATEST, self.model, self.corpus.vocab, train_cfg, weights=weights, **extra)
        if improved:
            ckpt.save_model(self.out_dir / ckpt.BEST, self.model, self.corpus.vocab, train_cfg, weights=weights,
                            **extra)

    def evaluate_and_save(self, lr):
        t0 = time.perf_counter()
        # the plain module: no DDP sync is needed under no_grad, and torch.compile would recompile for eval mode
        losses = estimate_loss(self.model, self.batches, self.cfg, self.device, self.dtype, self.dist)
        s = self.state
        if not all(math.isfinite(v) for v in losses.values()):  # the weights themselves are broken: never save them
            raise ChargptError(
                f"evaluation loss became {losses['val']} at step {s.step} (learning rate {lr:.2e}): training "
                f"diverged, most likely because the learning rate is too high; lower --learning-rate. The last "
                f"good checkpoint in {self.out_dir} is kept.")
        improved = losses["val"] < s.best_val
        s.best_val = min(s.best_val, losses["val"])
        s.evaluated = True
        record = {"step": s.step, "train_loss": round(losses["train"], 6), "val_loss": round(losses["val"], 6),
                  "train_bpc": round(losses["train"] / LN2, 6), "val_bpc": round(losses["val"] / LN2, 6),
                  "lr": lr, "elapsed_s": round(s.elapsed, 2)}
        # the line first, then the state: a kill between the two leaves a line that --resume drops (it is
        # after the saved step), never a saved step whose line is missing
        if self.dist.is_main:
            ckpt.append_jsonl(self.out_dir / ckpt.METRICS, record)
        s.eval_time += time.perf_counter() - t0
        self.save(losses["val"], improved)
        self.log(f"step {s.step:>6}: train {losses['train']:.4f} nats ({losses['train'] / LN2:.3f} bpc), "
                 f"val {losses['val']:.4f} nats ({losses['val'] / LN2:.3f} bpc)" + (" *" if improved else ""))
        return losses["val"]

    # --- the loop -------------------------------------------------------------------------------------
    def run(self):
        cfg, s, model = self.cfg, self.state, self.train_model
        stop = _SignalFlag()
        sync_every_step = self.device.type == "cpu" or cfg.skip_nonfinite  # host syncs are free on CPU
        total = cfg.max_iters if cfg.max_iters < UNLIMITED else None  # a time budget alone: no step total
        bar = tqdm(total=total, initial=s.step, disable=not self.dist.is_main, dynamic_ncols=True,
                   unit="step", leave=False, mininterval=0.1 if sys.stderr.isatty() else 5.0)  # quiet in logs
        last_val, lr = None, cfg.learning_rate
        t_last, step_last = time.perf_counter(), s.step
        session_start, elapsed_before = time.perf_counter(), s.elapsed
        reason = "max_iters"
        with stop, bar:  # the bar is cleared on any exit, so an error line starts on a clean line
            while True:
                lr = get_lr(s.step, run_fraction(s.step, s.elapsed, cfg), cfg)
                # 1. evaluate and checkpoint (at the interval, and at the end)
                finished = s.step >= cfg.max_iters or (cfg.max_time and s.elapsed >= cfg.max_time)
                if (s.step % cfg.eval_interval == 0 or finished) and not s.evaluated:
                    last_val = self.evaluate_and_save(lr)
                if finished:
                    reason = "max_time" if s.step < cfg.max_iters else reason
                    break
                for group in self.optimizer.param_groups:
                    group["lr"] = lr

                # 2. forward/backward, accumulating gradients over micro-batches
                loss_sum = torch.zeros((), device=self.device)
                for micro in range(cfg.grad_accum):
                    x, y = self.batches.get("train", self.data_gen)
                    sync = micro == cfg.grad_accum - 1  # DDP: all-reduce gradients on the last micro-step only
                    with model.no_sync() if self.dist.enabled and not sync else nullcontext():  # enter once
                        with autocast(self.device, self.dtype):
                            _, loss = model(x, y)
                        self.scaler.scale(loss / cfg.grad_accum).backward()
                    loss_sum += loss.detach()
                loss_step = loss_sum / cfg.grad_accum

                # 3. agree across ranks on the loss being finite, on stopping, and on the clock
                # (ranks only ever act on the all-reduced clock, so they can never disagree about stopping; a
                # signal to any rank stops all, and the highest signal number is the exit status of every rank)
                local_elapsed = elapsed_before + time.perf_counter() - session_start
                if not self.dist.enabled:
                    s.elapsed = local_elapsed
                nonfinite, stop_now, log_now = False, 0, s.step % 10 == 0
                if sync_every_step or log_now:
                    loss_value = loss_step.item()  # the step's one host sync (on a GPU only every 10 steps)
                    flags = torch.tensor([float(not math.isfinite(loss_value)), float(stop.signum or 0),
                                          local_elapsed], dtype=torch.float64)
                    if self.dist.enabled:
                        flags = flags.to(self.device)
                        torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
                        flags = flags.cpu()
                    nonfinite, stop_now, s.elapsed = bool(flags[0]), int(flags[1]), float(flags[2])
                if nonfinite:
                    self.optimizer.zero_grad(set_to_none=True)
                    if not cfg.skip_nonfinite:
                        bar.close()
                        raise ChargptError(
                            f"loss became {loss_value} at step {s.step} (learning rate {lr:.2e}): training "
                            f"diverged, most likely because the learning rate is too high; lower --learning-rate "
                            f"or pass --skip-nonfinite. The last good checkpoint in {self.out_dir} is kept.")
                    s.skipped += 1
                    self.log(f"step {s.step}: non-finite loss, step skipped ({s.skipped} so far)")
                else:
                    # 4. step
                    if cfg.grad_clip > 0:
                        self.scaler.unscale_(self.optimizer)
                        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                    self.scaler.step(self.optimizer)
                    self.scaler.update()
                    self.optimizer.zero_grad(set_to_none=True)
                s.step += 1
                s.evaluated = False

                # 5. log
                if log_now:
                    now = time.perf_counter()
                    speed = (s.step - step_last) * self.chars_per_step / max(now - t_last, 1e-9)
                    t_last, step_last = now, s.step
                    post = {"loss": f"{loss_value:.4f}", "val": f"{last_val:.4f}" if last_val else "-",
                            "lr": f"{lr:.2e}", "chars/s": f"{speed:,.0f}"}
                    if cfg.max_time:
                        post["left"] = f"{max(0, cfg.max_time - s.elapsed):.0f}s"
                    bar.set_postfix(post, refresh=False)
                bar.update(1)
                if stop_now:
                    reason = "signal"
                    break
        bar.close()
        if reason == "signal":
            self.save(None, False)
        if self.dist.enabled:
            # no rank leaves before rank 0's files are complete: the caller (or a --resume) may read them next, and
            # torchrun stops the remaining workers, mid-save, as soon as one of them exits with an error status
            torch.distributed.barrier()
        if reason == "signal":
            where = self.out_dir
            how = "the same torchrun command (any number of processes) plus" if self.dist.enabled else \
                "python train.py"
            raise Interrupted(f"interrupted at step {s.step}; saved the run to {where}. Resume with: "
                              f"{how} --out-dir {where} --resume", stop_now)
        return {"out_dir": str(self.out_dir), "step": s.step, "best_val_loss": s.best_val, "val_loss": last_val,
                "elapsed_s": s.elapsed, "eval_fraction": s.eval_time / max(s.elapsed, 1e-9), "stopped_by": reason}


def _json_step(line):
    """The step of a metrics line; infinity for a line that does not parse (cut short by a kill), so that
    resuming drops it."""
    import json
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return math.inf


class _SignalFlag:
    """SIGINT/SIGTERM set a flag the loop checks after each step (so the step finishes and a save follows);
    a second SIGINT while saving falls back to the default and stops at once: atomic writes keep the old files."""

    def __init__(self):
        self.requested, self.signum, self.old = False, None, {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def __enter__(self):
        try:
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.old[sig] = signal.signal(sig, self._handle)
        except ValueError:  # not the main thread: signals stay as they are
            pass
        return self

    def __exit__(self, *exc):
        for sig, handler in self.old.items():
            signal.signal(sig, handler)


def train(log=tqdm.write, **overrides):
    """Train a CharGPT. Keyword arguments are the CLI's flags with underscores (data=..., max_iters=...);
    anything not given takes its default (hardware-dependent ones from config.PRESETS). -> summary dict."""
    trainer = Trainer(overrides, log=log)
    try:
        summary = trainer.run()
        trainer.log(f"done: {summary['step']} steps in {summary['elapsed_s']:.0f} s ({summary['eval_fraction']:.0%} of "
                    f"it evaluating), best val loss {summary['best_val_loss']:.4f}; run saved in {trainer.out_dir}")
        if trainer.cfg.sample_chars and trainer.dist.is_main:
            from .sampling import Generator
            gen = Generator(trainer.model, trainer.corpus.vocab, trainer.device)
            text = gen.generate("", max_new_tokens=trainer.cfg.sample_chars, seed=trainer.cfg.seed)[0]
            trainer.model.train()
            log(f"\n--- sample from {trainer.out_dir} ({trainer.cfg.sample_chars} characters, temperature 0.8) "
                f"---\n{text}\n---\nmore with: python sample.py --checkpoint {trainer.out_dir} --prompt \"...\"")
        return summary
    finally:
        if trainer.dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
