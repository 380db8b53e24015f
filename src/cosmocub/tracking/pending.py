"""Job runs written to a file now, logged to MLflow later by the next process that opens the store.

A workflow's short jobs would spend most of their time on MLflow itself: a 64³ simulate computes
for ~2 s and importing MLflow plus opening the SQLite store costs ~3.5 s more, 48 times. Inside a
workflow (a parent run exists) such a job writes its run as one JSON record under
`<results>/mlflow-pending/`; the next job that opens the store (train, evaluate, and preprocess
where system metrics are on), or the workflow's end, logs it as the same child run, with the job's
own start and end times. A run that could not reach the store at its end (a server down) leaves
a record of what it could not send; it is delivered into that same run by the same means, or by
`cosmocub tracking sync`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmocub.config import Config, flatten
from cosmocub.io import atomic_path
from cosmocub.tracking.models import load_unsent_model, log_torch_model, save_unsent_model

log = logging.getLogger(__name__)

PENDING_DIR = "mlflow-pending"
# MLflow's log_batch takes at most 100 params and 1000 metrics per call.
_MAX_PARAMS, _MAX_METRICS = 100, 1000


def pending_dir(cfg: Config) -> Path:
    return Path(os.path.abspath(cfg.results)) / PENDING_DIR


def param_value(value: Any) -> str:
    """An MLflow param's string: JSON for non-strings, so that lists, None and booleans read as
    they do in the YAML config."""
    return value if isinstance(value, str) else json.dumps(value)


class RecordingTracker:
    """A job's tracker whose calls are kept in memory and written as one record at the end."""

    run_id: str | None = None

    def __init__(self) -> None:
        self.params: dict[str, str] = {}
        self.metrics: list[tuple[str, float, int, int]] = []
        self.tags: dict[str, str] = {}
        self.artifacts: list[tuple[str, str | None]] = []

    def log_params(self, params: Mapping[str, Any]) -> None:
        self.params.update({str(k): param_value(v) for k, v in params.items()})

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        now = int(time.time() * 1000)
        self.metrics += [(str(k), float(v), now, step or 0) for k, v in metrics.items()]

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        if not Path(path).exists():
            raise FileNotFoundError(f"{path}: artifact to log does not exist")
        # Logged from where it is when the record is flushed; the job's outputs stay in place.
        self.artifacts.append((os.path.abspath(path), artifact_path))

    def log_model(self, model: Any, name: str = "model") -> None:
        raise TypeError("a deferred job run cannot log a model; use job_run(..., defer=False)")

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.tags.update({str(k): str(v) for k, v in tags.items()})

    def adopt(
        self, child_run_id: str, *, tags: Mapping[str, Any], metrics: Mapping[str, float]
    ) -> None:
        raise TypeError("a deferred job run cannot adopt runs; use job_run(..., defer=False)")


def write_record(
    cfg: Config,
    tracker: RecordingTracker,
    *,
    tags: Mapping[str, str],
    run_name: str,
    params: Mapping[str, Any] | None,
    start_ms: int,
    status: str,
) -> Path:
    """Write the run as `<results>/mlflow-pending/<start>-<uuid>.json` (atomically)."""
    import yaml

    record = {
        "experiment": cfg.tracking.experiment,
        "run_name": run_name,
        "tags": {**tags, **tracker.tags},
        "params": {
            **{k: param_value(v) for k, v in {**flatten(cfg.values), **(params or {})}.items()},
            **tracker.params,
        },
        "metrics": tracker.metrics,
        "artifacts": tracker.artifacts,
        "config_yaml": yaml.safe_dump(cfg.values, sort_keys=False),
        "start_ms": start_ms,
        "end_ms": int(time.time() * 1000),
        "status": status,
    }
    folder = pending_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{start_ms}-{uuid.uuid4().hex}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record))
    return path


def write_run_update(
    cfg: Config,
    run_id: str,
    *,
    metrics: list[Any],
    artifacts: list[tuple[str, str | None]],
    status: str | None,
    epochs_file: Path | None,
    models: Sequence[tuple[Any, str]] = (),
) -> Path:
    """Write what run `run_id` could not send (metrics, artifacts, models, its end status, and
    the metrics.jsonl whose epochs it must hold) as a pending record, delivered into that run.
    A model is kept beside the record, pickled; one that cannot be pickled is reported, not kept."""
    end_ms = int(time.time() * 1000)
    folder = pending_dir(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{end_ms}-{run_id}-{uuid.uuid4().hex[:8]}"
    kept_models = []
    for model, name in models:
        model_path = folder / f"{stem}-{name}.pt"
        try:
            save_unsent_model(model, model_path)
        except Exception as err:
            log.warning("MLflow: model %r of run %s cannot be kept: %s", name, run_id, err)
            continue
        kept_models.append((str(model_path), name))
    record = {
        "run_id": run_id,
        "metrics": [(m.key, m.value, m.timestamp, m.step) for m in metrics],
        "artifacts": artifacts,
        "models": kept_models,
        "epochs_file": str(epochs_file) if epochs_file else None,
        "status": status,
        "end_ms": end_ms,
    }
    path = folder / f"{stem}.json"
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(record))
    return path


