"""Build the configured optimizer and its lr schedule, one per kind (config.OptimizerKind).

sgd, adamw and lion see gradients averaged by DDP (see `cosmocub.train.grad_sync`);
distributed_lion and lion_cub exchange compressed updates over the data group themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch.optim import Optimizer

from cosmocub.config import ConfigError, LionCubConfig, OptimizerConfig, OptimizerKind
from cosmocub.optim.lion import Lion
from cosmocub.optim.lion_cub import LionCub
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.optim.quantize import quantizer_levels
from cosmocub.optim.schedule import EpochSchedule, lr_at
from cosmocub.parallel.node_layout import NodeLayout
from cosmocub.parallel.parallel_dims import ParallelDims


def build_optimizer(
    params: Iterable[torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
    cfg: OptimizerConfig,
    global_batch: int,
    *,
    dims: ParallelDims | None = None,
    fused: bool = False,
) -> Optimizer:
    """The optimizer of kind cfg.name, starting at lr_at(0); the schedule moves lr from there.

    `params` may be named (model.named_parameters()): lion_cub matches momentum-sync patterns
    against the names. `dims` gives the data group the distributed Lions exchange over (None: a
    group of one). `fused`: torch's fused kernel (sgd, adamw only; train.fused_optimizer).
    """
    lr = lr_at(0.0, cfg, global_batch)
    items = list(params)
    plain = [x[1] if isinstance(x, tuple) else x for x in items]
    kind = cfg.name
    if fused and not kind.has_fused_kernel:
        raise ValueError(f"optimizer {kind.value!r} has no fused kernel (sgd, adamw have)")
    kernel = {"fused": True} if fused else {}  # else torch's own choice (foreach where it can)
    if kind is OptimizerKind.SGD:
        return torch.optim.SGD(
            plain, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, **kernel
        )
    if kind is OptimizerKind.ADAMW:
        return torch.optim.AdamW(
            plain, lr=lr, betas=cfg.resolved_betas, weight_decay=cfg.weight_decay, **kernel
        )
    if kind is OptimizerKind.LION:
        return Lion(plain, lr=lr, betas=cfg.resolved_betas, weight_decay=cfg.weight_decay)
    assert kind.votes_updates, f"every kind is built: {kind}"
    return _build_lion_cub(items, cfg, lr, dims)  # LionCub names plain tensors itself


def _build_lion_cub(
    named: list[torch.Tensor] | list[tuple[str, torch.Tensor]],
    cfg: OptimizerConfig,
    lr: float,
    dims: ParallelDims | None,
) -> LionCub:
    settings = LionCubSettings.from_config(cfg, lr=lr)
    layout = _node_layout(settings.hierarchy, dims)
    two_level = settings.hierarchy == "node" and layout is not None and layout.two_level
    data_ranks_per_node = layout.data_per_node if layout is not None else None
    lc = cfg.lion_cub
    if lc is None:  # distributed_lion: its settings are fixed, nothing to check
        return LionCub(
            named, settings, group=_data_group(dims), data_ranks_per_node=data_ranks_per_node
        )
    # The voters: the data ranks, or the nodes under hierarchy node.
    check_group_size(lc, (layout.nodes if two_level else dims.data) if dims is not None else 1)
    if lc.overlap and dims is not None and dims.spatial > 1:
        raise ConfigError(
            "key 'optimizer.lion_cub.overlap': needs a spatial group of 1 (gradients are reduced "
            f"over the spatial group after backward; here spatial = {dims.spatial})"
        )
    node_groups = None
    if two_level:
        assert dims is not None
        groups = dims.node_groups()
        assert groups.intra is not None and groups.inter is not None
        node_groups = (groups.intra, groups.inter)
    return LionCub(
        named,
        settings,
        group=_data_group(dims),
        data_ranks_per_node=data_ranks_per_node,
        node_groups=node_groups,
    )


def _node_layout(hierarchy: str, dims: ParallelDims | None) -> NodeLayout | None:
    """The data axis over the nodes; where it is uneven, a ConfigError under hierarchy node and
    None under flat (whose bytes then all count as inter-node)."""
    if not isinstance(dims, ParallelDims):  # None, or a stand-in in a test
        return None
    try:
        return dims.node_layout()
    except ValueError as err:
        if hierarchy == "node":
            raise ConfigError(f"key 'optimizer.lion_cub.hierarchy': node: {err}") from None
        return None


def _data_group(dims: ParallelDims | None) -> torch.distributed.ProcessGroup | None:
    return dims.group("data") if dims is not None and dims.data > 1 else None


def build_schedule(
    optimizer: Optimizer, cfg: OptimizerConfig, *, global_batch: int, steps_per_epoch: int
) -> EpochSchedule:
    return EpochSchedule(optimizer, cfg, global_batch=global_batch, steps_per_epoch=steps_per_epoch)


def check_group_size(lc: LionCubConfig, data_group_size: int) -> int:
    """The quantizer's levels at this data-group size (known only when the ranks have started);
    ConfigError, naming the key, N, the levels and what to choose instead, where the sum would
    not be exact or a p-bit quantizer would keep one level (only the allreduce collective's sum
    bounds them)."""
    try:
        return quantizer_levels(
            lc.quantizer,
            lc.resolved_bits,
            data_group_size,
            collective=lc.collective,
            allreduce_dtype=lc.resolved_allreduce_dtype,
        )
    except ValueError as err:
        raise ConfigError(f"key 'optimizer.lion_cub.allreduce_dtype': {err}") from None
