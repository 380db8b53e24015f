"""Entry of the training stage: read the launcher's environment, build, train, write, close.

One process per device, started by `cosmocub launch --max-restarts R -- train --config CFG
--shards DIR --out RUN_DIR` (torchrun locally, srun on Slurm, see cosmocub.launch.launcher; the
world it starts must be the config's, cluster.train.nodes × train.ranks_per_node):
it starts the ranks again after a crash, never after a user error (exit 2), and `train` resumes
from the newest checkpoint in RUN_DIR/checkpoints by itself. One training at a time holds RUN_DIR
(`run_lock`): a second one is refused at start.
"""

from __future__ import annotations

import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmocub.config import Config
from cosmocub.host_memory import keep_freed_memory
from cosmocub.io import sigterm_deferred, write_json, write_jsonl
from cosmocub.models.model_factory import build_model, save_model_file
from cosmocub.parallel.parallel_dims import (
    build_parallel_dims,
    close_parallel_dims,
    detect_launch_env,
)
from cosmocub.tracking.runs import job_run
from cosmocub.train import runtime
from cosmocub.train.build import build_trainer
from cosmocub.train.loop import TrainState, fit
from cosmocub.train.run_lock import hold_run_folder

log = logging.getLogger(__name__)
# The run folder's record of its MLflow run (store URI and run id), read when training resumes.
MLFLOW_RUN_FILE = "mlflow_run.json"


