"""Entry of the training stage: read the launcher's environment, build, train, write, close.

One process per device. Locally:
    torchrun --standalone --nproc-per-node N --max-restarts R -m cosmocub.cli train \
        --config CFG --shards DIR --out RUN_DIR
with R = train.max_restarts: torchrun restarts every rank when one dies, and `train` resumes from
the newest checkpoint in RUN_DIR/checkpoints by itself. On Slurm: `srun -n N cosmocub train …`
(add `--requeue` or an outer retry loop for restarts; the resume is the same).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from cosmocub.config import Config
from cosmocub.data.dataset import open_split
from cosmocub.io import atomic_path
from cosmocub.models.cosmoflow import CosmoFlow, save_model_file
from cosmocub.optim.factory import build_optimizer, build_schedule
from cosmocub.parallel.mesh import build_parallel_dims, close_parallel_dims
from cosmocub.tracking import job_run
from cosmocub.train import runtime
from cosmocub.train.checkpoint import CheckpointManager, restore_rng_state, resume_hash
from cosmocub.train.data import build_eval_loader, build_train_loader
from cosmocub.train.grad_sync import build_gradient_sync
from cosmocub.train.loop import Trainer, TrainState, train_one_epoch, validate


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
    tc = cfg.train
    dims = build_parallel_dims(backend=tc.backend)
    previous_deterministic = runtime.set_deterministic(tc.deterministic)
    try:
        threads = runtime.set_threads(tc, dims)
        num_workers = 0 if tc.deterministic else tc.num_data_workers
        train_set = open_split(shards_dir, "train", cfg.model)
        val_set = open_split(shards_dir, "val", cfg.model)
        per_rank = len(train_set) // dims.data
        if per_rank < tc.local_batch_size:
            raise ValueError(
                f"{train_set.path}: {len(train_set)} samples give {per_rank} per data rank "
                f"(x{dims.data}), fewer than train.local_batch_size {tc.local_batch_size}"
            )
        global_batch = tc.local_batch_size * dims.data

        runtime.seed_everything(cfg.seed)  # same initial weights on every rank
        model = CosmoFlow(cfg.model).to(dims.device)
        optimizer = build_optimizer(model.parameters(), cfg.optimizer, global_batch)
        train_loader = build_train_loader(
            train_set, dims, batch_size=tc.local_batch_size, seed=cfg.seed, num_workers=num_workers
        )
        steps_per_epoch = train_loader.sampler.batches_per_epoch
        schedule = build_schedule(
            optimizer, cfg.optimizer, global_batch=global_batch, steps_per_epoch=steps_per_epoch
        )
        runtime.seed_everything(runtime.rank_seed(cfg.seed, dims.rank))
        checkpoints = CheckpointManager(
            run_dir / "checkpoints", config_hash=resume_hash(cfg), is_main=dims.is_main
        )
        state = TrainState()
        resumed_from = checkpoints.latest()
        if resumed_from is not None:
            payload = checkpoints.load(resumed_from)
            if payload["data_parallel_size"] != dims.data:
                raise ValueError(
                    f"{resumed_from}: written with {payload['data_parallel_size']} data-parallel "
                    f"ranks, this run has {dims.data} (the global batch and sampler would differ)"
                )
            model.load_state_dict(payload["model"])
            optimizer.load_state_dict(payload["optimizer"])
            schedule.load_state_dict(payload["schedule"])
            state.load_state_dict(payload["train_state"])
            restore_rng_state(payload["rng_per_rank"][dims.rank])
        grad_sync = build_gradient_sync(optimizer, dims)
        params = {
            "world_size": dims.world_size,
            "data_parallel": dims.data,
            "spatial_parallel": dims.spatial,
            "global_batch_size": global_batch,
            "steps_per_epoch": steps_per_epoch,
            "threads_per_rank": threads,
            "gradient_sync": grad_sync.name,
        }
        with job_run(cfg, stage="train", params=params, enabled=dims.is_main) as tracker:
            trainer = Trainer(
                cfg=cfg,
                dims=dims,
                model=model,
                wrapped=grad_sync.wrap(model),
                optimizer=optimizer,
                schedule=schedule,
                grad_sync=grad_sync,
                train_loader=train_loader,
                val_loader=build_eval_loader(
                    val_set, dims, batch_size=tc.local_batch_size, num_workers=num_workers
                ),
                checkpoints=checkpoints,
                autocast_dtype=runtime.autocast_dtype(tc.amp, dims.device),
                log=lambda metrics, step: tracker.log_metrics(metrics, step=step),
                on_step_end=on_step_end,
            )
            metrics_path = run_dir / "metrics.jsonl"
            while state.epoch < tc.epochs:
                speed = train_one_epoch(trainer, state)
                record = {
                    "epoch": state.epoch,
                    "step": state.step,
                    "train_loss": state.epoch_loss_sum / max(1, state.epoch_steps),
                    **validate(trainer),
                    "lr": schedule.lr,
                    **speed,
                }
                state.history.append(record)
                state.epoch, state.batch_in_epoch = state.epoch + 1, 0
                state.epoch_loss_sum, state.epoch_steps = 0.0, 0
                tracker.log_metrics(
                    {k: v for k, v in record.items() if k != "epoch"}, step=state.step
                )
                if dims.is_main:
                    _write_jsonl(metrics_path, state.history)
                    _print_epoch(record)
            trainer.checkpoint(state)  # the final position, so a re-run finds nothing left to do
            summary = {
                "final": state.history[-1] if state.history else {},
                "epochs": tc.epochs,
                "steps": state.step,
                "wall_time_s": time.time() - started,
                "world_size": dims.world_size,
                "data_parallel": dims.data,
                "global_batch_size": global_batch,
                "device": str(dims.device),
                "resumed_from": str(resumed_from) if resumed_from else None,
                "config_hash": cfg.hash,
                "resume_hash": checkpoints.config_hash,
                "mlflow_run_id": getattr(tracker, "run_id", None),
            }
            if dims.is_main:
                _write_jsonl(metrics_path, state.history)
                save_model_file(run_dir / "model.pt", model, cfg.model)
                with atomic_path(run_dir / "train_summary.json") as tmp:
                    tmp.write_text(json.dumps(summary, indent=2) + "\n")
                tracker.log_artifact(metrics_path)
                tracker.log_artifact(run_dir / "train_summary.json")
                tracker.log_model(model)
        return summary
    finally:
        runtime.set_deterministic(previous_deterministic)
        close_parallel_dims(dims)


def _write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))


def _print_epoch(record: dict[str, Any]) -> None:
    import sys

    print(
        f"epoch {record['epoch']} step {record['step']} train_loss {record['train_loss']:.5f} "
        f"val_loss {record['val_loss']:.5f} val_mae {record['val_mae']:.4f} "
        f"{record['samples_per_s']:.1f} samples/s data_wait {100 * record['data_wait_share']:.1f}%",
        file=sys.stderr,
        flush=True,
    )
