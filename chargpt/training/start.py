"""Start-up: everything a training run is made of, built in one call before the first step.

    run = start_run({"data": "corpus.txt", "max_iters": 500}, log=print)
    Trainer(run).train()

In order: the settings (defaults <- preset <- config file <- flags, chargpt/config/settings.py), the run directory
(claimed and locked by rank 0), where the run starts from (Origin: a new run, its own last save with --resume, or
another run's weights with --init-from), the corpus (encoded once and cached; in the run's vocabulary), the size
of the model (--preset auto measures this machine: chargpt/training/sizing.py), the batches, the model and its
optimizer, the saved state restored, and the model as the loop calls it (compiled, wrapped for DDP). A start that fails
leaves no lock and no empty run directory behind. What start-up says is describe.start_lines(run).
"""

import json
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from chargpt import errors
from chargpt.config import ModelConfig, TrainConfig, check_task, split_overrides
from chargpt.config.flags import param, spelled
from chargpt.config.settings import FLAGS, HARDWARE, Settings, init_settings, new_run_settings, resume_settings
from chargpt.data.corpus import corpus_sources, share_compile_cache
from chargpt.data.pairs import NoTab
from chargpt.data.tokenizer import MAX_CODEPOINT, describe_chars
from chargpt.errors import ChargptError, CheckpointError, ConfigError
from chargpt.model.adaptive import char_counts, shortlist_for
from chargpt.model.transformer import build_model, check_model_fits, estimated_params
from chargpt.runs import checkpoint as ckpt
from chargpt.runs import rundir
from chargpt.runs.rundir import METRICS, STATE
from chargpt.runtime import (
    Dist,
    broadcast_str,
    configure_threads,
    ddp,
    device_memory,
    enable_fast_math,
    init_distributed,
    pick_compile,
    pick_device,
    pick_dtype,
    stream_seed,
)
from chargpt.threads import ThreadTuner
from chargpt.training import init_from, sizing, trackers
from chargpt.training.budget import Budget
from chargpt.training.budget import fit as fit_budget
from chargpt.training.checkpointer import Checkpointer, restore
from chargpt.training.optim import low_precision_copies, make_optimizer
from chargpt.training.overfit import OverfitWatch, history_of
from chargpt.training.samples import NoveltyScorer, Samples
from chargpt.training.sinks import LogFile, RunStatus, Sinks, make_sinks
from chargpt.training.state import RunState, resumed_state
from chargpt.training.tasks import make_task
from chargpt.training.validate import Validator, eval_period, eval_steps, pass_steps, per_byte

GPU_SYNC_EVERY = 10  # steps between the host syncs that read the stop flags on a GPU (every step on a CPU)


@dataclass
class Origin:
    """Where a run starts from: nothing (a new run), its own last save (--resume: `meta` is its state.safetensors'
    metadata) or another run's weights (--init-from: `base`). The three differ here and nowhere else."""
    model_kw: dict  # the model's fields but the vocabulary size
    cfg: TrainConfig
    state: RunState
    notes: list = field(default_factory=list)  # lines for the start-up log: what differs from the saved run
    meta: dict | None = None
    base: init_from.Base | None = None
    lineage: dict | None = None  # what checkpoints record of the run this one started from
    pairs_from_base: bool = False  # --init-from: --task pairs came from the base, not from the user

    def in_run_vocab(self, corpus, log):
        """The corpus in the vocabulary the run trains in: a run started from another trains in the base's
        vocabulary extended by the corpus's new characters (on --resume, the one its checkpoint holds), the
        corpus's ids remapped into it (chargpt/training/init_from.py)."""
        if self.base is not None:
            vocab = self.base.vocab.extended(corpus.vocab)
            self.lineage = init_from.lineage(self.base, vocab)
            self.notes.insert(0, init_from.describe_added(vocab, self.lineage["base_vocab_size"]))
        elif self.meta is not None and (vocab := init_from.run_vocab(self.meta, corpus.vocab)) is not None:
            self.lineage = init_from.read_lineage(self.meta)
        else:
            return corpus
        return init_from.in_vocab(corpus, vocab, log=log)

    def load_base(self, model):
        """A run started from another: its weights over the freshly built ones (new characters keep their fresh
        rows), and the base's memory handed back."""
        if self.base is not None:
            init_from.load_base_weights(model, self.base)
            self.base.weights = {}


