"""train(): start a run (training/start.py), then the loop that trains it (Trainer), then a closing sample.

    python train.py --data corpus.txt          # the CLI; or from Python:
    chargpt.train(data="corpus.txt", max_iters=500)
    chargpt.train(data="pairs.tsv", task="pairs", arch="encoder-decoder")      # sentence pairs (chargpt.data.pairs)

The Trainer is the loop and only the loop: it reads top to bottom, phase by phase in nanoGPT's order: evaluate and
save (when the validator says so, and at the end), forward/backward (with gradient accumulation), agree across
ranks on whether the loss was finite and whether to stop, step, progress, and now and then a sample. Each phase
calls a part of chargpt/training/ with explicit arguments; what a run is made of comes in one object, the Run
(start.py), and records leave through the run's sinks (sinks.py). Under torchrun every rank runs the loop; all
decisions to stop (the budget, --patience, a signal) are taken together.
"""

import math
import shutil
import time
from contextlib import nullcontext

import torch
from tqdm import tqdm

from chargpt.errors import ChargptError, Interrupted
from chargpt.runtime import autocast
from chargpt.training.budget import Overhead, Resize, end_seconds
from chargpt.training.describe import brief_lines, start_lines
from chargpt.training.interrupt import Aborted, SignalFlag, StopRequested
from chargpt.training.progress import Progress
from chargpt.training.schedules import finished, lr_at, training_seconds
from chargpt.training.start import Run, start_run
from chargpt.training.validate import eval_line, eval_record, model_inputs

NO_BAD_STEP = 2**62  # Trainer.first_bad while every loss so far was finite


