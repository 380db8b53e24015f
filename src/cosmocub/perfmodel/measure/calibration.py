"""This CPU's compute rates: forward + backward of conv blocks and dense heads timed over a small
grid (threads, batch, voxels, channels, memory format), fitted per layer kind (measure.rates),
and the optimizer's update per element; any point's layer times then come from the fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cosmocub.config import (
    CalibrationConfig,
    ModelConfig,
    OptimizerConfig,
    PooledConfig,
    load_config,
)
from cosmocub.models.cosmoflow import CosmoFlow, conv_block
from cosmocub.parallel.layers import SyncBatchNorm3d
from cosmocub.perfmodel.measure.compute import TRAIN_FLOPS_FACTOR, fastest_time, torch_threads
from cosmocub.perfmodel.measure.rates import RateFit, fit_rates

FORMATS = {"contiguous": torch.contiguous_format, "channels_last_3d": torch.channels_last_3d}
# The grid's convolutions are 3³ (every shipped config's model.kernel_size).
KERNEL = 3
# Dense heads of the grid: (features, dense sizes); six shapes per batch for 3 unknowns.
HEAD_GRID = (
    (64, (16,)),
    (256, (128,)),
    (1024, (128, 64)),
    (2048, (16,)),
    (8192, (128,)),
    (8192, (64, 32)),
)
# The update's grid: (tensors, elements); its time is per tensor (Python's loop) + per element.
UPDATE_GRID = ((4, 1 << 12), (4, 1 << 18), (32, 1 << 14), (32, 1 << 19))
UPDATE_OPTIMIZERS = {
    "adamw": {"name": "adamw"},
    "lion": {"name": "lion"},
    "sgd": {"name": "sgd"},
    "lion_cub": {"name": "lion_cub", "lion_cub": {"quantizer": "sign", "collective": "alltoall"}},
    # A scaled quantizer (l1, linf, l0): its per-tensor scales and levels besides the sign's work.
    "lion_cub_scaled": {"name": "lion_cub", "lion_cub": {"quantizer": "l1", "bits": 4}},
}

# Batch norms of (batch, channels, side): the plain one and the synced one that training swaps in
# whenever its mesh has more than one rank (parallel.layers.SyncBatchNorm3d: statistics in
# float64, a Python autograd function), each time = a call + per element.
NORM_GRID = ((2, 8, 32), (2, 16, 16), (4, 32, 16), (2, 64, 8), (8, 8, 16), (1, 128, 4))
NORM_KINDS = ("plain", "synced")
# The compressed exchange's host work (optim.collectives' host_work: encode, the vote, unpack; the
# wire left out) in a group of two, per element of a bucket: (quantizer, bits) of the sign and of a
# scaled quantizer, each collective, at these bucket sizes.
VOTE_QUANTIZERS = {"sign": ("sign", 1), "scaled": ("l1", 4)}
VOTE_SIZES = (1 << 12, 1 << 15, 1 << 18, 1 << 19)
VOTE_GROUP = 2


def conv_kind(*, batch_norm: bool, memory_format: str, first: bool = False) -> str:
    """`first`: the model's first block, whose input is the data: backward computes no input
    gradient there (for 4 input channels at 32³ that gradient cost half the block's time)."""
    return f"conv{'_bn' if batch_norm else ''}{'_first' if first else ''}/{memory_format}"


def conv_work(
    *, batch: int, cin: int, cout: int, shape: Sequence[int], kernel: int
) -> dict[str, float]:
    """A conv block's work: one call, its voxels (what each output position costs whatever its
    channels: the kernels' loops, the pool's window), its training FLOPs, the bytes of its output
    activations (conv, norm, activation, pool passes over them) and of its input unfolded over
    the kernel (what a convolution on few channels spends its time moving), fp32."""
    voxels = batch * math.prod(shape)
    return {
        "call": 1.0,
        "voxels": float(voxels),
        "flops": TRAIN_FLOPS_FACTOR * 2.0 * voxels * cin * cout * kernel**3,
        "out_bytes": 4.0 * voxels * cout,
        "unfold_bytes": 4.0 * voxels * cin * kernel**3,
    }


def head_work(*, batch: int, widths: Sequence[int]) -> dict[str, float]:
    """A dense head's work (widths: features, the dense sizes, the outputs): a call per layer,
    training FLOPs, and bytes of weights and activations."""
    weights = sum(a * b for a, b in itertools.pairwise(widths))
    return {
        "call": float(len(widths) - 1),
        "flops": TRAIN_FLOPS_FACTOR * 2.0 * batch * weights,
        "bytes": 4.0 * (weights + batch * sum(widths)),
    }


def head_widths(model_cfg: ModelConfig, features: int) -> list[int]:
    from cosmocub.models.heads import outputs_per_parameter

    outputs = model_cfg.num_outputs * outputs_per_parameter(model_cfg)
    return [features, *model_cfg.dense_sizes, outputs]


def grid_threads(settings: CalibrationConfig, cores: int) -> tuple[int, ...]:
    """calibration.threads, else 1, 2, 4, … up to the cores and the cores themselves."""
    if settings.threads:
        return tuple(settings.threads)
    powers = [2**i for i in range(int(math.log2(cores)) + 1)]
    return tuple(sorted({*powers, cores}))


def batch_class(batch: int) -> str:
    """oneDNN runs a batch of one on other kernels (a 16³ conv of 16 → 32 channels: forward
    slower at batch 1 than at 4 here), so batch 1 is fitted apart from the larger batches."""
    return "batch1" if batch == 1 else "batch2+"


def fit_key(kind: str, threads: int, batch: int) -> str:
    return f"{kind}@{threads}/{batch_class(batch)}"


def _time_train(module: nn.Module, x: torch.Tensor, repeats: int, input_grad: bool = True) -> float:
    x = x.requires_grad_(input_grad)

    def run() -> None:
        module.zero_grad(set_to_none=True)
        module(x).sum().backward()

    return fastest_time(run, repeats)


@functools.cache
def base_model() -> ModelConfig:
    return load_config(None).model


def measure_grid(
    settings: CalibrationConfig, *, threads: Sequence[int], kernel: int = KERNEL
) -> list[dict[str, Any]]:
    """One row per timing: kind, threads, the work's shape and its seconds (the fastest of
    settings.repeats after a warm-up)."""
    rows: list[dict[str, Any]] = []
    base = base_model()
    for t in threads:
        with torch_threads(t):
            for batch_norm, first in itertools.product((False, True), repeat=2):
                for fmt, layout in FORMATS.items():
                    kind = conv_kind(batch_norm=batch_norm, memory_format=fmt, first=first)
                    for (cin, cout), size, batch in _conv_points(settings):
                        block = conv_block(
                            cin, cout, kernel_size=kernel, batch_norm=batch_norm, slope=0.3
                        ).to(memory_format=layout)
                        x = torch.randn(batch, cin, size, size, size).to(memory_format=layout)
                        seconds = _time_train(block.train(), x, settings.repeats, not first)
                        shape = {"batch": batch, "cin": cin, "cout": cout, "size": size}
                        rows.append({"kind": kind, "threads": t, **shape, "seconds": seconds})
            for features, dense in HEAD_GRID:
                for batch in settings.batches:
                    cfg = dataclasses.replace(base, dense_sizes=dense, dropout=0.0)
                    head = _head_of(cfg, features)
                    seconds = _time_train(
                        head.train(), torch.randn(batch, features), settings.repeats
                    )
                    widths = head_widths(cfg, features)
                    rows.append(
                        {"kind": "head", "threads": t, "batch": batch, "widths": widths,
                         "seconds": seconds}
                    )  # fmt: skip
    return rows


def _conv_points(settings: CalibrationConfig):
    for channels in settings.channels:
        for size in settings.sizes:
            for batch in settings.batches:
                yield tuple(channels), size, batch


def _head_of(cfg: ModelConfig, features: int) -> nn.Module:
    """CosmoFlow's own head at `features` inputs (a one-block model whose pooled output has
    that many: its conv is never run)."""
    side = round((features / cfg.base_filters) ** (1 / 3))
    if cfg.base_filters * side**3 != features:
        side, filters = 1, features
    else:
        filters = cfg.base_filters
    # The plain head (model.pooled off): its cost at exactly `features` inputs.
    one_block = dataclasses.replace(
        cfg, input_size=2 * side, num_conv_blocks=1, base_filters=filters, pooled=PooledConfig()
    )
    return CosmoFlow(one_block).head


def row_work(row: Mapping[str, Any], *, kernel: int = KERNEL) -> dict[str, float]:
    if row["kind"] == "head":
        return head_work(batch=row["batch"], widths=row["widths"])
    shape = (row["size"],) * 3
    return conv_work(
        batch=row["batch"], cin=row["cin"], cout=row["cout"], shape=shape, kernel=kernel
    )


def fit_by_key(
    rows: Sequence[Mapping[str, Any]],
    *,
    key: Callable[[Mapping[str, Any]], str],
    work: Callable[[Mapping[str, Any]], dict[str, float]],
    what: str,
) -> dict[str, RateFit]:
    """One rate fit (perfmodel.measure.rates) per key(row) of the timings, each row's work its
    terms."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(key(row), []).append(row)
    return {
        k: fit_rates([work(r) for r in group], [r["seconds"] for r in group], what=f"{what} {k}")
        for k, group in groups.items()
    }


def fit_grid(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """One rate fit per fit_key (kind, threads, batch class) of the timings."""
    return fit_by_key(
        rows,
        key=lambda r: fit_key(r["kind"], r["threads"], r["batch"]),
        work=row_work,
        what="compute calibration",
    )


def update_parameters(tensors: int, elements: int) -> list[tuple[str, nn.Parameter]]:
    per = elements // tensors
    out = []
    for i in range(tensors):
        p = nn.Parameter(torch.randn(per))
        p.grad = torch.randn(per)
        out.append((f"p{i}", p))
    return out


def measure_updates(*, threads: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """The optimizer step (a data group of one: Lion Cub's interpolation, quantize and local
    vote, no wire) over UPDATE_GRID's parameters, per optimizer and thread count."""
    from cosmocub.optim.optimizer_factory import build_optimizer

    rows = []
    for t in threads:
        with torch_threads(t):
            for name, section in UPDATE_OPTIMIZERS.items():
                cfg = load_config(None, overrides={"optimizer": section}).optimizer
                for tensors, elements in UPDATE_GRID:
                    optimizer = build_optimizer(update_parameters(tensors, elements), cfg, 1)
                    seconds = fastest_time(optimizer.step, repeats)
                    rows.append(
                        {"optimizer": name, "threads": t, "tensors": tensors,
                         "elements": elements, "seconds": seconds}
                    )  # fmt: skip
    return rows


def update_work(tensors: int, elements: int) -> dict[str, float]:
    """An update's work: a Python loop over its tensors (a fixed cost each), and its elements."""
    return {"tensors": float(tensors), "elements": float(elements)}


def fit_updates(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """A per-tensor and per-element cost per "optimizer@threads" (perfmodel.measure.rates' fit, as
    the
    layers')."""
    return fit_by_key(
        rows,
        key=lambda r: f"{r['optimizer']}@{r['threads']}",
        work=lambda r: update_work(r["tensors"], r["elements"]),
        what="update calibration",
    )


def update_key(optimizer_cfg: OptimizerConfig) -> str:
    """The UPDATE_OPTIMIZERS entry that costs `optimizer_cfg`'s step."""
    name = optimizer_cfg.name
    lc = optimizer_cfg.lion_cub
    if name in ("lion_cub", "distributed_lion"):
        sign = name == "distributed_lion" or (lc is not None and lc.quantizer == "sign")
        return "lion_cub" if sign else "lion_cub_scaled"
    if name not in UPDATE_OPTIMIZERS:
        raise ValueError(
            f"key 'optimizer.name': {name!r} has no calibrated update (have "
            f"{', '.join(UPDATE_OPTIMIZERS)})"
        )
    return name


def norm_key(kind: str, memory_format: str, threads: int) -> str:
    return f"norm_{kind}/{memory_format}@{threads}"


def call_work(elements: int) -> dict[str, float]:
    """The work of a call over `elements` values (a norm, a bucket's vote): a fixed cost and a
    per-element one."""
    return {"call": 1.0, "elements": float(elements)}


@contextlib.contextmanager
def one_rank_group() -> Iterator[dist.ProcessGroup]:
    """A gloo group of this process alone (an in-memory store, no port), for timing the synced
    norm's arithmetic and its collectives' calls without a wire; the wire is the links' fit."""
    if dist.is_initialized():
        raise RuntimeError("the compute calibration runs in a process of its own, not in ranks")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def measure_norms(*, threads: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """Forward + backward of a plain and a synced batch norm (a group of one) over NORM_GRID, per
    memory format and thread count."""
    rows = []
    with one_rank_group() as group:
        for t in threads:
            with torch_threads(t):
                for fmt, layout in FORMATS.items():
                    for batch, channels, side in NORM_GRID:
                        x = torch.randn(batch, channels, side, side, side)
                        x = x.to(memory_format=layout)
                        for kind in NORM_KINDS:
                            norm: nn.Module = nn.BatchNorm3d(channels)
                            if kind == "synced":
                                norm = SyncBatchNorm3d(norm, group)
                            rows.append(
                                {"kind": kind, "format": fmt, "threads": t,
                                 "elements": x.numel(),
                                 "seconds": _time_train(norm.train(), x, repeats)}
                            )  # fmt: skip
    return rows


def fit_norms(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """A per-call and per-element cost per norm_key (perfmodel.measure.rates' fit, as the
    layers')."""
    return fit_by_key(
        rows,
        key=lambda r: norm_key(r["kind"], r["format"], r["threads"]),
        work=lambda r: call_work(r["elements"]),
        what="norm calibration",
    )


def vote_kind(quantizer: str) -> str:
    """VOTE_QUANTIZERS' entry that costs a quantizer's codes: the sign's, or a scaled one's."""
    return "sign" if quantizer == "sign" else "scaled"


def vote_key(kind: str, collective: str, threads: int) -> str:
    return f"vote_{kind}/{collective}@{threads}"


def measure_votes(*, threads: Sequence[int], repeats: int) -> list[dict[str, Any]]:
    """The compressed exchange's host work per bucket (no wire) over VOTE_SIZES, per quantizer
    kind, collective and thread count, in a group of VOTE_GROUP."""
    from cosmocub.optim.collectives import COLLECTIVES, host_collective
    from cosmocub.optim.quantize import quantizer_levels, wire_bits
    from cosmocub.optim.vote import tie_pattern
    from cosmocub.optim.wire import WireSpec

    rows = []
    for t in threads:
        with torch_threads(t):
            for kind, (quantizer, bits) in VOTE_QUANTIZERS.items():
                for name in COLLECTIVES:
                    levels = quantizer_levels(quantizer, bits, VOTE_GROUP, collective=name)
                    spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), "int8")
                    collective = host_collective(name, VOTE_GROUP)
                    for n in VOTE_SIZES:
                        q = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8)
                        tie = tie_pattern(n, step=1)
                        seconds = fastest_time(
                            functools.partial(collective.host_work, q, tie, spec), repeats
                        )
                        rows.append(
                            {"kind": kind, "collective": name, "threads": t, "elements": n,
                             "seconds": seconds}
                        )  # fmt: skip
    return rows


def fit_votes(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """A per-call (bucket) and per-element cost per vote_key."""
    return fit_by_key(
        rows,
        key=lambda r: vote_key(r["kind"], r["collective"], r["threads"]),
        work=lambda r: call_work(r["elements"]),
        what="vote calibration",
    )
