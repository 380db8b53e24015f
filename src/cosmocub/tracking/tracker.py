"""MLflow tracking for every stage: one parent run per workflow invocation, one child run per job.

The store is checked at job start (short timeout), so a missing server fails a job in seconds,
never after hours of training; only world rank 0 logs (callers pass `enabled=`).
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from cosmocub.config import Config, flatten
from cosmocub.tracking.pending import param_value

log = logging.getLogger(__name__)

# Environment the Snakefile (onstart / rule shell) passes to jobs.
PARENT_RUN_ENV = "COSMOCUB_PARENT_RUN_ID"
RULE_ENV = "COSMOCUB_RULE"
WILDCARDS_ENV = "COSMOCUB_WILDCARDS"
# Scheduler job ids, in the order they are looked for.
SCHEDULER_JOB_ENVS = {
    "slurm": "SLURM_JOB_ID",
    "flux": "FLUX_JOB_ID",
    "lsf": "LSB_JOBID",
    "pbs": "PBS_JOBID",
}
RUN_STATUSES = ("FINISHED", "FAILED", "KILLED")
# MLflow 3's UI opens an experiment in its GenAI view unless it is told it holds model training.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# The start-of-job probe: one retry, no backoff, 5 s per request, so a dead server costs seconds.
_PROBE_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}
# MLflow error codes that mean the call itself was wrong: these propagate even mid-run.
_CALLER_ERROR_CODES = {
    "INVALID_PARAMETER_VALUE",
    "RESOURCE_ALREADY_EXISTS",
    "RESOURCE_DOES_NOT_EXIST",
    "BAD_REQUEST",
    "INVALID_STATE",
}


class TrackingUnavailable(ValueError):
    """The configured MLflow store cannot be reached or created; the message names the URI."""


# ---------------------------------------------------------------------------------------------
# Store and experiment


def tracking_uri(cfg: Config) -> str:
    """cfg.tracking.uri, the server the workflow starts (tracking.server.start), or the default
    SQLite store `sqlite:///<abs results>/mlflow.db`."""
    if cfg.tracking.uri:
        return cfg.tracking.uri
    if cfg.tracking.server.start:
        from cosmocub.tracking.server import server_uri

        return server_uri(cfg)
    return f"sqlite:///{_results_dir(cfg) / 'mlflow.db'}"


def artifact_location(cfg: Config) -> str | None:
    """Where a newly created experiment keeps artifacts (absolute file URI), or None = the server's.

    The default store puts them in `<abs results>/mlartifacts`; a user-given SQLite URI puts them
    beside its database file, so they never land in whatever folder a job happens to run in.
    """
    db = _sqlite_path(tracking_uri(cfg))
    if db is None:
        return None
    root = db.parent if cfg.tracking.uri else _results_dir(cfg)
    return (root / "mlartifacts").as_uri()


def init_store(cfg: Config) -> str:
    """Create (once) the store and the experiment; return the experiment id.

    Safe to call from many jobs at once: SQLite creation is serialised by a lock file and a
    concurrent `create_experiment` that loses the race reads the winner's experiment back.
    Raises TrackingUnavailable (one line, naming the URI) when the store cannot be used.
    """
    uri = tracking_uri(cfg)
    db = _sqlite_path(uri)
    try:
        if db is None:
            with _probe_timeouts():
                return _get_or_create_experiment(cfg, uri)
        _prepare_sqlite_folder(cfg, uri, db)
        with _file_lock(db.with_name(db.name + ".lock")):
            return _get_or_create_experiment(cfg, uri)
    except TrackingUnavailable:
        raise
    except Exception as err:  # any failure to reach/create the store is the same user problem
        raise _unavailable(cfg, uri, err) from err


def _get_or_create_experiment(cfg: Config, uri: str) -> str:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    name = cfg.tracking.experiment
    found = client.get_experiment_by_name(name)
    if found is not None:
        if found.lifecycle_stage == "deleted":
            raise TrackingUnavailable(
                f"{cfg.source}: key 'tracking.experiment': experiment '{name}' in {uri} is "
                "deleted; restore it (mlflow experiments restore) or choose another name"
            )
        if EXPERIMENT_KIND_TAG not in found.tags:  # an experiment made before the tag, or by hand
            client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
        return found.experiment_id
    try:
        return client.create_experiment(
            name,
            artifact_location=artifact_location(cfg),
            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND},
        )
    except MlflowException as err:
        # Another job (or host, with a server) created it between our lookup and create.
        found = client.get_experiment_by_name(name)
        if found is None:
            raise err from None
        return found.experiment_id


def _prepare_sqlite_folder(cfg: Config, uri: str, db: Path) -> None:
    folders = [db.parent]
    if (art := artifact_location(cfg)) is not None:
        folders.append(Path(urlparse(art).path))
    for folder in folders:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise _unavailable(cfg, uri, err) from err
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TrackingUnavailable(
                f"{cfg.source}: key 'tracking.uri': MLflow store {uri} is unavailable: "
                f"folder {folder} is not writable"
            )


def _unavailable(cfg: Config, uri: str, err: BaseException) -> TrackingUnavailable:
    reason = " ".join(str(err).split()) or type(err).__name__
    if len(reason) > 240:
        reason = reason[:237] + "..."
    hint = "start the server or fix tracking.uri" if cfg.tracking.uri else "check results/"
    return TrackingUnavailable(
        f"{cfg.source}: key 'tracking.uri': MLflow store {uri} is unavailable "
        f"({type(err).__name__}: {reason}); {hint}, or set tracking.enabled: false"
    )


@contextlib.contextmanager
def _probe_timeouts() -> Iterator[None]:
    # MLflow reads these at each request; restore them so that later logging in a long job gets
    # MLflow's patient defaults back (a server blip mid-training should be retried, not fatal).
    saved = {k: os.environ.get(k) for k in _PROBE_ENV}
    os.environ.update(_PROBE_ENV)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a SQLite URI (SQLAlchemy form: sqlite:////abs or sqlite:///rel)."""
    if not uri.startswith("sqlite:///"):
        return None  # not SQLite, or in-memory (sqlite://): nothing on disk to prepare
    path = uri.removeprefix("sqlite:///").split("?", 1)[0]
    if path in ("", ":memory:"):
        return None
    return Path(path) if path.startswith("/") else Path.cwd() / path


