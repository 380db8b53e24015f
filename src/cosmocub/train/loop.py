"""The training epoch and the epochs of a run: one screen each, shapes in comments.

`Trainer` holds the pieces `main.train` built; the loss and the validation are whatever the task
says (`tasks.py`), gradient exchange whatever `grad_sync` says, so a self-communicating optimizer
or another model's task slots in without touching this loop.
"""

from __future__ import annotations

import contextlib
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.optim import Optimizer
from torch.utils.data import DataLoader
from tqdm import tqdm

from cosmocub.config import Config
from cosmocub.contention.meter import ConditionsMeter
from cosmocub.io import write_jsonl
from cosmocub.optim.schedule import EpochSchedule
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.parallel.timing import clock_for
from cosmocub.train.checkpoint import CheckpointManager
from cosmocub.train.comm_meter import CommMeter
from cosmocub.train.grad_sync import GradientSync
from cosmocub.train.loaders import ResumableSampler
from cosmocub.train.resident_loader import ResidentLoader
from cosmocub.train.tasks import Task
from cosmocub.train.wire_meter import WireMeter


class NonFiniteLossError(ValueError):
    """The loss became NaN or inf; the message names the step (earlier checkpoints are kept)."""


@dataclass
class TrainState:
    """Where training stands; checkpointed with the model so a resume continues exactly here."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    epoch_loss_sum: float = 0.0
    epoch_steps: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            setattr(self, key, value)


@dataclass(kw_only=True)
class Trainer:
    cfg: Config
    dims: ParallelDims
    task: Task  # loss, validation and layouts of the model's outputs
    model: nn.Module  # CosmoFlow or U-Net (its spatial form under a split; same state_dict keys)
    wrapped: nn.Module  # what the step calls (DDP or the model itself)
    optimizer: Optimizer
    schedule: EpochSchedule
    grad_sync: GradientSync
    train_loader: DataLoader | ResidentLoader  # workers' reads, or crops cut on the device
    val_loader: DataLoader
    checkpoints: CheckpointManager
    autocast_dtype: torch.dtype | None
    global_batch: int
    log: Callable[[dict[str, float], int], None]  # (metrics, step) → tracker
    on_step_end: Callable[[int, nn.Module], None] | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.dims.device.type, dtype=self.autocast_dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_losses(t: Trainer, state: TrainState, pending: list[torch.Tensor]) -> float:
    """Bring the pending per-step losses to the host (one sync), stop on the first non-finite
    one, add them to the epoch's sum; returns the newest. Steps are numbered from 1."""
    values = (torch.stack(pending) / t.dims.data).tolist()
    first_step = state.step - len(values) + 1
    for i, value in enumerate(values):
        if not math.isfinite(value):
            batch = state.batch_in_epoch - len(values) + i
            raise NonFiniteLossError(
                f"run {t.checkpoints.folder.parent}: training loss is {value} at step "
                f"{first_step + i} (epoch {state.epoch}, batch {batch}); "
                f"last checkpoint kept: {t.checkpoints.latest()}"
            )
    state.epoch_loss_sum += sum(values)
    state.epoch_steps += len(values)
    pending.clear()
    return values[-1]


