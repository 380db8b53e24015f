"""Spatially parallel layers that take over the parameters of plain ones: a halo Conv3d, a batch
norm whose statistics span a process group, the gather before the dense head, a shared dropout,
whole-sample moments merged from the blocks (the pooled branch).

Gradient convention: the gather's backward hands each rank S × its slice of the (replicated)
feature gradient, so every parameter's local gradient is S × a partial whose spatial-group sum is
the full gradient, while the replicated dense layers hold the full gradient on each of the S
ranks. Averaging over the spatial group (`train/grad_sync.py`) then gives the full gradient for
both kinds alike, and averaging over the whole data × spatial mesh gives the data average.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cosmocub.parallel.halo import HaloPlan, HaloStats, halo_exchange, spatial_coords


class SpatialConv3d(nn.Module):
    """Conv3d on a block: exchange halos, then convolve with no padding along the halo dims.

    Holds the plain conv's own Parameter objects, so the state_dict keys stay `…conv.weight`.
    """

    def __init__(self, conv: nn.Conv3d, plan: HaloPlan) -> None:
        super().__init__()
        k = conv.kernel_size
        same = tuple(n // 2 for n in k)
        if (
            conv.stride != (1, 1, 1)
            or conv.dilation != (1, 1, 1)
            or conv.groups != 1
            or conv.padding != same
            or conv.padding_mode != "zeros"
        ):
            raise ValueError(f"SpatialConv3d needs a stride-1 'same' conv, got {conv}")
        if any(w not in (0, h) for w, h in zip(plan.widths, same, strict=True)):
            raise ValueError(f"halo widths {plan.widths} do not match kernel {k}")
        self.weight = conv.weight
        self.bias = conv.bias
        self.plan = plan
        # Dims with a halo are padded by it; the others are zero-padded by the conv itself.
        self.padding = tuple(0 if w else p for w, p in zip(plan.widths, same, strict=True))
        self.in_channels, self.out_channels, self.kernel_size = (
            conv.in_channels,
            conv.out_channels,
            k,
        )

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        x_bcdhw = halo_exchange(x_bcdhw, self.plan)  # (B, C, d+2wd, h+2wh, w+2ww)
        return F.conv3d(x_bcdhw, self.weight, self.bias, padding=self.padding)

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"split={self.plan.split}, halo={self.plan.widths}, periodic={self.plan.periodic}"
        )


def halo_stats(model: nn.Module) -> HaloStats | None:
    """The halo exchange counters of a spatially parallel model (its convs share one plan), or
    None for a model without halo convs."""
    for module in model.modules():
        if isinstance(module, SpatialConv3d):
            return module.plan.stats
    return None


class _SyncBatchNorm(torch.autograd.Function):
    """Training-mode batch norm over every element of `group`'s blocks.

    Forward: one all-gather of (count, mean, M2) per rank, merged with Chan's formula in float64
    (exact enough however the mean compares with the spread). Backward: one all-reduce of
    (Σdy, Σdy·x̂); the weight and bias gradients stay local partial sums.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        x_bcdhw: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        eps: float,
        group: dist.ProcessGroup,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        dims = [0, *range(2, x_bcdhw.dim())]
        count = x_bcdhw.numel() // x_bcdhw.shape[1]
        # Statistics and normalisation in at least float32, also for a bf16/fp16 input (autocast).
        acc = torch.promote_types(x_bcdhw.dtype, torch.float32)
        x = x_bcdhw.to(acc)
        var, mean = torch.var_mean(x, dim=dims, correction=0)  # (C,), (C,)
        # Formed in float64 from the start: a float32 count is exact only up to 2^24 elements
        # and var·count in float32 rounds the very sums the float64 merge is meant to keep.
        mean64, var64 = mean.double(), var.double()
        count64 = torch.tensor([count], dtype=torch.float64, device=mean.device)
        local = torch.cat([count64, mean64, var64 * count])  # (1+2C,)
        parts = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, local, group=group)
        stats = torch.stack(parts)  # (P, 1+2C)
        c = x.shape[1]
        n_p, mean_pc, m2_pc = stats[:, :1], stats[:, 1 : 1 + c], stats[:, 1 + c :]
        total = n_p.sum()
        mean_c = (n_p * mean_pc).sum(0) / total
        m2_c = (m2_pc + n_p * (mean_pc - mean_c) ** 2).sum(0)
        invstd_c = torch.rsqrt(m2_c / total + eps)
        shape = (1, c) + (1,) * (x.dim() - 2)
        mean_x, invstd_x = mean_c.to(acc), invstd_c.to(acc)
        # In place on one new tensor: a block-sized temporary fewer at the peak than (x̂·w + b).
        y = x - mean_x.view(shape)
        y.mul_((invstd_x * weight.to(acc)).view(shape)).add_(bias.to(acc).view(shape))
        y = y.to(x_bcdhw.dtype)
        ctx.save_for_backward(x_bcdhw, weight, mean_x, invstd_x)
        ctx.group, ctx.total = group, float(total)
        ctx.mark_non_differentiable(mean_c, m2_c, total)
        return y, mean_c, m2_c, total

    @staticmethod
    def backward(ctx, dy: torch.Tensor, *_unused: torch.Tensor):  # type: ignore[override]
        x_bcdhw, weight, mean_x, invstd_x = ctx.saved_tensors
        acc = mean_x.dtype
        x, dy = x_bcdhw.to(acc), dy.to(acc)
        c = x.shape[1]
        shape = (1, c) + (1,) * (x.dim() - 2)
        dims = [0, *range(2, x.dim())]
        xhat = x - mean_x.view(shape)
        xhat.mul_(invstd_x.view(shape))
        sum_dy = dy.sum(dims)  # (C,) local partials: they are also the bias gradient
        sum_dy_xhat = (dy * xhat).sum(dims)  # (C,) and the weight gradient
        both = torch.cat([sum_dy, sum_dy_xhat])
        dist.all_reduce(both, group=ctx.group)
        mean_dy, mean_dy_xhat = (both / ctx.total).split(c)
        # dx = w·invstd·(dy − mean(dy) − x̂·mean(dy·x̂)), in place: at most two block-sized
        # temporaries alive (x̂ and dx), where the plain expression holds four.
        dx = dy - mean_dy.view(shape)
        dx.sub_(xhat.mul_(mean_dy_xhat.view(shape)))
        dx.mul_((weight.to(acc) * invstd_x).view(shape))
        dx = dx.to(x_bcdhw.dtype)
        sum_dy_xhat, sum_dy = sum_dy_xhat.to(weight.dtype), sum_dy.to(weight.dtype)
        return dx, sum_dy_xhat, sum_dy, None, None