def _results_dir(cfg: Config) -> Path:
    return Path(os.path.abspath(cfg.results))


# ---------------------------------------------------------------------------------------------
# Workflow (parent) runs


def start_workflow_run(cfg: Config, *, name: str | None = None) -> str:
    """Open the parent run of one workflow invocation; return its id ("" if tracking is off)."""
    if not cfg.tracking.enabled:
        return ""
    from mlflow.tracking import MlflowClient

    experiment_id = init_store(cfg)
    uri = tracking_uri(cfg)
    client = MlflowClient(tracking_uri=uri)
    tags = {**_common_tags(cfg), "cosmocub.kind": "workflow", "mlflow.source.name": "snakemake"}
    run_name = name or time.strftime("workflow-%Y%m%d-%H%M%S")
    run = client.create_run(experiment_id, tags=tags, run_name=run_name)
    run_id = run.info.run_id
    _log_config(client, run_id, cfg, params=None)
    _flush_pending(cfg, client)  # left by an earlier invocation that was killed
    return run_id


def end_workflow_run(cfg: Config, run_id: str, status: str) -> None:
    """Close the parent run with FINISHED, FAILED or KILLED (no-op for an empty run id)."""
    if status not in RUN_STATUSES:
        raise ValueError(f"tracking end: status '{status}' is not one of {', '.join(RUN_STATUSES)}")
    if not run_id or not cfg.tracking.enabled:
        return
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(cfg)
    try:
        with _probe_timeouts():
            client = MlflowClient(tracking_uri=uri)
            _flush_pending(cfg, client)  # the runs of the last short jobs
            client.set_terminated(run_id, status=status)
    except Exception as err:
        raise _unavailable(cfg, uri, err) from err


def _flush_pending(cfg: Config, client: Any) -> None:
    from cosmocub.tracking.pending import flush_pending

    if count := flush_pending(cfg, client):
        log.info("MLflow: logged %d pending job run(s)", count)


# ---------------------------------------------------------------------------------------------
# Job (child) runs


class NullTracker:
    """What a job gets when tracking is off or it is not world rank 0: every call does nothing."""

    run_id: str | None = None

    def log_params(self, params: Mapping[str, Any]) -> None:
        pass

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        pass

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        pass

    def log_model(self, model: Any, name: str = "model") -> None:
        pass

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        pass


