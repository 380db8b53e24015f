"""The runs of a workflow: one parent run per invocation, one child run per job, and their tags.

Jobs find the parent run, their rule and wildcards in the environment the Snakefile sets; only
world rank 0 logs (callers pass `enabled=`), and a job of seconds may defer its run to a record.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from cosmocub.config import Config, flatten
from cosmocub.io import write_json
from cosmocub.tracking.pending import (
    RecordingTracker,
    flush_pending,
    param_value,
    pending_dir,
    replay_epochs,
    write_record,
    write_run_update,
)
from cosmocub.tracking.reconcile import PID_TAG, end_dead_runs, owner_tags
from cosmocub.tracking.sender import job_http_timeouts
from cosmocub.tracking.store import init_store, probe_timeouts, store_unavailable, tracking_uri
from cosmocub.tracking.system import start_system_metrics
from cosmocub.tracking.tracker import NullTracker, Tracker

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
# How long a job's end waits for its last metrics to reach the store before it keeps them in
# mlflow-pending/ instead.
CLOSE_TIMEOUT_S = 15.0


def start_workflow_run(
    cfg: Config,
    *,
    name: str | None = None,
    tags: Mapping[str, str] | None = None,
    owned: bool = False,
) -> str:
    """Open the parent run of one workflow invocation, named `name` (default workflow-<date>)
    with `tags` beside the common ones; return its id ("" if tracking is off). `owned`: this
    process (Snakemake's) ends the run, and a later workflow may end it KILLED once it is gone;
    runs left RUNNING by dead processes of this host are ended so here."""
    if not cfg.tracking.enabled:
        return ""
    from mlflow.tracking import MlflowClient

    experiment_id = init_store(cfg)
    uri = tracking_uri(cfg)
    client = MlflowClient(tracking_uri=uri)
    tags = {
        **_common_tags(cfg),
        **(tags or {}),
        "cosmocub.kind": "workflow",
        "mlflow.source.name": "snakemake",
    }
    if owned:
        tags.update(owner_tags())
    run_name = name or time.strftime("workflow-%Y%m%d-%H%M%S")
    run = client.create_run(experiment_id, tags=tags, run_name=run_name)
    run_id = run.info.run_id
    _log_config(client, run_id, cfg, params=None)
    _flush_pending(cfg, client)  # left by an earlier invocation that was killed
    end_dead_runs(client, experiment_id)  # after the records: they end their runs themselves
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
        with probe_timeouts():
            client = MlflowClient(tracking_uri=uri)
            _flush_pending(cfg, client)  # the runs of the last short jobs
            client.set_terminated(run_id, status=status)
    except Exception as err:
        raise store_unavailable(cfg, uri, err) from err


def sync_pending(cfg: Config) -> int:
    """Deliver every record in mlflow-pending/ (short jobs' runs, what runs could not send);
    returns how many. Raises TrackingUnavailable (one line) when the store does not answer, and
    when records are left (the store failed part way)."""
    from mlflow.tracking import MlflowClient

    init_store(cfg)
    uri = tracking_uri(cfg)
    with probe_timeouts():
        count = flush_pending(cfg, MlflowClient(tracking_uri=uri))
    if left := sorted(pending_dir(cfg).glob("*.json")):
        raise store_unavailable(
            cfg, uri, RuntimeError(f"{len(left)} record(s) left in {left[0].parent}")
        )
    return count


def _flush_pending(cfg: Config, client: Any) -> None:
    if count := flush_pending(cfg, client):
        log.info("MLflow: logged %d pending job run(s)", count)


@contextlib.contextmanager
def job_run(
    cfg: Config,
    *,
    stage: str,
    params: Mapping[str, Any] | None = None,
    enabled: bool = True,
    defer: bool = False,
    run_file: Path | None = None,
    reopen: bool = False,
    epochs_file: Path | None = None,
) -> Iterator[Any]:
    """Run a job inside an MLflow child run; yield its Tracker (a NullTracker when not logging).

    The run is nested under $COSMOCUB_PARENT_RUN_ID when set, tagged with the rule, wildcards,
    stage, config hash, git commit, host and scheduler job id, and carries the flattened config as
    params and the resolved config as `config.yaml`. An exception ends it FAILED and propagates.

    `run_file` (a training's run folder) keeps the run's id: with `reopen` (a resumed training)
    the run it names is continued instead of a new one started. `epochs_file` (metrics.jsonl)
    holds what the run must hold in the end: epochs it lacks are replayed from it. What the store
    did not take by the job's end (down, or slow) is kept in mlflow-pending/ for later.

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
    _flush_pending(cfg, client)  # a resumed run's own record first, before it is reopened
    try:
        with probe_timeouts():
            run_id = _reopen_run(client, run_file, uri, tags) if reopen and run_file else None
            if run_id is None:
                run_id = client.create_run(experiment_id, tags=tags, run_name=_run_name(tags))
                run_id = run_id.info.run_id
    except Exception as err:
        raise store_unavailable(cfg, uri, err) from err
    if run_file is not None:
        write_json(run_file, {"tracking_uri": uri, "run_id": run_id})
    with job_http_timeouts():
        tracker = Tracker(uri, run_id)
        monitor = start_system_metrics(cfg, uri, tracker.run_id)
        status = "FAILED"
        try:
            _log_config(client, tracker.run_id, cfg, params=params, reopened=reopen)
            yield tracker
            status = "FINISHED"
        except KeyboardInterrupt:
            status = "KILLED"
            raise
        finally:
            if monitor is not None:
                monitor.finish()
            _end_run(cfg, tracker, status, epochs_file)


def _reopen_run(client: Any, run_file: Path, uri: str, tags: Mapping[str, str]) -> str | None:
    """The run named in `run_file`, set RUNNING again, or None where there is none to continue
    (no file, another store, a run deleted since)."""
    from mlflow.exceptions import MlflowException

    try:
        kept = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return None
    if kept.get("tracking_uri") != uri or not kept.get("run_id"):
        return None
    try:
        run = client.get_run(kept["run_id"])
    except MlflowException as err:
        if err.error_code == "RESOURCE_DOES_NOT_EXIST":
            return None
        raise
    if run.info.lifecycle_stage == "deleted":
        return None
    client.update_run(run.info.run_id, status="RUNNING")
    client.set_tag(run.info.run_id, PID_TAG, str(os.getpid()))  # its owner now
    # The run keeps its first parent; the invocation that continued it is noted beside it.
    resumes = int(run.data.tags.get("cosmocub.resumes", "0")) + 1
    client.set_tag(run.info.run_id, "cosmocub.resumes", str(resumes))
    if parent := tags.get("mlflow.parentRunId"):
        client.set_tag(run.info.run_id, "cosmocub.resumed_under", parent)
    log.info("MLflow: continuing run %s (resume %d)", run.info.run_id, resumes)
    return run.info.run_id


def _end_run(cfg: Config, tracker: Tracker, status: str, epochs_file: Path | None) -> None:
    """Send what is left, replay the epochs the run lacks, set its status; keep in a pending
    record whatever of that the store did not take."""
    unsent = tracker.close(CLOSE_TIMEOUT_S)
    reachable = not unsent and not tracker.sender.circuit_open
    if reachable and epochs_file is not None:
        try:
            replay_epochs(tracker.client, tracker.run_id, epochs_file)
        except Exception as err:  # an outage at the very end: the record below replays it
            log.warning(
                "MLflow: could not replay %s into run %s: %s", epochs_file, tracker.run_id, err
            )
            reachable = False
    ended = reachable and tracker.end(status)
    if not ended or tracker.unsent_artifacts or tracker.unsent_models:
        path = write_run_update(
            cfg,
            tracker.run_id,
            metrics=unsent,
            artifacts=tracker.unsent_artifacts,
            models=tracker.unsent_models,
            status=None if ended else status,
            epochs_file=None if reachable else epochs_file,
        )
        log.warning(
            "MLflow: the store did not take run %s's end (%d metric value(s) unsent); kept in %s "
            "for the next job or `cosmocub tracking sync`",
            tracker.run_id,
            len(unsent),
            path,
        )
    if tracker.failures:
        log.warning("%d MLflow call(s) failed during run %s", tracker.failures, tracker.run_id)


@contextlib.contextmanager
def _deferred_run(
    cfg: Config, tags: dict[str, str], params: Mapping[str, Any] | None
) -> Iterator[Any]:
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


def _log_config(
    client: Any,
    run_id: str,
    cfg: Config,
    *,
    params: Mapping[str, Any] | None,
    reopened: bool = False,
) -> None:
    from mlflow.entities import Param

    merged = {k: param_value(v) for k, v in {**flatten(cfg.values), **(params or {})}.items()}
    if reopened:
        # MLflow refuses to change a logged param; a continued run keeps its first values (a
        # resume on other hardware may see other thread counts) and adds only new ones.
        logged = client.get_run(run_id).data.params
        changed = sorted(k for k, v in merged.items() if k in logged and logged[k] != v)
        if changed:
            log.info("MLflow: run %s keeps its first value of %s", run_id, ", ".join(changed))
        merged = {k: v for k, v in merged.items() if k not in logged}
    batch = [Param(k, v) for k, v in merged.items()]
    for i in range(0, len(batch), 100):  # log_batch takes at most 100 params a call
        client.log_batch(run_id, params=batch[i : i + 100])
    client.log_text(run_id, yaml.safe_dump(cfg.values, sort_keys=False), "config.yaml")


def _run_name(tags: Mapping[str, str]) -> str:
    wildcards = tags.get("wildcards")
    return f"{tags['rule']}[{wildcards}]" if wildcards else tags["rule"]


def _job_tags(cfg: Config, stage: str) -> dict[str, str]:
    tags = {**_common_tags(cfg), **owner_tags(), "cosmocub.kind": "job", "stage": stage}
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
