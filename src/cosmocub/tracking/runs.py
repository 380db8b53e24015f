"""The runs of a workflow: one parent run per invocation, one child run per job, and their tags.

Jobs find the parent run, their rule and wildcards in the environment the Snakefile sets; only
world rank 0 logs (callers pass `enabled=`), and a job of seconds may defer its run to a record.
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping
from typing import Any

import yaml

from cosmocub.config import Config, flatten
from cosmocub.tracking.pending import RecordingTracker, flush_pending, param_value, write_record
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


def start_workflow_run(
    cfg: Config, *, name: str | None = None, tags: Mapping[str, str] | None = None
) -> str:
    """Open the parent run of one workflow invocation, named `name` (default workflow-<date>)
    with `tags` beside the common ones; return its id ("" if tracking is off)."""
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
        with probe_timeouts():
            client = MlflowClient(tracking_uri=uri)
            _flush_pending(cfg, client)  # the runs of the last short jobs
            client.set_terminated(run_id, status=status)
    except Exception as err:
        raise store_unavailable(cfg, uri, err) from err


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
        with probe_timeouts():
            run = client.create_run(experiment_id, tags=tags, run_name=_run_name(tags))
    except Exception as err:
        raise store_unavailable(cfg, uri, err) from err
    tracker = Tracker(uri, run.info.run_id)
    monitor = start_system_metrics(cfg, uri, tracker.run_id)
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
        tracker.end(status)
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