class Trainer:
    """Trains one Run until its budget is spent, --patience ends it, or a signal stops it (then saved)."""

    def __init__(self, run: Run, started=None):
        """started: time.perf_counter() when the command began: its --max-time is wall time from then (Overhead)."""
        self.run, self.cfg, self.state = run, run.cfg, run.state
        params = sum(p.numel() for p in run.model.parameters())
        self.overhead = Overhead(run.state, started, end_seconds(run.cfg, params), run.dist) if run.cfg.max_time \
            else None
        self.profiler = None  # a torch.profiler.profile: the loop labels its phases and steps it (chargpt.bench)
        self.signals = SignalFlag(say=run.log, distributed=run.dist.enabled)
        self.validator, self.samples = run.validator, run.samples
        self.last_val, self.last_scores = None, {}  # of the last evaluation (scores: exact match, chrF of pairs)

    def train(self):
        """Train until the budget is spent or a signal arrives (_loop), then save and sum up (_finish) -> summary
        dict. The signal handlers stay in place until the final save is written: a signal never cuts it short."""
        run, s = self.run, self.state
        self.progress = Progress.of(run)  # with run.budget's Pace: the speed trained at, against the probe's
        self.first_bad = torch.tensor(NO_BAD_STEP, device=run.device)  # first step with a non-finite loss
        self.bad_loss = torch.zeros((), device=run.device)  # its loss
        self.lrs = {}  # step -> learning rate, since the last sync (to name the rate of a bad step)
        try:
            with self.signals:
                try:
                    try:
                        reason, signum = self._loop()
                    finally:
                        self.progress.close()  # cleared on any exit, so an error line starts clean
                    return self._finish(reason, signum)
                except Aborted as e:
                    what = "during the save" if e.during == "save" else f"during a {e.during}, without saving"
                    raise Interrupted(f"stopped {what} at step {s.step}; {run.out_dir} keeps the last complete save",
                                      e.signum, out_dir=run.out_dir, distributed=run.dist.enabled, saved=False) \
                        from None
        finally:
            run.sinks.close()
            run.release()

    def _loop(self):
        """The steps, until the budget is spent or a signal arrives; -> (why it stopped, signal number or 0)."""
        s, cfg, signum = self.state, self.cfg, 0
        while True:
            lr = lr_at(s.step, s.elapsed, cfg, s)
            reason = finished(cfg, s)
            if (self.validator.due(s.step, s.elapsed) or reason) and not s.evaluated:
                with self._phase("1 evaluate and save"):  # at the interval, by the clock, and at the end
                    try:
                        self._evaluate_and_save(lr, final=bool(reason))
                    except StopRequested:  # a signal during the evaluation: save the run as it is
                        return "signal", self.signals.signum
                reason = finished(cfg, s)  # --patience: this evaluation may end the run
            if reason:
                return reason, signum
            with self._threads():  # a CPU's step at the thread count measured fastest (chargpt/threads.py)
                with self._phase("2 forward and backward"):  # accumulated over micro-batches
                    loss = self._forward_backward()
                with self._phase("3 agree"):  # across ranks: loss finite? stop? clock?
                    bad_step, signum = self._agree(loss, lr)
                with self._phase("4 optimizer step"):  # or drop a non-finite step
                    self._step(bad_step, lr)
            with self._phase("5 progress"):
                left = training_seconds(cfg, s) - (s.elapsed - s.budget_elapsed) if cfg.max_time else None
                record = self.progress.step(s.step, loss, lr, s.elapsed, self.last_val, left)
                if record is not None:
                    self.run.sinks.write("train", record)
            if cfg.sample_every and s.step % cfg.sample_every == 0 and self.run.dist.is_main:
                self.progress.pause(self.samples.write(s.step))  # 6. now and then, the model in its own words
            if self.profiler is not None:
                self.profiler.step()
            if signum:
                return "signal", signum

    def _threads(self):
        return self.run.tuner.step() if self.run.tuner is not None else nullcontext()

    def _phase(self, name):
        """A labelled span for torch.profiler (`python -m chargpt.bench profile` sets self.profiler); else nothing."""
        return torch.profiler.record_function(name) if self.profiler is not None else nullcontext()

    def _forward_backward(self):
        """Gradients of one optimizer step over grad_accum micro-batches; -> their mean loss (on the device).
        With one micro-batch no averaging op is issued: small models are bound by per-op overhead."""
        run, cfg, model, copies = self.run, self.cfg, self.run.wrapped.train_model, self.run.wrapped.copies
        t0, loss_sum = time.perf_counter() if self.progress.first_step_s is None else None, None
        if copies is not None:
            copies.refresh()  # the bf16 weights, once per step
        for micro in range(cfg.grad_accum):
            with self._phase("2a batch"):
                batch = model_inputs(run.batches.get("train", run.data_gen))
            last = micro == cfg.grad_accum - 1  # DDP: all-reduce gradients on the last micro-batch only
            with model.no_sync() if run.dist.enabled and not last else nullcontext():  # enter once
                with autocast(run.device, run.dtype):
                    kw = dict(batch, label_smoothing=cfg.label_smoothing)
                    _, loss = model(**kw) if copies is None else copies.forward(model, kw)
                run.scaler.scale(loss / cfg.grad_accum if cfg.grad_accum > 1 else loss).backward()
                if copies is not None:
                    copies.grads_to_flat()
            loss_sum = loss.detach() if loss_sum is None else loss_sum + loss.detach()
        if t0 is not None:  # the session's first step: with torch.compile, the compilation
            if run.device.type == "cuda":
                torch.cuda.synchronize(run.device)
            self.progress.first_step(time.perf_counter() - t0)
            if run.wrapped.compiled:
                run.log(f"torch.compile: the first step took {self.progress.first_step_s:.1f} s (compiling)")
        return loss_sum / cfg.grad_accum if cfg.grad_accum > 1 else loss_sum

    def _agree(self, loss, lr):
        """-> (first step whose loss was not finite, or None; signal number or 0), agreed by all ranks.

        Reading them costs a host sync, so on a GPU it happens every sync_every steps, and on the step before
        an evaluation or the end; in between the first non-finite loss is remembered on the device. Ranks
        act only on the all-reduced clock, so they never disagree about stopping; a signal to any rank stops
        all, and the highest signal number is every rank's exit status."""
        s, dist = self.state, self.run.dist
        self.lrs[s.step] = lr
        if self.run.wrapped.sync_every == 1:  # read every step (free on a CPU): no device-side bookkeeping needed
            value = loss.item()
            first_bad, self.bad_value = (s.step, value) if not math.isfinite(value) else (NO_BAD_STEP, None)
        else:
            fresh = ~torch.isfinite(loss) & (self.first_bad == NO_BAD_STEP)
            self.first_bad = torch.where(fresh, s.step, self.first_bad)
            self.bad_loss = torch.where(fresh, loss, self.bad_loss)
            ahead = s.step + 1
            if s.step % self.run.wrapped.sync_every and ahead % self.cfg.eval_interval and ahead < self.cfg.max_iters:
                return None, 0
            first_bad = self.first_bad.item()  # note: the host sync
            self.bad_value = None
        elapsed = self.progress.clock()
        if not dist.enabled:  # nothing to agree on: no tensor round trip
            s.elapsed = elapsed
            if first_bad != NO_BAD_STEP and self.bad_value is None:
                self.bad_value = self.bad_loss.item()
            return (None if first_bad == NO_BAD_STEP else first_bad), int(self.signals.signum or 0)
        # all MAX-reduced: -(first bad step) so that the earliest wins; -inf when every loss was finite
        flags = torch.tensor([-first_bad if first_bad != NO_BAD_STEP else -math.inf,
                              float(self.signals.signum or 0), elapsed], dtype=torch.float64).to(dist.device)
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
        s, cfg, optimizer, scaler = self.state, self.cfg, self.run.optimizer, self.run.scaler
        if bad_step is not None:
            optimizer.zero_grad()
            if not cfg.skip_nonfinite:
                raise ChargptError(
                    f"loss became {self.bad_value} at step {bad_step} (learning rate {self.lrs.get(bad_step, lr):.2e})"
                    f": training diverged, most likely because the learning rate is too high; lower --learning-rate "
                    f"or pass --skip-nonfinite. The last good checkpoint in {self.run.out_dir} is kept.")
            s.skipped += 1
            self.first_bad.fill_(NO_BAD_STEP)
            self.run.log(f"step {s.step}: non-finite loss, step skipped ({s.skipped} so far)")
        else:
            parts = optimizer.parts.values()  # AdamW, and Muon with --optimizer muon
            for group in optimizer.param_groups:
                group["lr"] = lr * group["lr_scale"]  # one schedule for all: Muon's peak is --muon-lr
            if cfg.grad_clip > 0:
                for part in parts:
                    scaler.unscale_(part)
                optimizer.clip_grad_norm_(cfg.grad_clip)  # one norm over the flat gradient buffer
            for part in parts:
                scaler.step(part)
            scaler.update()
            optimizer.zero_grad()
        if s.step % self.run.wrapped.sync_every == 0:
            self.lrs.clear()
        s.step += 1
        s.evaluated = False

    def _evaluate_and_save(self, lr, final=False):
        """Evaluate, write the "eval" record, then save (the line first: a kill between the two leaves a line that
        --resume drops, never a saved step whose line is missing). A signal abandons the evaluation."""
        run, s, t0 = self.run, self.state, time.perf_counter()
        with self.signals.doing("evaluation"):
            losses = self.validator.evaluate(s.step, lr, self.signals.check)
            self.last_scores = run.task.scores(run.model, run.corpus, run.dtype, run.log, self.signals.check) \
                if run.dist.is_main else {}
        improved = s.evaluated_at(losses["val"])
        run.sinks.write("eval", eval_record(s.step, losses, lr, s.elapsed, self.last_scores, run.bytes_per_char))
        s.eval_time += time.perf_counter() - t0
        if not run.dist.enabled:  # the clock, read after the evaluation, saved with it (under torchrun the
            s.elapsed = self.progress.clock()  # ranks agree it, in _agree)
        self.validator.evaluated(s.step, s.elapsed)
        with self.signals.doing("save"):
            run.checkpointer.save(s, losses["val"], improved, final)
        run.log(eval_line(s.step, losses, improved, self.last_scores, len(getattr(run.task, "eval_rows", ())),
                          run.bytes_per_char))
        self.last_val = losses["val"]
        self.progress.pause(time.perf_counter() - t0)
        if self.overhead is not None:  # the last evaluation and save will take about as long
            self.overhead.update(time.perf_counter() - t0)

    def _finish(self, reason, signum):
        run, s = self.run, self.state
        # the clock as of now: s.elapsed was last read at the last step, before the final evaluation (whose time
        # is in eval_time), so a share of it would otherwise pass 100%
        elapsed = max(s.elapsed, self.progress.clock())
        speed = self.progress.session_speed(s.step)
        with self.signals.doing("save"):
            if reason == "signal":
                run.checkpointer.save(s, None, False, final=True)
            if reason == "patience":
                run.log(f"stopped early at step {s.step}: no improvement in {self.cfg.patience} evaluations (best "
                        f"val loss {s.best_val:.4f})")
                if self.cfg.save_state == "end":  # the evaluation that ended the run did not know it was the last
                    run.checkpointer.save(s, self.last_val, False, final=True)
        if run.dist.is_main and self.cfg.curves:
            from chargpt.runs.plot import maybe_write_curves
            maybe_write_curves(run.out_dir, run.log)
        if run.dist.enabled:
            # no rank leaves before rank 0's files are complete: the caller (or a --resume) may read them next, and
            # torchrun stops the remaining workers, mid-save, as soon as one of them exits with an error status
            torch.distributed.barrier()
        if reason == "signal":
            raise Interrupted(f"interrupted at step {s.step}; saved the run to {run.out_dir}", signum,
                              out_dir=run.out_dir, distributed=run.dist.enabled)
        return {"out_dir": str(run.out_dir), "step": s.step, "best_val_loss": s.best_val, "val_loss": self.last_val,
                "elapsed_s": elapsed, "eval_fraction": min(1.0, s.eval_time / max(elapsed, 1e-9)),
                "stopped_by": reason, "stopped_early": reason == "patience", "chars_per_step": run.chars_per_step,
                "chars_per_s": speed, "mfu": self.progress.session_mfu(s.step),
                "first_step_s": self.progress.first_step_s, "compiled": run.wrapped.compiled,
                "task": run.task.name, **self.last_scores}