class SyncBatchNorm3d(nn.Module):
    """BatchNorm3d whose training statistics span `group` (e.g. data × spatial), on CPU and GPU.

    torch.nn.SyncBatchNorm refuses CPU tensors (torch 2.13), hence this one. It takes over the
    plain norm's parameters and buffers (same objects, same state_dict keys); in eval mode it is
    the plain norm with the running statistics, which need no communication. It also takes a
    BatchNorm1d's (B, C) features. `replicas`: on how many ranks of `group` each sample's
    features are (the spatial group's, for features replicated after a spatial reduction): the
    mean, variance and gradients are the same either way, the running variance's n / (n − 1)
    needs the number of distinct samples.
    """

    def __init__(
        self, norm: nn.BatchNorm3d | nn.BatchNorm1d, group: dist.ProcessGroup, *, replicas: int = 1
    ) -> None:
        super().__init__()
        if not (norm.affine and norm.track_running_stats):
            raise ValueError(f"SyncBatchNorm3d needs an affine norm with running stats: {norm}")
        self.num_features, self.eps, self.momentum = norm.num_features, norm.eps, norm.momentum
        self.weight, self.bias = norm.weight, norm.bias
        self.register_buffer("running_mean", norm.running_mean)
        self.register_buffer("running_var", norm.running_var)
        self.register_buffer("num_batches_tracked", norm.num_batches_tracked)
        self.group, self.replicas = group, replicas

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.batch_norm(
                x_bcdhw, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0,
                self.eps,
            )  # fmt: skip
        y, mean_c, m2_c, total = _SyncBatchNorm.apply(
            x_bcdhw, self.weight, self.bias, self.eps, self.group
        )
        # Every replica adds the same M2 and count: divide both to count samples once.
        m2_c, total = m2_c / self.replicas, total / self.replicas
        if total < 2:  # as nn.BatchNorm1d: one value per channel normalises to zeros
            raise ValueError(
                f"SyncBatchNorm3d: {float(total):g} value per channel over the group in "
                f"training (input {list(x_bcdhw.shape)}, {self.replicas} replicas)"
            )
        with torch.no_grad():  # as nn.BatchNorm3d: unbiased variance into the running estimate
            self.num_batches_tracked.add_(1)
            if self.momentum is None:
                factor = 1.0 / float(self.num_batches_tracked)
            else:
                factor = self.momentum
            unbiased = m2_c / (total - 1)
            self.running_mean.lerp_(mean_c.to(self.running_mean.dtype), factor)
            self.running_var.lerp_(unbiased.to(self.running_var.dtype), factor)
        return y

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, synced"


