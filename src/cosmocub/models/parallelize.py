"""Apply spatial parallelism to a plain model from outside: which block a rank owns, whether a
split fits the model, and `parallelize_cosmoflow` / `parallelize_unet`, which swap in the layers
of `layers.py`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.unet import UNet3d
from cosmocub.parallel.halo import SPATIAL_DIMS, HaloPlan, spatial_coords
from cosmocub.parallel.layers import GatherFlatten, SharedDropout, SpatialConv3d, SyncBatchNorm3d
from cosmocub.parallel.mesh import ParallelDims

Split = tuple[int, int, int]


def _as_split(split: Sequence[int]) -> Split:
    values = tuple(int(s) for s in split)
    if len(values) != 3 or any(s < 1 for s in values):
        raise ValueError(f"split {list(split)}: need three positive ranks counts [sd, sh, sw]")
    return values[0], values[1], values[2]


def spatial_block(
    dims: ParallelDims, split: Sequence[int], global_shape_dhw: Sequence[int]
) -> tuple[slice, slice, slice]:
    """The part of the global (D, H, W) this rank owns; rank order in the spatial group is
    row-major over (sd, sh, sw)."""
    split = _as_split(split)
    if math.prod(split) != dims.spatial:
        raise ValueError(
            f"split {list(split)} has {math.prod(split)} ranks, spatial is {dims.spatial}"
        )
    coords = spatial_coords(dims.axis_rank("spatial"), split)
    out = []
    for d, (n, s, c) in enumerate(zip(global_shape_dhw, split, coords, strict=True)):
        if n % s:
            raise ValueError(f"{SPATIAL_DIMS[d]} extent {n} does not divide into {s} blocks")
        out.append(slice(c * (n // s), (c + 1) * (n // s)))
    return out[0], out[1], out[2]


def check_spatial_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """Raise ValueError, naming the layer and the numbers, if `split` cannot run the model on
    `input_size`³ samples: an extent that does not divide, a local extent narrower than the halo,
    or an odd local extent before a pooling layer (a pool window would straddle two ranks)."""
    split = _as_split(split)
    halo = model_cfg.kernel_size // 2
    extent = input_size
    for i in range(model_cfg.num_conv_blocks):
        block = f"conv_blocks.block{i}"
        for d, s in enumerate(split):
            dim = SPATIAL_DIMS[d]
            if extent % s:
                raise ValueError(
                    f"{block}.conv: {dim} extent {extent} does not divide into {s} blocks "
                    f"(split {list(split)}, input {input_size})"
                )
            local = extent // s
            if s > 1 and local < halo:
                raise ValueError(
                    f"{block}.conv: local {dim} extent {local} is narrower than the halo {halo} "
                    f"(kernel {model_cfg.kernel_size}, split {list(split)}, input {input_size})"
                )
            if local % 2:
                raise ValueError(
                    f"{block}.pool: odd local {dim} extent {local} before pooling "
                    f"(split {list(split)}, input {input_size})"
                )
        extent //= 2


def parallelize_cosmoflow(
    model: CosmoFlow, dims: ParallelDims, *, split: Sequence[int], periodic: bool = False
) -> CosmoFlow:
    """Swap `model`'s layers in place for spatially parallel ones and return it.

    Parameters and buffers stay the same objects under the same state_dict keys, so checkpoints
    and saved models are the plain CosmoFlow. Afterwards forward takes this rank's block
    (B, C, D/sd, H/sh, W/sw), the one `spatial_block` names, and returns the (B, 4) prediction,
    identical on every rank of the spatial group. Batch norm statistics span the whole
    data × spatial mesh (also at split [1, 1, 1] when data > 1: a global-batch norm, so that a
    data × spatial run and a data-only run normalise over the same samples). `periodic` gives
    every conv periodic halos (whole periodic boxes) instead of zero padding. Dropout draws
    nn.Dropout's mask on spatial rank 0 (`SharedDropout`), the mask the unsplit run draws.

    Gradients: see `layers.py` — average them over the spatial group (`build_gradient_sync`).
    """
    split = _as_split(split)
    if math.prod(split) != dims.spatial:
        raise ValueError(
            f"split {list(split)} has {math.prod(split)} ranks, the mesh's spatial axis "
            f"{dims.spatial}"
        )
    cfg = model.config
    check_spatial_split(cfg, cfg.input_size, split)
    if dims.world_size == 1 and not periodic:
        return model  # one rank, zero halos: the plain model is already exact
    group_rank = dims.axis_rank("spatial")
    halo = cfg.kernel_size // 2
    plan = HaloPlan(
        group=dims.group("spatial"),
        split=split,
        coords=spatial_coords(group_rank, split),
        widths=tuple(halo if (s > 1 or periodic) else 0 for s in split),  # type: ignore[arg-type]
        periodic=periodic,
    )
    stats_group = None
    if cfg.batch_norm and dims.world_size > 1:
        # A group of its own, so norm collectives issued during backward never interleave with
        # DDP's gradient all-reduce on the default group.
        stats_group = dims.new_group(list(range(dims.world_size)))
    for block in model.conv_blocks.children():
        if not isinstance(block.conv, nn.Conv3d):
            raise ValueError("parallelize_cosmoflow: the model is already parallelized")
        if any(plan.widths):
            block.conv = SpatialConv3d(block.conv, plan)
        if stats_group is not None:
            block.norm = SyncBatchNorm3d(block.norm, stats_group)
    if dims.spatial > 1:
        model.flatten = GatherFlatten(plan, group_rank)
        for name, layer in model.head.named_children():
            if isinstance(layer, nn.Dropout):
                setattr(model.head, name, SharedDropout(layer.p, plan.group))
    return model


def replicated_parameters(model: nn.Module) -> list[nn.Parameter]:
    """The parameters every rank of the spatial group holds whole, with the same gradient: the
    dense head after a `GatherFlatten` (none in a model that is not spatially split)."""
    if not isinstance(getattr(model, "flatten", None), GatherFlatten):
        return []
    return list(model.head.parameters())


def check_unet_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """Raise ValueError, naming the level and the numbers, if `split` cannot run the U-Net on
    `input_size`³ samples: at some level an extent does not divide, a block is thinner than the
    halo (its convs would need planes from beyond the next rank), or a block is odd before a
    pooling. Such levels are refused rather than gathered: pick a smaller split or depth."""
    split = _as_split(split)
    assert model_cfg.unet is not None, "model.name unet comes with model.unet (config.py)"
    halo, depth = model_cfg.kernel_size // 2, model_cfg.unet.depth
    for level in range(depth):
        extent = input_size // 2**level
        where = f"U-Net level {level} ({extent}³ voxels)"
        for d, s in enumerate(split):
            dim = SPATIAL_DIMS[d]
            if extent % s:
                raise ValueError(
                    f"{where}: {dim} extent {extent} does not divide into {s} blocks "
                    f"(split {list(split)}, input {input_size}, depth {depth})"
                )
            local = extent // s
            if s > 1 and local < halo:
                raise ValueError(
                    f"{where}: local {dim} extent {local} is thinner than the halo {halo} "
                    f"(kernel {model_cfg.kernel_size}, split {list(split)}, input {input_size}, "
                    f"depth {depth})"
                )
            if level < depth - 1 and local % 2:
                raise ValueError(
                    f"{where}: odd local {dim} extent {local} before pooling "
                    f"(split {list(split)}, input {input_size}, depth {depth})"
                )


def parallelize_unet(
    model: UNet3d, dims: ParallelDims, *, split: Sequence[int], periodic: bool = False
) -> UNet3d:
    """Swap the U-Net's layers in place for spatially parallel ones and return it.

    Every k > 1 conv becomes a halo conv (`SpatialConv3d`); max-pooling and the kernel-2,
    stride-2 transposed convs need no halo (a window never straddles two blocks while local
    extents are even, which `check_unet_split` guarantees), the 1×1×1 output conv none either;
    skips are concatenated locally. Batch norm statistics span the whole data × spatial mesh.
    Afterwards forward takes this rank's block (B, C, D/sd, H/sh, W/sw) and returns the
    prediction for the same block: outputs stay split. A loss that is the mean over the block,
    with gradients averaged over the spatial group (`build_gradient_sync`), gives exactly the
    gradient of the mean over the whole sample. Parameters, buffers and state_dict keys stay the
    plain U-Net's.
    """
    split = _as_split(split)
    if math.prod(split) != dims.spatial:
        raise ValueError(
            f"split {list(split)} has {math.prod(split)} ranks, the mesh's spatial axis "
            f"{dims.spatial}"
        )
    cfg = model.config
    check_unet_split(cfg, cfg.input_size, split)
    if dims.world_size == 1 and not periodic:
        return model
    halo = cfg.kernel_size // 2
    plan = HaloPlan(
        group=dims.group("spatial"),
        split=split,
        coords=spatial_coords(dims.axis_rank("spatial"), split),
        widths=tuple(halo if (s > 1 or periodic) else 0 for s in split),  # type: ignore[arg-type]
        periodic=periodic,
    )
    stats_group = None
    if cfg.batch_norm and dims.world_size > 1:
        # Its own group, as in parallelize_cosmoflow: norm collectives in backward never
        # interleave with DDP's all-reduce.
        stats_group = dims.new_group(list(range(dims.world_size)))
    swaps: list[tuple[nn.Module, str, nn.Module]] = []
    for parent in model.modules():
        for name, layer in parent.named_children():
            if isinstance(layer, nn.Conv3d) and max(layer.kernel_size) > 1 and any(plan.widths):
                swaps.append((parent, name, SpatialConv3d(layer, plan)))
            elif isinstance(layer, nn.BatchNorm3d) and stats_group is not None:
                swaps.append((parent, name, SyncBatchNorm3d(layer, stats_group)))
            elif isinstance(layer, SpatialConv3d | SyncBatchNorm3d):
                raise ValueError("parallelize_unet: the model is already parallelized")
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return model
