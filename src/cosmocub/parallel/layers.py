"""Spatially parallel layers that take over the parameters of plain ones: a halo Conv3d, a batch
norm whose statistics span a process group, the gather before the dense head, a shared dropout
(the pooled branch's whole-sample moments merged from the blocks: parallel/spatial_moments.py).

Gradient convention: the gather's backward hands each rank S × its slice of the (replicated)
feature gradient, so every parameter's local gradient is S × a partial whose spatial-group sum is
the full gradient, while the replicated dense layers hold the full gradient on each of the S
ranks. Averaging over the spatial group (`train/grad_sync.py`) then gives the full gradient for
both kinds alike, and averaging over the whole data × spatial mesh gives the data average.
"""

from __future__ import annotations

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
                x_bcdhw,
                self.running_mean,
                self.running_var,
                self.weight,
                self.bias,
                False,
                0.0,
                self.eps,
            )
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