def origin_of(given, settings: Settings, device_type, out_dir):
    """The settings given (merged layers) -> Origin, the run's settings reconciled with what it starts from."""
    if given.get("resume"):
        meta = ckpt.read_meta(out_dir / STATE)[0]
        model_kw, cfg, notes = resume_settings(meta, settings, out_dir)
        state, more = resumed_state(meta, cfg, settings.merged(), out_dir)
        return Origin(model_kw, cfg, state, notes + more, meta=meta)
    if given.get("init_from"):
        base = init_from.read_base(given["init_from"])
        started = init_settings(base.meta, settings, device_type, given["init_from"])
        return Origin(started.model_kw, replace(started.cfg, out_dir=str(out_dir)), RunState(), started.notes,
                      base=base, pairs_from_base=started.task_from_base)
    model_kw, cfg = new_run_settings(settings, device_type)[:2]
    return Origin(model_kw, replace(cfg, out_dir=str(out_dir)), RunState())


@dataclass(frozen=True)
class Wrapped:
    """The model as the training step calls it: compiled and/or wrapped for DDP (wrap)."""
    train_model: torch.nn.Module
    compiled: bool
    compile_reason: str
    sync_every: int  # steps between host reads of the stop flags
    copies: object  # flat.LowPrecisionCopies (the bf16 weights a CPU's forward reads), or None


@dataclass(frozen=True)
class Run:
    """What a training run is made of, built whole by start_run before the first step: the Trainer's one input.
    `model` is the plain module (saved, evaluated, sampled); `wrapped.train_model` is what the training step calls
    (compiled and/or DDP). The parts the loop calls (validator, samples, checkpointer, sinks) come made; what
    changes as it trains is in `state` and in those parts, never in the Run's fields."""
    settings: Settings
    origin: Origin
    dist: Dist
    device: torch.device
    dtype: torch.dtype
    dtype_reason: str
    threads: int | None  # a CPU's torch threads at the start
    tuner: object  # threads.ThreadTuner: the threads of each training step (a CPU), or None
    out_dir: Path
    cfg: TrainConfig
    mcfg: ModelConfig
    state: RunState
    task: object  # tasks.Text or tasks.Pairs
    corpus: object  # data.EncodedCorpus or pairs.EncodedPairs, in the run's vocabulary
    distinct: int  # the corpus's own characters (a run started from another has more in its vocabulary)
    sizing_lines: list
    batches: object
    chars_per_step: float
    model: torch.nn.Module
    optimizer: object  # optim.Optimizers
    scaler: torch.amp.GradScaler
    data_gen: torch.Generator
    wrapped: Wrapped
    bytes_per_char: dict  # {"train": b, "val": b}: UTF-8 bytes per character of each split (bits per byte)
    budget: Budget  # the warm-up, speed and evaluation fitted to a time budget
    validator: Validator  # when to evaluate, and the evaluation
    checkpointer: Checkpointer
    sinks: Sinks
    samples: Samples  # the samples written while training (--sample-every) and at the end
    log: object  # log(line, show=True): a line shown on rank 0 and kept in the run's train.log
    logfile: LogFile
    run_dir: rundir.RunDir | None  # rank 0's lock on out_dir, until release()

    def hardware(self):
        """The hardware settings in effect (saved with each checkpoint, to say on --resume what changed)."""
        return hardware(self.device, self.dtype, self.threads, self.cfg)

    def release(self):
        """Give the run directory up (rank 0): unlock it, and remove it if this start created it and nothing was
        saved in it. Again, it does nothing more."""
        if self.run_dir is not None:
            self.run_dir.release()


def hardware(device, dtype, threads, cfg):
    return dict(zip(HARDWARE, (str(device), str(dtype).removeprefix("torch."), threads, cfg.compile, cfg.attention)))


def start_run(overrides, log=print, sinks=(), resizable=False) -> Run:
    """The keyword arguments of chargpt.train (the flags, with underscores) -> a Run ready to train; `sinks`:
    loggers beside the run's own files (training/sinks.py). Settings are checked before any work. resizable: the
    run may start again, sized for the speed it trains at, if that is far from the probe's (budget.Pace)."""
    model_kw, train_kw = split_overrides(overrides)  # unknown names and wrong types fail before any work
    # before torch's optimizers import dynamo, which points the variable at the temporary folder when it is unset
    share_compile_cache()
    if "vocab_size" in model_kw:
        raise ConfigError("vocab_size is set from the corpus, not by a setting; drop it")
    settings = Settings({**model_kw, **train_kw})  # reads --config: its mistakes too fail before any work
    given = settings.merged()
    dist = init_distributed(given.get("device", "auto"))
    device = pick_device(given.get("device", "auto"))
    claimed = []  # rank 0's RunDir, once claimed
    logfile = LogFile(None, enabled=dist.is_main)  # the run's train.log, once the run directory is known

    def say(message, show=True):
        """A line of the run's log: shown (on rank 0, by `log`) unless show=False, and kept in train.log."""
        if dist.is_main:
            if show:
                log(message)
            logfile.line(message)

    try:
        return _build(settings, given, dist, device, say, claimed, sinks, logfile, resizable)
    except BaseException:
        if claimed:
            claimed[0].release()  # a failed start leaves no lock and no empty run directory behind
        raise


