"""Saving a run and restoring it: the files --resume continues from and the checkpoints people sample from.

    state.safetensors   weights, optimizer moments, random streams and the run's state: an exact --resume
    latest.safetensors  the weights as of the last save
    best.safetensors    the weights with the best validation loss so far

Each file is written atomically (a temporary file renamed over the old one), so a kill at any moment leaves the
previous complete file. Under DDP every rank calls save (it gathers the ranks' random streams), rank 0 writes.
"""

from dataclasses import asdict

from chargpt.config.settings import config_toml
from chargpt.errors import CheckpointError
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir
from chargpt.runs.rundir import CONFIG, LOSSES, METRICS, SAMPLES, STATE
from chargpt.runtime import gather_rng_state, restore_rng_state


class Checkpointer:
    """Saves one run into `out_dir`. `about`: metadata that stays the same through the run (its corpus, hardware,
    lineage, ...), written with every checkpoint beside the state of the moment."""

    def __init__(self, out_dir, dist, model, optimizer, scaler, data_gen, device, vocab, mcfg, cfg, about):
        self.out_dir, self.dist, self.device, self.vocab = out_dir, dist, device, vocab
        self.model, self.optimizer, self.scaler, self.data_gen = model, optimizer, scaler, data_gen
        self.mcfg, self.cfg, self.about = mcfg, cfg, about
        self.config_saved = False

    def save(self, state, val_loss=None, improved=False, final=False):
        """state and latest at every save (with --save-state end only when training stops: `final`), best when
        `improved`. config.toml goes with the first save of a session, so a failed start leaves no file."""
        full = final or self.cfg.save_state == "eval"
        rng = gather_rng_state(self.data_gen, self.device, self.dist) if full else None
        if not self.dist.is_main or not (full or improved):
            return
        extra = dict(step=state.step, val_loss=val_loss,
                     best_val_loss=state.best_val if state.best_val < float("inf") else None,
                     run_state=asdict(state), **self.about)
        if self.scaler.is_enabled():  # fp16 loss scale: part of exact resume
            extra["scaler"] = self.scaler.state_dict()
        if not self.config_saved:
            rundir.write_text_atomic(self.out_dir / CONFIG, config_toml(self.mcfg, self.cfg))
            self.config_saved = True
        weights = ckpt.model_tensors(self.model)  # one device-to-host copy serves all three files
        if full:
            ckpt.save_state(self.out_dir / STATE, self.model, self.optimizer, rng, self.vocab, self.cfg,
                            weights=weights, **extra)
            ckpt.save_model(self.out_dir / rundir.LATEST, self.model, self.vocab, self.cfg, weights=weights,
                            **extra)
        if improved:
            ckpt.save_model(self.out_dir / rundir.BEST, self.model, self.vocab, self.cfg, weights=weights, **extra)


def restore(out_dir, meta, model, optimizer, scaler, data_gen, device, dist, seed, step):
    """Weights, moments, random streams and loss scale from out_dir's state.safetensors (meta: its metadata); lines
    of the run's .jsonl files past its step (written by a run killed between a line and its save) are dropped, to
    be written again."""
    state_path = out_dir / STATE
    _, rng = ckpt.load_state(state_path, model, optimizer)
    restore_rng_state(rng, data_gen, device, dist, seed + step)
    saved_scaler = meta.get("scaler")
    if scaler.is_enabled() and isinstance(saved_scaler, dict):
        try:
            scaler.load_state_dict(saved_scaler)
        except (KeyError, TypeError, ValueError, RuntimeError):
            raise CheckpointError(f"{state_path} has a corrupted loss-scaler state; re-train or re-copy it") from None
    if dist.is_main:
        rundir.remove_stale_temps(out_dir)  # left by a run that was killed while saving
        for log in (METRICS, SAMPLES, LOSSES):
            rundir.truncate_metrics(out_dir / log, step)