def replay_epochs(client: Any, run_id: str, epochs_file: Path) -> int:
    """Log into run `run_id` every value of metrics.jsonl (one record an epoch, logged at its
    "step") that the run lacks at that step, or holds otherwise as its latest there; returns how
    many. metrics.jsonl is the source of truth: what an outage or a killed job kept from the
    store is taken from there, and an epoch a resumed training ran again (after its last
    checkpoint) replaces the killed job's value as the step's latest (MLflow deletes none)."""
    from mlflow.entities import Metric

    if not epochs_file.is_file():
        return 0
    records = [json.loads(line) for line in epochs_file.read_text().splitlines() if line.strip()]
    keys = {
        k
        for r in records
        for k, v in r.items()
        if k not in ("epoch", "step") and isinstance(v, int | float)
    }
    now = int(time.time() * 1000)
    missing = []
    for key in sorted(keys):
        latest = {}  # step -> the value MLflow shows there (its newest)
        for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.timestamp):
            latest[m.step] = m.value
        missing += [
            Metric(key, float(r[key]), now, int(r["step"]))
            for r in records
            if isinstance(r.get(key), int | float)
            and not _same(latest.get(int(r["step"])), float(r[key]))
        ]
    for i in range(0, len(missing), _MAX_METRICS):
        client.log_batch(run_id, metrics=missing[i : i + _MAX_METRICS])
    return len(missing)


def _same(logged: float | None, value: float) -> bool:
    if logged is None:
        return False
    return logged == value or (math.isnan(logged) and math.isnan(value))


def flush_pending(cfg: Config, client: Any) -> int:
    """Log every pending record through `client` (an MlflowClient on the store); returns how many.

    Each record is claimed by renaming it, so concurrent flushers never log one twice. A store
    failure puts the record back for a later flush and stops this one (it is reported, never
    raised: the jobs that wrote them have finished, and the calling job must not fail for them).
    """
    folder = pending_dir(cfg)
    if not folder.is_dir():
        return 0
    logged = 0
    for path in sorted(folder.glob("*.json")):
        claimed = path.with_name(f"{path.name}.claimed-{os.getpid()}")
        try:
            path.rename(claimed)
        except FileNotFoundError:
            continue  # another process took it
        try:
            record = json.loads(claimed.read_text())
            _log_record(client, record)
        except Exception as err:
            claimed.rename(path)
            log.warning("MLflow: could not log pending job run %s yet: %s", path, err)
            break
        claimed.unlink()
        for model_path, _ in record.get("models", []):
            Path(model_path).unlink(missing_ok=True)
        logged += 1
    return logged


def _log_record(client: Any, record: dict[str, Any]) -> None:
    from mlflow.entities import Metric, Param

    if "run_id" in record:
        _update_run(client, record)
        return
    experiment = client.get_experiment_by_name(record["experiment"])
    if experiment is None:
        raise ValueError(f"experiment '{record['experiment']}' does not exist")
    run = client.create_run(
        experiment.experiment_id,
        start_time=record["start_ms"],
        tags=record["tags"],
        run_name=record["run_name"],
    )
    run_id = run.info.run_id
    params = [Param(k, v) for k, v in record["params"].items()]
    for i in range(0, len(params), _MAX_PARAMS):
        client.log_batch(run_id, params=params[i : i + _MAX_PARAMS])
    metrics = [Metric(k, v, ts, step) for k, v, ts, step in record["metrics"]]
    for i in range(0, len(metrics), _MAX_METRICS):
        client.log_batch(run_id, metrics=metrics[i : i + _MAX_METRICS])
    client.log_text(run_id, record["config_yaml"], "config.yaml")
    for path, artifact_path in record["artifacts"]:
        if Path(path).exists():
            client.log_artifact(run_id, path, artifact_path)
        else:
            log.warning("MLflow: artifact %s of pending run %s is gone", path, run_id)
    client.set_terminated(run_id, status=record["status"], end_time=record["end_ms"])


def _update_run(client: Any, record: dict[str, Any]) -> None:
    from mlflow.entities import Metric

    run_id = record["run_id"]
    metrics = [Metric(k, v, ts, step) for k, v, ts, step in record["metrics"]]
    for i in range(0, len(metrics), _MAX_METRICS):
        client.log_batch(run_id, metrics=metrics[i : i + _MAX_METRICS])
    if record["epochs_file"]:
        replay_epochs(client, run_id, Path(record["epochs_file"]))
    for path, artifact_path in record["artifacts"]:
        if Path(path).exists():
            client.log_artifact(run_id, path, artifact_path)
    for path, name in record.get("models", []):
        log_torch_model(client, run_id, load_unsent_model(Path(path)), name)
    # A resumed training flushes the records of its run before it reopens it, so the status
    # here is the last word of the job that wrote it.
    if record["status"]:
        client.set_terminated(run_id, status=record["status"], end_time=record["end_ms"])
