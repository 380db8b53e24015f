"""Measured against predicted: every row of a study's points.tsv (per-step means of the step's
parts, as cosmocub.studies.engine.training_row gives them) beside the model's prediction for the
same point (its config.yaml beside the table), with the relative errors and a plot.

How the measured columns map onto the model's parts: measured compute_s is the step less the
timed exchange and momentum sync, so it holds compute, halo swaps, the synced batch norms'
collectives and the optimizer's arithmetic.
The measured exchange is what the step waited for (exchange_exposed_s, or exchange_s in tables
from before that column): for DDP under train.ddp_exchange_timing overlapped the part of the
all-reduce left after backward, which the model predicts as such (its exchange_s; busy, the
whole all-reduce, beside it), under blocking every bucket. A table from before DDP was timed
overlapped (exchange_s = 0 for a DDP optimizer) has the exchange inside compute_s, and is
compared so.

The fit is the compute calibration and the links' α–β; every measured point is held out, except
those named in the fit set, on which the one optional correction (the cores' speed during the
measurements) is fitted. Contended and oversubscribed points are skipped and counted.
"""

from __future__ import annotations

import csv
import dataclasses
import logging
import math
import os
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import OptimizerKind, load_config
from cosmocub.contention.marks import is_marked
from cosmocub.io import atomic_path, read_tsv
from cosmocub.perfmodel.cost_model.machines import ThisCpu, fitted_network
from cosmocub.perfmodel.cost_model.step_model import StepPrediction, predict_step
from cosmocub.perfmodel.cost_model.topology import Mesh, Network
from cosmocub.perfmodel.measure.cpu_model import Calibration
from cosmocub.perfmodel.measure.link_fits import LinkFits

log = logging.getLogger(__name__)
MEASURED = ("step_s", "compute_s", "exchange_s", "momentum_sync_s")
REQUIRED = ("point", "data", "step_s", "compute_s", "exchange_s", "momentum_sync_s")
PARTS = ("step", "compute", "exchange", "momentum_sync")
FIT, HELD_OUT = "fit", "held-out"
# A part's errors are summarised over the points where it is at least this share of the step.
PART_SHARE = 0.1


def read_points(path: Path) -> list[dict[str, str]]:
    rows = read_tsv(path, not_found="measured points not found")
    if not rows:
        raise ValueError(f"{path}: no measured points")
    if missing := [c for c in REQUIRED if c not in rows[0]]:
        raise ValueError(f"{path}: columns {missing} missing (need {', '.join(REQUIRED)})")
    return rows


