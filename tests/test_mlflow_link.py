"""The link to the MLflow UI's runs view that the workflow logs last
(docs/getting-started/mlflow.md), and the name the runs view
lists the workflow's parent run under."""

from pathlib import Path

import pytest

from cosmocub.config import load_config
from cosmocub.tracking import store
from cosmocub.tracking.workflow_run import (
    MAX_RUN_NAME,
    mlflow_runs_link,
    runs_view_url,
    workflow_run_name,
)


def test_runs_view_link_names_the_experiment_and_the_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = runs_view_url("http://host:5000/", "7")
    assert url == "http://host:5000/#/experiments/7/runs?workflowType=machine_learning"
    # The store itself is tracking's (tested there); here, which id and URL the line shows.
    monkeypatch.setattr(store, "init_store", lambda cfg: "12")
    cfg = load_config(None, overrides={"results": str(tmp_path)})
    line = mlflow_runs_link(cfg)
    assert line.startswith(
        "MLflow runs: http://127.0.0.1:5000/#/experiments/12/runs?workflowType=machine_learning"
    )
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in line
    server = load_config(None, overrides={"tracking": {"uri": "http://mlflow.site:8080"}})
    assert mlflow_runs_link(server) == (
        "MLflow runs: http://mlflow.site:8080/#/experiments/12/runs?workflowType=machine_learning"
    )

    def unreachable(cfg):
        raise store.TrackingUnavailable("store down")

    monkeypatch.setattr(store, "init_store", unreachable)
    assert mlflow_runs_link(server) == ""  # the workflow's end does not fail on it
    off = load_config(None, overrides={"tracking": {"enabled": False}})
    assert mlflow_runs_link(off) == ""


def test_the_parent_run_is_named_after_the_targets() -> None:
    assert workflow_run_name(["network_study"]) == "network_study"
    assert workflow_run_name(["all"]) == "all"  # no target given: the default one
    assert workflow_run_name(["network_study", "scaling_study"]) == "network_study scaling_study"
    assert workflow_run_name([]) is None  # none known: start_workflow_run's workflow-<date>
    files = [f"results/runs/run{i:03d}/eval/metrics.json" for i in range(20)]
    name = workflow_run_name(files)
    assert len(name) <= MAX_RUN_NAME and name.startswith(files[0] + " " + files[1])
    kept = len(name.split(" +")[0].split())
    assert name.endswith(f" +{20 - kept} more") and 1 < kept < 20
    assert workflow_run_name(["x" * 300]) == "x" * MAX_RUN_NAME
