"""Experiment trackers as sinks: --log-to tensorboard,wandb,mlflow sends a run's records to the trackers people
already watch runs in, beside the run's own files (training/sinks.py); the training loop does not know them.

    python train.py --data notes.txt --log-to tensorboard,mlflow

Each writes inside the run directory unless the user's environment says otherwise, so nothing lands in the current
folder: RUN/tensorboard/ (event files), RUN/wandb/ (W&B offline, never a login prompt, unless WANDB_MODE says
online; `wandb sync` uploads an offline run later), RUN/mlruns/ (an MLflow file store, or $MLFLOW_TRACKING_URI).
Each gets the same numbers (metrics()): the running training loss in nats and bits per character, the learning
rate and characters per second; each evaluation's losses (nats, bits per character, bits per byte) and scores;
then the samples written while training, as text; and once per session the settings (model and training), what
--preset auto decided and why (Run.sizing_lines) and the run directory.

--resume continues the same tracker runs: their ids are kept in RUN/trackers.json. A tracker whose package is
missing stops the start before any work (check); one that fails later (a full disk, a lost connection) is said
once and dropped: no tracker is worth a training. Only rank 0 logs (make_sinks gives other ranks no sinks).
"""

import contextlib
import json
import math
import os
import re
import shutil
import sys
import time
from dataclasses import asdict

from chargpt.config import tracker_names
from chargpt.config.flags import param
from chargpt.errors import ChargptError, ConfigError
from chargpt.runs import rundir
from chargpt.training.sinks import ending

STATE_FILE = "trackers.json"  # {tracker: what continues its run on --resume}
STATE_BYTES = 1 << 16
# tracker -> (module imported, what pip installs, the extra in pyproject.toml)
PACKAGES = {"tensorboard": ("tensorboard", "tensorboard", "tensorboard"), "wandb": ("wandb", "wandb", "wandb"),
            "mlflow": ("mlflow", "mlflow-skinny", "mlflow")}
SKIPPED = ("step", "elapsed_s")  # record keys that are the axis, not a metric
LN2 = math.log(2)
MAX_SAMPLE_ROWS = 200  # the W&B samples table keeps the latest this many
MAX_PARAM_CHARS = 500  # MLflow's limit on a parameter's value in its oldest supported versions
# A tracker that sends over the network is asked first whether its server answers, within this many seconds: MLflow
# at a closed local port retried for 253 s in silence, W&B online without a network for 102 s
REACH_S = 5.0


def check(value):
    """--log-to's trackers -> their names, each one's package imported; a missing (or broken) one is a ConfigError
    naming the pip line. Called before any work: a start that fails here leaves no run directory."""
    names = tracker_names(value)
    for name in names:
        module, package, extra = PACKAGES[name]
        try:
            __import__(module)
        except ImportError as e:
            # the package itself missing, or something it needs (then said: a broken install, not a missing one)
            why = "is not installed" if getattr(e, "name", None) == module else f"does not import ({brief(e)})"
            raise ConfigError(f"{param('log_to', name)} needs the {package} package, which {why}: "
                              f"pip install -e \".[{extra}]\" (or pip install {package})") from None
    return names


def start(run, log):
    """The trackers run.cfg.log_to names, opened (on --resume, the same tracker runs continued) -> sinks; one line
    of the start-up log says where each writes. A tracker that cannot start is a one-line ChargptError, and what
    this start made in the run directory for the trackers is removed."""
    names = tracker_names(run.cfg.log_to)
    if not names:
        return []
    saved = read_state(run.out_dir, log) if run.origin.meta is not None else {}
    made = [run.out_dir / d for d in ("tensorboard", "wandb", "mlruns", STATE_FILE)
            if not (run.out_dir / d).exists()]
    opened, doing = [], None
    try:
        for name in names:
            doing = TRACKER_CLASSES[name](run, log)
            opened.append(doing)
            doing.open(saved.get(name) or {})
        doing = None
        write_state(run.out_dir, {**saved, **{t.name: t.state for t in opened}})
    except Exception as e:
        for tracker in opened:
            with contextlib.suppress(Exception):
                tracker.abandon()
        for path in made:
            with contextlib.suppress(OSError):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        if isinstance(e, ChargptError):
            raise
        if doing is None:
            raise ChargptError(f"cannot write {run.out_dir / STATE_FILE} ({brief(e)}); check the disk") from None
        raise ChargptError(f"{param('log_to', doing.name)}: {doing.label} did not start ({brief(e)}); fix that, or "
                           f"drop it from {param('log_to')}") from None
    log("trackers: " + "; ".join(t.where() for t in opened))
    return opened


