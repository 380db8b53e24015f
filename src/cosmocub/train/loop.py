"""The training epoch and the validation pass: one screen each, shapes in comments.

`Trainer` holds the pieces `main.train` built; gradient exchange is whatever `grad_sync` says, so a
self-communicating optimizer slots in without touching this loop.
"""

from __future__ import annotations

import contextlib
import json
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
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.io import atomic_path
from cosmocub.models.heads import gaussian_nll_terms, regression_loss, split_output
from cosmocub.optim.schedule import EpochSchedule
from cosmocub.parallel.mesh import ParallelDims
from cosmocub.train.checkpoint import CheckpointManager
from cosmocub.train.comm_meter import CommMeter
from cosmocub.train.data import ResumableSampler
from cosmocub.train.grad_sync import GradientSync
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
    model: nn.Module  # CosmoFlow (its spatial form under a split; state_dict keys the same)
    wrapped: nn.Module  # what the step calls (DDP or the model itself)
    optimizer: Optimizer
    schedule: EpochSchedule
    grad_sync: GradientSync
    train_loader: DataLoader
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
    data_group = t.dims.group("data")
    # A U-Net's loss is the mean over this rank's block (outputs stay split, see
    # parallelize_unet): its sample mean also sums over the spatial group.
    loss_group, loss_share = data_group, 1.0
    if t.cfg.model.name == "unet" and t.dims.spatial > 1:
        loss_group, loss_share = t.dims.world_group, 1.0 / t.dims.spatial
    show_bar = t.dims.is_main and sys.stderr.isatty()
    t.wrapped.train()
    data_wait, steps_here = 0.0, 0
    meter = CommMeter(t.optimizer, t.model, t.grad_sync)
    wire = WireMeter(t.dims)
    # Global mean losses of steps not yet looked at, kept on the device: the host reads them only
    # when it logs or checkpoints, so a GPU is not made to wait at every step.
    pending: list[torch.Tensor] = []
    _sync(device)
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
    for x_bcdhw, y_bp in batches:
        # Already augmented by the sampler's symmetries; a spatial rank holds its block only.
        x_bcdhw = x_bcdhw.to(device, non_blocking=True)  # (B, C, S/sd, S/sh, S/sw)
        y_bp = y_bp.to(device, non_blocking=True)  # (B, P)
        data_wait += time.perf_counter() - tick
        step_start = time.perf_counter()
        with t.autocast():
            pred_bp = t.wrapped(x_bcdhw)  # (B, P)
        # (B, P) parameters (B, 2P with the gaussian head), or for the U-Net (B, 1, d, h, w) fields
        # of this rank's block.
        loss = regression_loss(pred_bp.float(), y_bp, t.cfg.model)
        # Sum of the loss over data ranks, started now and awaited after backward, so every rank
        # holds the same values and stops at the same step if one is not finite.
        loss_all = loss.detach() * loss_share
        work = None
        if t.dims.data > 1 or loss_share != 1.0:
            work = dist.all_reduce(loss_all, group=loss_group, async_op=True)
        t.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t.grad_sync.after_backward(t.model)
        if work is not None:
            work.wait()
        pending.append(loss_all)
        t.optimizer.step()
        t.schedule.step()
        meter.add_step(time.perf_counter() - step_start)
        state.step += 1
        state.batch_in_epoch += 1
        steps_here += 1
        log_now = state.step % cfg.log_every_steps == 0
        checkpoint_now = state.step % cfg.checkpoint_every_steps == 0
        if log_now or checkpoint_now:
            loss_value = _check_losses(t, state, pending)  # sync point; never save a NaN model
        if log_now:
            t.log({"train_loss": loss_value, "lr": t.schedule.lr}, state.step)
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
    samples = steps_here * cfg.local_batch_size * t.dims.data
    return {
        "samples_per_s": samples / elapsed if steps_here else 0.0,
        "data_wait_share": data_wait / elapsed if steps_here else 0.0,
        **meter.metrics(),
        **wire.metrics(steps_here),
    }


@torch.no_grad()
def validate(t: Trainer) -> dict[str, float]:
    """MSE loss and MAE (overall and per parameter) over the whole val shard, reduced over ranks."""
    if t.cfg.model.name == "unet":
        from cosmocub.train.validate_fields import validate_fields

        return validate_fields(t)
    device = t.dims.device
    names = NAME_PAR  # the config checks num_outputs against these
    # sums[0] = Σ|err| per param, sums[1] = Σerr² per param, sums[2] = Σ Gaussian NLL per param
    # (gaussian head); float64 so large shards add exactly.
    sums = torch.zeros(3, len(names), dtype=torch.float64, device=device)
    count = torch.zeros(1, dtype=torch.float64, device=device)
    t.model.eval()
    for x_bcdhw, y_bp in t.val_loader:
        x_bcdhw, y_bp = x_bcdhw.to(device), y_bp.to(device)
        with t.autocast():
            out_bk = t.model(x_bcdhw)
        pred_bp, log_var_bp = split_output(out_bk, t.cfg.model)  # the mean, for either head
        err_bp = pred_bp.double() - y_bp.double()
        sums[0] += err_bp.abs().sum(0)
        sums[1] += err_bp.square().sum(0)
        if log_var_bp is not None:
            sums[2] += gaussian_nll_terms(pred_bp.double(), log_var_bp.double(), y_bp.double()).sum(
                0
            )
        count += err_bp.shape[0]
    t.model.train()
    if t.dims.data > 1:
        group = t.dims.group("data")
        dist.all_reduce(sums, group=group)
        dist.all_reduce(count, group=group)
    n = count.item()
    assert n > 0, "build_trainer refuses an empty validation shard"
    mae_p, mse_p = (sums[0] / n).tolist(), (sums[1] / n).tolist()
    metrics = {"val_loss": sum(mse_p) / len(names), "val_mae": sum(mae_p) / len(names)}
    metrics.update({f"val_mae_{name}": value for name, value in zip(names, mae_p, strict=True)})
    if t.cfg.model.gaussian:
        # What the gaussian head is trained on (plain NLL, without ½ log 2π): lower is better.
        metrics["val_nll"] = (sums[2] / n).mean().item()
    return metrics


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
            **validate(t),
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
                f"data_wait {100 * record['data_wait_share']:.1f}%",
                file=sys.stderr,
                flush=True,
            )


def _peak_rss_mb() -> float:
    """This rank's peak resident memory so far (ru_maxrss: KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
