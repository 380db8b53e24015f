"""The synced batch norms as a two-rank training step runs them on this CPU.

Timed alone in a group of one (calibration.measure_norms), the synced norm's arithmetic misses
what it costs inside a step of two ranks: there each of its collectives waits for the other rank
to reach the same layer and wakes a thread that slept on a socket. Measured here (network-study
model, batch 2, one core per rank): whole steps of 10.5 ms with plain norms, 21 ms with the synced
ones in a group of one, 28 ms across two ranks on loopback, where the norms' collectives in a
tight loop take 0.17 ms each (8 a step). So the synced norm's cost is timed as training pays it:
a whole CosmoFlow step on two ranks (one core and one thread each, gloo over 127.0.0.1, every
block's norm swapped as models.parallelize swaps it for a data-only mesh) less the same step on
one rank alone with plain norms (as the layers are timed), over PAIR_MODELS × the grid's
batches: the norms' arithmetic (timed alone) plus a cost per norm in the step (fit_pairs). The
fit holds the collectives' cost on loopback; a prediction charges a link only what it costs
beyond loopback (model.predict_step).
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.parallel.layers import SyncBatchNorm3d
from cosmocub.perfmodel.measure.calibration import base_model
from cosmocub.perfmodel.measure.compute import call_times
from cosmocub.perfmodel.measure.host_work import NORM_KINDS, call_work, norm_key
from cosmocub.perfmodel.measure.rates import RateFit

# CosmoFlow shapes of the pair timings (3 conv blocks, a small head), apart from the studies'.
PAIR_MODELS = (
    {"input_size": 16, "base_filters": 4},
    {"input_size": 16, "base_filters": 8},
    {"input_size": 32, "base_filters": 4},
)
PAIR_STEPS = 20  # timed steps per model and batch, after PAIR_WARMUP
PAIR_WARMUP = 3
PAIR_TIMEOUT_S = 300
# A collective called after compute (as training calls its exchange and syncs) against the same
# one back to back: a gap of this long, this many times.
WAKE_GAP_S, WAKE_REPEATS = 2e-3, 60
# Each timing is a difference of two medians of a few milliseconds, where the layers' timings
# are one: a looser bound than perfmodel.measure.rates' before the form is refused.
PAIR_MAX_MEDIAN_REL_ERROR = 0.5


def pair_key(memory_format: str) -> str:
    """The pair fit's key: one thread per rank (two ranks of more would oversubscribe 2 cores)."""
    return f"norm_pair/{memory_format}@1"


def norm_elements(model_cfg: ModelConfig, batch: int) -> tuple[int, int]:
    """(norm calls, normalised elements) of one forward pass: one norm per conv block."""
    side, elements = model_cfg.input_size, 0
    for i in range(model_cfg.num_conv_blocks):
        elements += batch * model_cfg.base_filters * 2**i * side**3
        side //= 2
    return model_cfg.num_conv_blocks, elements


def pair_models() -> list[ModelConfig]:
    base = base_model()
    return [
        dataclasses.replace(base, **shape, num_conv_blocks=3, dense_sizes=(16,), dropout=0.0)
        for shape in PAIR_MODELS
    ]


def _step_seconds(model: nn.Module, cfg: ModelConfig, batch: int, layout, barrier) -> float:
    """Median seconds of a training step (zero_grad, forward, loss, backward)."""
    x = torch.randn(batch, cfg.in_channels, *(cfg.input_size,) * 3).to(memory_format=layout)
    y = torch.zeros(batch, cfg.num_outputs)
    model = model.train().to(memory_format=layout)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()

    for _ in range(PAIR_WARMUP):
        step()
    barrier()
    return statistics.median(call_times(step, PAIR_STEPS))


def _wake_seconds() -> float:
    """Both ranks' mean of what a small all-reduce costs after WAKE_GAP_S of compute beyond its
    median back to back: the rank that arrives first has slept on its socket by the time the
    other comes (the pair's skew, and the wake-up of a sleeping thread: on this VM about half a
    millisecond, which a back-to-back benchmark never sees)."""
    buf, work = torch.zeros(64), torch.randn(128, 128)

    def compute() -> None:
        start = time.perf_counter()
        while time.perf_counter() - start < WAKE_GAP_S:
            work @ work

    for _ in range(5):
        dist.all_reduce(buf)
    tight, after = call_times(lambda: dist.all_reduce(buf), WAKE_REPEATS), []
    for _ in range(WAKE_REPEATS):
        compute()
        start = time.perf_counter()
        dist.all_reduce(buf)
        after.append(time.perf_counter() - start)
    extra = torch.tensor([statistics.mean(after) - statistics.median(tight)], dtype=torch.float64)
    dist.all_reduce(extra)
    return max(0.0, float(extra) / 2)