def _build(settings, given, dist, device, log, claimed, extra_sinks, logfile, resizable=False):
    out_dir = claim_run_dir(given, dist, claimed)
    logfile.out_dir = out_dir
    origin = origin_of(given, settings, device.type, out_dir)
    cfg = origin.cfg
    chosen = settings.given()  # what a person chose (a flag, a config file): what start-up fits leaves as it is
    _rank0_decides(lambda: trackers.check(cfg.log_to), dist)  # --log-to's packages, before any work
    sizes = cfg.preset == "auto" and origin.meta is None and origin.base is None  # --preset auto sizes this run
    early = origin.model_kw
    if sizes and "n_head" in chosen and "n_embd" not in chosen:  # auto fits the width to the heads chosen
        early = {**early, "n_embd": sizing.width_for(early["n_embd"], early["n_head"])}
    # the one check of the run's model settings, before the corpus is read (room for any vocabulary: what the
    # corpus's characters decide is checked with them, ModelConfig.with_vocabulary); sizing's choices are its rule's
    check_task(ModelConfig(**early, vocab_size=MAX_CODEPOINT + 1).validate().arch, cfg)
    task = make_task(cfg)
    task.labels_from = origin.meta or (origin.base.meta if origin.base is not None else None)  # --labels: its ids
    dtype, dtype_reason = pick_dtype(cfg.dtype, device)
    enable_fast_math(device)
    threads = configure_threads(cfg.threads, dist.local_world_size) if device.type == "cpu" else None
    # --threads auto (none given, one process on this machine): the count measured fastest, by the probe's first
    # steps and again as the run trains (chargpt/threads.py); else the count given or the machine's share
    tuner = None if threads is None else ThreadTuner.of(
        "auto" if cfg.threads is None and dist.local_world_size == 1 else threads)
    try:
        corpus = encode(task, cfg, origin.model_kw["block_size"], dist, log)
    except NoTab as e:
        if not origin.pairs_from_base:
            raise
        raise NoTab(e.where, e.line, f"the base run {given['init_from']} was trained on sentence pairs, so this run "
                                     f"is {param('task', 'pairs')} (from the base): pass a TSV of source<TAB>target "
                                     f"lines, or start a text run from a text run") from None
    distinct = len(corpus.vocab)
    corpus = origin.in_run_vocab(corpus, log)
    model_kw, counts, softmax_line = adaptive_softmax(origin, corpus, cfg, task, device)
    sizing_lines, step_s, rung = [], None, None
    if sizes:
        model_kw, cfg, sizing_lines, step_s, rung = auto_size(chosen, model_kw, cfg, task, corpus, device, dtype,
                                                              dist, counts, tuner)
    sizing_lines = [*sizing_lines, softmax_line] if softmax_line else sizing_lines
    threads = tuner.best if tuner is not None and tuner.measured else threads
    if origin.meta is not None and cfg.fim and task.fim is not None and "fim" not in origin.meta:
        raise ConfigError(f"--resume: the run in {out_dir} trained without {param('fim')}, so its vocabulary has no "
                          f"fill-in-the-middle markers; teach it in a new run: {param('init_from')} {out_dir} "
                          f"{param('fim')} {cfg.fim:g}")
    if origin.meta is not None and origin.meta["vocab"] != corpus.vocab:
        raise ConfigError(f"--resume: the corpus's vocabulary ({len(corpus.vocab)} characters) differs from "
                          f"the checkpoint's ({len(origin.meta['vocab'])}); resume with the same --data")
    mcfg = ModelConfig(**model_kw).with_vocabulary(len(corpus.vocab))
    check_model_fits(mcfg, *device_memory(device), lambda name: file_setting(settings, name))  # before allocating
    if mcfg.softmax == "adaptive" and cfg.label_smoothing:
        raise ConfigError(f"{param('label_smoothing')} needs {param('softmax', 'full')}: an adaptive softmax scores "
                          f"the rare characters only for the rows whose target is one of them")
    unknown = corpus.vocab.unknown(cfg.sample_prompt or "")
    if unknown:
        raise ConfigError(f"{param('sample_prompt')} has characters the corpus does not: "
                          f"{describe_chars(unknown)}; use characters of the corpus")
    batches = task.batches(corpus, cfg, mcfg, device, log)
    chars_per_step = cfg.batch_size * task.chars_per_example * cfg.grad_accum * dist.world_size
    model, optimizer, scaler, data_gen = build(mcfg, cfg, device, dtype, dist, origin.load_base)
    if counts is not None:  # a new run's adaptive softmax ranks the characters by their use in the text
        model.lm_head.set_frequencies(counts)
    state = origin.state
    if origin.meta is not None:
        restore(out_dir, origin.meta, model, optimizer, scaler, data_gen, device, dist, cfg.seed, state.step)
    wrapped = wrap(model, optimizer, cfg, device, dtype, dist)
    period = eval_period(cfg, "eval_interval" in chosen)  # None: by steps alone
    fresh = origin.meta is None  # a new run fits what the user did not choose
    larger = None  # a run sized here, in a folder of its own, may start again sized for the speed it trains at
    if resizable and rung is not None and step_s and not dist.enabled and not cfg.log_to and claimed and \
            out_dir in claimed[0].created:
        train_chars = int(corpus.length * (1 - cfg.val_fraction))
        larger = lambda step, left: sizing.larger_pays(rung, step, left, train_chars, 1, cfg.grad_accum)  # noqa: E731
    budget = fit_budget(cfg, state, step_s, period, chars_per_step / cfg.grad_accum, log,
                        fit_warmup=fresh and "warmup_iters" not in chosen,
                        fit_iters=fresh and "eval_iters" not in chosen, larger=larger)
    # --fim lays out training windows for fill in the middle; evaluation reads plain text (FimBatches.plain)
    validator = Validator(cfg, state, period, eval_steps(cfg, period, state.budget_step), model,
                          getattr(batches, "plain", batches), device,
                          dtype, dist, budget.eval_fit,
                          passes=pass_steps(period, int(corpus.length * (1 - cfg.val_fraction)), chars_per_step))
    about = dict(corpus=corpus.name, corpus_key=corpus.key, hardware=hardware(device, dtype, threads, cfg),
                 world_size=dist.world_size, chars_per_step=chars_per_step, corpus_chars=corpus.length,  # model cards;
                 closing_prompt=getattr(task, "closing_prompt", None))  # the key: novelty; the playground's prompt
    if getattr(task, "labels", None) is not None:  # --labels: each label's character (chargpt/data/labels.py)
        about["labels"] = task.labels.to_meta()
    if getattr(task, "fim", None) is not None:  # --fim: its four markers (chargpt/data/fim.py)
        about["fim"] = task.fim.to_meta()
    if origin.lineage:  # the run this one started from (--init-from)
        about[init_from.LINEAGE] = origin.lineage
    checkpointer = Checkpointer(out_dir, dist, model, optimizer, scaler, data_gen, device, corpus.vocab, mcfg, cfg,
                                about)
    overfit = OverfitWatch(log, cfg.patience, history_of(out_dir, state.step) if origin.meta and dist.is_main
                           else ())  # says once a run that validation rose as training fell
    status = RunStatus(out_dir, state, chars_per_step, cfg) if dist.is_main else None  # status.json: the watchers'
    sinks = make_sinks(out_dir, dist.is_main, [*extra_sinks, overfit], status)
    novelty = NoveltyScorer(corpus, cfg.val_fraction, getattr(task, "split", None), log)
    samples = Samples(model, corpus.vocab, device, cfg.sample_prompt, cfg.sample_chars, cfg.seed, novelty, sinks, log)
    run = Run(settings=settings, origin=origin, dist=dist, device=device, dtype=dtype, dtype_reason=dtype_reason,
              threads=threads, tuner=tuner, out_dir=out_dir, cfg=cfg, mcfg=mcfg, state=state, task=task, corpus=corpus,
              distinct=distinct, sizing_lines=sizing_lines, batches=batches, chars_per_step=chars_per_step,
              model=model, optimizer=optimizer, scaler=scaler, data_gen=data_gen, wrapped=wrapped,
              bytes_per_char=per_byte(corpus, batches), budget=budget, validator=validator, checkpointer=checkpointer,
              sinks=sinks, samples=samples, log=log, logfile=logfile, run_dir=claimed[0] if claimed else None)
    opened = []  # --log-to's trackers (rank 0's), last: they read the run whole, and join its sinks
    _rank0_decides(lambda: opened.extend(trackers.start(run, log)), dist)
    sinks.add(opened)
    return run


