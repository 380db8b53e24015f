"""The universes study: the learning curve over the number of training universes.

The same recipe trains on the first N universes of the training split (train.universes) for
every N of `universes_study.train_universes`, at equal optimizer steps (the same epochs of the
same capped length at every N, so a small N repeats its universes more often), each N once per
learning rate of the grid; the gather keeps per N the lr with the lowest per-universe validation
MAE.
Every point reads the same shards, so the test universes are the same at every N, and each
point's evaluation fits its baselines (predict-the-mean, the one-point and P(k) ridge fits) on
its own N universes. The table and plot give, per N, the per-universe test MAE of the CNN and of
each baseline with their bootstrap ranges over the test universes.

Published field-level CNNs beat the power spectrum with hundreds to thousands of simulations; the
curve says where, on these universes, the CNN's error crosses the P(k) fit's (if it does).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config, ConfigError
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.splits import split_counts
from cosmocub.io import atomic_path
from cosmocub.optim.schedule import stretched
from cosmocub.studies.accuracy import (
    ESTIMATORS,
    evaluated_point_rows,
    point_metrics,
    select_lr_per_group,
    selected_rows,
)
from cosmocub.studies.engine import Point, PointOutputs, StudyDefinition
from cosmocub.studies.training_columns import LR_SELECTION_COLUMNS

MAE_COLUMNS = tuple(f"{est}_mae{end}" for est in ESTIMATORS for end in ("", "_lo", "_hi"))
COLUMNS = (
    "train_universes",
    *LR_SELECTION_COLUMNS,
    "level",
    "parameter",
    "count",
    *MAE_COLUMNS,
    "cnn_over_mean",
    "cnn_over_pk",
    "cnn_over_pk_lo",
    "cnn_over_pk_hi",
    "width68",
    "coverage68",
    "coverage95",
)
# Line style of each estimator in the plot.
STYLES = {"cnn": "o-", "pk": "s--", "one_point": "^-.", "mean": ":"}
NAMES = {"cnn": "CNN", "pk": "P(k) fit", "one_point": "one-point fit", "mean": "predict the mean"}


def point_name(universes: int, lr: float) -> str:
    return f"u{universes}_lr{lr:g}"


def check_budget(cfg: Config) -> None:
    """Refuse, before anything runs, an N the training split cannot give and a smallest N
    too small to fill the study's steps per epoch (synthetic universes, whose counts are known
    from the config; public ones are checked by training and by the gather's budget check)."""
    study = cfg.universes_study
    if cfg.universes.source != "synthetic":
        return
    train = split_counts(cfg.universes.count, cfg.preprocess.splits.as_dict())["train"]
    if max(study.train_universes) > train:
        raise ConfigError(
            f"key 'universes_study.train_universes': {max(study.train_universes)} universes, but "
            f"universes.count {cfg.universes.count} gives the training split {train} "
            f"(preprocess.splits); raise universes.count (config/universes.yaml)"
        )
    crops = (cfg.universes.size // cfg.preprocess.sample_size) ** 3
    batch = cfg.global_batch
    smallest = min(study.train_universes)
    if smallest * crops < study.max_steps_per_epoch * batch:
        raise ConfigError(
            f"key 'universes_study.max_steps_per_epoch': {study.max_steps_per_epoch} batches "
            f"of {batch} need {study.max_steps_per_epoch * batch} crops an epoch, but the "
            f"smallest train_universes {smallest} give {smallest * crops} ({crops} per universe)"
        )


def universes_point(cfg: Config, universes: int, lr: float) -> Point:
    """The run on the first `universes` training universes at learning rate `lr`: the base
    config with the study's epochs and steps per epoch and the recipe's warm-up and decay epochs
    scaled to them. Everything else (model, seed, universes made, shards) is the base recipe."""
    study = cfg.universes_study
    if universes not in study.train_universes:
        raise ConfigError(
            f"key 'universes_study.train_universes': {universes} is not one of "
            f"{list(study.train_universes)}"
        )
    return Point(
        name=point_name(universes, lr),
        labels={"train_universes": universes, "lr": lr},
        overrides={
            "optimizer": {"lr": lr, **stretched(cfg.optimizer, study.epochs / cfg.train.epochs)},
            "train": {
                "universes": universes,
                "epochs": study.epochs,
                "max_steps_per_epoch": study.max_steps_per_epoch,
            },
        },
    )


def universes_points(cfg: Config) -> list[Point]:
    study = cfg.universes_study
    return [universes_point(cfg, n, lr) for n in study.train_universes for lr in study.lrs]


def select_lr(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    study = cfg.universes_study
    return select_lr_per_group(
        rows,
        group="train_universes",
        grid=lambda _: study.lrs,
        budget_key=f"universes_study.max_steps_per_epoch = {study.max_steps_per_epoch}",
    )


def point_rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    return evaluated_point_rows(outputs)


def plot_study(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Per parameter (and their mean), at each N's selected learning rate: the per-universe test
    MAE of every estimator against the number of training universes (log x), the bootstrap
    ±1σ range shaded; and CNN ÷ P(k) with its range."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cosmocub.evaluation.parameter_plots import LABELS

    chosen = [r for r in selected_rows(rows) if r["level"] == "universe"]
    names = [*NAME_PAR, "mean"]
    fig = Figure(figsize=(13, 7.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(2, 3, k + 1) for k in range(len(names) + 1)]
    counts = sorted({r["train_universes"] for r in rows})
    for ax, name in zip(axes, names, strict=False):
        pick = sorted(
            (r for r in chosen if r["parameter"] == name), key=lambda r: r["train_universes"]
        )
        xs = [r["train_universes"] for r in pick]
        for k, est in enumerate(ESTIMATORS):
            ys = [r[f"{est}_mae"] for r in pick]
            ax.plot(xs, ys, STYLES[est], color=f"C{k}", label=NAMES[est], ms=4)
            lo = [r.get(f"{est}_mae_lo", math.nan) for r in pick]
            hi = [r.get(f"{est}_mae_hi", math.nan) for r in pick]
            ax.fill_between(xs, lo, hi, color=f"C{k}", alpha=0.15, lw=0)
        ax.set_title(f"{LABELS.get(name, name).split(' [')[0]}: test MAE per universe", fontsize=10)
    ratio_ax = axes[-1]
    for j, name in enumerate(NAME_PAR):
        pick = sorted(
            (r for r in chosen if r["parameter"] == name), key=lambda r: r["train_universes"]
        )
        xs = [r["train_universes"] for r in pick]
        ys = [r["cnn_over_pk"] for r in pick]
        err = [
            [y - r.get("cnn_over_pk_lo", y) for y, r in zip(ys, pick, strict=True)],
            [r.get("cnn_over_pk_hi", y) - y for y, r in zip(ys, pick, strict=True)],
        ]
        label = LABELS.get(name, name).split(" [")[0]
        ratio_ax.errorbar(xs, ys, yerr=err, fmt="o-", color=f"C{j}", label=label, capsize=2)
    ratio_ax.axhline(1.0, color="k", lw=0.8)
    ratio_ax.axhline(0.8, color="k", lw=0.8, ls=":")
    ratio_ax.set_title("CNN ÷ P(k) fit per universe (dotted: 0.8)", fontsize=10)
    for ax in axes:
        ax.set_xscale("log")
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.set_xlabel("training universes")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    ratio_ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


STUDY = StudyDefinition(
    name="universes",
    config_key="universes_study",
    columns=COLUMNS,
    points=universes_points,
    rows=point_rows,
    plot=plot_study,
    point_metrics=point_metrics,
    evaluate=True,
    finish=select_lr,
    check=check_budget,
    description=(
        "Test MAE (unitPar) per parameter against the number of training universes at equal "
        "optimizer steps, per universe (its crops' predictions combined) and per crop: the CNN, "
        "predict-the-mean, the one-point and the P(k) ridge fits (each fitted on the point's own "
        "training universes), with their bootstrap ±1σ ranges over the test universes "
        "(`_lo`, `_hi`), the CNN's ratios, and for the gaussian head its calibrated 68% widths "
        "and 68%/95% coverages; each N trained at every lr of the grid, `selected` = 1 on the "
        "lr with the lowest per-universe validation MAE (`selected_by`; the final validation "
        "loss for points evaluated without it)."
    ),
)