class _GatherBlocks(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx, h_bcdhw: torch.Tensor, plan: HaloPlan, group_rank: int
    ) -> torch.Tensor:
        split = plan.split
        b, c, d, h, w = h_bcdhw.shape
        parts = [torch.empty_like(h_bcdhw) for _ in range(plan.num_ranks)]
        dist.all_gather(parts, h_bcdhw.contiguous(), group=plan.group)
        out = h_bcdhw.new_empty(b, c, d * split[0], h * split[1], w * split[2])
        for r, part in enumerate(parts):
            cd, ch, cw = spatial_coords(r, split)
            out[:, :, cd * d : (cd + 1) * d, ch * h : (ch + 1) * h, cw * w : (cw + 1) * w] = part
        ctx.block = (d, h, w)
        ctx.coords = spatial_coords(group_rank, split)
        ctx.num_ranks = plan.num_ranks
        return out

    @staticmethod
    def backward(ctx, g_bcdhw: torch.Tensor):  # type: ignore[override]
        (d, h, w), (cd, ch, cw) = ctx.block, ctx.coords
        mine = g_bcdhw[:, :, cd * d : (cd + 1) * d, ch * h : (ch + 1) * h, cw * w : (cw + 1) * w]
        # Every rank holds the same upstream gradient (the head is replicated, dropout shared):
        # S × our slice is the sum over the group's copies, what a reduce-scatter would give.
        return mine * ctx.num_ranks, None, None


class GatherFlatten(nn.Module):
    """Before the dense head: all-gather the blocks into the whole (B, F, s, s, s) map on every
    rank of the spatial group, then flatten exactly as nn.Flatten does on one process."""

    def __init__(self, plan: HaloPlan, group_rank: int) -> None:
        super().__init__()
        self.plan, self.group_rank = plan, group_rank

    def forward(self, h_bcdhw: torch.Tensor) -> torch.Tensor:
        whole = _GatherBlocks.apply(h_bcdhw, self.plan, self.group_rank)  # (B, F, s, s, s)
        return whole.flatten(1)


class SharedDropout(nn.Module):
    """Dropout whose mask is drawn on spatial rank 0 and broadcast, so the replicated head stays
    identical across the group whatever each rank's random state.

    The draw is nn.Dropout's (F.dropout of ones): spatial rank 0 of data rank d is seeded as data
    rank d of an unsplit run (train/build.py) and nothing random runs before the head, so a split
    run drops the same units as the unsplit one. On the CPU (tested) mask and output are equal
    bit for bit; elsewhere the mask is the same kernel's, and x·(mask/(1−p)) may round
    differently from a fused kernel's x·mask·scale unless 1/(1−p) is a power of two (p = 0.5).
    """

    def __init__(self, p: float, group: dist.ProcessGroup) -> None:
        super().__init__()
        self.p, self.group = p, group

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.p >= 1.0:
            return torch.zeros_like(x)
        # nn.Dropout's own draw, on the group's rank 0: the kept entries scaled by 1/(1−p) as
        # F.dropout forms them, so with the same generator state the mask and the product are
        # those of the plain model at spatial = 1 (bit for bit on the CPU).
        scaled_keep = F.dropout(torch.ones_like(x), self.p, training=True)
        dist.broadcast(scaled_keep, group=self.group, group_src=0)
        return x * scaled_keep

    def extra_repr(self) -> str:
        return f"p={self.p}, shared over the spatial group"


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
    Blocks of C: all the means, then all the deviations, and so on (models.pooling's layout)."""
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
    x_bcdhw: torch.Tensor, order: int, *, group: dist.ProcessGroup | None = None,
    num_ranks: int = 1,
) -> tuple[torch.Tensor, list[torch.Tensor]]:  # fmt: skip
    """The mean and [E[(x − mean)^p] for p = 2 … order] per (sample, channel), (B, C) each,
    in x's dtype: of the block, or with `group` of the whole sample (`_CentralMoments`)."""
    out = _CentralMoments.apply(x_bcdhw, group, num_ranks, order).to(x_bcdhw.dtype)
    return out[0], list(out[1:])


class SpatialGlobalMoments(nn.Module):
    """models.pooling.GlobalMoments on a block: the whole sample's per-channel statistics up to
    `order` (channel_statistics), identical on every rank of the spatial group."""

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