# --- the steps of start-up ------------------------------------------------------------------------------------------
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


def claim_run_dir(given, dist, claimed):
    """Choose the run directory; rank 0 claims it (created if new, locked for the run's lifetime: appended to
    `claimed`) -> its path."""
    resume = given.get("resume", False)
    if given.get("out_dir"):
        out_dir = Path(given["out_dir"])
    else:  # rank 0's choice: ranks on other machines may see another checkpoints/ folder
        name, _ = corpus_sources(given.get("data"), given.get("encoding", "utf-8"))
        out_dir = Path(broadcast_str(str(rundir.default_out_dir(name, resume)), dist))
    if resume and not (out_dir / STATE).exists():
        raise CheckpointError(f"--resume: no training state in {out_dir} ({STATE} missing); "
                              f"start without --resume, or pass the run's --out-dir")

    def claim():
        claimed.append(rundir.RunDir(out_dir).claim())
        if resume:
            rundir.check_metrics(out_dir / METRICS)
        elif rundir.holds_run(out_dir):
            raise ConfigError(f"{out_dir} already holds a run; pass --resume to continue it, or another "
                              f"--out-dir for a new one (nothing was changed)")

    _rank0_decides(claim, dist)
    return out_dir


def encode(task, cfg, block_size, dist, log):
    """The corpus (text, or sentence pairs), encoded once (cached) and memory-mapped. Under torchrun one process
    per machine encodes; the others wait, then read its cache entry."""
    encoder = dist.local_rank == 0
    if dist.enabled and not encoder:
        torch.distributed.barrier()
    corpus = task.encode(cfg, block_size, log)
    if dist.enabled and encoder:
        torch.distributed.barrier()
    return corpus


