"""What a training run says when it starts: pure functions of the Run that start_run built.

start_lines(run), in full, in order: the corpus, the device and numerics, where each setting came from (and what
--preset auto chose), the model, the batch and the run directory, the peak MFU is measured against, which text
validates, the budget and the evaluation cadence, then notes (what a --resume or --init-from changed). They always go
to the run's train.log, and to the terminal with --verbose.

brief_lines(run), what the terminal shows by default: the corpus, the model and why it is that size, the budget,
where the run goes; then every warning and note of the full lines, which are never left out.
"""

from chargpt.config.architecture import describe_model
from chargpt.config.settings import HARDWARE
from chargpt.runs.checkpoint import run_settings
from chargpt.runs.plot import curves_note
from chargpt.runs.rundir import LOG
from chargpt.training import init_from
from chargpt.training.mfu import Utilisation
from chargpt.training.optim import describe_numerics
from chargpt.training.schedules import describe_budget, seconds
from chargpt.training.validate import EVALS_PER_BUDGET, PASSES_PER_EVAL

FAST_STEP_S = 0.01  # about the fastest CPU step: a passes cadence of more steps than a period holds is not said


def start_lines(run):
    cfg, mcfg, corpus, task, dist, origin = run.cfg, run.mcfg, run.corpus, run.task, run.dist, run.origin
    lines = [f"corpus: {corpus.name} — {task.describe_corpus(corpus)}, {run.distinct:,} distinct"
             + (" (built-in default: the Python help topics from pydoc_data; pass --data FILE for your own text)"
                if cfg.data is None else f" ({cfg.data})"),
             f"device: {run.device}, {run.dtype_reason}" + (f", threads {run.tuner.choice()}" if run.tuner else "")
             + (f", {dist.world_size} processes" if dist.enabled else "") + f"; {run.wrapped.compile_reason}",
             describe_numerics(run.dtype, cfg.optimizer, copies=run.wrapped.copies is not None),
             *run.settings.describe(), *run.sizing_lines]
    if cfg.optimizer == "muon":
        lines.append(f"optimizer: Muon (lr {cfg.muon_lr:g}, momentum {cfg.muon_momentum:g}) for the block matrices, "
                     f"AdamW (lr {cfg.learning_rate:g}) for the rest; {cfg.lr_schedule} schedule")
    lines.append(model_line(run))
    notes = notes_of(run)
    global_batch = cfg.batch_size * cfg.grad_accum * dist.world_size
    lines.append(f"global batch: {cfg.batch_size} x {cfg.grad_accum} accum x {dist.world_size} proc = {global_batch} "
                 f"{task.describe_examples(mcfg)} = {run.chars_per_step:,.0f} chars/step; run dir: {run.out_dir}")
    if (mfu := Utilisation.of(run)) is not None:  # the peak MFU is against, and how it was found (a CPU: measured)
        lines.append(mfu.line())
    if dist.is_main:  # which text validates (and what only it holds): a pass over the corpus, once
        known = origin.base.vocab.stoi if origin.base is not None else ()  # what the base run already learned
        lines += task.describe_split(corpus, cfg, known)
    if not any(note.startswith("new budget") for note in notes):
        default = origin.meta is None and str(run.settings.source("max_time")).startswith("preset ")
        lines.append(f"budget: {describe_budget(cfg, run.state)}" + (f" (the default of --preset {cfg.preset}; "
                     f"--max-time SECONDS or --max-iters N for another)" if default else ""))
    lines += run.budget.lines  # a warm-up or decay the budget cannot reach (training/budget.py)
    period, steps, every = run.validator.period, run.validator.steps, run.validator.passes  # period None: by steps
    passes = (f", and after {PASSES_PER_EVAL} passes over the training text ({every:,} steps) where "
              f"evaluation's share of the budget allows, so a small text's best checkpoint is not missed"
              if every and every * FAST_STEP_S < period else "")
    if period and steps:
        lines.append(f"evaluating every {steps:,} steps or {seconds(period)} of training, whichever "
                     f"comes first (1/{EVALS_PER_BUDGET} of the budget){passes}; --eval-interval N to evaluate every "
                     f"N steps instead")
    elif period:
        lines.append(f"evaluating every {period:.3g} s of training (1/{EVALS_PER_BUDGET} of --max-time)"
                     f"{passes}; --eval-interval N to evaluate every N steps instead")
    if cfg.curves and dist.is_main and (note := curves_note()):  # without matplotlib: said once, not silence
        lines.append(note)
    return lines + notes


def model_line(run):
    """The model, and where its weights start: fresh, another run's (--init-from), or this run's (--resume)."""
    origin, s = run.origin, run.state
    model = f"model: {describe_model(run.mcfg)}, {run.model.num_params() / 1e6:.2f}M parameters"
    if origin.base is not None:
        return f"starting from {init_from.describe_lineage(origin.lineage)}; {model}; fresh optimizer and schedule"
    if origin.meta is None:
        return model
    best = f"best val loss {s.best_val:.4f}" if s.best_val < float("inf") else "not evaluated yet"
    return f"resuming {run.out_dir} at step {s.step} ({best}); {model}"


def notes_of(run):
    """What a --resume or --init-from changed, and a resumed run's hardware and dropout changes."""
    notes = list(run.origin.notes)
    if run.origin.meta is not None:
        notes += changes_since(run.origin.meta, run.hardware(), run.cfg, run.mcfg)
    return notes


def brief_lines(run, full=None):
    """The start-up a person reads (module docstring); the rest is in train.log and with --verbose. full: the
    start_lines already made (they read the corpus once)."""
    cfg, full = run.cfg, full if full is not None else start_lines(run)
    why = (" (sized by --preset auto for this corpus, budget and machine)" if run.sizing_lines and cfg.preset == "auto"
           else f" (--preset {cfg.preset})" if run.origin.meta is None and run.origin.base is None else "")
    budget = [line for line in full if line.startswith("budget: ")]
    log = run.out_dir / LOG
    lines = [full[0], model_line(run) + why, *budget,
             f"run: {run.out_dir} (every start-up line is in {log}; --verbose shows them here)"]
    kept = ("warning: ", "note: ", "labels: ", "items: ")  # what a list or labelled texts became is always shown
    return lines + [line for line in full if line.startswith(kept)] + notes_of(run)


def changes_since(meta, now, cfg, mcfg):
    """Lines saying how this session differs from the checkpoint (meta): hardware (`now`: Run.hardware()), and
    dropout."""
    saved = meta.get("hardware")
    if not isinstance(saved, dict):  # written before hardware was recorded: compare the flags
        settings = run_settings(meta)
        saved = {k: getattr(settings, k) for k in HARDWARE} if settings else {}
        now = {k: getattr(cfg, k) for k in HARDWARE}
    changed = [f"{k} {now[k]} (checkpoint: {saved[k]})" for k in HARDWARE if k in saved and saved[k] != now[k]]
    notes = [f"hardware as this command sets it: {', '.join(changed)}"] if changed else []
    if meta["model_config"].dropout != mcfg.dropout:
        notes.append(f"dropout {mcfg.dropout} (checkpoint: {meta['model_config'].dropout}) from here on")
    return notes