class Tracker(NullTracker):
    """Logs to one MLflow run through a client bound to its URI; only `log_model` sets MLflow's
    global tracking URI (Model.log reads it), so concurrent jobs must be processes, not threads."""

    def __init__(self, uri: str, run_id: str) -> None:
        from mlflow.tracking import MlflowClient

        self.uri = uri
        self.run_id = run_id
        self.client = MlflowClient(tracking_uri=uri)
        self.failures = 0

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        with self._guard("log_params"):
            batch = [Param(str(k), param_value(v)) for k, v in params.items()]
            self.client.log_batch(self.run_id, params=batch)

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        with self._guard("log_metrics"):
            batch = [Metric(str(k), float(v), now, step or 0) for k, v in metrics.items()]
            self.client.log_batch(self.run_id, metrics=batch)

    def log_artifact(self, path: str | os.PathLike, artifact_path: str | None = None) -> None:
        # A missing local file is the caller's bug, not a store outage: never swallow it.
        if not Path(path).exists():
            raise FileNotFoundError(f"{path}: artifact to log does not exist")
        with self._guard("log_artifact"):
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_model(self, model: Any, name: str = "model") -> None:
        """Log a torch model so that `mlflow.pytorch.load_model(f"runs:/{run_id}/{name}")` works.

        Pickle serialisation (torch.export would need an input example) and an explicit pip
        requirement list, so logging takes a second instead of an environment inference.
        """
        import mlflow
        import mlflow.pytorch
        import torch

        model = getattr(model, "module", model)  # unwrap DDP and the like
        with self._guard("log_model", broad=True):
            # Create the logged model through our client, in the run's experiment: left to itself,
            # Model.log would file it under the global default experiment ("0", in ./mlruns).
            experiment_id = self.client.get_run(self.run_id).info.experiment_id
            logged = self.client.create_logged_model(
                experiment_id, name=name, source_run_id=self.run_id
            )
            # Model.log resolves the store from MLflow's global URI; point it at ours.
            mlflow.set_tracking_uri(self.uri)
            torch_version = torch.__version__.split("+")[0]
            with _quiet("mlflow.pytorch"):  # its pickle warning is about loading untrusted files
                mlflow.pytorch.log_model(
                    model,
                    name=name,
                    run_id=self.run_id,
                    model_id=logged.model_id,
                    serialization_format="pickle",
                    pip_requirements=[f"torch=={torch_version}", f"mlflow=={mlflow.__version__}"],
                )

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        from mlflow.entities import RunTag

        with self._guard("set_tags"):
            self.client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])

    @contextlib.contextmanager
    def _guard(self, what: str, *, broad: bool = False) -> Iterator[None]:
        # The store was checked at job start; a failure now (server restart, network blip after
        # MLflow's own retries) must not throw away hours of training whose metrics are also on
        # disk, so it is reported loudly and the job goes on. `broad` also covers serialisation
        # errors: log_model runs after model.pt is written, and failing the job there would make
        # Snakemake delete that model.
        from mlflow.exceptions import MlflowException

        try:
            yield
        except Exception as err:
            if not (broad or isinstance(err, MlflowException | OSError)):
                raise
            if getattr(err, "error_code", None) in _CALLER_ERROR_CODES:
                raise  # a bad call (e.g. changing a logged param), not an outage
            self.failures += 1
            log.warning("MLflow %s failed for run %s at %s: %s", what, self.run_id, self.uri, err)


