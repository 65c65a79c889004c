"""Experiment trackers fed beside metrics.jsonl: TensorBoard, Weights & Biases (offline), MLflow (docs/tracking.md).

``run.report_to`` names them (any subset; none by default). metrics.jsonl and samples.jsonl stay the run's record;
each tracker gets a copy through its own library's API, imported only when asked for:

- ``tensorboard``: event files under RUN_DIR/tensorboard (torch.utils.tensorboard.SummaryWriter): every metric as a
  scalar; the config, the objective card, the manifest and the completions tables as text (markdown);
- ``wandb``: an offline run under RUN_DIR/wandb (no network; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads
  it): every metric, the config as the run's config, card and manifest as run files, tables as ``wandb.Table``;
- ``mlflow``: a run in ``run.mlflow_tracking_uri``, by default a SQLite store RUN_DIR/mlflow/mlflow.db with its
  artifacts under RUN_DIR/mlflow/artifacts: every metric, the flattened config as parameters, card and manifest
  as artifacts, tables through ``log_table`` (JSON artifacts under completions/).

A tracker asked for but not installed is one ConfigError naming its extra, raised before the model loads
(`check_installed`).

A tracker never puts the run at risk: one that raises (a full disk, a lost server, a library bug) logs one warning
and is turned off for the rest of the run; training, metrics.jsonl and the other trackers carry on (`Trackers`).

A resume continues the same tracker runs. RUN_DIR/trackers.json records each tracker's run id and the last step it
was given. TensorBoard purges the events of the steps a resumed run redoes (SummaryWriter's ``purge_step``), so the
redone values replace the first ones; W&B and MLflow cannot delete a logged point, so the steps they already hold
are not sent again: under an exact resume (train.deterministic) the redone values are the same, except the
``time/``, ``throughput/`` and ``memory/`` measurements, which keep their first values there.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..config import Config, to_dict
from ..errors import ConfigError
from ..manifest import write_json_atomic

log = logging.getLogger("grpolab")
LEDGER = "trackers.json"
TABLE_KEY = "completions"


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker is opened with: the run, its resolved config, the texts to attach (file name -> text), the
    step the loop starts from (a resume: its checkpoint's) and this tracker's ledger entry ({} for a new run)."""

    run_dir: Path
    config: dict[str, Any]
    texts: dict[str, str]
    start_step: int
    state: dict[str, Any] = field(default_factory=dict)
    mlflow_tracking_uri: str = ""


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"a": {"b": 1}} -> {"a.b": 1}; the leaves of a nested mapping under dotted names.

    >>> flatten({"train": {"lr": 0.1, "steps": 2}, "task": {"options": {}}})
    {'train.lr': 0.1, 'train.steps': 2, 'task.options': {}}
    """
    out: dict[str, Any] = {}
    for k, v in tree.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(flatten(v, name))
        else:
            out[name] = v
    return out


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table (what TensorBoard's text dashboard renders); '|' escaped, line breaks shown as '⏎'.

    >>> print(markdown_table(["a", "b"], [[1, "x|y"], [2, "p\\nq"]]))
    | a | b |
    |---|---|
    | 1 | x\\|y |
    | 2 | p ⏎ q |
    """

    def cell(v: Any) -> str:
        return str(v).replace("|", "\\|").replace("\r", "").replace("\n", " ⏎ ")

    lines = ["| " + " | ".join(map(cell, columns)) + " |", "|" + "---|" * len(columns)]
    return "\n".join([*lines, *("| " + " | ".join(map(cell, r)) + " |" for r in rows)])


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


# ----------------------------------------------------------------------------------------------- the sinks