def network_for(row: Mapping[str, str], fits: LinkFits) -> Network:
    """The network a measured point ran on (`machines.fitted_network`): loopback within a node,
    between nodes the emulated link at the row's rate_mbit (0: unshaped)."""
    world = int(row.get("world_size") or row["data"])
    nodes = int(row.get("nodes") or 1)
    rate = None
    if nodes > 1:
        mbit = row.get("rate_mbit")
        if mbit in (None, ""):
            raise ValueError(
                f"point {row['point']!r}: {nodes} nodes but no rate_mbit, so the link its "
                "collectives crossed is unknown"
            )
        rate = float(mbit)
    return fitted_network(fits, rate_mbit=rate, ranks_per_node=max(1, world // nodes))


Predictor = Callable[[Mapping[str, str]], tuple[StepPrediction, str]]


def cpu_predictor(
    study_dir: Path, fits: LinkFits, *, cores: int, calibration: Calibration
) -> Predictor:
    """Predict a row on this CPU: layer and update times from the calibration at the point's
    local batch, split and cores per rank, scaled by ranks × threads / cores where the ranks
    oversubscribe the machine."""
    # One device per thread count (machines.ThisCpu, as perf-model predict builds it); the
    # oversubscription slowdown is the row's own.
    devices: dict[int, ThisCpu] = {}

    def predict_row(row: Mapping[str, str]) -> tuple[StepPrediction, str]:
        cfg = load_config(study_dir / row["point"] / "config.yaml")
        # Ranks sharing cores (cores_per_rank < 1) run one thread each; the slowdown below
        # accounts for the sharing.
        threads = max(1, round(float(row.get("cores_per_rank") or 1)))
        device = devices.setdefault(
            threads, ThisCpu(threads=threads, slowdown=1.0, calibration=calibration)
        )
        world = int(row.get("world_size") or row["data"])
        layers = device.layer_seconds(
            cfg.model,
            batch=cfg.train.local_batch_size,
            split=cfg.parallel.split_dhw,
            synced_norm=world > 1,
        )
        optimizer_s = device.optimizer_seconds(cfg.model, cfg.optimizer)
        slowdown = max(1.0, world * threads / cores)
        prediction = predict_step(
            model_cfg=cfg.model,
            optimizer_cfg=cfg.optimizer,
            local_batch=cfg.train.local_batch_size,
            mesh=Mesh(data=int(row["data"]), split=cfg.parallel.split_dhw),
            network=network_for(row, fits),
            layer_seconds={k: v * slowdown for k, v in layers.items()},
            optimizer_s=optimizer_s * slowdown,
            steps=max(1, int(float(row.get("steps") or 1000))),
            ddp_overlap=cfg.train.ddp_exchange_timing == "overlapped",
            vote_host=lambda q, c, n: slowdown * device.vote_host(q, c, n),
            norm_sync_local_in_layers=device.norm_collectives_in_layers(cfg.parallel.split_dhw),
            collective_wake_s=device.collective_wake_s,
        )
        return prediction, cfg.optimizer.name

    return predict_row


def skip_reason(row: Mapping[str, object]) -> str | None:
    """Why a measured point cannot test the model: its ranks waited for cores other processes
    held (contended), or shared cores among themselves (oversubscribed); None if it can."""
    if is_marked(row):
        return "contended"
    # The scaling table says why ("4 ranks of 1 thread(s) on 2 core(s)"), others True; blank
    # or False where each rank had cores of its own.
    if row.get("oversubscribed") not in (None, "", False, "False"):
        return "oversubscribed"
    return None


def in_fit_set(study: str, point: str, fit_set: Collection[str]) -> bool:
    """Whether a point is named in the fit set, by its name or as study/point."""
    return point in fit_set or f"{study}/{point}" in fit_set


def compare(
    rows: Sequence[Mapping[str, str]],
    predictor: Predictor,
    *,
    study: str = "",
    fit_set: Collection[str] = (),
) -> list[dict[str, Any]]:
    """One row per point: its set (fit or held-out), measured and predicted step and parts, and
    their relative errors."""
    out = []
    for row in rows:
        p, optimizer = predictor(row)
        measured = {part: float(row[f"{part}_s"]) for part in PARTS}
        measured["exchange"] = float(row.get("exchange_exposed_s") or row["exchange_s"])
        # Tables with a halo_s column time the halo swaps apart from compute_s: the model's
        # compute holds them.
        measured["compute"] += float(row.get("halo_s") or 0)
        kind = OptimizerKind.parse(optimizer)  # a row names it by its string
        ddp_hidden = kind.averages_gradients and measured["exchange"] == 0.0
        predicted = {
            "step": p.step_s,
            "compute": p.compute_s
            + p.halo_s
            + p.norm_sync_s
            + p.optimizer_s
            + (p.exchange_s if ddp_hidden else 0),
            "exchange": 0.0 if ddp_hidden else p.exchange_s,
            "momentum_sync": p.momentum_sync_s,
        }
        result: dict[str, Any] = {
            "point": row["point"],
            "set": FIT if in_fit_set(study, row["point"], fit_set) else HELD_OUT,
            "optimizer": optimizer,
        }
        for part in PARTS:
            result[f"measured_{part}_s"] = measured[part]
            result[f"predicted_{part}_s"] = predicted[part]
            result[f"rel_error_{part}"] = _rel(predicted[part], measured[part])
        result |= {
            "predicted_halo_s": p.halo_s,
            "predicted_norm_sync_s": p.norm_sync_s,
            "predicted_optimizer_s": p.optimizer_s,
            "predicted_exchange_busy_s": p.exchange_s + p.exchange_hidden_s,
            "measured_exchange_busy_s": float(row.get("exchange_busy_s") or "nan"),
            "predicted_comm_bytes_per_step": p.comm_bytes_per_step,
            "measured_comm_bytes_per_step": float(row.get("comm_bytes_per_step") or "nan"),
        }
        out.append(result)
    return out


def fit_correction(predictor: Predictor, rows: Sequence[Mapping[str, str]]) -> float:
    """How fast this machine's cores ran during the measurements against the calibration: the
    median over `rows` (the fit set; one-rank points, whose measured compute is all on-CPU
    work) of measured compute / predicted compute + halo + update."""
    if not rows:
        raise ValueError("perf_model.fit_set: no measured point of the tables is named in it")
    ratios = []
    for row in rows:
        world = int(row.get("world_size") or int(row["data"]) * int(row.get("spatial") or 1))
        if world != 1:
            raise ValueError(
                f"perf_model.fit_set: point {row['point']!r} has {world} ranks; the correction "
                "is fitted on one-rank points (their measured compute holds no network)"
            )
        p, _ = predictor(row)
        ratios.append(float(row["compute_s"]) / (p.compute_s + p.halo_s + p.optimizer_s))
    return statistics.median(ratios)


def scaled_predictor(predictor: Predictor, scale: float) -> Predictor:
    """`predictor` with its on-CPU work (compute, update) scaled by `scale`; the network's parts
    are not the cores'."""

    def scaled(r: Mapping[str, str]) -> tuple[StepPrediction, str]:
        q, name = predictor(r)
        work = {"compute_s": q.compute_s * scale, "optimizer_s": q.optimizer_s * scale}
        return dataclasses.replace(q, **work), name

    return scaled


def usable(rows: Sequence[Mapping[str, str]]) -> list[Mapping[str, str]]:
    """The rows with measurements (a study's skipped points have a blank step_s)."""
    return [r for r in rows if r.get("step_s") not in (None, "")]


def _rel(predicted: float, measured: float) -> float:
    if measured == 0:
        return 0.0 if predicted == 0 else math.nan
    return (predicted - measured) / measured


def error_summary(
    results: Sequence[Mapping[str, Any]], part: str = "step", *, min_share: float = 0.0
) -> dict[str, float]:
    """Median and worst |relative error| of `part` over the points not marked contended (skipped
    before they get here; a marked one would measure the neighbours) and, with `min_share`,
    where `part` measured at least that share of the step."""
    kept = [r for r in results if not is_marked(r)]
    if min_share > 0:
        kept = [r for r in kept if r[f"measured_{part}_s"] >= min_share * r["measured_step_s"]]
    errors = np.abs([r[f"rel_error_{part}"] for r in kept], dtype=float)
    errors = errors[np.isfinite(errors)]
    if not len(errors):
        return {"median": math.nan, "worst": math.nan, "points": 0}
    return {"median": float(np.median(errors)), "worst": float(errors.max()), "points": len(errors)}


def set_summaries(results: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per set (fit, held-out): the step's errors, and each part's over the points where it is
    at least PART_SHARE of the step."""
    out: dict[str, dict[str, Any]] = {}
    for name in (FIT, HELD_OUT):
        members = [r for r in results if r["set"] == name]
        if members:
            out[name] = {
                part: error_summary(members, part, min_share=0.0 if part == "step" else PART_SHARE)
                for part in PARTS
            }
    return out


def write_results(results: Sequence[Mapping[str, Any]], path: Path) -> None:
    columns = list(results[0])
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, delimiter="\t", lineterminator="\n")
        writer.writeheader()
        for r in results:
            writer.writerow({k: f"{v:.6g}" if isinstance(v, float) else v for k, v in r.items()})


def plot_results(results: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Predicted against measured step time (log-log), the ±20 % band shaded; held-out points
    filled circles, fit-set points open squares."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5, 5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    measured = np.array([r["measured_step_s"] for r in results]) * 1e3
    predicted = np.array([r["predicted_step_s"] for r in results]) * 1e3
    lo, hi = min(measured.min(), predicted.min()) / 1.5, max(measured.max(), predicted.max()) * 1.5
    line = np.array([lo, hi])
    ax.plot(line, line, "k-", lw=1)
    ax.fill_between(line, line / 1.2, line * 1.2, color="0.85", label="±20 %")
    for r, x, y in zip(results, measured, predicted, strict=True):
        held_out = r["set"] == HELD_OUT
        ax.plot(
            x,
            y,
            "o" if held_out else "s",
            mfc=None if held_out else "none",
            label=f"{r['point']} ({r['optimizer']}, {r['set']})",
        )
    s = error_summary([r for r in results if r["set"] == HELD_OUT])
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi))
    ax.set_xlabel("measured step (ms)")
    ax.set_ylabel("predicted step (ms)")
    ax.set_title(
        f"held-out step: median |error| {100 * s['median']:.0f} %, worst "
        f"{100 * s['worst']:.0f} % ({s['points']} points)"
    )
    ax.legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
