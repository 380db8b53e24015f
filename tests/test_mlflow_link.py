"""The link to the MLflow UI's runs view that the workflow logs last (README: MLflow)."""

from pathlib import Path

import pytest

from cosmocub import workflow_support as ws
from cosmocub.config import load_config
from cosmocub.tracking import tracker as tracking


def test_runs_view_link_names_the_experiment_and_the_view(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = ws.runs_view_url("http://host:5000/", "7")
    assert url == "http://host:5000/#/experiments/7/runs?workflowType=machine_learning"
    # The store itself is tracking's (tested there); here, which id and URL the line shows.
    monkeypatch.setattr(tracking, "init_store", lambda cfg: "12")
    cfg = load_config(None, overrides={"results": str(tmp_path)})
    line = ws.mlflow_runs_link(cfg)
    assert line.startswith(
        "MLflow runs: http://127.0.0.1:5000/#/experiments/12/runs?workflowType=machine_learning"
    )
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in line
    server = load_config(None, overrides={"tracking": {"uri": "http://mlflow.site:8080"}})
    assert ws.mlflow_runs_link(server) == (
        "MLflow runs: http://mlflow.site:8080/#/experiments/12/runs?workflowType=machine_learning"
    )

    def unreachable(cfg):
        raise tracking.TrackingUnavailable("store down")

    monkeypatch.setattr(tracking, "init_store", unreachable)
    assert ws.mlflow_runs_link(server) == ""  # the workflow's end does not fail on it
    off = load_config(None, overrides={"tracking": {"enabled": False}})
    assert ws.mlflow_runs_link(off) == ""