def read_state(out_dir, log):
    path = out_dir / STATE_FILE
    if not path.is_file():
        return {}
    try:
        with open(path, "rb") as f:
            state = json.loads(read_bounded(f))
        if isinstance(state, dict):
            return {k: v for k, v in state.items() if isinstance(v, dict)}
    except (OSError, ValueError):
        pass
    log(f"note: {path} is not readable; the trackers start new runs")
    return {}


def read_bounded(f):
    data = f.read(STATE_BYTES + 1)
    if len(data) > STATE_BYTES:
        raise ValueError("too large")
    return data.decode("utf-8")


def write_state(out_dir, state):
    rundir.write_text_atomic(out_dir / STATE_FILE, json.dumps(state, indent=1, sort_keys=True) + "\n")


def brief(e):
    """An exception as a few words for one line."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__


def metrics(kind, record, speed=None):
    """A record -> {metric name: number}, the same for every tracker: each number of the record as `kind/key`
    (eval/val_loss, eval/val_bpc, eval/val_bpb, eval/exact_match ...), each number of a table of them as
    `kind/key/name` (--labels: eval/val_loss_by_label/LABEL, its name in the characters every tracker takes), the
    running loss also in bits per character (train/bpc), and characters per second (train/chars_per_s) where known."""
    def number(v):
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    out = {f"{kind}/{k}": float(v) for k, v in record.items() if k not in SKIPPED and number(v)}
    for k, table in record.items():
        if isinstance(table, dict):
            out |= {f"{kind}/{k}/{metric_name(name)}": float(v) for name, v in table.items() if number(v)}
    if kind == "train" and "train/train_loss" in out:
        out["train/loss"] = out.pop("train/train_loss")
        out["train/bpc"] = out["train/loss"] / LN2
    if speed is not None and "train/chars_per_s" not in out:
        out["train/chars_per_s"] = speed
    return out


def metric_name(name):
    """A label's name as a part of a metric's name: letters (any script), digits, _ - . and spaces kept (MLflow
    refuses others, TensorBoard and W&B take them), the rest _."""
    return re.sub(r"[^\w.\- ]", "_", str(name))[:100] or "_"


def settings_of(run):
    """The run's settings for a tracker: {"model": {...}, "train": {...}}."""
    return {"model": asdict(run.mcfg), "train": asdict(run.cfg)}


def sample_text(record):
    return f"{record.get('prompt') or ''}{record.get('text') or ''}"


class Tracker:
    """One tracker as a sink. write() and close() never raise: the first failure is said in one line and the
    tracker is dropped for the rest of the run."""
    name = label = ""

    def __init__(self, run, log):
        self.run, self.log, self.out_dir, self.dead = run, log, run.out_dir, False
        self.state = {}  # what trackers.json keeps for --resume
        self.last = None  # (step, elapsed_s) of the last "train" record: the speed between two of them
        self.before = sys.exc_info()[1]  # see ending()

    def speed(self, record):
        """Characters per second since the last "train" record (its elapsed_s is the run's training clock, so an
        evaluation in between counts); None for a session's first."""
        last, self.last = self.last, (record["step"], record["elapsed_s"])
        if last is None or record["elapsed_s"] <= last[1] or record["step"] <= last[0]:
            return None
        return (record["step"] - last[0]) * self.run.chars_per_step / (record["elapsed_s"] - last[1])

    def write(self, kind, record):
        if not self.dead:
            try:
                speed = self.speed(record) if kind == "train" else None
                if kind == "sample":
                    self.sample(record)
                else:
                    self.scalars(record["step"], metrics(kind, record, speed), flush=kind == "eval")
            except Exception as e:
                self.fail(e)

    def close(self):
        if not self.dead:
            try:
                self.finish()
            except Exception as e:
                self.fail(e)
            self.dead = True

    def fail(self, e):
        self.dead = True
        self.log(f"warning: {self.label} failed ({brief(e)}) and logs no more of this run; training goes on, and "
                 f"the run directory's own files keep every record")
        with contextlib.suppress(Exception):
            self.abandon()

    def abandon(self):
        """Let the tracker go after a failure, without raising."""
        self.finish()


