"""A calibration of this machine at known rates, for the tests that predict from one."""

from __future__ import annotations

import itertools
from pathlib import Path

from cosmocub.config import load_config
from cosmocub.perfmodel.measure import calibration as grid
from cosmocub.perfmodel.measure import cpu_model
from cosmocub.perfmodel.measure import host_work as host
from cosmocub.perfmodel.measure.rates import RateFit

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config/test.yaml"
# A conv's true rates: 0.3 ms a call, 40 GFLOP/s peak, 0.2 and 1 GB/s on its two byte terms.
TRUE = {
    "call": 3e-4,
    "voxels": 3e-8,
    "flops": 1 / 40e9,
    "out_bytes": 1 / 0.2e9,
    "unfold_bytes": 1 / 1e9,
}
# The first block's (no input gradient): this share of every rate.
FIRST_SHARE = 0.6
# A batch norm's, plain and synced (one thread): a call and a time per element.
NORM_CALL_S = {"plain": 2e-5, "synced": 2e-4}
NORM_ELEMENT_S = {"plain": 1e-9, "synced": 4e-9}
# The compressed exchange's host work per bucket (one thread): a call and a time per element.
VOTE_CALL_S, VOTE_ELEMENT_S = 2.5e-4, 1e-8


def synthetic_calibration(threads: tuple[int, ...] = (1, 2)) -> cpu_model.Calibration:
    """Every kind's fit at the TRUE conv rates (the head: a call and FLOPs), twice as fast at
    batch 2+ than at batch 1, as a calibration of this machine."""
    layers = {}
    for t in threads:
        for batch in (1, 4):
            speed = t * (2 if batch > 1 else 1)
            conv = {k: v / speed for k, v in TRUE.items()}
            head = {"call": 1e-4 / speed, "flops": 1 / (20e9 * speed), "bytes": 0.0}
            for bn, first in itertools.product((False, True), repeat=2):
                for fmt in grid.FORMATS:
                    kind = grid.conv_kind(batch_norm=bn, memory_format=fmt, first=first)
                    rates = {k: v * FIRST_SHARE for k, v in conv.items()} if first else conv
                    layers[grid.fit_key(kind, t, batch)] = RateFit(
                        seconds_per_unit=rates, samples=18, median_rel_error=0, worst_rel_error=0
                    )
            layers[grid.fit_key("head", t, batch)] = RateFit(
                seconds_per_unit=head, samples=12, median_rel_error=0, worst_rel_error=0
            )
    updates = {
        f"{name}@{t}": RateFit(
            seconds_per_unit={"tensors": 2e-5 / t, "elements": (i + 1) * 1e-9 / t},
            samples=4,
            median_rel_error=0,
            worst_rel_error=0,
        )
        for i, name in enumerate(host.UPDATE_OPTIMIZERS)
        for t in threads
    }
    glue = {f"{fmt}@{t}": 1e-3 / t for fmt in grid.FORMATS for t in threads}
    norms = {
        host.norm_key(kind, fmt, t): RateFit(
            seconds_per_unit={"call": NORM_CALL_S[kind] / t, "elements": NORM_ELEMENT_S[kind] / t},
            samples=6,
            median_rel_error=0,
            worst_rel_error=0,
        )
        for kind in host.NORM_KINDS
        for fmt in grid.FORMATS
        for t in threads
    }
    votes = {
        host.vote_key(kind, collective, t): RateFit(
            seconds_per_unit={"call": VOTE_CALL_S / t, "elements": VOTE_ELEMENT_S / t},
            samples=4,
            median_rel_error=0,
            worst_rel_error=0,
        )
        for kind in host.VOTE_QUANTIZERS
        for collective in ("allgather", "alltoall", "allreduce")
        for t in threads
    }
    settings = load_config(TEST_CONFIG).perf_model.calibration
    return cpu_model.Calibration(
        machine=cpu_model.machine_key(threads),
        grid=cpu_model.grid_settings(settings),
        layers=layers,
        glue_s=glue,
        updates=updates,
        norms=norms,
        votes=votes,
    )
