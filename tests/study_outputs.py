"""Synthetic outputs of the scaling study's points (point.json, run/train_summary.json and
run/metrics.jsonl), as `cosmocub study-point` leaves them, for gather tests without training.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path

from cosmocub.config import Config
from cosmocub.studies import scaling


def point_times(data: int, spatial: int, local_batch: int) -> dict[str, float]:
    """Per-step seconds: compute ∝ the rank's share of its samples, 10 ms per exchange and halo."""
    return {
        "time_compute_s": 0.05 * local_batch / spatial,
        "time_exchange_s": 0.01 if data > 1 else 0.0,
        "time_halo_s": 0.01 if spatial > 1 else 0.0,
    }


def write_scaling_outputs(
    cfg: Config,
    folder: Path,
    *,
    oversubscribed: Collection[str] = (),
    run_ids: Mapping[str, str] | None = None,
) -> None:
    """Every point of cfg's scaling study under `folder`: one core per rank, except the points
    in `oversubscribed` (their ranks shared one core between two); `run_ids`: point → the
    MLflow run id its training summary names."""
    for point in scaling.points(cfg):
        data, spatial = (int(n) for n in point.name.split("_")[1].split("x"))
        local = point.labels["local_batch_size"]
        shared = point.name in oversubscribed
        times = point_times(data, spatial, local)
        step = sum(times.values())
        epochs = [
            {
                "epoch": e,
                "step": 4 * e,
                **times,
                "comm_bytes_per_step": 1000.0 * (data > 1),
                "halo_bytes_per_step": 500.0 * (spatial > 1),
                "samples_per_s": point.labels["global_batch_size"] / step,
                "data_wait_share": 0.0,
                "val_loss": 1.0 / e,
                "peak_rss_mb": 100.0,
            }
            for e in (1, 2)
        ]
        run = folder / point.name / "run"
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in epochs))
        summary = {"world_size": data * spatial, "data_parallel": data, "steps": 8}
        summary |= {"spatial_parallel": spatial, "mlflow_run_id": (run_ids or {}).get(point.name)}
        (run / "train_summary.json").write_text(json.dumps(summary))
        record = {
            "point": point.name,
            "nodes": point.launch.nodes,
            "ranks_per_node": point.launch.ranks_per_node,
            "cores_per_rank": 0.5 if shared else 1.0,
            "threads_per_rank": 1,
            "oversubscribed": shared,
        }
        (folder / point.name / "point.json").write_text(json.dumps(record))
