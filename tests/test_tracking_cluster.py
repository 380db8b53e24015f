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
    from cosmocub.tracking import job_run

    cfg = load_config(sys.argv[1])
    index = int(sys.argv[2])
    with job_run(cfg, stage="simulate", params={{"job": index}}) as tracker:
        for step in range({steps}):
            tracker.log_metrics({{name: index + step / 1000 for name in {metrics!r}}}, step=step)
    print(json.dumps({{"run_id": tracker.run_id, "failures": tracker.failures}}))
    """
).format(steps=STEPS, metrics=METRICS)


def _run_jobs(config: Path, tmp_path: Path) -> list[dict]:
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
        for i in range(JOBS)
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


@pytest.mark.slow
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