def closing_sample(run: Run):
    """What training shows when it ends: a sample of text, or for pairs a few greedy validation translations."""
    return run.task.closing_sample(run.model, run.corpus, run.cfg, run.dtype, run.device, run.out_dir)


def train(log=tqdm.write, sinks=(), started=None, **overrides):
    """Train a model (CharGPT, or with arch='encoder-decoder' the 2017 Transformer). Keyword arguments are the
    CLI's flags with underscores (data=..., max_iters=..., preset="tiny", config="run.toml"); anything not given
    comes from the config file, else the preset (by default the device's), else the dataclass default:
    chargpt/config/settings.py. `sinks`: loggers that receive the run's records beside its own files
    (chargpt/training/sinks.py). --max-time is wall time from `started` (time.perf_counter() when the command began;
    default: now) to the saved run and its closing sample. -> summary dict."""
    run, threads, started = None, torch.get_num_threads(), started or time.perf_counter()
    try:
        again = None  # why the run started again, for the new run's train.log
        for attempt in range(2):
            # a run --preset auto sized while the machine was busy may start again once, sized for the speed it
            # then trains at (budget.Pace): in the folder it made, emptied (start.py allows it only there)
            run = start_run(overrides, log=log, sinks=sinks, resizable=attempt == 0 and not sinks)
            try:
                if again:  # said when it happened; kept in the new run's log too
                    run.log(again, show=False)
                full = start_lines(run)
                for line in full:
                    run.log(line, show=run.cfg.verbose)  # all of them in train.log
                if not run.cfg.verbose and run.dist.is_main:
                    for line in brief_lines(run, full):
                        log(line)
            except BaseException:
                run.release()
                raise
            try:
                summary = Trainer(run, started).train()
                break
            except Resize as e:
                again = str(e)
                log(again)
                shutil.rmtree(run.out_dir, ignore_errors=True)
        early = f" (stopped early: no improvement in {run.cfg.patience} evaluations)" if summary["stopped_early"] \
            else ""
        run.log(f"done: {summary['step']} steps{early} in {summary['elapsed_s']:.0f} s "
                f"({summary['eval_fraction']:.0%} of it evaluating"
                + (f", MFU {summary['mfu']:.1%}" if summary.get("mfu") is not None else "")
                + f"), best val loss {summary['best_val_loss']:.4f}; run saved in {run.out_dir}")
        if run.cfg.sample_chars and run.dist.is_main:
            run.log(closing_sample(run))
        return summary
    finally:
        if run is not None and run.dist.enabled and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        # --threads is the run's: a program that trains in its own process (a notebook, the tests) gets its own back
        torch.set_num_threads(threads)
