"""The sample-size study: the same recipe trained on crops of increasing size cut from the same
universes, at equal budgets (the same optimizer steps at every size, each size's learning rate
chosen on validation from a grid), and its per-universe error against sample size beside the
predict-the-mean and P(k) fits of the same crops.

The seed (*The Case for Strong Scaling in Deep Learning*) found larger samples far more accurate;
this module derives one point per (size, learning rate), reads each point's evaluation
(eval/metrics.json: `comparison`, and `calibration` for the gaussian head) and, in the gather,
keeps per size the learning rate with the lowest per-universe validation MAE.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config, ConfigError
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.io import atomic_path
from cosmocub.optim.schedule import stretched
from cosmocub.studies.accuracy import (
    evaluated_point_rows,
    point_metrics,
    select_lr_per_group,
    selected_rows,
)
from cosmocub.studies.engine import Point, PointOutputs, StudyDefinition, point_values

COLUMNS = (
    "sample_size",
    "lr",
    "lr_grid",
    "selected",
    "selected_by",
    "spatial",
    "steps",
    "final_val_loss",
    "val_universe_mae",
    "level",
    "parameter",
    "count",
    "cnn_mae",
    "mean_mae",
    "pk_mae",
    "cnn_over_mean",
    "cnn_over_pk",
    "cnn_over_pk_lo",
    "cnn_over_pk_hi",
    "width68",
)


def point_name(size: int, lr: float) -> str:
    return f"{size}_lr{lr:g}"


def size_point(cfg: Config, size: int, lr: float) -> Point:
    """The run at crop side `size` and learning rate `lr`: the base config with the sample and
    model input set to `size`, split over the spatial ranks the study gives that size (each of
    the base's data ranks becomes that many ranks, so the global batch stays the base's), and the
    study's epochs and steps per epoch (the same budget at every size), with the recipe's
    warm-up and decay epochs scaled to them. Everything else (model, seed, universes) is the base
    recipe."""
    study = cfg.sample_size_study
    if size not in study.sizes:
        raise ConfigError(f"key 'sample_size_study.sizes': {size} is not one of {study.sizes}")
    if cfg.universes.source == "synthetic" and cfg.universes.size % size:
        raise ConfigError(
            f"key 'sample_size_study.sizes': {size} does not divide universes.size "
            f"{cfg.universes.size}"
        )
    spatial = study.spatial[study.sizes.index(size)]
    return Point(
        name=point_name(size, lr),
        labels={"sample_size": size, "lr": lr},
        overrides={
            "preprocess": {"sample_size": size},
            "model": {"input_size": size},
            # The recipe's schedule at the same fractions of the study's run: the default's
            # decays at epochs 24 and 32 (of 36) would otherwise cut the lr 16× after 32 of the
            # study's many short epochs.
            "optimizer": {"lr": lr, **stretched(cfg.optimizer, study.epochs / cfg.train.epochs)},
            "parallel": {"spatial": spatial, "split": None},
            "train": {
                "ranks_per_node": spatial * cfg.data_ranks,
                "epochs": study.epochs,
                "max_steps_per_epoch": study.max_steps_per_epoch,
            },
        },
    )


def size_points(cfg: Config) -> list[Point]:
    study = cfg.sample_size_study
    return [size_point(cfg, size, lr) for size in study.sizes for lr in study.lr_grid(size)]


def size_config_values(cfg: Config, size: int, lr: float) -> dict[str, Any]:
    """The resolved config of the run at (`size`, `lr`) (run name `sample_size_<size>_lr<lr>`)."""
    return point_values(cfg, "sample_size", size_point(cfg, size, lr))


def select_lr(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Per size, mark the learning rate with the lowest per-universe validation MAE and record
    the size's grid (accuracy.select_lr_per_group); refuse unequal budgets."""
    study = cfg.sample_size_study
    return select_lr_per_group(
        rows,
        group="sample_size",
        grid=study.lr_grid,
        budget_key=f"sample_size_study.max_steps_per_epoch = {study.max_steps_per_epoch}",
    )


def plot_study(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Per universe, at each size's selected learning rate: the MAE of the CNN (solid), the P(k)
    fit (dashed) and predict-the-mean (dotted) per parameter; CNN ÷ P(k); and, with the gaussian
    head, the calibrated 68% interval widths."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cosmocub.evaluation.parameter_plots import LABELS

    chosen = [r for r in selected_rows(rows) if r["level"] == "universe"]
    widths = any(math.isfinite(r.get("width68", math.nan)) for r in chosen)
    panels = 3 if widths else 2
    fig = Figure(figsize=(4.6 * panels, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, k + 1) for k in range(panels)]
    sizes = sorted({r["sample_size"] for r in rows})
    for j, name in enumerate([*NAME_PAR, "mean"]):
        pick = sorted((r for r in chosen if r["parameter"] == name), key=lambda r: r["sample_size"])
        xs = [r["sample_size"] for r in pick]
        color, label = f"C{j}", LABELS.get(name, name).split(" [")[0]
        axes[0].plot(xs, [r["cnn_mae"] for r in pick], "o-", color=color, label=label)
        axes[0].plot(xs, [r["pk_mae"] for r in pick], "--", color=color, lw=1)
        axes[0].plot(xs, [r["mean_mae"] for r in pick], ":", color=color, lw=1)
        axes[1].plot(xs, [r["cnn_over_pk"] for r in pick], "o-", color=color, label=label)
        if widths:
            axes[2].plot(xs, [r["width68"] for r in pick], "o-", color=color, label=label)
    titles = ["test MAE per universe (unitPar)", "CNN ÷ P(k) fit, per universe"]
    titles += ["gaussian head: mean 68% width (unitPar)"] if widths else []
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{s}³" for s in sizes])
        ax.set_xlabel("sample size (voxels)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[1].axhline(1.0, color="k", lw=0.8)
    axes[0].legend(title="dashed: P(k) fit, dotted: mean", fontsize=8, title_fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def point_rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    size = int(outputs.point.labels["sample_size"])
    study = cfg.sample_size_study
    spatial = study.spatial[study.sizes.index(size)]
    return [{"spatial": spatial, **r} for r in evaluated_point_rows(outputs)]


STUDY = StudyDefinition(
    name="sample_size",
    config_key="sample_size_study",
    columns=COLUMNS,
    points=size_points,
    rows=point_rows,
    plot=plot_study,
    point_metrics=point_metrics,
    evaluate=True,
    finish=select_lr,
    description=(
        "Test MAE (unitPar) per parameter against crop size at equal optimizer steps, per "
        "universe (its crops' predictions combined) and per crop: the CNN, predict-the-mean and "
        "the P(k) ridge fit, the CNN's ratios to both, and the gaussian head's calibrated 68% "
        "widths; each size trained at every lr of the grid, `selected` = 1 on the lr with the "
        "lowest per-universe validation MAE (`selected_by`; the final validation loss for "
        "points evaluated without it)."
    ),
)
