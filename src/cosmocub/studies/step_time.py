"""The step-time study: short training runs over meshes and optimizers whose measured step parts
(compute, exchange, momentum sync, bytes) the performance model is validated against.

A study on the engine in its smallest form: points from the config block, one training row each.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config, optimizer_variant
from cosmocub.contention.marks import CONDITION_COLUMNS
from cosmocub.io import atomic_path
from cosmocub.studies.engine import Point, PointOutputs, StudyDefinition, training_row
from cosmocub.studies.training_columns import COMM_BYTES_COLUMNS, STEP_TIME_COLUMNS

COLUMNS = (
    "optimizer",
    "world_size",
    "data",
    "spatial",
    "nodes",
    "ranks_per_node",
    "cores_per_rank",
    "steps",
    *STEP_TIME_COLUMNS,
    *COMM_BYTES_COLUMNS,
    "final_val_loss",
    *CONDITION_COLUMNS,
)
PARTS = ("compute_s", "exchange_s", "momentum_sync_s")


def points(cfg: Config) -> list[Point]:
    study = cfg.step_time_study
    out = []
    for p in study.points:
        overrides: dict[str, Any] = {
            "parallel": {"spatial": p.spatial, "split": None},
            "train": {"ranks_per_node": p.ranks_per_node, "epochs": study.epochs},
        }
        if p.optimizer:
            # A whole optimizer section: the base's options for another optimizer do not apply.
            overrides["optimizer"] = optimizer_variant(cfg.values["optimizer"], p.optimizer)
        labels = {"optimizer": (p.optimizer or cfg.values["optimizer"])["name"]}
        out.append(Point(name=p.name, overrides=overrides, labels=labels))
    return out


def rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    return [training_row(outputs)]


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    (row,) = rows
    return {k: row[k] for k in ("step_s", *PARTS, "comm_bytes_per_step")}


def plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Stacked bars: each point's step split into compute, exchange and momentum sync."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(max(5.0, 1.1 * len(rows) + 2), 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    names = [f"{r['point']}\n{r['optimizer']} {r['data']}x{r['spatial']}" for r in rows]
    bottom = [0.0] * len(rows)
    for part in PARTS:
        values = [1e3 * r[part] for r in rows]
        ax.bar(names, values, bottom=bottom, label=part.removesuffix("_s").replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_ylabel("ms per step (mean after the first epoch)")
    ax.set_title("step time by part (mesh: data x spatial)")
    ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


STUDY = StudyDefinition(
    name="step_time",
    config_key="step_time_study",
    columns=COLUMNS,
    points=points,
    rows=rows,
    plot=plot,
    point_metrics=point_metrics,
    description=(
        "Per-step means (after the first epoch) of the training step's parts on each mesh and "
        "optimizer: the measured points `cosmocub perf-model validate` compares against. "
        "compute_s holds forward, backward (with the part of DDP's all-reduce that ran under "
        "it) and the optimizer's arithmetic; exchange_s what the step waited for its exchange "
        "(DDP overlapped: the all-reduce left after backward, = exchange_exposed_s; the "
        "distributed Lions' voted exchange); exchange_busy_s how long the exchange ran."
    ),
)