def adaptive_softmax(origin, corpus, cfg, task, device):
    """--softmax auto resolved (sizing.pick_softmax), and --softmax adaptive on a new run: the corpus's character
    counts, and the shortlist they give unless one is set -> (model fields, counts or None, the start-up line of
    auto's choice or None). A resumed run keeps its own (stored with its weights)."""
    model_kw, line = origin.model_kw, None
    if model_kw.get("softmax") == "auto":
        against = [why for why, on in (
            ("a resumed run keeps its output layer", origin.meta is not None),
            (f"{param('init_from')} keeps the base's", origin.base is not None),
            ("sentence pairs", task.name != "text"), (f"{param('labels')}", bool(cfg.labels)),
            (f"{param('label_smoothing')}", bool(cfg.label_smoothing))) if on]
        choice, why = sizing.pick_softmax(len(corpus.vocab), cfg.max_time, device.type, against)
        model_kw = {**model_kw, "softmax": choice}
        if choice == "adaptive":
            model_kw["tie_weights"] = False  # as ModelConfig does for an adaptive layer given by name
        line = f"softmax: {choice} ({param('softmax', 'auto')}: {why}; {param('softmax')} full or adaptive to choose)"
    if model_kw.get("softmax") != "adaptive" or origin.meta is not None:
        return model_kw, None, line
    if origin.base is not None:  # a full base with --softmax adaptive is a clash settings.init_settings refuses
        raise ConfigError(f"{param('init_from')} keeps the base's {param('softmax')}; drop {param('softmax')}")
    counts = char_counts(corpus.ids(), len(corpus.vocab))
    return {**model_kw, "shortlist": model_kw.get("shortlist") or shortlist_for(counts)}, counts, line


