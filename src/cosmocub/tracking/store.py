"""The MLflow store runs log to: its URI, its experiment (created once), a fast reachability probe.

A job opens the store at its start with short timeouts, so a missing server fails it in seconds;
every failure to reach or create the store is one TrackingUnavailable naming the URI.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

from cosmocub.config import Config

# MLflow 3's UI opens an experiment in its GenAI view unless it is told it holds model training.
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
# The start-of-job probe: one retry, no backoff, 5 s per request, so a dead server costs seconds.
_PROBE_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "0",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "5",
}


class TrackingUnavailable(ValueError):
    """The configured MLflow store cannot be reached or created; the message names the URI."""


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
            with probe_timeouts():
                return _get_or_create_experiment(cfg, uri)
        _prepare_sqlite_folder(cfg, uri, db)
        with _file_lock(db.with_name(db.name + ".lock")):
            return _get_or_create_experiment(cfg, uri)
    except TrackingUnavailable:
        raise
    except Exception as err:  # any failure to reach/create the store is the same user problem
        raise store_unavailable(cfg, uri, err) from err


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
            raise store_unavailable(cfg, uri, err) from err
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TrackingUnavailable(
                f"{cfg.source}: key '{store_key(cfg)[0]}': MLflow store {uri} is unavailable: "
                f"folder {folder} is not writable"
            )


def store_unavailable(cfg: Config, uri: str, err: BaseException) -> TrackingUnavailable:
    """The one-line error for a store that `err` says cannot be used, naming the URI and the key."""
    reason = " ".join(str(err).split()) or type(err).__name__
    if len(reason) > 240:
        reason = reason[:237] + "..."
    key, hint = store_key(cfg)
    return TrackingUnavailable(
        f"{cfg.source}: key '{key}': MLflow store {uri} is unavailable "
        f"({type(err).__name__}: {reason}); {hint}, or set tracking.enabled: false"
    )


def store_key(cfg: Config) -> tuple[str, str]:
    """The config key that chose the store, and what to do when it does not answer."""
    if cfg.tracking.uri:
        return "tracking.uri", "start the server or fix tracking.uri"
    if cfg.tracking.server.start:
        return "tracking.server.start", (
            "the server this workflow started is gone (see results/logs/mlflow-server.log); "
            "run the workflow again"
        )
    return "results", "check results/"


@contextlib.contextmanager
def probe_timeouts() -> Iterator[None]:
    """MLflow's HTTP calls inside this block give up within seconds (one retry, 5 s each)."""
    # MLflow reads these at each request; restore them after (a job's later calls run under
    # sender.job_http_timeouts, and its sender retries by itself).
    with environ_set(_PROBE_ENV):
        yield


@contextlib.contextmanager
def environ_set(values: dict[str, str]) -> Iterator[None]:
    """`values` in os.environ inside the block, and os.environ as it was after it."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
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