def train_one_epoch(t: Trainer, state: TrainState) -> dict[str, float]:
    """Run the rest of epoch `state.epoch` from batch `state.batch_in_epoch`; returns its stats."""
    cfg, device = t.cfg.train, t.dims.device
    sampler = t.train_loader.sampler
    assert isinstance(sampler, ResumableSampler)
    sampler.set_position(state.epoch, state.batch_in_epoch)
    loss_group, loss_share = t.task.loss_reduction(t.dims)
    show_bar = t.dims.is_main and sys.stderr.isatty()
    t.wrapped.train()
    data_wait, steps_here = 0.0, 0
    meter = CommMeter(t.optimizer, t.model, t.grad_sync)
    clock = clock_for(device)  # the steps' and their parts' (parallel/timing.py)
    wire = WireMeter(t.dims)
    # Global mean losses of steps not yet looked at, kept on the device: the host reads them only
    # when it logs or checkpoints, so a GPU is not made to wait at every step.
    pending: list[torch.Tensor] = []
    _sync(device)
    conditions = ConditionsMeter(t.dims)  # CPU, waits for a core, load: what the steps were given
    start = time.perf_counter()
    batches = tqdm(
        t.train_loader,
        desc=f"epoch {state.epoch}",
        initial=state.batch_in_epoch,
        total=sampler.batches_per_epoch,
        disable=not show_bar,
        leave=False,
    )
    tick = time.perf_counter()
    for x_bcdhw, target in batches:
        # Already augmented by the sampler's symmetries; a spatial rank holds its block only.
        # A resident shard's batch is on the device already (no copy, no wait for the host).
        x_bcdhw = x_bcdhw.to(device, non_blocking=True)  # (B, C, S/sd, S/sh, S/sw)
        # task.target_layout: (B, P) parameters, or the U-Net's (B, 1, d, h, w) target block
        target = target.to(device, non_blocking=True)
        data_wait += time.perf_counter() - tick
        step_start = clock.mark()  # on a GPU an event: the step is timed on the device
        with t.autocast():
            # task.output_layout: (B, P), (B, 2P) for the gaussian head, or (B, 1, d, h, w)
            out = t.wrapped(x_bcdhw)
        loss = t.task.loss(out, target)
        # Sum of the loss over the ranks that hold parts of it, started now and awaited after
        # backward, so every rank holds the same values and stops at the same step if one is
        # not finite.
        loss_all = loss.detach() * loss_share
        work = None
        if loss_group is not None:
            work = dist.all_reduce(loss_all, group=loss_group, async_op=True)
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.grad_sync.after_backward(t.model)
        if work is not None:
            work.wait()
        pending.append(loss_all)
        t.optimizer.step()
        t.schedule.step()
        meter.add_step(clock, step_start, clock.mark())
        state.step += 1
        state.batch_in_epoch += 1
        steps_here += 1
        log_now = state.step % cfg.log_every_steps == 0
        checkpoint_now = state.step % cfg.checkpoint_every_steps == 0
        if log_now or checkpoint_now:
            loss_value = _check_losses(t, state, pending)  # sync point; never save a NaN model
        if log_now:
            # Keys apart from the epoch's train_loss and lr (logged at an epoch's last step
            # too): one key, one meaning, so MLflow charts the batch and the epoch mean apart.
            t.log({"train_loss_step": loss_value, "lr_step": t.schedule.lr}, state.step)
            if show_bar:
                batches.set_postfix(loss=f"{loss_value:.4f}")
            elif t.dims.is_main:
                print(
                    f"step {state.step} epoch {state.epoch} batch {state.batch_in_epoch}/"
                    f"{sampler.batches_per_epoch} loss {loss_value:.5f} lr {t.schedule.lr:.3g}",
                    file=sys.stderr,
                    flush=True,
                )
        if checkpoint_now:
            t.checkpoints.save(state.step)
        if t.on_step_end is not None:
            t.on_step_end(state.step, t.model)
        tick = time.perf_counter()
    if pending:
        _check_losses(t, state, pending)
    _sync(device)
    elapsed = time.perf_counter() - start
    samples = steps_here * t.global_batch
    return {
        "samples_per_s": samples / elapsed if steps_here else 0.0,
        "data_wait_share": data_wait / elapsed if steps_here else 0.0,
        # The steps' time on the device's clock over the epoch's wall time: CUDA events from
        # batch in hand to optimizer step queued (a GPU: busy, launch gaps inside a step
        # included), the host's compute on a CPU.
        "device_busy_share": meter.step.seconds / elapsed if steps_here else 0.0,
        **conditions.metrics(),  # first: the wire meter's settling waits are not the steps'
        **meter.metrics(),
        **wire.metrics(steps_here),
    }


def fit(t: Trainer, state: TrainState, *, metrics_path: Path) -> None:
    """Run the remaining epochs: train, validate, and record one metrics line per epoch."""
    # Wall time since training started (validation and checkpoints included), carried on from
    # the history across a resume: the network study's time to a target validation loss.
    before = state.history[-1].get("elapsed_s", 0.0) if state.history else 0.0
    started = time.perf_counter() - before
    while state.epoch < t.cfg.train.epochs:
        speed = train_one_epoch(t, state)
        record = {
            "epoch": state.epoch,
            "step": state.step,
            "train_loss": state.epoch_loss_sum / max(1, state.epoch_steps),
            **t.task.validate(t.model, t.val_loader, dims=t.dims, autocast=t.autocast),
            "lr": t.schedule.lr,
            **speed,
            "elapsed_s": time.perf_counter() - started,
            "peak_rss_mb": _peak_rss_mb(),
        }
        state.history.append(record)
        state.epoch, state.batch_in_epoch = state.epoch + 1, 0
        state.epoch_loss_sum, state.epoch_steps = 0.0, 0
        t.log({k: v for k, v in record.items() if k not in ("epoch", "step")}, state.step)
        if t.dims.is_main:
            # Rewritten whole from the checkpointed history, so a resumed run's file matches.
            write_jsonl(metrics_path, state.history)
            print(
                f"epoch {record['epoch']} step {record['step']} "
                f"train_loss {record['train_loss']:.5f} val_loss {record['val_loss']:.5f} "
                f"val_mae {record['val_mae']:.4f} {record['samples_per_s']:.1f} samples/s "
                f"data_wait {100 * record['data_wait_share']:.1f}% "
                f"device_busy {100 * record['device_busy_share']:.1f}%",
                file=sys.stderr,
                flush=True,
            )


def _peak_rss_mb() -> float:
    """This rank's peak resident memory so far (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
