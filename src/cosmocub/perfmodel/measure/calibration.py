"""This CPU's compute rates: forward + backward of conv blocks and dense heads timed over a small
grid (threads, batch, voxels, channels, memory format), fitted per layer kind (measure.rates);
any point's layer times then come from the fit. The work besides the layers (the update, the
batch norms, the vote) is timed and fitted in measure.host_work.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from cosmocub.config import (
    CalibrationConfig,
    ModelConfig,
    PooledConfig,
    load_config,
)
from cosmocub.models.cosmoflow import CosmoFlow, conv_block
from cosmocub.models.heads import outputs_per_parameter
from cosmocub.perfmodel.measure.compute import TRAIN_FLOPS_FACTOR, fastest_time, torch_threads
from cosmocub.perfmodel.measure.rates import RateFit, fit_rates

log = logging.getLogger(__name__)

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


def time_train(module: nn.Module, x: torch.Tensor, repeats: int, input_grad: bool = True) -> float:
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
    for t in threads:
        with torch_threads(t):
            rows += _conv_rows(settings, t, kernel)
            rows += _head_rows(settings, t)
    return rows


def _conv_rows(settings: CalibrationConfig, threads: int, kernel: int) -> list[dict[str, Any]]:
    rows = []
    kinds = itertools.product((False, True), (False, True), FORMATS.items())
    for (batch_norm, first, (fmt, layout)), point in itertools.product(
        kinds, _conv_points(settings)
    ):
        (cin, cout), size, batch = point
        kind = conv_kind(batch_norm=batch_norm, memory_format=fmt, first=first)
        block = conv_block(cin, cout, kernel_size=kernel, batch_norm=batch_norm, slope=0.3)
        block = block.to(memory_format=layout)
        x = torch.randn(batch, cin, size, size, size).to(memory_format=layout)
        seconds = time_train(block.train(), x, settings.repeats, not first)
        shape = {"batch": batch, "cin": cin, "cout": cout, "size": size}
        rows.append({"kind": kind, "threads": threads, **shape, "seconds": seconds})
    return rows


def _head_rows(settings: CalibrationConfig, threads: int) -> list[dict[str, Any]]:
    rows = []
    for (features, dense), batch in itertools.product(HEAD_GRID, settings.batches):
        cfg = dataclasses.replace(base_model(), dense_sizes=dense, dropout=0.0)
        head = _head_of(cfg, features)
        seconds = time_train(head.train(), torch.randn(batch, features), settings.repeats)
        widths = head_widths(cfg, features)
        rows.append(
            {
                "kind": "head",
                "threads": threads,
                "batch": batch,
                "widths": widths,
                "seconds": seconds,
            }
        )
    return rows


def _conv_points(settings: CalibrationConfig) -> Iterator[tuple[tuple[int, int], int, int]]:
    for channels, size, batch in itertools.product(
        settings.channels, settings.sizes, settings.batches
    ):
        yield (channels[0], channels[1]), size, batch


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


ATTEMPTS = 3


def fit_fastest(
    measure: Callable[[], list[dict[str, Any]]],
    fit: Callable[[list[dict[str, Any]]], dict[str, RateFit]],
) -> tuple[dict[str, RateFit], list[dict[str, Any]]]:
    """fit(measure()); where a fit misses its timings (rates.fit_rates' one-line error), the grid
    is timed again and each timing keeps its faster measurement, up to ATTEMPTS times, before the
    error stands. Why: this VM's own speed drifts by up to a quarter over tens of seconds with
    nothing else running (docs/explanation/cluster_model.md), and a grid of short timings, each the
    fastest
    of a few repeats taken back to back, can land partly on a slow stretch: on a quiet machine
    (load ~1) 3 of 10 calibrations stopped on one such fit (the head's, SGD's and AdamW's
    update: 26-46 % median against at most 25 %)."""
    rows = measure()
    for attempt in range(2, ATTEMPTS + 1):
        try:
            return fit(rows), rows
        except ValueError as missed:
            log.warning(
                "calibration: %s; timing that grid again (%d of %d)", missed, attempt, ATTEMPTS
            )
        rows = [
            {**row, "seconds": min(row["seconds"], other["seconds"])}
            for row, other in zip(rows, measure(), strict=True)
        ]
    return fit(rows), rows
