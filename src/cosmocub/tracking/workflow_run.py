"""What the Snakefile's onstart, onsuccess and onerror ask of tracking: the resolved config file,
the parent run (and the server the invocation starts), and the link to the runs in the MLflow UI.
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config, write_config
from cosmocub.tracking import store
from cosmocub.tracking.pending import write_run_update
from cosmocub.tracking.runs import PARENT_RUN_ENV, end_workflow_run, start_workflow_run
from cosmocub.tracking.server import SERVER_PID_ENV, start_server, stop_server

# MLflow 3 opens an experiment in its GenAI view in a fresh browser, whatever the experiment's
# tags (the UI keeps the mode per browser); this query after the hash route opens the runs view.
RUNS_VIEW_QUERY = "workflowType=machine_learning"
# MLflow keeps a run name in 250 characters; longer target lists are cut to what fits.
MAX_RUN_NAME = 200
TARGETS_TAG = "cosmocub.targets"


def resolved_config_path(cfg: Config) -> str:
    """Content-addressed: the same config always maps to the same file, a new one to a new file."""
    return str(cfg.results / "config" / f"config-{cfg.hash}.yaml")


def write_resolved_config(cfg: Config, path: str) -> None:
    """Write the resolved config to `path` unless it is there (its name is its content's hash)."""
    if not Path(path).exists():
        write_config(cfg.values, path)


def workflow_run_name(targets: Sequence[str]) -> str | None:
    """The parent run's name: the invocation's targets as given ("network_study", "all",
    "network_study scaling_study"), the first of them and "+N more" where all would not fit in
    MAX_RUN_NAME characters; None without any (start_workflow_run then names it workflow-<date>)."""
    name = " ".join(targets)
    if not targets or len(name) <= MAX_RUN_NAME:
        return name or None
    for kept in range(len(targets) - 1, 0, -1):
        short = f"{' '.join(targets[:kept])} +{len(targets) - kept} more"
        if len(short) <= MAX_RUN_NAME:
            return short
    return name[:MAX_RUN_NAME]  # the first target alone is too long: the names' start


def start_tracking(cfg: Config, targets: Sequence[str]) -> None:
    """Create the store once, before jobs fan out, and open this invocation's parent run, named
    after its `targets` (workflow_run_name) and tagged with them all."""
    if not cfg.tracking.enabled:
        return
    if cfg.tracking.server.start:
        os.environ[SERVER_PID_ENV] = str(start_server(cfg).pid)
        # Snakemake may end without onsuccess/onerror (a second Ctrl-C, an error of its own):
        # the server still goes when this process does.
        atexit.register(_stop_started_server)
    # start_workflow_run creates the store and experiment first. Jobs are child processes of
    # this one (locally) or inherit its environment (srun/sbatch).
    tags = {TARGETS_TAG: " ".join(targets)} if targets else {}
    try:
        run_id = start_workflow_run(cfg, name=workflow_run_name(targets), tags=tags, owned=True)
    except BaseException:
        # Snakemake stops at a failed onstart without calling onerror: the server started above
        # would outlive it (seen: a server too loaded to answer its first API call in time).
        if pid := os.environ.pop(SERVER_PID_ENV, None):
            stop_server(int(pid))
        raise
    os.environ[PARENT_RUN_ENV] = run_id


def finish_tracking(cfg: Config, status: str) -> None:
    """Close the parent run; stop the tracking server this invocation started, if any.

    A store that does not answer is one line on stderr, never an exception (the jobs' outputs
    are made): the run's end is kept in mlflow-pending/ for the next invocation to deliver."""
    run_id = os.environ.get(PARENT_RUN_ENV)
    try:
        if cfg.tracking.enabled and run_id:
            end_workflow_run(cfg, run_id, status)
    except store.TrackingUnavailable as err:
        write_run_update(cfg, run_id, metrics=[], artifacts=[], status=status, epochs_file=None)
        print(f"cosmocub: the workflow's MLflow run stays open: {err}", file=sys.stderr)
    finally:
        _stop_started_server()


def _stop_started_server() -> None:
    if pid := os.environ.pop(SERVER_PID_ENV, None):
        stop_server(int(pid))


def runs_view_url(base_url: str, experiment_id: str) -> str:
    """The MLflow UI's runs table (not its GenAI view) of one experiment."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{RUNS_VIEW_QUERY}"


def mlflow_runs_link(cfg: Config) -> str:
    """One line for the end of a workflow: where to see its runs in the MLflow UI ("" when
    tracking is off or the store cannot be read)."""
    if not cfg.tracking.enabled:
        return ""
    try:
        experiment_id = store.init_store(cfg)
    except ValueError:
        return ""
    uri = store.tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"MLflow runs: {runs_view_url(uri, experiment_id)}"
    # A file store: the UI is the user's `mlflow ui` (port 5000 by default).
    return (
        f"MLflow runs: {runs_view_url('http://127.0.0.1:5000', experiment_id)} "
        f"(start the UI with: mlflow ui --backend-store-uri {uri})"
    )
