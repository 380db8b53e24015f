"""Validation of a field-to-field model: MSE and MAE per voxel over the whole val shard.

Data ranks hold different samples and spatial ranks different blocks of them, so one sum over
the whole mesh counts every voxel of every sample exactly once.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


@torch.no_grad()
def validate_fields(t) -> dict[str, float]:
    """{val_loss: mean squared error, val_mae: mean absolute error} on the standardised fields."""
    device = t.dims.device
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # Σerr², Σ|err|, voxels
    t.model.eval()
    for x_bcdhw, y_bcdhw in t.val_loader:
        x_bcdhw, y_bcdhw = x_bcdhw.to(device), y_bcdhw.to(device)
        with t.autocast():
            pred_bcdhw = t.model(x_bcdhw)  # (B, 1, d, h, w): this rank's block
        err = pred_bcdhw.double() - y_bcdhw.double()
        sums += torch.stack([err.square().sum(), err.abs().sum(), sums.new_tensor(err.numel())])
    t.model.train()
    if t.dims.world_size > 1:
        dist.all_reduce(sums, group=t.dims.world_group)
    voxels = sums[2].item()
    assert voxels > 0, "build_trainer refuses an empty validation shard"
    return {"val_loss": sums[0].item() / voxels, "val_mae": sums[1].item() / voxels}