class TensorBoardSink:
    """Scalars and text through torch.utils.tensorboard.SummaryWriter into RUN_DIR/tensorboard."""

    def __init__(self, run: TrackerRun):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run.run_dir / "tensorboard"), purge_step=run.start_step + 1)
        self.state: dict[str, Any] = {}
        if not run.state:  # a new tracker run: what it was started with, once
            self.writer.add_text("config", "```json\n" + json.dumps(run.config, indent=2) + "\n```", 0)
            for name, text in run.texts.items():
                self.writer.add_text(name, "```\n" + text + "\n```", 0)
            self.writer.flush()

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in _numbers(metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()  # watched live: without it SummaryWriter holds events for up to two minutes

    def log_table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        self.writer.add_text(TABLE_KEY, markdown_table(columns, rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """An offline W&B run under RUN_DIR/wandb (wandb.init(mode="offline", id=the recorded id, resume="allow"))."""

    def __init__(self, run: TrackerRun):
        import wandb

        run_id = run.state.get("id") or secrets.token_hex(6)  # a W&B run id: letters and digits
        self.run = wandb.init(
            mode="offline",
            dir=str(run.run_dir),
            id=run_id,
            resume="allow",
            project=os.environ.get("WANDB_PROJECT") or "grpolab",
            name=run.run_dir.name,
            config=run.config,
            settings=wandb.Settings(console="off", silent=True, save_code=False),
        )
        self.state = {"id": run_id}
        for name, text in run.texts.items():  # files of the run's files directory are synced with it
            (Path(self.run.dir) / name).write_text(text, encoding="utf-8")

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(_numbers(metrics), step=step)

    def log_table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        import wandb

        self.run.log({TABLE_KEY: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowSink:
    """An MLflow run through MlflowClient: run.mlflow_tracking_uri, or a SQLite store under RUN_DIR/mlflow."""

    MAX_PARAMS, MAX_METRICS = 100, 1000  # per log_batch call (MLflow's limits)

    def __init__(self, run: TrackerRun):
        from mlflow import MlflowClient
        from mlflow.entities import Param

        local = run.run_dir.resolve() / "mlflow"
        uri = run.mlflow_tracking_uri or f"sqlite:///{local / 'mlflow.db'}"
        if not run.mlflow_tracking_uri:
            local.mkdir(parents=True, exist_ok=True)
        self.client = MlflowClient(tracking_uri=uri)
        if run.state.get("run_id") and run.state.get("tracking_uri") == uri:
            self.run_id = run.state["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "grpolab"
            found = self.client.get_experiment_by_name(name)
            artifacts = None if run.mlflow_tracking_uri else (local / "artifacts").as_uri()
            experiment = (
                found.experiment_id if found else self.client.create_experiment(name, artifact_location=artifacts)
            )
            self.run_id = self.client.create_run(
                experiment, run_name=run.run_dir.name, tags={"grpolab.run_dir": str(run.run_dir.resolve())}
            ).info.run_id
            params = [Param(k, v if isinstance(v, str) else json.dumps(v)) for k, v in flatten(run.config).items()]
            for i in range(0, len(params), self.MAX_PARAMS):
                self.client.log_batch(self.run_id, params=params[i : i + self.MAX_PARAMS])
            for name, text in run.texts.items():
                self.client.log_text(self.run_id, text, name)
        self.state = {"run_id": self.run_id, "tracking_uri": uri}

    def log_metrics(self, step: int, metrics: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        points = [Metric(k, v, now, step) for k, v in _numbers(metrics).items()]
        for i in range(0, len(points), self.MAX_METRICS):
            self.client.log_batch(self.run_id, metrics=points[i : i + self.MAX_METRICS])

    def log_table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
        self.client.log_table(self.run_id, data, f"{TABLE_KEY}/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


@dataclass(frozen=True)
class TrackerKind:
    """A tracker: what it needs installed (modules, and the extra that installs them), how to open it, and whether
    it can replace the points of redone steps (else they are not sent again)."""

    modules: tuple[str, ...]
    open: Callable[[TrackerRun], Any]
    replaces_redone_steps: bool


KINDS: dict[str, TrackerKind] = {
    "tensorboard": TrackerKind(("tensorboard",), TensorBoardSink, True),
    "wandb": TrackerKind(("wandb",), WandbSink, False),
    "mlflow": TrackerKind(("mlflow", "sqlalchemy", "alembic", "pandas"), MlflowSink, False),
}


def check_installed(names: Sequence[str]) -> None:
    """One ConfigError for the first tracker of run.report_to whose library is missing (nothing is imported)."""
    for name in names:
        missing = [m for m in KINDS[name].modules if importlib.util.find_spec(m) is None]
        if missing:
            raise ConfigError(
                f"run.report_to: {name} needs {', '.join(missing)}, which is not installed: "
                f"pip install 'grpolab[{name}]'"
            )


# ----------------------------------------------------------------------------------------------- the fan-out


def read_ledger(run_dir: Path) -> dict[str, dict[str, Any]]:
    """RUN_DIR/trackers.json: {tracker: {run ids..., "logged_through": last step sent}}; {} when absent or unreadable
    (then each tracker starts a new run rather than stop the training run)."""
    path = Path(run_dir) / LEDGER
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable (%s: %s); the trackers start new runs", path, type(e).__name__, e)
        return {}
    return data if isinstance(data, dict) else {}


class Trackers:
    """The trackers of run.report_to, fed together; any one that raises is warned about once and turned off."""

    def __init__(self, run_dir: Path, sinks: dict[str, Any], ledger: dict[str, dict[str, Any]]):
        self.run_dir, self.sinks, self.ledger = Path(run_dir), sinks, ledger

    @classmethod
    def open(cls, cfg: Config, run_dir: Path, start_step: int, texts: dict[str, str]) -> "Trackers":
        """Open every tracker of cfg.run.report_to for a loop starting after `start_step` (0 for a new run)."""
        ledger, sinks = read_ledger(run_dir), {}
        for name in cfg.run.report_to:
            entry = ledger.get(name, {})
            run = TrackerRun(Path(run_dir), to_dict(cfg), texts, start_step, entry, cfg.run.mlflow_tracking_uri)
            try:
                sinks[name] = KINDS[name].open(run)
            except Exception as e:  # noqa: BLE001 -- a tracker must never stop the run
                _warn(name, "starting", e)
                continue
            ledger[name] = {
                **entry,
                **sinks[name].state,
                "logged_through": min(entry.get("logged_through", 0), start_step)
                if KINDS[name].replaces_redone_steps
                else entry.get("logged_through", 0),
            }
        trackers = cls(run_dir, sinks, ledger)
        trackers.write_ledger()
        return trackers

    def _each(self, what: str, step: int, call: Callable[[Any], None]) -> None:
        for name, sink in list(self.sinks.items()):
            if step <= self.ledger[name]["logged_through"] and not KINDS[name].replaces_redone_steps:
                continue  # sent before a resume: this tracker cannot replace it, and must not hold it twice
            try:
                call(sink)
            except Exception as e:  # noqa: BLE001 -- a tracker must never stop the run
                _warn(name, f"{what} step {step}", e)
                self.drop(name)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """A step's metrics to every tracker; the ledger then records the step as sent."""
        self._each("logging", step, lambda sink: sink.log_metrics(step, metrics))
        for name in self.sinks:
            self.ledger[name]["logged_through"] = max(self.ledger[name]["logged_through"], step)
        self.write_ledger()

    def log_table(self, step: int, columns: list[str], rows: list[list[Any]]) -> None:
        """A completions table to every tracker (call it before `log` of the same step)."""
        self._each("logging the table of", step, lambda sink: sink.log_table(step, columns, rows))

    def drop(self, name: str) -> None:
        sink = self.sinks.pop(name)
        try:
            sink.close()
        except Exception:  # noqa: BLE001 -- already failing; its warning is out
            pass

    def write_ledger(self) -> None:
        if not self.sinks:  # nothing open (or all turned off): the ledger keeps what it last said
            return
        try:
            write_json_atomic(self.run_dir / LEDGER, self.ledger)
        except OSError as e:
            log.warning(
                "%s: not written (%s: %s); a resume may start new tracker runs",
                self.run_dir / LEDGER,
                type(e).__name__,
                e,
            )

    def close(self) -> None:
        for name in list(self.sinks):
            try:
                self.sinks.pop(name).close()
            except Exception as e:  # noqa: BLE001
                _warn(name, "closing", e)


def _warn(name: str, what: str, e: Exception) -> None:
    log.warning(
        "run.report_to: %s failed while %s (%s: %s); it is turned off for the rest of this run "
        "(training and metrics.jsonl are unaffected)",
        name,
        what,
        type(e).__name__,
        str(e).splitlines()[0] if str(e) else "",
    )


def run_texts(run_dir: Path) -> dict[str, str]:
    """What the trackers attach to a run: the manifest and its objective card (when the run has a manifest)."""
    try:
        manifest = json.loads((Path(run_dir) / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {
        "manifest.json": json.dumps(manifest, indent=2),
        "objective_card.json": json.dumps(manifest.get("objective"), indent=2),
    }