class TensorBoard(Tracker):
    name, label = "tensorboard", "TensorBoard"

    def open(self, saved):
        from torch.utils.tensorboard import SummaryWriter
        self.dir = self.out_dir / "tensorboard"
        step = self.run.state.step
        # a resumed run continues in the same folder; what a killed session logged after its last save is hidden
        # (purge_step), as --resume drops those lines of metrics.jsonl
        self.writer = SummaryWriter(str(self.dir), purge_step=step + 1 if self.run.origin.meta is not None else None)
        self.state = {"log_dir": self.dir.name}
        text = {"settings": "\n".join(f"    {part}.{k} = {v!r}" for part, values in settings_of(self.run).items()
                                      for k, v in values.items()),
                "run_dir": f"    {self.out_dir.resolve()}"}
        if self.run.sizing_lines:
            text["auto_sizing"] = "\n".join(f"    {line}" for line in self.run.sizing_lines)
        for tag, value in text.items():
            self.writer.add_text(tag, value, step)
        self.writer.flush()

    def scalars(self, step, values, flush):
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        if flush:
            self.writer.flush()

    def sample(self, record):
        self.writer.add_text("samples", "\n".join(f"    {line}" for line in sample_text(record).split("\n")),
                             record["step"])
        self.writer.flush()

    def finish(self):
        self.writer.close()

    def where(self):
        return f"tensorboard -> {self.dir} (tensorboard --logdir {self.dir})"


