"""This CPU's calibrated compute: the grids' rate fits (perfmodel.measure.calibration and
host_work) turned into any model's per-layer and update seconds (its cache per machine:
calibration_cache).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
import os
import platform
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmocub.config import CalibrationConfig, ModelConfig, OptimizerConfig
from cosmocub.contention.probes import read_core_ticks, steal_between
from cosmocub.host_memory import keep_freed_memory
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.perfmodel.measure import calibration as grid
from cosmocub.perfmodel.measure import host_work as host
from cosmocub.perfmodel.measure.compute import fastest_time, torch_threads
from cosmocub.perfmodel.measure.norm_pairs import fit_pairs, measure_pairs, pair_extra_s, pair_key
from cosmocub.perfmodel.measure.rates import RateFit

log = logging.getLogger(__name__)
# 3: batch norms, plain and synced; 4: the vote's host work; 5: the first block apart, and
# the synced norms in a two-rank step; 6: timed with malloc keeping what is freed, as training
# runs (cosmocub.host_memory)
FORMAT_VERSION = 6
# The models whose whole step, less their layers' fitted sum, is the step's glue (loss,
# zero_grad, autograd between layers): test.yaml's and one twice its side.
GLUE_MODELS = ({"input_size": 8, "base_filters": 4}, {"input_size": 16, "base_filters": 8})


def machine_key(threads: Sequence[int]) -> dict[str, Any]:
    """What a calibration holds only for: host, CPU model, torch, cores granted, threads."""
    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "hostname": platform.node(),
        "cpu_model": model,
        "torch": torch.__version__,
        "cores": len(os.sched_getaffinity(0)),
        "threads": list(threads),
    }


def grid_settings(settings: CalibrationConfig) -> dict[str, Any]:
    """The grid a calibration was measured on (its path is where it lies, not what it is)."""
    return {
        "repeats": settings.repeats,
        "batches": list(settings.batches),
        "sizes": list(settings.sizes),
        "channels": [list(c) for c in settings.channels],
        "head_grid": [[f, list(d)] for f, d in grid.HEAD_GRID],
        "update_grid": [list(u) for u in host.UPDATE_GRID],
        "norm_grid": [list(n) for n in host.NORM_GRID],
        "vote_sizes": list(host.VOTE_SIZES),
    }


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """The rate fits of one machine: per layer kind, threads and batch class; the step's glue
    per memory format and threads; the update per optimizer and threads; the batch norm, plain
    and synced, per memory format and threads; the compressed exchange's host work per quantizer
    kind, collective and threads; with the timings, how long they took and the load they were
    taken at."""

    machine: Mapping[str, Any]
    grid: Mapping[str, Any]
    layers: Mapping[str, RateFit]
    glue_s: Mapping[str, float]
    updates: Mapping[str, RateFit]
    norms: Mapping[str, RateFit] = field(default_factory=dict)
    # The synced norms in a two-rank step beyond plain ones, their loopback collectives in
    # (perfmodel.measure.norm_pairs); empty on one core.
    norm_pairs: Mapping[str, RateFit] = field(default_factory=dict)
    # What a blocking collective costs after compute beyond back to back (norm_pairs), per call
    # of the exchange's collectives; 0 on one core.
    wake_s: float = 0.0
    votes: Mapping[str, RateFit] = field(default_factory=dict)
    timings: Sequence[Mapping[str, Any]] = field(default=(), repr=False)
    wall_s: float = 0.0
    load_1m: tuple[float, float] = (math.nan, math.nan)
    # The share of the cores' busy time the hypervisor gave other guests while timing (NaN
    # where /proc/stat has no steal): the load average cannot see them (contention/conditions.py).
    steal_share: float = math.nan

    @property
    def threads(self) -> tuple[int, ...]:
        return tuple(self.machine["threads"])

    def _check_threads(self, threads: int) -> None:
        if threads not in self.threads:
            raise ValueError(
                f"compute calibration: {threads} threads per rank not calibrated (have "
                f"{list(self.threads)}; perf_model.calibration.threads)"
            )

    def layer_seconds(
        self,
        model_cfg: ModelConfig,
        *,
        batch: int,
        split: tuple[int, int, int],
        threads: int,
        memory_format: str,
        synced_norm: bool = False,
    ) -> dict[str, float]:
        """Forward + backward seconds of each conv block on one rank's block, of the head (on
        the gathered features) and the step's glue ("overhead"), from the fits; `synced_norm`:
        each block's batch norm is the synced one (a mesh of more than one rank), which costs
        its own fit's time less the plain norm's on the block's activations (its collectives
        are the network's: perfmodel.cost_model.layer_collectives)."""
        self._check_threads(threads)
        if model_cfg.name != "cosmoflow":
            raise ValueError(
                f"key 'model.name': {model_cfg.name!r}; the compute calibration costs CosmoFlow's "
                "conv blocks and dense head only"
            )
        if model_cfg.kernel_size != grid.KERNEL:
            raise ValueError(
                f"key 'model.kernel_size': {model_cfg.kernel_size}; the compute calibration "
                f"timed {grid.KERNEL}^3 convolutions only"
            )
        first, inner = (
            self.layers[grid.fit_key(kind, threads, batch)]
            for kind in (
                grid.conv_kind(
                    batch_norm=model_cfg.batch_norm, memory_format=memory_format, first=is_first
                )
                for is_first in (True, False)
            )
        )
        shape = [model_cfg.input_size // s for s in split]
        channels, out = model_cfg.in_channels, {}
        for i in range(model_cfg.num_conv_blocks):
            conv = first if i == 0 else inner  # the first block's input is the data
            filters = model_cfg.base_filters * 2**i
            work = grid.conv_work(
                batch=batch, cin=channels, cout=filters, shape=shape, kernel=model_cfg.kernel_size
            )
            out[f"block{i}"] = conv.seconds(work)
            if synced_norm and model_cfg.batch_norm:
                elements = batch * filters * math.prod(shape)
                out[f"block{i}"] += self.synced_norm_extra_s(elements, memory_format, threads)
            channels, shape = filters, [n // 2 for n in shape]
        side = model_cfg.input_size // 2**model_cfg.num_conv_blocks
        widths = grid.head_widths(model_cfg, channels * side**3)
        head = self.layers[grid.fit_key("head", threads, batch)]
        out["head"] = head.seconds(grid.head_work(batch=batch, widths=widths))
        out["overhead"] = self.glue_s[f"{memory_format}@{threads}"]
        return out

    def norms_hold_local_collectives(self, memory_format: str, threads: int) -> bool:
        """Whether synced_norm_extra_s holds the norms' collectives on loopback (the two-rank
        fit, perfmodel.measure.norm_pairs), so that a link is charged only its cost beyond
        loopback."""
        return threads == 1 and pair_key(memory_format) in self.norm_pairs

    def synced_norm_extra_s(self, elements: int, memory_format: str, threads: int) -> float:
        """What the synced batch norm costs on this CPU beyond the plain one (never below 0): in
        a two-rank step where that was timed (one thread per rank), else alone in a group of
        one (its arithmetic only)."""
        if self.norms_hold_local_collectives(memory_format, threads):
            return pair_extra_s(self.norm_pairs[pair_key(memory_format)], elements)
        keys = [host.norm_key(k, memory_format, threads) for k in host.NORM_KINDS]
        if missing := [k for k in keys if k not in self.norms]:
            raise ValueError(
                f"compute calibration: no batch-norm fit {missing} (a calibration from before "
                "norms were timed); rerun `cosmocub perf-model calibrate`"
            )
        work = host.call_work(elements)
        plain, synced = (self.norms[k].seconds(work) for k in keys)
        return max(0.0, synced - plain)

    def vote_seconds(self, quantizer: str, collective: str, elements: int, threads: int) -> float:
        """The host work of one bucket's compressed exchange (encode, vote, unpack) of
        `elements` values, beside its collectives."""
        key = host.vote_key(host.vote_kind(quantizer), collective, threads)
        if key not in self.votes:
            raise ValueError(
                f"compute calibration: no vote fit {key!r} (a calibration from before the vote "
                "was timed); rerun `cosmocub perf-model calibrate`"
            )
        return self.votes[key].seconds(host.call_work(elements))

    def optimizer_seconds(
        self, sizes: Sequence[int], optimizer_cfg: OptimizerConfig, *, threads: int
    ) -> float:
        """The update of parameters of `sizes` elements (one rank, no wire)."""
        self._check_threads(threads)
        fit = self.updates[f"{host.update_key(optimizer_cfg)}@{threads}"]
        return fit.seconds(host.update_work(len(sizes), sum(sizes)))

    def as_dict(self) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "machine": dict(self.machine),
            "grid": dict(self.grid),
            "wall_s": self.wall_s,
            "load_1m": list(self.load_1m),
            "steal_share": self.steal_share,
            "layers": {k: f.as_dict() for k, f in self.layers.items()},
            "glue_s": dict(self.glue_s),
            "updates": {k: u.as_dict() for k, u in self.updates.items()},
            "norms": {k: n.as_dict() for k, n in self.norms.items()},
            "norm_pairs": {k: n.as_dict() for k, n in self.norm_pairs.items()},
            "wake_s": self.wake_s,
            "votes": {k: v.as_dict() for k, v in self.votes.items()},
            "timings": list(self.timings),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        return cls(
            machine=d["machine"],
            grid=d["grid"],
            layers={k: RateFit.from_dict(v) for k, v in d["layers"].items()},
            glue_s=d["glue_s"],
            updates={k: RateFit.from_dict(v) for k, v in d["updates"].items()},
            norms={k: RateFit.from_dict(v) for k, v in d.get("norms", {}).items()},
            norm_pairs={k: RateFit.from_dict(v) for k, v in d.get("norm_pairs", {}).items()},
            wake_s=d.get("wake_s", 0.0),
            votes={k: RateFit.from_dict(v) for k, v in d.get("votes", {}).items()},
            timings=d.get("timings", ()),
            wall_s=d.get("wall_s", 0.0),
            load_1m=tuple(d.get("load_1m", (math.nan, math.nan))),  # type: ignore[arg-type]
            steal_share=d.get("steal_share", math.nan),
        )


def calibrate(settings: CalibrationConfig, *, cores: int) -> Calibration:
    """Time the grid at every thread count, fit it, and time the step's glue."""
    keep_freed_memory()  # what training runs with (cosmocub.host_memory)
    threads = grid.grid_threads(settings, cores)
    start, load_start, ticks_start = time.perf_counter(), os.getloadavg()[0], read_core_ticks()
    layers, timings = grid.fit_fastest(
        lambda: grid.measure_grid(settings, threads=threads), grid.fit_grid
    )
    repeats = settings.repeats
    updates, _ = grid.fit_fastest(
        lambda: host.measure_updates(threads=threads, repeats=repeats), host.fit_updates
    )
    norms, _ = grid.fit_fastest(
        lambda: host.measure_norms(threads=threads, repeats=repeats), host.fit_norms
    )
    votes, _ = grid.fit_fastest(
        lambda: host.measure_votes(threads=threads, repeats=repeats), host.fit_votes
    )
    pair_rows, wake_s = measure_pairs(batches=settings.batches, formats=grid.FORMATS, cores=cores)
    partial = Calibration(
        machine=machine_key(threads),
        grid=grid_settings(settings),
        layers=layers,
        glue_s={},
        updates=updates,
        norms=norms,
        norm_pairs=fit_pairs(pair_rows, norms),
        wake_s=wake_s,
        votes=votes,
    )
    glue = _measure_glue(partial, settings)
    return dataclasses.replace(
        partial,
        glue_s=glue,
        timings=timings,
        wall_s=time.perf_counter() - start,
        load_1m=(load_start, os.getloadavg()[0]),
        steal_share=steal_between(ticks_start, read_core_ticks()),
    )


def _measure_glue(partial: Calibration, settings: CalibrationConfig) -> dict[str, float]:
    """Per memory format and threads: the whole model's training step (zero_grad, forward, loss,
    backward) less its layers' fitted seconds, the median over GLUE_MODELS × batches. Negative
    where each layer timed alone (its own zero_grad, sum and backward call) costs more glue than
    the step has: the layers' sum is then too high by that much."""

    out = {}
    for t in partial.threads:
        with torch_threads(t):
            for fmt, layout in grid.FORMATS.items():
                residues = [
                    _glue_residue(partial, settings, shape, batch, t, fmt, layout)
                    for shape, batch in itertools.product(GLUE_MODELS, settings.batches)
                ]
                out[f"{fmt}@{t}"] = statistics.median(residues)
    return out


def _glue_residue(
    partial: Calibration,
    settings: CalibrationConfig,
    shape: Mapping[str, Any],
    batch: int,
    threads: int,
    fmt: str,
    layout: torch.memory_format,
) -> float:
    """One model's whole training step less its layers' fitted seconds."""
    cfg = dataclasses.replace(grid.base_model(), **shape, num_conv_blocks=2, dense_sizes=(16,))
    model = CosmoFlow(cfg).train().to(memory_format=layout)
    x = torch.randn(batch, cfg.in_channels, *(cfg.input_size,) * 3).to(memory_format=layout)
    y = torch.zeros(batch, cfg.num_outputs)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()

    whole = fastest_time(step, settings.repeats)
    return whole - sum(_layers_only(partial, cfg, batch, threads, fmt).values())


def _layers_only(
    partial: Calibration, cfg: ModelConfig, batch: int, threads: int, fmt: str
) -> dict[str, float]:
    with_glue = dataclasses.replace(partial, glue_s={f"{fmt}@{threads}": 0.0})
    return with_glue.layer_seconds(
        cfg, batch=batch, split=(1, 1, 1), threads=threads, memory_format=fmt
    )


def describe(cal: Calibration) -> str:
    """What was timed, how long it took, at what load, and each fit's rate and error."""
    m = cal.machine
    lines = [
        f"compute calibration on {m['hostname']} ({m['cpu_model']}, {m['cores']} cores, torch "
        f"{m['torch']}): {len(cal.timings)} layer timings at threads {m['threads']} in "
        f"{cal.wall_s:.1f} s, load {cal.load_1m[0]:.2f} -> {cal.load_1m[1]:.2f}, "
        f"{100 * cal.steal_share:.0f} % of the busy time stolen by the hypervisor"
    ]
    for key, fit in cal.layers.items():
        peak = (
            "FLOPs never the bottleneck on the grid"
            if math.isinf(fit.peak_flops)
            else f"peak {fit.peak_flops / 1e9:.3g} GFLOP/s"
        )
        lines.append(
            f"  {key}: {peak}, fit error median "
            f"{100 * fit.median_rel_error:.0f} %, worst {100 * fit.worst_rel_error:.0f} % over "
            f"{fit.samples}"
        )
    for key, u in cal.updates.items():
        per = u.seconds_per_unit
        lines.append(
            f"  update {key}: {1e9 * per['elements']:.3g} ns per element + "
            f"{1e6 * per['tensors']:.3g} us per tensor"
        )
    for fits, call in ((cal.norms, "call"), (cal.norm_pairs, "norm"), (cal.votes, "bucket")):
        for key, fit in fits.items():
            per = fit.seconds_per_unit
            lines.append(
                f"  {key}: {1e9 * per['elements']:.3g} ns per element + "
                f"{1e6 * per['call']:.3g} us per {call}"
            )
    lines.append(
        f"  step glue: {', '.join(f'{k} {1e3 * v:.3g} ms' for k, v in cal.glue_s.items())}; "
        f"a blocking collective after compute: {1e3 * cal.wake_s:.3g} ms more"
    )
    return "\n".join(lines)
