"""System metrics (CPU, memory, GPU) of a job, sampled into its MLflow run while it works.

MLflow's own monitor, bound to the run's store rather than to MLflow's global active run.
"""

from __future__ import annotations

from typing import Any

from cosmocub.config import Config


def start_system_metrics(cfg: Config, uri: str, run_id: str) -> Any:
    """Start sampling into run `run_id` when tracking.system_metrics is on; returns the monitor
    (its `finish()` stops it) or None."""
    if not cfg.tracking.system_metrics:
        return None
    # The monitor mlflow.start_run(log_system_metrics=True) uses, bound to our URI instead of the
    # global one, so concurrent jobs in threads do not share an active run.
    from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

    monitor = SystemMetricsMonitor(run_id, tracking_uri=uri)
    monitor.start()
    return monitor