@contextlib.contextmanager
def job_run(
    cfg: Config,
    *,
    stage: str,
    params: Mapping[str, Any] | None = None,
    enabled: bool = True,
    defer: bool = False,
) -> Iterator[Any]:
    """Run a job inside an MLflow child run; yield its Tracker (a NullTracker when not logging).

    The run is nested under $COSMOCUB_PARENT_RUN_ID when set, tagged with the rule, wildcards,
    stage, config hash, git commit, host and scheduler job id, and carries the flattened config as
    params and the resolved config as `config.yaml`. An exception ends it FAILED and propagates.

    `defer`, for jobs of seconds: inside a workflow (a parent run is set) the run is written to a
    pending record instead (`cosmocub.tracking.pending`), without importing MLflow, and logged by
    the next process that opens the store; by hand it is logged at once as usual.
    """
    if not (enabled and cfg.tracking.enabled):
        yield NullTracker()
        return
    tags = _job_tags(cfg, stage)
    if defer and os.environ.get(PARENT_RUN_ENV):
        with _deferred_run(cfg, tags, params) as recorder:
            yield recorder
        return
    from mlflow.tracking import MlflowClient

    experiment_id = init_store(cfg)  # fails here, at job start, if the store is unusable
    uri = tracking_uri(cfg)
    client = MlflowClient(tracking_uri=uri)
    _flush_pending(cfg, client)
    try:
        with _probe_timeouts():
            run = client.create_run(experiment_id, tags=tags, run_name=_run_name(tags))
    except Exception as err:
        raise _unavailable(cfg, uri, err) from err
    tracker = Tracker(uri, run.info.run_id)
    monitor = _start_system_metrics(cfg, uri, tracker.run_id)
    status = "FAILED"
    try:
        _log_config(client, tracker.run_id, cfg, params=params)
        yield tracker
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if monitor is not None:
            monitor.finish()
        with tracker._guard("set_terminated"):
            client.set_terminated(tracker.run_id, status=status)
        if tracker.failures:
            log.warning("%d MLflow call(s) failed during run %s", tracker.failures, tracker.run_id)


@contextlib.contextmanager
def _deferred_run(
    cfg: Config, tags: dict[str, str], params: Mapping[str, Any] | None
) -> Iterator[Any]:
    from cosmocub.tracking.pending import RecordingTracker, write_record

    recorder = RecordingTracker()
    start_ms, status = int(time.time() * 1000), "FAILED"
    try:
        yield recorder
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        write_record(
            cfg,
            recorder,
            tags=tags,
            run_name=_run_name(tags),
            params=params,
            start_ms=start_ms,
            status=status,
        )


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    logger = logging.getLogger(logger_name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _start_system_metrics(cfg: Config, uri: str, run_id: str) -> Any:
    if not cfg.tracking.system_metrics:
        return None
    # The monitor mlflow.start_run(log_system_metrics=True) uses, bound to our URI instead of the
    # global one, so concurrent jobs in threads do not share an active run.
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, tracking_uri=uri)
    monitor.start()
    return monitor


def _log_config(client: Any, run_id: str, cfg: Config, *, params: Mapping[str, Any] | None) -> None:
    from mlflow.entities import Param

    merged = {**flatten(cfg.values), **(params or {})}
    client.log_batch(run_id, params=[Param(k, param_value(v)) for k, v in merged.items()])
    client.log_text(run_id, yaml.safe_dump(cfg.values, sort_keys=False), "config.yaml")


def _run_name(tags: Mapping[str, str]) -> str:
    wildcards = tags.get("wildcards")
    return f"{tags['rule']}[{wildcards}]" if wildcards else tags["rule"]


def _job_tags(cfg: Config, stage: str) -> dict[str, str]:
    tags = {**_common_tags(cfg), "cosmocub.kind": "job", "stage": stage}
    tags["rule"] = os.environ.get(RULE_ENV) or stage
    tags["mlflow.source.name"] = f"cosmocub {stage}"
    if parent := os.environ.get(PARENT_RUN_ENV):
        tags["mlflow.parentRunId"] = parent
    if wildcards := os.environ.get(WILDCARDS_ENV):
        tags["wildcards"] = wildcards
        # One tag per wildcard as well, so runs can be filtered with tags.`wildcard.run` = 'x'.
        for item in wildcards.split(","):
            key, sep, value = item.partition("=")
            if sep and key.strip():
                tags[f"wildcard.{key.strip()}"] = value.strip()
    for scheduler, env in SCHEDULER_JOB_ENVS.items():
        if job_id := os.environ.get(env):
            tags["scheduler"] = scheduler
            tags["scheduler_job_id"] = job_id
            break
    return tags


def _common_tags(cfg: Config) -> dict[str, str]:
    tags = {
        "config_hash": cfg.hash,
        "config_source": cfg.source,
        "host": socket.gethostname(),
        "mlflow.user": _user(),
    }
    if commit := git_commit():
        tags["git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    return tags


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        return str(os.getuid())


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    """HEAD of the git repository holding `cwd` (default: the working dir), or None."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=3,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and commit else None
