"""`perf-model calibrate --from-run PATH` on what it is given: a result log (run_calibration),
or a cosmocub run folder, on GPUs (against its preset's roofline) or on this CPU (against this
CPU's calibration grid).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.io import read_jsonl
from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS
from cosmocub.perfmodel.cost_model.machines import this_cpu
from cosmocub.perfmodel.cost_model.software import profile
from cosmocub.perfmodel.measure.cpu_model import Calibration
from cosmocub.perfmodel.uses.run_calibration import (
    GPU_STRAGGLERS,
    RunCalibration,
    RunScale,
    calibrate_mllog,
    make_calibration,
    predict_scale,
)
from cosmocub.perfmodel.uses.run_prediction import Workload


def _gpu_family_match(name: str) -> str | None:
    """The preset whose accelerator a driver's device name is (roofline and NCCL's nodes)."""
    upper = name.upper().replace(" ", "-")
    for family, key in (
        ("H100", "eos"),
        ("A100-SXM4-80GB", "selene"),
        ("A100-SXM4-40GB", "perlmutter"),
    ):
        if family in upper:
            return key
    return None


def _run_record(run_dir: Path) -> tuple[dict[str, Any], list[float]]:
    """(train_summary.json, the measured step's own compute of every epoch after the first:
    metrics.jsonl's time_compute_s, the step less its exchange and halo)."""
    summary_path = run_dir / "train_summary.json"
    if not summary_path.is_file():
        raise ValueError(f"{run_dir}: no train_summary.json (not a finished cosmocub run)")
    summary = json.loads(summary_path.read_text())
    missing = [k for k in ("accelerator", "nodes", "ranks_per_node") if k not in summary]
    if missing:
        raise ValueError(
            f"{summary_path}: no {', '.join(missing)} (a run from before they were recorded)"
        )
    metrics = run_dir / "metrics.jsonl"
    records = [r for r in read_jsonl(metrics) if "time_compute_s" in r] if metrics.is_file() else []
    if not records:
        raise ValueError(f"{metrics}: no epoch with time_compute_s")
    kept = records[1:] if len(records) > 1 else records  # the first epoch holds warm-up
    return summary, [r["time_compute_s"] for r in kept]


def calibrate_cpu_run(
    run_dir: Path, cfg: Config, calibration: Calibration, *, cores: int
) -> RunCalibration:
    """A cosmocub run on this machine's CPU (one rank a sample, no spatial split): its measured
    compute (forward, backward, update) ÷ what this CPU's calibration prices at the run's batch,
    threads and ranks, as `perf-model validate`'s correction fits it on its fit set; predict
    --accelerator cpu --calibration FILE scales the calibration by it.

    The run's fastest epoch after the first is its compute, as the calibration keeps each
    timing's fastest repeat: on a shared machine other work only adds time, and this VM's own
    speed drifts by up to a quarter over tens of seconds with its thread on a core
    (docs/explanation/cluster_model.md), so a median measures when the run was disturbed."""
    summary, epochs = _run_record(run_dir)
    compute = min(epochs)
    if cfg.parallel.spatial != 1:
        raise ValueError(
            f"{run_dir}: parallel.spatial {cfg.parallel.spatial}: calibrate on a run without a "
            "spatial split (its measured compute then holds no halo)"
        )
    ranks = int(summary["ranks_per_node"])
    device = this_cpu(
        threads_per_rank=cfg.train.threads_per_rank,
        ranks_per_node=ranks,
        cores=cores,
        calibration=calibration,
    )
    world = int(summary["world_size"])
    layers = device.layer_seconds(
        cfg.model, batch=cfg.train.local_batch_size, split=(1, 1, 1), synced_norm=world > 1
    )
    predicted = sum(layers.values()) + device.optimizer_seconds(cfg.model, cfg.optimizer)
    return make_calibration(
        str(run_dir), None, None, _summary_scale(summary), (compute, compute / predicted)
    )


def calibrate_run_folder(run_dir: Path, cfg: Config) -> RunCalibration:
    """A cosmocub run on GPUs (train_summary.json: accelerator, nodes, ranks per node, global
    batch; metrics.jsonl: the measured compute, timed with CUDA events): its layers' scale
    against the roofline of the preset with that accelerator. Not yet run on a GPU."""
    summary, epochs = _run_record(run_dir)
    step = statistics.median(epochs)  # a GPU's epochs: its own device, not a shared core
    accelerator = str(summary["accelerator"])
    preset = _gpu_family_match(accelerator)
    if preset is None:
        raise ValueError(
            f"{run_dir / 'train_summary.json'}: accelerator {accelerator!r} has no cluster preset"
        )
    run = _summary_scale(summary)
    cluster = CLUSTERS[preset]
    software = profile("cosmocub_eager")
    # The measured compute is the rank's own (the wait for others falls in its exchange time):
    # less the model's other device work, the layers'.
    t = predict_scale(Workload.of(cfg), run, cluster, software, GPU_STRAGGLERS)
    other = t.own_s - t.host_s - t.compute_s
    if step <= other:
        raise ValueError(
            f"{run_dir}: a measured compute of {1e3 * step:.3g} ms leaves nothing for the layers"
        )
    scale = (step - other) / t.compute_s
    return make_calibration(
        str(run_dir), cluster, software, run, (step, scale), stragglers_cv=GPU_STRAGGLERS.cv
    )


def _summary_scale(summary: dict[str, Any]) -> RunScale:
    """A cosmocub run's scale from its train_summary.json: one step's samples for each split (the
    calibration prices a step, not the run's epochs)."""
    batch = int(summary["global_batch_size"])
    return RunScale(
        nodes=int(summary["nodes"]),
        ranks_per_node=int(summary["ranks_per_node"]),
        global_batch=batch,
        train_samples=batch * max(1, int(summary.get("steps", 1))),
        eval_samples=batch,
    )


def calibrate_from_run(
    path: Path, cfg: Config, *, cpu: Callable[[], tuple[Calibration, int]]
) -> RunCalibration:
    """A result log (a file) or a cosmocub run folder trained with `cfg` (a GPU run against its
    preset's roofline; a CPU run against this CPU's calibration, `cpu()` giving it and the
    cores); a one-line ValueError for anything else."""
    if path.is_dir():
        summary, _ = _run_record(path)
        if str(summary["accelerator"]).startswith("cpu"):
            calibration, cores = cpu()
            return calibrate_cpu_run(path, cfg, calibration, cores=cores)
        return calibrate_run_folder(path, cfg)
    if not path.is_file():
        raise ValueError(f"--from-run {path}: no such file or folder")
    return calibrate_mllog(path, Workload.of(cfg))