def _pair_row(rank: int, cfg: ModelConfig, fmt: str, layout: Any, batch: int) -> dict[str, Any]:
    """One model's step plain (rank 0 alone, as the layers' fits are timed: what the second
    rank costs is the synced step's) and with its norms synced over the two ranks."""
    torch.manual_seed(0)
    model = CosmoFlow(cfg)
    plain = _step_seconds(model, cfg, batch, layout, lambda: None) if rank == 0 else 0.0
    dist.barrier()
    for block in model.conv_blocks.children():
        block.norm = SyncBatchNorm3d(block.norm, dist.group.WORLD)
    synced = _step_seconds(model, cfg, batch, layout, dist.barrier)
    calls, elements = norm_elements(cfg, batch)
    return {
        "format": fmt,
        "calls": calls,
        "elements": elements,
        "plain_s": plain,
        "synced_s": synced,
        "seconds": max(synced - plain, 1e-6),
    }


def _rank(rank: int, port: int, batches: Sequence[int], formats: Mapping[str, Any], out) -> None:
    """One of the two ranks: pinned to core `rank`, one thread; rank 0 puts its rows and the
    wake-up cost on `out`."""

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rows = []
    try:
        for cfg, (fmt, layout), batch in itertools.product(pair_models(), formats.items(), batches):
            rows.append(_pair_row(rank, cfg, fmt, layout, batch))
        wake_s = _wake_seconds()
    finally:
        dist.destroy_process_group()
    if rank == 0:
        out.put((rows, wake_s))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure_pairs(
    *, batches: Sequence[int], formats: Mapping[str, Any], cores: int
) -> tuple[list[dict[str, Any]], float]:
    """The rows of the pair fit and a blocking collective's wake-up cost after compute (seconds,
    _wake_seconds); ([], 0) where the machine has fewer than 2 cores to give the ranks one each
    (the group-of-one norm fit then stands alone)."""
    if cores < 2 or len(os.sched_getaffinity(0)) < 2:
        return [], 0.0
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    ranks = [
        ctx.Process(target=_rank, args=(r, port, tuple(batches), dict(formats), out))
        for r in range(2)
    ]
    for p in ranks:
        p.start()
    try:
        rows, wake_s = out.get(timeout=PAIR_TIMEOUT_S)
    finally:
        for p in ranks:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
    if any(p.exitcode != 0 for p in ranks):
        raise RuntimeError(f"norm pair calibration: rank exit codes {[p.exitcode for p in ranks]}")
    return rows, wake_s


def fit_pairs(
    rows: Sequence[Mapping[str, Any]], arithmetic: Mapping[str, RateFit]
) -> dict[str, RateFit]:
    """Per memory format: the synced norms' cost in a two-rank step beyond plain norms, as
    their arithmetic (`arithmetic`: the group-of-one fits' synced less plain, per call and
    element, calibration.measure_norms) plus one cost per norm in the step (its collectives'
    waits), the median over the rows of what is left per norm. (A free per-element term
    scattered from 1 to 7 ns between calibrations: each row is a difference of two noisy medians,
    and the pair models' elements span only 30x.)"""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["format"], []).append(row)
    fits = {}
    for fmt, group in groups.items():
        plain, synced = (arithmetic[norm_key(kind, fmt, 1)].seconds_per_unit for kind in NORM_KINDS)
        per_call = synced["call"] - plain["call"]
        per_element = max(0.0, synced["elements"] - plain["elements"])
        in_step = statistics.median(
            (r["seconds"] - r["calls"] * per_call - r["elements"] * per_element) / r["calls"]
            for r in group
        )
        rates = {"call": max(0.0, per_call + in_step), "elements": per_element}
        errors = [
            abs(rates["call"] * r["calls"] + rates["elements"] * r["elements"] - r["seconds"])
            / r["seconds"]
            for r in group
        ]
        fits[pair_key(fmt)] = RateFit(
            seconds_per_unit=rates,
            samples=len(group),
            median_rel_error=statistics.median(errors),
            worst_rel_error=max(errors),
        )
        if fits[pair_key(fmt)].median_rel_error > PAIR_MAX_MEDIAN_REL_ERROR:
            raise ValueError(
                f"norm pair calibration {pair_key(fmt)}: arithmetic + a cost per norm misses "
                f"the {len(group)} timings by {100 * statistics.median(errors):.0f} % median "
                f"(at most {100 * PAIR_MAX_MEDIAN_REL_ERROR:.0f} %): the machine was busy"
            )
    return fits


def pair_extra_s(fit: RateFit, elements: int) -> float:
    """One norm's cost in a two-rank step beyond the plain norm's, over `elements` values."""
    return max(0.0, fit.seconds(call_work(elements)))
