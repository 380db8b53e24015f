"""This CPU's work besides the layers, timed over small grids and fitted (measure.rates): the
optimizer's update per tensor and element, the plain and synced batch norms per call and element,
and the compressed exchange's host work (encode, vote, unpack) per bucket and element.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from cosmocub.config import OptimizerConfig, load_config
from cosmocub.optim.collectives import COLLECTIVES, host_collective
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.optim.quantize import quantizer_levels, wire_bits
from cosmocub.optim.vote import tie_pattern
from cosmocub.optim.wire import WireSpec
from cosmocub.parallel.layers import SyncBatchNorm3d
from cosmocub.perfmodel.measure.calibration import FORMATS, fit_by_key, time_train
from cosmocub.perfmodel.measure.compute import fastest_time, torch_threads
from cosmocub.perfmodel.measure.rates import RateFit

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

    rows = []
    for t in threads:
        with torch_threads(t):
            for (name, section), (tensors, elements) in itertools.product(
                UPDATE_OPTIMIZERS.items(), UPDATE_GRID
            ):
                cfg = load_config(None, overrides={"optimizer": section}).optimizer
                optimizer = build_optimizer(update_parameters(tensors, elements), cfg, 1)
                seconds = fastest_time(optimizer.step, repeats)
                shape = {"tensors": tensors, "elements": elements}
                rows.append({"optimizer": name, "threads": t, **shape, "seconds": seconds})
    return rows


def update_work(tensors: int, elements: int) -> dict[str, float]:
    """An update's work: a Python loop over its tensors (a fixed cost each), and its elements."""
    return {"tensors": float(tensors), "elements": float(elements)}


def fit_updates(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """A per-tensor and per-element cost per "optimizer@threads" (perfmodel.measure.rates' fit,
    as the layers')."""
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
    if name.votes_updates:  # distributed_lion votes signs; lion_cub what its quantizer says
        sign = lc is None or lc.quantizer == "sign"
        return "lion_cub" if sign else "lion_cub_scaled"
    if name not in UPDATE_OPTIMIZERS:
        raise ValueError(
            f"key 'optimizer.name': {name.value!r} has no calibrated update (have "
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
    points = list(itertools.product(FORMATS.items(), NORM_GRID, NORM_KINDS))
    with one_rank_group() as group:
        for t in threads:
            with torch_threads(t):
                rows += [_norm_row(group, t, repeats, *point) for point in points]
    return rows


def _norm_row(
    group: dist.ProcessGroup,
    threads: int,
    repeats: int,
    memory_format: tuple[str, torch.memory_format],
    shape: tuple[int, int, int],
    kind: str,
) -> dict[str, Any]:
    (fmt, layout), (batch, channels, side) = memory_format, shape
    x = torch.randn(batch, channels, side, side, side).to(memory_format=layout)
    norm: nn.Module = nn.BatchNorm3d(channels)
    if kind == "synced":
        norm = SyncBatchNorm3d(norm, group)
    seconds = time_train(norm.train(), x, repeats)
    return {
        "kind": kind,
        "format": fmt,
        "threads": threads,
        "elements": x.numel(),
        "seconds": seconds,
    }


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

    rows = []
    for t in threads:
        with torch_threads(t):
            for (kind, (quantizer, bits)), name in itertools.product(
                VOTE_QUANTIZERS.items(), COLLECTIVES
            ):
                levels = quantizer_levels(quantizer, bits, VOTE_GROUP, collective=name)
                spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), "int8")
                collective = host_collective(name, VOTE_GROUP)
                for n in VOTE_SIZES:
                    q = torch.randint(-levels, levels + 1, (n,), dtype=torch.int8)
                    work = functools.partial(collective.host_work, q, tie_pattern(n, step=1), spec)
                    seconds = fastest_time(work, repeats)
                    where = {"kind": kind, "collective": name, "threads": t}
                    rows.append({**where, "elements": n, "seconds": seconds})
    return rows


def fit_votes(rows: Sequence[Mapping[str, Any]]) -> dict[str, RateFit]:
    """A per-call (bucket) and per-element cost per vote_key."""
    return fit_by_key(
        rows,
        key=lambda r: vote_key(r["kind"], r["collective"], r["threads"]),
        work=lambda r: call_work(r["elements"]),
        what="vote calibration",
    )
