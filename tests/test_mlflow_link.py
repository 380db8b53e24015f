"""The link to the MLflow UI's runs view that the workflow logs last (README: MLflow)."""

from pathlib import Path

from cosmocub import workflow_support as ws
from cosmocub.config import load_config


def test_runs_view_link_names_the_experiment_and_the_view(tmp_path: Path) -> None:
    url = ws.runs_view_url("http://host:5000/", "7")
    assert url == "http://host:5000/#/experiments/7/runs?workflowType=machine_learning"
    cfg = load_config(None, overrides={"results": str(tmp_path), "tracking": {"experiment": "x"}})
    line = ws.mlflow_runs_link(cfg)  # creates the SQLite store and experiment "x" (id 1)
    assert line.startswith(
        "MLflow runs: http://127.0.0.1:5000/#/experiments/1/runs?workflowType=machine_learning"
    )
    assert f"mlflow ui --backend-store-uri sqlite:///{tmp_path}/mlflow.db" in line
    off = load_config(None, overrides={"tracking": {"enabled": False}})
    assert ws.mlflow_runs_link(off) == ""
