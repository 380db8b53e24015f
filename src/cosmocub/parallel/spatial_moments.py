"""Whole-sample moments of a spatially split sample, merged from the ranks' blocks (the pooled
branch of models.statistics_branch): per-channel central moments to an order, their standardised
form, and the layer that computes them over the spatial group with exact gradients.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from cosmocub.parallel.halo import HaloPlan


def gaussian_moment(p: int) -> int:
    """E[z^p] of a standard normal z: 0 for odd p, (p − 1)!! for even p."""
    return 0 if p % 2 else math.prod(range(p - 1, 0, -2))


def channel_statistics(
    mean: torch.Tensor, central: list[torch.Tensor], *, order: int, eps: float
) -> torch.Tensor:
    """(B, order·C) from per-(sample, channel) central moments, (B, C) each: `central` holds
    E[(x − mean)^p] for p = 2 … order. Order 1: the means; 2: then the deviations
    sd = sqrt(var + eps) (finite for a constant map); from 3: then for each p the standardised
    moment E[(x − mean)^p] / sd^p less its Gaussian value (skewness, excess kurtosis, …).
    Blocks of C: all the means, then all the deviations, and so on (models.statistics_branch's
    layout)."""
    if order == 1:
        return mean
    sd = torch.sqrt(central[0] + eps)
    shape = [c / sd**p - gaussian_moment(p) for p, c in enumerate(central[1:], start=3)]
    return torch.cat([mean, sd, *shape], dim=1)


def _merge_blocks(local: torch.Tensor, group: dist.ProcessGroup, num_ranks: int) -> torch.Tensor:
    """(order, B, C) of each rank's equal block, [mean, m_2 … m_order] about the block's own
    mean, all-gathered once and merged in float64 into the sample's (the same layout): mean the
    blocks' means; m_p = mean over blocks of Σ_j C(p, j)·m_j·δ^(p−j), δ the block's mean less
    the sample's, m_0 = 1, m_1 = 0 (the exact shift of a block's moments to the sample's mean,
    Chan's merge at equal counts for p = 2)."""
    parts = [torch.empty_like(local) for _ in range(num_ranks)]
    dist.all_gather(parts, local, group=group)
    blocks = torch.stack(parts)  # (S, order, B, C)
    mean = blocks[:, 0].mean(0)
    delta = blocks[:, 0] - mean  # (S, B, C)
    about_own = [torch.ones_like(delta), torch.zeros_like(delta), *blocks[:, 1:].unbind(1)]
    central = [
        sum(math.comb(p, j) * about_own[j] * delta ** (p - j) for j in range(p + 1)).mean(0)
        for p in range(2, local.shape[0] + 1)
    ]
    return torch.stack([mean, *central])


class _CentralMoments(torch.autograd.Function):
    """Per (sample, channel), the mean and the central moments E[(x − mean)^p], p = 2 … order,
    over D, H, W of the whole sample: (order, B, C) in float64. Two passes over the block: its
    mean, then the powers of the deviations from it (in float32 at least; no cancellation,
    which raw power sums would suffer where the mean is large against the spread). With a
    `group` each rank holds an equal block of the sample, and one all-gather of the blocks'
    moments gives the sample's (`_merge_blocks`); without one, the block is the sample.

    Backward, from the saved block and moments (no per-power tensors kept): ∂mean/∂x = 1/N,
    ∂m_p/∂x = p·((x − mean)^(p−1) − m_(p−1))/N with m_1 = 0, over the sample's N = S·n voxels.
    The upstream gradient is the same on every rank (the head is replicated); as the gather
    before the head does, each rank returns S × that, so the spatial group's gradient average
    leaves the exact conv-stack gradient.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx, x_bcdhw: torch.Tensor, group: dist.ProcessGroup | None, num_ranks: int, order: int
    ) -> torch.Tensor:
        x = x_bcdhw.to(torch.promote_types(x_bcdhw.dtype, torch.float32))
        dims = (2, 3, 4)
        # Sums in float32 (torch's cascade summation: ~1e-7 relative at these sizes), as float64
        # accumulation costs 15× the time on a CPU; the blocks merge in float64.
        mean = x.mean(dim=dims)
        deviation = x - mean[:, :, None, None, None]
        moments, power = [mean.double()], deviation
        for _ in range(2, order + 1):
            power = power * deviation
            moments.append(power.mean(dim=dims).double())
        out = torch.stack(moments)  # (order, B, C)
        if group is not None:
            out = _merge_blocks(out, group, num_ranks)
        if order >= 2:
            out[1].clamp_(min=0.0)  # a variance, against rounding
        ctx.save_for_backward(x_bcdhw, out)
        ctx.block_voxels = x[0, 0].numel()
        return out

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        x_bcdhw, moments = ctx.saved_tensors
        n = ctx.block_voxels  # S × 1/N = 1/n: the S × of the convention folded in
        expand = (slice(None), slice(None), None, None, None)
        x = x_bcdhw.to(torch.promote_types(x_bcdhw.dtype, torch.float32))
        grads, moments = (g / n).to(x.dtype), moments.to(x.dtype)
        deviation = x - moments[0][expand]
        dx = grads[0][expand].expand_as(deviation).clone()
        power = torch.ones_like(deviation)
        for p in range(2, moments.shape[0] + 1):
            power = power * deviation  # (x − mean)^(p − 1)
            lower = moments[p - 2] if p > 2 else torch.zeros_like(moments[0])  # m_(p−1)
            dx += (p * grads[p - 1])[expand] * (power - lower[expand])
        return dx.to(x_bcdhw.dtype), None, None, None


def central_moments(
    x_bcdhw: torch.Tensor,
    order: int,
    *,
    group: dist.ProcessGroup | None = None,
    num_ranks: int = 1,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The mean and [E[(x − mean)^p] for p = 2 … order] per (sample, channel), (B, C) each,
    in x's dtype: of the block, or with `group` of the whole sample (`_CentralMoments`)."""
    out = _CentralMoments.apply(x_bcdhw, group, num_ranks, order).to(x_bcdhw.dtype)
    return out[0], list(out[1:])


class SpatialGlobalMoments(nn.Module):
    """models.statistics_branch.GlobalMoments on a block: the whole sample's per-channel
    statistics up to `order` (channel_statistics), identical on every rank of the spatial
    group."""

    def __init__(self, *, order: int, eps: float, plan: HaloPlan) -> None:
        super().__init__()
        self.order, self.eps, self.plan = order, eps, plan

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        mean, central = central_moments(
            x_bcdhw, self.order, group=self.plan.group, num_ranks=self.plan.num_ranks
        )
        return channel_statistics(mean, central, order=self.order, eps=self.eps)

    def extra_repr(self) -> str:
        return f"order {self.order}, merged over split={self.plan.split}"