def train(
    cfg: Config,
    *,
    shards_dir: Path,
    run_dir: Path,
    on_step_end: Callable[[int, nn.Module], None] | None = None,
) -> dict[str, Any]:
    """Train (or resume) the run in `run_dir`; returns what train_summary.json holds.

    `on_step_end(step, model)` runs after every optimizer step and checkpoint (a test hook: raise
    from it to simulate a killed job).
    """
    started = time.time()
    shards_dir, run_dir = Path(shards_dir), Path(run_dir)
    dims = build_parallel_dims(
        backend=cfg.train.backend,
        spatial=cfg.parallel.spatial,
        timeout_s=cfg.train.collective_timeout_s,
        assumed_ranks_per_node=cfg.parallel.assumed_ranks_per_node,
    )
    previous_deterministic = runtime.set_deterministic(cfg.train.deterministic)
    lock = None
    try:
        # Before anything reads or writes the folder: a second training on it stops here.
        lock = hold_run_folder(run_dir, is_main=dims.is_main, world_size=dims.world_size)
        threads = runtime.set_threads(cfg.train, dims)
        host_allocator = keep_freed_memory()
        trainer, state, resumed_from = build_trainer(
            cfg, dims, shards_dir=shards_dir, run_dir=run_dir, on_step_end=on_step_end
        )
        fresh = trainer.checkpoints.fresh_start
        if fresh is not None and dims.is_main:
            log.warning("train: %s", fresh.describe())
        params = {
            "world_size": dims.world_size,
            "data_parallel": dims.data,
            "spatial_parallel": dims.spatial,
            # data × spatial ranks, and the spatial split of a sample along (D, H, W)
            "mesh_shape": f"{dims.data}x{dims.spatial}",
            "spatial_split": "x".join(map(str, cfg.parallel.split_dhw)),
            "global_batch_size": trainer.global_batch,
            "steps_per_epoch": trainer.train_loader.sampler.batches_per_epoch,
            "threads_per_rank": threads,
            "host_allocator": host_allocator,
            "gradient_sync": trainer.grad_sync.name,
            # Where batches are cut (train.data_placement resolved): loader, device or pinned.
            "data_placement": getattr(trainer.train_loader, "placement", "loader"),
        }
        if (levels := getattr(trainer.optimizer, "levels_in_use", None)) is not None:
            # What the quantizer keeps at this data group's size (an all-reduce keeps fewer).
            params["lion_cub_levels_in_use"] = levels
        # A resumed training continues its MLflow run (its id kept in the run folder); a new or
        # fresh-started one opens a new run. metrics.jsonl is what the run must hold at the end.
        with job_run(
            cfg,
            stage="train",
            params=params,
            enabled=dims.is_main,
            run_file=run_dir / MLFLOW_RUN_FILE,
            reopen=resumed_from is not None and fresh is None,
            epochs_file=run_dir / "metrics.jsonl",
        ) as tracker:
            trainer.log = lambda metrics, step: tracker.log_metrics(metrics, step=step)
            if fresh is not None:
                tracker.set_tags(
                    {
                        "fresh_start.previous_checkpoints": str(fresh.previous),
                        # MLflow tags hold up to 8000 characters; the job log has the full list.
                        "fresh_start.changed": "; ".join(fresh.changed or ["(not recorded)"])[
                            :8000
                        ],
                    }
                )
            fit(trainer, state, metrics_path=run_dir / "metrics.jsonl")
            # The final position, so that a re-run finds nothing left to do.
            trainer.checkpoints.save(state.step)
            summary = {
                "final": state.history[-1] if state.history else {},
                "epochs": cfg.train.epochs,
                "steps": state.step,
                "wall_time_s": time.time() - started,
                "world_size": dims.world_size,
                "data_parallel": dims.data,
                "spatial_parallel": dims.spatial,
                "global_batch_size": trainer.global_batch,
                "device": str(dims.device),
                "host_allocator": host_allocator,
                # Where every rank ran (host, local rank, node) and the node size the node
                # groups were built with; what `perf-model calibrate --from-run` needs to price
                # this run elsewhere (the accelerator, nodes, ranks per node).
                "ranks_per_node": dims.per_node,
                "nodes": max(1, dims.world_size // max(1, dims.per_node)),
                "placement": [p.as_record() for p in dims.placement or ()],
                "accelerator": accelerator_name(dims.device),
                "data_placement": getattr(trainer.train_loader, "placement", "loader"),
                "resumed_from": str(resumed_from) if resumed_from else None,
                "fresh_start": None
                if fresh is None
                else {
                    "previous": str(fresh.previous),
                    "changed": None if fresh.changed is None else list(fresh.changed),
                },
                "config_hash": cfg.hash,
                "resume_hash": trainer.checkpoints.config_hash,
                "mlflow_run_id": getattr(tracker, "run_id", None),
            }
            if dims.is_main:
                _write_outputs(run_dir, trainer.model, cfg, state, summary, tracker)
        return summary
    finally:
        if lock is not None:
            lock.release()
        runtime.restore_deterministic(previous_deterministic)
        close_parallel_dims(dims)


def _write_outputs(
    run_dir: Path, model: nn.Module, cfg: Config, state: TrainState, summary: dict, tracker: Any
) -> None:
    """Rank 0: metrics.jsonl, model.pt and train_summary.json (atomically), then to MLflow.

    What is saved is the plain model (CosmoFlow or U-Net) on the CPU with the trained weights,
    whatever the split: loadable and evaluable on one process (the spatial layers hold process
    groups).
    """
    module = getattr(model, "module", model)
    model = build_model(cfg.model)
    model.load_state_dict({k: v.detach().cpu() for k, v in module.state_dict().items()})
    # A cancel here waits for all three: never a model.pt without its summary beside it.
    with sigterm_deferred():
        write_jsonl(run_dir / "metrics.jsonl", state.history)
        save_model_file(run_dir / "model.pt", model, cfg.model)
        write_json(run_dir / "train_summary.json", summary)
    tracker.log_artifact(run_dir / "metrics.jsonl")
    tracker.log_artifact(run_dir / "train_summary.json")
    tracker.log_model(model)


def accelerator_name(device: torch.device) -> str:
    """The device's model as its driver names it ("NVIDIA H100 80GB HBM3"), or the CPU's."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu: {platform.processor() or platform.machine()}"


def check_launched_world(cfg: Config) -> None:
    """The `train` stage's first step (cli): refuse a world unlike the config's. Its batch,
    learning rate, shards per rank and node layout are the config's world's, and a launcher
    given other counts would train something the config does not say. Before any process
    group, so every rank stops at once."""
    launched = detect_launch_env()
    if launched.world_size != cfg.world_size:
        raise ValueError(
            f"{cfg.source}: the launcher started {launched.world_size} rank(s) "
            f"({launched.launcher}), the config's world is {cfg.world_size} "
            f"(cluster.train.nodes {cfg.cluster.train.nodes} × train.ranks_per_node "
            f"{cfg.train.ranks_per_node})"
        )
