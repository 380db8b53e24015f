"""What a run trains its model to do, chosen once by `build_task`: which samples it reads, its
loss, how the loss of each rank adds up to the batch's, its validation and its tensor layouts.

Three tasks: CosmoFlow's point head and gaussian head (the parameters of a universe), and the
U-Net's fields (a field at one redshift from fields at others). The loop only calls them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

from cosmocub.config import Config, ConfigError
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.dataset import open_split
from cosmocub.data.field_pairs import open_field_split
from cosmocub.models.heads import gaussian_nll, gaussian_nll_terms, split_output
from cosmocub.parallel.parallel_dims import ParallelDims

Block = tuple[slice, slice, slice]
Autocast = Callable[[], contextlib.AbstractContextManager]


class Task(Protocol):
    """`output_layout` / `target_layout`: what the model returns for a batch and what it is
    compared with (P = 4 parameters; d, h, w this rank's block of a sample)."""

    name: str
    output_layout: str
    target_layout: str

    def open_split(self, shards_dir: Path, split: str, *, block: Block | None) -> Dataset:
        """The split's (input, target) samples; `block`: this rank's part of each (None: all)."""
        ...

    def loss(self, out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """This rank's training loss of a batch, in float32 whatever the autocast."""
        ...

    def loss_reduction(self, dims: ParallelDims) -> tuple[dist.ProcessGroup | None, float]:
        """(group, share): summing loss × share over the group, then dividing by the data ranks,
        gives the global batch's loss; group None: nothing to sum (one rank holds it all)."""
        ...

    def validate(
        self, model: nn.Module, loader: DataLoader, *, dims: ParallelDims, autocast: Autocast
    ) -> dict[str, float]:
        """val_loss, val_mae and the task's other metrics over the whole val shard, the same on
        every rank (a collective)."""
        ...


def build_task(cfg: Config) -> Task:
    """The task of `cfg.model`: the U-Net's fields (model.name unet), else CosmoFlow's head."""
    if cfg.model.name == "unet":
        if cfg.model.gaussian:
            raise ConfigError(
                "key 'model.head': 'gaussian' is a CosmoFlow head; the U-Net (model.name "
                "unet) predicts a field and trains on its MSE (model.head point)"
            )
        return FieldsTask(cfg)
    if cfg.model.gaussian:
        return GaussianHeadTask(cfg)
    return PointHeadTask(cfg)


def _data_sum(dims: ParallelDims) -> tuple[dist.ProcessGroup | None, float]:
    # Every spatial rank of a data rank holds the whole loss (outputs gathered before the head).
    return (dims.group("data") if dims.data > 1 else None), 1.0


class PointHeadTask:
    """CosmoFlow's point head: one value per parameter, trained on the MSE; validation gives
    the MSE and the MAE, overall and per parameter."""

    name = "point"
    output_layout = "(B, P)"
    target_layout = "(B, P)"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def open_split(self, shards_dir: Path, split: str, *, block: Block | None) -> Dataset:
        return open_split(shards_dir, split, self.cfg.model, block=block)

    def loss(self, out_bp: torch.Tensor, y_bp: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out_bp.float(), y_bp)

    def loss_reduction(self, dims: ParallelDims) -> tuple[dist.ProcessGroup | None, float]:
        return _data_sum(dims)

    def mean_and_log_var(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(mean (B, P), log-variance (B, P) or None) of a model output."""
        return out, None

    @torch.no_grad()
    def validate(
        self, model: nn.Module, loader: DataLoader, *, dims: ParallelDims, autocast: Autocast
    ) -> dict[str, float]:
        device = dims.device
        names = NAME_PAR  # the config checks num_outputs against these
        # sums[0] = Σ|err| per param, sums[1] = Σerr² per param, sums[2] = Σ Gaussian NLL per
        # param (gaussian head); float64 so large shards add exactly.
        sums = torch.zeros(3, len(names), dtype=torch.float64, device=device)
        count = torch.zeros(1, dtype=torch.float64, device=device)
        model.eval()
        for x_bcdhw, y_bp in loader:
            x_bcdhw, y_bp = x_bcdhw.to(device), y_bp.to(device)
            with autocast():
                out = model(x_bcdhw)  # self.output_layout
            mean_bp, log_var_bp = self.mean_and_log_var(out)
            err_bp = mean_bp.double() - y_bp.double()
            sums[0] += err_bp.abs().sum(0)
            sums[1] += err_bp.square().sum(0)
            if log_var_bp is not None:
                nll_bp = gaussian_nll_terms(mean_bp.double(), log_var_bp.double(), y_bp.double())
                sums[2] += nll_bp.sum(0)
            count += err_bp.shape[0]
        model.train()
        if dims.data > 1:
            group = dims.group("data")
            dist.all_reduce(sums, group=group)
            dist.all_reduce(count, group=group)
        n = count.item()
        assert n > 0, "build_trainer refuses an empty validation shard"
        return self.metrics(sums, n)

    def metrics(self, sums: torch.Tensor, n: float) -> dict[str, float]:
        """The validation metrics of the sums over every val sample (see `validate`)."""
        names = NAME_PAR
        mae_p, mse_p = (sums[0] / n).tolist(), (sums[1] / n).tolist()
        metrics = {"val_loss": sum(mse_p) / len(names), "val_mae": sum(mae_p) / len(names)}
        metrics.update({f"val_mae_{name}": value for name, value in zip(names, mae_p, strict=True)})
        return metrics


class GaussianHeadTask(PointHeadTask):
    """CosmoFlow's gaussian head: a mean and a log-variance per parameter, trained on the β-NLL;
    validation adds the plain NLL of the means' point-head metrics."""

    name = "gaussian"
    output_layout = "(B, 2P): the means, then the log-variances"
    target_layout = "(B, P)"

    def loss(self, out_bk: torch.Tensor, y_bp: torch.Tensor) -> torch.Tensor:
        mean_bp, log_var_bp = self.mean_and_log_var(out_bk.float())
        assert log_var_bp is not None
        return gaussian_nll(mean_bp, log_var_bp, y_bp, beta=self.cfg.model.nll_beta)

    def mean_and_log_var(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return split_output(out, self.cfg.model)

    def metrics(self, sums: torch.Tensor, n: float) -> dict[str, float]:
        metrics = super().metrics(sums, n)
        # What the gaussian head is trained on (plain NLL, without ½ log 2π): lower is better.
        metrics["val_nll"] = (sums[2] / n).mean().item()
        return metrics


class FieldsTask:
    """The U-Net's field to field: trained on the MSE per voxel of the standardised fields;
    validation gives the MSE and the MAE per voxel."""

    name = "fields"
    output_layout = "(B, 1, d, h, w)"  # the predicted field in this rank's block
    target_layout = "(B, 1, d, h, w)"

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg

    def open_split(self, shards_dir: Path, split: str, *, block: Block | None) -> Dataset:
        return open_field_split(shards_dir, split, self.cfg, block=block)

    def loss(self, out_bcdhw: torch.Tensor, y_bcdhw: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(out_bcdhw.float(), y_bcdhw)

    def loss_reduction(self, dims: ParallelDims) -> tuple[dist.ProcessGroup | None, float]:
        # The loss is the mean over this rank's block (outputs stay split, see
        # parallelize_unet): its sample mean also sums over the spatial group.
        if dims.spatial > 1:
            return dims.world_group, 1.0 / dims.spatial
        return _data_sum(dims)

    @torch.no_grad()
    def validate(
        self, model: nn.Module, loader: DataLoader, *, dims: ParallelDims, autocast: Autocast
    ) -> dict[str, float]:
        # Data ranks hold different samples and spatial ranks different blocks of them, so one
        # sum over the whole mesh counts every voxel of every sample exactly once.
        device = dims.device
        sums = torch.zeros(3, dtype=torch.float64, device=device)  # Σerr², Σ|err|, voxels
        model.eval()
        for x_bcdhw, y_bcdhw in loader:
            x_bcdhw, y_bcdhw = x_bcdhw.to(device), y_bcdhw.to(device)
            with autocast():
                pred_bcdhw = model(x_bcdhw)  # (B, 1, d, h, w): this rank's block
            err = pred_bcdhw.double() - y_bcdhw.double()
            sums += torch.stack([err.square().sum(), err.abs().sum(), sums.new_tensor(err.numel())])
        model.train()
        if dims.world_size > 1:
            dist.all_reduce(sums, group=dims.world_group)
        voxels = sums[2].item()
        assert voxels > 0, "build_trainer refuses an empty validation shard"
        return {"val_loss": sums[0].item() / voxels, "val_mae": sums[1].item() / voxels}
