"""The scaling study: strong (fixed global batch) and weak (fixed batch per data rank) scaling
over data x spatial meshes, each mesh on emulated nodes (cosmocub.netemu) at one link rate.

Points are `<mode>_<data>x<spatial>`. The breakdown per step (means after the first epoch):
compute (forward, backward and the optimizer's arithmetic: the optimizer is not timed apart),
halo (the spatial layers' halo swaps), exchange (what the step waited for the gradient
all-reduce: DDP overlaps it with backward, train.ddp_exchange_timing; how long it ran is
exchange_busy_s), data wait (waiting for the next batch), plus cores per rank and rank 0's peak
resident memory. Every rank of every point runs the same threads on cores of its own (the workflow's
`--cpus-per-rank`, one number per study), so the 1x1 reference runs as each rank of the others;
a mesh whose ranks need more cores than there are shares them, is marked `oversubscribed`, and
gets no efficiency. Efficiency is per core-second: samples per second per core the ranks had,
relative to the same mode's 1x1 point.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config
from cosmocub.contention.marks import CONDITION_COLUMNS, kept
from cosmocub.io import atomic_path
from cosmocub.studies.engine import (
    Point,
    PointOutputs,
    StudyDefinition,
    step_weighted_mean_after_first,
    training_row,
)
from cosmocub.studies.launch_plan import PointLaunch
from cosmocub.studies.training_columns import COMM_BYTES_COLUMNS, STEP_TIME_COLUMNS

COLUMNS = (
    "mode",
    "data",
    "spatial",
    "world_size",
    "nodes",
    "ranks_per_node",
    "rate_mbit",
    "cores_per_rank",
    "oversubscribed",
    "local_batch_size",
    "global_batch_size",
    "steps",
    *STEP_TIME_COLUMNS,
    "halo_s",
    "data_wait_s",
    *COMM_BYTES_COLUMNS,
    "halo_bytes_per_step",
    "peak_rss_mb",
    "samples_per_core_s",
    "efficiency",
    "final_val_loss",
    *CONDITION_COLUMNS,
    "skipped",
)
PARTS = ("compute_s", "halo_s", "exchange_s", "data_wait_s")


def points(cfg: Config) -> list[Point]:
    study = cfg.scaling_study
    out = []
    for mode in study.modes:
        for data, spatial in study.meshes:
            local = study.global_batch_size // data if mode == "strong" else study.local_batch_size
            ranks = data * spatial
            overrides = {
                "parallel": {"spatial": spatial, "split": None},
                "train": {
                    "ranks_per_node": study.ranks_per_node,
                    "epochs": study.epochs,
                    "max_steps_per_epoch": study.max_steps_per_epoch,
                    "local_batch_size": local,
                },
            }
            out.append(
                Point(
                    name=f"{mode}_{data}x{spatial}",
                    overrides=overrides,
                    labels={
                        "mode": mode,
                        "local_batch_size": local,
                        "global_batch_size": local * data,
                        "rate_mbit": study.rate_mbit,
                    },
                    launch=PointLaunch(
                        nodes=ranks // study.ranks_per_node,
                        ranks_per_node=study.ranks_per_node,
                        rate_mbit=study.rate_mbit,
                    ),
                    runner="emulated",
                )
            )
    return out


def oversubscription(row: Mapping[str, Any], outputs: PointOutputs) -> str | None:
    """Why the point's ranks shared cores ("4 ranks of 1 thread(s) on 2 core(s)"), from what its
    runner recorded; None when each had cores of its own."""
    record = outputs.record()
    if "oversubscribed" not in record:
        raise ValueError(
            f"{outputs.folder / 'point.json'}: no 'oversubscribed' (written by an older "
            "cosmocub: run the point again)"
        )
    if not record["oversubscribed"]:
        return None
    cores = row["cores_per_rank"] * row["world_size"]
    threads = record["threads_per_rank"]
    return f"{row['world_size']} ranks of {threads} thread(s) on {cores:g} core(s)"


def rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    row = training_row(outputs)
    row["oversubscribed"] = oversubscription(row, outputs)
    epochs = outputs.metrics()
    # data_wait_share is of the epoch's wall time, samples_per_s its global samples per second:
    # seconds per step waiting = share x (global batch / samples per second).
    global_batch = outputs.point.labels["global_batch_size"]
    for e in epochs:
        e["_data_wait_s"] = (
            e["data_wait_share"] * global_batch / e["samples_per_s"] if e["samples_per_s"] else 0.0
        )
    row["data_wait_s"] = step_weighted_mean_after_first(epochs, "_data_wait_s")
    row["peak_rss_mb"] = max((e.get("peak_rss_mb") or 0.0) for e in epochs) or None
    cores = (row["cores_per_rank"] or 1.0) * row["world_size"]
    row["samples_per_core_s"] = global_batch / ((row["step_s"] + row["data_wait_s"]) * cores)
    return [row]


def comparable(row: Mapping[str, Any]) -> bool:
    """Measured on cores of its own: a skipped or oversubscribed point has no efficiency (its
    ranks shared cores, so its times measure the sharing) and is no 1x1 reference."""
    return not row.get("skipped") and not row.get("oversubscribed")


def finish(all_rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    # Points contended on both runs measured their neighbours: no efficiency, nor a reference.
    base = {
        r["mode"]: r["samples_per_core_s"]
        for r in kept(all_rows)
        if comparable(r) and r["data"] == 1 and r["spatial"] == 1
    }
    for r in kept(all_rows):
        if comparable(r) and r["mode"] in base:
            r["efficiency"] = r["samples_per_core_s"] / base[r["mode"]]
    return all_rows


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    (row,) = rows
    keys = ("step_s", *PARTS, "samples_per_core_s", "peak_rss_mb")
    return {k: row[k] for k in keys if row.get(k) is not None}


def plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Step time and efficiency against ranks per mode; the step's breakdown as stacked bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    measured = [r for r in rows if not r.get("skipped") and r.get("step_s") is not None]
    fig = Figure(figsize=(14, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax, ex, bx = fig.subplots(1, 3)
    for mode in dict.fromkeys(r["mode"] for r in measured):
        for spatial in sorted({r["spatial"] for r in measured if r["mode"] == mode}):
            pts = sorted(
                (r["world_size"], r["step_s"], r.get("efficiency"))
                for r in measured
                if r["mode"] == mode and r["spatial"] == spatial
            )
            label = f"{mode}, spatial {spatial}"
            ax.plot([p[0] for p in pts], [1e3 * p[1] for p in pts], "o-", label=label)
            ex.plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=label)
    ax.set_xlabel("ranks")
    ax.set_ylabel("ms per step")
    ax.legend(fontsize=8)
    ex.axhline(1.0, color="grey", lw=0.8)
    ex.set_xlabel("ranks")
    ex.set_ylabel("efficiency per core-second (vs 1x1)")
    ex.legend(fontsize=8)
    names = [r["point"] for r in measured]
    bottom = [0.0] * len(measured)
    for part in PARTS:
        values = [1e3 * (r[part] or 0.0) for r in measured]
        bx.bar(names, values, bottom=bottom, label=part.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    bx.tick_params(axis="x", labelrotation=30, labelsize=8)
    bx.set_ylabel("ms per step")
    bx.legend(fontsize=8)
    bx.set_title("breakdown (optimizer inside compute)", fontsize=9)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


STUDY = StudyDefinition(
    name="scaling",
    config_key="scaling_study",
    columns=COLUMNS,
    points=points,
    rows=rows,
    plot=plot,
    point_metrics=point_metrics,
    finish=finish,
    description=(
        "Strong (fixed global batch) and weak (fixed batch per data rank) scaling over data x "
        "spatial meshes on emulated nodes at one link rate. Per-step means after the first "
        "epoch: compute_s holds forward, backward and the optimizer (not timed apart); halo_s "
        "the halo swaps; exchange_s what the step waited for the gradient all-reduce after "
        "backward (DDP overlapped: exchange_exposed_s, the same), exchange_busy_s how long it ran "
        "(while some bucket's all-reduce was in flight); data_wait_s "
        "waiting for batches (not in step_s, the sum of the others). peak_rss_mb is rank 0's "
        "peak resident memory. "
        "Every rank of every point runs the same threads (cores per rank) on cores of its own, "
        "the 1x1 reference included; efficiency is samples per core-second relative to the same "
        "mode's 1x1 point. A point whose oversubscribed cell is set (why: its ranks, threads "
        "and the cores there were) needed more cores than there were, so its ranks shared them "
        "(cores_per_rank is what each had): it is measured, but its efficiency is left empty, "
        "since its times measure the sharing."
    ),
)
