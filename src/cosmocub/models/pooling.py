"""CosmoFlow's pooled branch (model.pooled): whole-sample moments per channel of chosen feature
maps, normalised, for the dense head to read beside the flattened features.

Plain layers only: `parallelize_cosmoflow` swaps the moments for spatially merged ones.
"""

from __future__ import annotations

import torch
from torch import nn

from cosmocub.config import ModelConfig

STD_EPS = 1e-5  # under the square root: a finite gradient even for a constant map


class GlobalMoments(nn.Module):
    """(B, C, D, H, W) → (B, C): each channel's mean over D, H and W; with `with_std`
    (B, 2C): the means, then the standard deviations sqrt(var + eps) (population variance)."""

    def __init__(self, *, with_std: bool, eps: float = STD_EPS) -> None:
        super().__init__()
        self.with_std, self.eps = with_std, eps

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        if not self.with_std:
            return x_bcdhw.mean(dim=(2, 3, 4))  # (B, C)
        var, mean = torch.var_mean(x_bcdhw, dim=(2, 3, 4), correction=0)  # (B, C) each
        return torch.cat([mean, torch.sqrt(var + self.eps)], dim=1)  # (B, 2C)

    def extra_repr(self) -> str:
        return "mean, std" if self.with_std else "mean"


def tap_channels(cfg: ModelConfig) -> dict[str, int]:
    """Channels of each pooled feature map, by tap name: "input", then "block0", "block1", …
    (model.pooled.taps "blocks" stands for every conv block's output)."""
    out: dict[str, int] = {}
    if "input" in cfg.pooled.taps:
        out["input"] = cfg.in_channels
    if "blocks" in cfg.pooled.taps:
        for i in range(cfg.num_conv_blocks):
            out[f"block{i}"] = cfg.base_filters * 2**i
    return out


class PooledBranch(nn.Module):
    """`moments`: a `GlobalMoments` per tap (keys as `tap_channels`); forward(list of their
    outputs, in that order) → (B, num_features), batch-normalised when model.batch_norm is on:
    the statistics differ between samples by a small fraction of their size (one universe's
    mean density against another's), which the norm brings to the scale of the other features."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        with_std = cfg.pooled.stats == "mean_std"
        channels = tap_channels(cfg)
        self.moments = nn.ModuleDict({name: GlobalMoments(with_std=with_std) for name in channels})
        self.num_features = (2 if with_std else 1) * sum(channels.values())
        self.norm = nn.BatchNorm1d(self.num_features) if cfg.batch_norm else nn.Identity()

    def forward(self, stats: list[torch.Tensor]) -> torch.Tensor:
        return self.norm(torch.cat(stats, dim=1))  # (B, num_features)
