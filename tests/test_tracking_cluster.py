"""MLflow at cluster scale: 8 jobs logging into the default SQLite store at once, and jobs logging
over HTTP to an `mlflow server` the workflow starts (tracking.server)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

JOBS = 8
STEPS = 40
METRICS = ("loss", "mae", "lr")

# One job: a child run with the config as params, STEPS batches of METRICS, an artifact.
JOB = textwrap.dedent(
    """
    import json, sys
    from cosmocub.config import load_config
    from cosmocub.tracking.runs import job_run

    cfg = load_config(sys.argv[1])
    index = int(sys.argv[2])
    with job_run(cfg, stage="simulate", params={{"job": index}}) as tracker:
        for step in range({steps}):
            tracker.log_metrics({{name: index + step / 1000 for name in {metrics!r}}}, step=step)
    print(json.dumps({{"run_id": tracker.run_id, "failures": tracker.failures}}))
    """
).format(steps=STEPS, metrics=METRICS)


def _run_jobs(config: Path, tmp_path: Path, jobs: int = JOBS) -> list[dict]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(config), str(i)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(jobs)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
        assert "database is locked" not in err, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _count(uri: str, experiment: str, results: list[dict]) -> tuple[int, int]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    runs = [r for r in runs if r.data.tags.get("cosmocub.kind") == "job"]
    assert {r.info.run_id for r in runs} == {r["run_id"] for r in results}
    points = 0
    for run in runs:
        assert run.info.status == "FINISHED"
        index = int(run.data.params["job"])
        for name in METRICS:
            history = client.get_metric_history(run.info.run_id, name)
            assert sorted(m.step for m in history) == list(range(STEPS))
            assert {round(m.value - index, 6) for m in history} == {
                round(s / 1000, 6) for s in range(STEPS)
            }
            points += len(history)
    return len(runs), points


# Eight processes at once on one SQLite store (41 s at the suite's load): on request.
@pytest.mark.long
def test_eight_jobs_log_to_sqlite_at_once(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {"results": str(tmp_path / "results"), "tracking": {"experiment": "concurrent"}}
        )
    )
    results = _run_jobs(config, tmp_path)
    assert [r["failures"] for r in results] == [0] * JOBS
    runs, points = _count(f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}", "concurrent", results)
    print(f"concurrent SQLite logging: {runs} runs, {points} metric points, 0 lock errors")
    assert (runs, points) == (JOBS, JOBS * STEPS * len(METRICS))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A whole workflow beside the server it starts (62 s at the suite's load): on request, beside
# tests/test_tracking.py's runs logged to a real server.
@pytest.mark.long
def test_jobs_log_over_http_to_the_server_the_workflow_starts(tmp_path, monkeypatch):
    import os
    import urllib.request

    from cosmocub.config import load_config
    from cosmocub.tracking.runs import PARENT_RUN_ENV
    from cosmocub.tracking.server import SERVER_PID_ENV
    from cosmocub.tracking.store import tracking_uri
    from cosmocub.tracking.workflow_run import finish_tracking, start_tracking

    port = _free_port()
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "results": str(tmp_path / "results"),
                "tracking": {"experiment": "served", "server": {"start": True, "port": port}},
            }
        )
    )
    cfg = load_config(config)
    assert tracking_uri(cfg) == f"http://127.0.0.1:{port}"
    monkeypatch.delenv(PARENT_RUN_ENV, raising=False)
    monkeypatch.delenv(SERVER_PID_ENV, raising=False)
    start_tracking(cfg, ["all"])  # what the Snakefile's onstart does
    pid = int(os.environ[SERVER_PID_ENV])
    parent = os.environ[PARENT_RUN_ENV]
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert r.status == 200
        results = _run_jobs(config, tmp_path, jobs=2)
        runs, points = _count(f"http://127.0.0.1:{port}", "served", results)
        assert (runs, points) == (2, 2 * STEPS * len(METRICS))
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"http://127.0.0.1:{port}")
        run = client.get_run(results[0]["run_id"])
        assert run.data.tags["mlflow.parentRunId"] == parent
        # Artifacts went through the server into <results>/mlartifacts, not into the job's cwd.
        assert run.info.artifact_uri.startswith("mlflow-artifacts:")
        stored = list((tmp_path / "results" / "mlartifacts").rglob("config.yaml"))
        assert len(stored) == 2 + 1  # every job and the parent run
    finally:
        finish_tracking(cfg, "FINISHED")  # what onsuccess does: closes the run, stops the server
    assert SERVER_PID_ENV not in os.environ
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    from mlflow.tracking import MlflowClient

    db = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}")
    assert db.get_run(parent).info.status == "FINISHED"