def unreachable(url, timeout=REACH_S):
    """Why the server of an http(s) URL cannot be reached (a TCP connection to its host and port, name lookup
    included, within `timeout` seconds), or None where it answers. Other schemes (file:, a database) -> None."""
    import socket
    import threading
    from urllib.parse import urlsplit
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as e:
        return f"not a URL ({e})"
    if parts.scheme not in ("http", "https") or not host:
        return None
    outcome = []

    def connect():  # in a thread: a name lookup takes no timeout of its own
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as e:
            outcome.append(e.strerror or str(e) or type(e).__name__)
    worker = threading.Thread(target=connect, name="tracker-reach", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"no answer in {timeout:g} s"


def reach(label, url, log, fix):
    """Say what is waited for, then wait at most REACH_S for the server at `url`: a ConfigError naming `fix` if it
    does not answer."""
    if not url.startswith(("http://", "https://")):
        return
    log(f"{label}: connecting to {url} (at most {REACH_S:g} s)")
    why = unreachable(url)
    if why:
        raise ConfigError(f"{label}: cannot reach {url} ({why}); {fix}")


class WandB(Tracker):
    name, label = "wandb", "W&B"

    def open(self, saved):
        import wandb
        # offline unless the user asked otherwise: no network, no account, no login prompt
        self.mode = os.environ.get("WANDB_MODE") or "offline"
        if self.mode == "online":
            reach("W&B", os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai", self.log,
                  "check the network, or unset WANDB_MODE to log offline")
        if self.mode == "online" and not logged_in(wandb):
            raise ConfigError("W&B: WANDB_MODE=online, but not logged in; run `wandb login` (or set WANDB_API_KEY), "
                              "or unset WANDB_MODE to log offline")
        run_id = saved.get("id") if isinstance(saved.get("id"), str) and re.fullmatch(r"[\w-]{1,64}",
                                                                                      saved["id"]) else None
        settings = {"console": "off"}  # the terminal stays ours: W&B does not wrap stdout or stderr
        if "WANDB_SILENT" not in os.environ:
            settings["silent"] = True  # the start-up line says where it writes
        self.wb = wandb.init(project=None if os.environ.get("WANDB_PROJECT") else "chargpt",
                             name=self.out_dir.name, dir=str(self.out_dir), id=run_id,
                             resume="allow" if run_id else None, mode=self.mode,
                             settings=wandb.Settings(**settings))
        config = {**settings_of(self.run), "run_dir": str(self.out_dir.resolve())}
        if self.run.sizing_lines:
            config["auto_sizing"] = list(self.run.sizing_lines)
        self.wb.config.update(config, allow_val_change=True)  # a resumed run may change settings
        # our step is the x axis: W&B's own counter must only grow, and a resume may go back a few steps
        self.wb.define_metric("step")
        for kind in ("train", "eval"):
            self.wb.define_metric(f"{kind}/*", step_metric="step")
        self.rows = []
        self.state = {"id": self.wb.id, "project": self.wb.project}

    def scalars(self, step, values, flush):
        self.wb.log({"step": step, **values})

    def sample(self, record):
        import wandb
        self.rows = [*self.rows, [record["step"], record.get("prompt") or "", record.get("text") or ""]]
        self.rows = self.rows[-MAX_SAMPLE_ROWS:]
        self.wb.log({"step": record["step"], "samples": wandb.Table(columns=["step", "prompt", "text"],
                                                                    data=self.rows)})

    def finish(self):
        self.wb.finish(exit_code=0 if ending(self.before) == "finished" else 1)

    def where(self):
        where = f"{self.out_dir / 'wandb'} (offline; wandb sync {self.wb.settings.sync_dir} to upload)" \
            if self.mode == "offline" else f"{self.wb.url or self.mode}"
        return f"wandb run {self.wb.id} -> {where}"


def logged_in(wandb):
    """Whether W&B has credentials, asked without a prompt (wandb.login's `prompt` is recent: older ones are not
    asked, and W&B itself says what is missing)."""
    try:
        return wandb.login(prompt=False, verify=False)
    except TypeError:
        return True


class MLflow(Tracker):
    name, label = "mlflow", "MLflow"

    def open(self, saved):
        from mlflow.tracking import MlflowClient
        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (self.out_dir / "mlruns").resolve().as_uri()
        reach("MLflow", self.uri, self.log, "start the tracking server, or unset MLFLOW_TRACKING_URI to log to the "
                                            "run's folder")
        if self.uri.startswith("file:"):
            # MLflow 3 keeps its file store behind this switch (its database stores need SQLAlchemy, which
            # mlflow-skinny does not bring); it is set for this process only, and the user's own value wins
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = client = MlflowClient(self.uri)
        run_id = saved.get("run_id") if saved.get("tracking_uri") == self.uri else None
        known = {}
        if isinstance(run_id, str):
            with contextlib.suppress(Exception):  # gone from the store: a new run
                known = client.get_run(run_id).data.params
                client.update_run(run_id, status="RUNNING")
                self.run_id = run_id
        if not hasattr(self, "run_id"):
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "chargpt"
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            self.run_id = client.create_run(experiment_id, run_name=self.out_dir.name).info.run_id
        self.state = {"run_id": self.run_id, "tracking_uri": self.uri}
        self.settings(known)

    def settings(self, known):
        """Parameters can be set once per run: a resumed session adds the new ones, and settings.json (an
        artifact) has this session's in full."""
        from mlflow.entities import Param, RunTag
        values = settings_of(self.run)
        params = [Param(f"{part}.{k}", str(v)[:MAX_PARAM_CHARS]) for part, kw in values.items() for k, v in kw.items()
                  if f"{part}.{k}" not in known]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.client.log_batch(self.run_id, tags=[RunTag("chargpt.run_dir", str(self.out_dir.resolve()))])
        self.client.log_text(self.run_id, json.dumps(values, indent=1, default=str), "settings.json")
        if self.run.sizing_lines:
            self.client.log_text(self.run_id, "\n".join(self.run.sizing_lines) + "\n", "auto_sizing.txt")

    def scalars(self, step, values, flush):
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        # to a tracking server, queued (MLflow's own queue, emptied when the run ends): the loop does not wait on
        # the network; a local store is written at once
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, step) for k, v in values.items()],
                              synchronous=self.uri.startswith("file:"))

    def sample(self, record):
        self.client.log_text(self.run_id, sample_text(record), f"samples/step-{record['step']:09d}.txt")

    def finish(self):
        status = {"finished": "FINISHED", "stopped": "KILLED", "failed": "FAILED"}[ending(self.before)]
        self.client.set_terminated(self.run_id, status=status)

    def abandon(self):
        if hasattr(self, "run_id"):
            self.client.set_terminated(self.run_id, status="FAILED")

    def where(self):
        return f"mlflow run {self.run_id} -> {self.uri}"


TRACKER_CLASSES = {"tensorboard": TensorBoard, "wandb": WandB, "mlflow": MLflow}