def auto_size(given, model_kw, cfg, task, corpus, device, dtype, dist, counts=None, threads=None):
    """--preset auto: the model for this corpus, budget and machine (chargpt/training/sizing.py), decided on rank 0 (its
    speed measured there) for every rank; `given`: the settings a person chose, which it leaves as they are -> (model
    fields, TrainConfig, start-up lines, the probe's seconds a step of the model that trains, or None where a size
    setting of the user's changed it, and the sizing.Rung chosen)."""
    if task.name != "text":
        return model_kw, cfg, ["auto: sentence pairs keep the cpu preset's model (sizing is fitted to text)"], None, \
            None
    train_chars = int(corpus.length * (1 - cfg.val_fraction))
    decided = ""
    if dist.is_main:
        probe = sizing.Probe(len(corpus.vocab), cfg, device, dtype, head=(model_kw.get("softmax", "full"),
                                                                         model_kw.get("shortlist", 0), counts),
                             threads=threads)
        # the same command on the same machine keeps its last model where the probe's speed is near a threshold
        memory = corpus.cache_dir / sizing.MEMORY_FILE
        budget = None if cfg.max_time is None else float(cfg.max_time)  # 150 and 150.0: the same command
        key = sizing.memory_key(corpus=corpus.key, vocab=len(corpus.vocab), budget=budget, chars=train_chars,
                                world=dist.world_size, accum=cfg.grad_accum, device=device.type, dtype=str(dtype),
                                threads=torch.get_num_threads(),
                                given=sizing.command_settings(given))
        plan = sizing.plan_run(cfg, given, train_chars, probe, dist.world_size, sizing.recall(memory, key))
        if plan.step_s is not None:  # sized by the probe
            sizing.remember(memory, key, plan)
        model_kw, train_kw, kept = sizing.apply(plan, model_kw, {}, given)
        lines = sizing.describe(plan, cfg.max_time, train_chars, kept, spelled)
        if plan.warning:
            lines.append(f"warning: {plan.warning}")
        for note in (probe.quiet_note, probe.busy_note()):
            if note:
                lines.append(f"note: {note}")
        step_s = plan.step_s if not [name for name, _ in kept if name != "max_iters"] else None  # its model's
        r = plan.rung
        decided = json.dumps({"model": model_kw, "train": train_kw, "lines": lines, "step_s": step_s,
                              "rung": [r.n_layer, r.n_embd, r.block_size, r.batch_size]})
    decided = json.loads(broadcast_str(decided, dist))
    # the sizes are the rule's (sizing.py), whole numbers it chose within their ranges: nothing to check again
    return (decided["model"], replace(cfg, **decided["train"]), decided["lines"], decided["step_s"],
            sizing.Rung(*decided["rung"]))


def file_setting(settings, name):
    """The config file that set `name`, or None (a flag, a preset, a default or the checkpoint did)."""
    source = settings.source(name)
    return source if source not in (None, FLAGS) and not source.startswith("preset ") else None


def build(mcfg, cfg, device, dtype, dist, init=lambda model: None):
    """-> (model, optimizer, loss scaler, data generator). Every rank builds the same initial weights from the same
    seed, then init(model) may replace them (--init-from), before the optimizer takes the parameters; dropout and
    batch order differ per rank, reproducibly (rank 0 draws what one process does)."""
    torch.manual_seed(cfg.seed)
    try:
        model = build_model(mcfg).to(device)
    except (RuntimeError, MemoryError) as e:  # e.g. --n-embd 100000: torch's "can't allocate memory"
        if not isinstance(e, MemoryError) and "alloc" not in str(e).lower() and "memory" not in str(e).lower():
            raise
        raise ConfigError(f"a model of about {estimated_params(mcfg) / 1e6:,.0f}M parameters does not fit in {device} "
                          f"memory; lower --n-embd, --n-layer or --block-size") from None
    init(model)
    model.set_attention(cfg.attention)
    optimizer = make_optimizer(model, cfg, device, dtype)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    torch.manual_seed(stream_seed(cfg.seed, "dropout", dist.rank))
    data_gen = torch.Generator().manual_seed(stream_seed(cfg.seed, "data", dist.rank))
    return model, optimizer, scaler, data_gen


def wrap(model, optimizer, cfg, device, dtype, dist) -> Wrapped:
    """What the loop calls: the model, compiled and/or wrapped for DDP (the plain one stays the Run's `model`); how
    often the host reads the stop flags; the bf16 weight copies the forward reads on a CPU."""
    compiled, reason = pick_compile(cfg.compile, device, dtype, cfg.max_time)
    train_model = torch.compile(model) if compiled else model
    if dist.enabled:
        train_model = ddp(train_model, device)  # one graph when compiled; its options are rules
    # every sync_every steps the host reads whether to stop (a sync: free on a CPU, a stall on a GPU)
    sync_every = 1 if device.type == "cpu" or cfg.skip_nonfinite else GPU_SYNC_EVERY
    copies = low_precision_copies(model, optimizer, device, dtype, compiled or dist.enabled)
    return Wrapped(train_model, compiled, reason, sync_every, copies)
