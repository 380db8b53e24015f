"""The sample-size study: the same recipe trained on crops of increasing size cut from the same
universes, and its test error per parameter against sample size, per sample and per universe.

The seed (*The Case for Strong Scaling in Deep Learning*) found larger samples far more accurate;
this module derives one config per size and turns the runs' test predictions into a table.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cosmocub.config import Config, ConfigError
from cosmocub.data.universe import NAME_PAR
from cosmocub.io import atomic_path
from cosmocub.studies.engine import Point, PointOutputs, StudyDefinition, point_values

LEVELS = ("sample", "universe")
COLUMNS = (
    "sample_size",
    "spatial",
    "level",
    "parameter",
    "count",
    "mae",
    "baseline_mae",
    "mae_ratio",
    "rmse",
    "baseline_rmse",
)


def size_point(cfg: Config, size: int) -> Point:
    """The run at crop side `size`: the base config with the sample and model input set to
    `size`, split over the spatial ranks the study gives that size. Everything else (model,
    optimizer, epochs, seed, universes) is the base recipe."""
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
        name=str(size),
        labels={},  # the rows carry sample_size and spatial themselves
        overrides={
            "preprocess": {"sample_size": size},
            "model": {"input_size": size},
            "parallel": {"spatial": spatial, "split": None},
            "train": {"nproc_per_node": spatial * cfg.train.nproc_per_node},
        },
    )


def size_points(cfg: Config) -> list[Point]:
    return [size_point(cfg, size) for size in cfg.sample_size_study.sizes]


def size_config_values(cfg: Config, size: int) -> dict[str, Any]:
    """The resolved config of the run at crop side `size` (run name `sample_size_<size>`)."""
    return point_values(cfg, "sample_size", size_point(cfg, size))


def universe_means(values_np: np.ndarray, universe_index: np.ndarray) -> np.ndarray:
    """(U, P): the mean of `values_np` (N, P) over each universe's samples, universes sorted."""
    ids = np.unique(universe_index)
    return np.stack([values_np[universe_index == u].mean(axis=0) for u in ids])


def _errors(pred: np.ndarray, true: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    err = pred - true  # (N, P)
    return np.abs(err).mean(axis=0), np.sqrt((err**2).mean(axis=0))


def study_rows(
    predictions: Mapping[int, Mapping[str, np.ndarray]],
    *,
    spatial: Mapping[int, int],
    train_mean_unit: Mapping[int, np.ndarray],
    names: Sequence[str] = NAME_PAR,
) -> list[dict[str, Any]]:
    """Table rows, per (size, level, parameter and "mean"), in unitPar space.

    predictions[size] holds pred_unit, true_unit (N, P) and universe_index (N,) as in
    eval/predictions.npz; the baseline predicts the training targets' mean for every sample.
    Per universe, the prediction is the mean over that universe's test samples (its true value is
    the same for all of them), so that sizes are compared on the same universes.
    """
    rows = []
    for size in sorted(predictions):
        p = predictions[size]
        pred = np.asarray(p["pred_unit"], np.float64)
        true = np.asarray(p["true_unit"], np.float64)
        universe = np.asarray(p["universe_index"])
        baseline = np.broadcast_to(np.asarray(train_mean_unit[size], np.float64), true.shape)
        by_level = {
            "sample": (pred, true, baseline),
            "universe": tuple(universe_means(a, universe) for a in (pred, true, baseline)),
        }
        for level, (lp, lt, lb) in by_level.items():
            mae, rmse = _errors(lp, lt)
            base_mae, base_rmse = _errors(lb, lt)
            for j, name in enumerate([*names, "mean"]):
                pick = slice(None) if name == "mean" else j
                row = {
                    "sample_size": size,
                    "spatial": spatial[size],
                    "level": level,
                    "parameter": name,
                    "count": len(lt),
                    "mae": float(np.mean(mae[pick])),
                    "baseline_mae": float(np.mean(base_mae[pick])),
                    "rmse": float(np.mean(rmse[pick])),
                    "baseline_rmse": float(np.mean(base_rmse[pick])),
                }
                # Undefined (NaN) where the baseline is exact, as in evaluate's mae_ratio.
                base = row["baseline_mae"]
                row["mae_ratio"] = row["mae"] / base if base > 0 else math.nan
                rows.append(row)
    return rows


def plot_study(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """One panel per level: test MAE per parameter against sample size, baselines dashed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cosmocub.plots import LABELS

    fig = Figure(figsize=(10, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    sizes = sorted({r["sample_size"] for r in rows})
    for k, level in enumerate(LEVELS):
        ax = fig.add_subplot(1, 2, k + 1)
        for j, name in enumerate([*NAME_PAR, "mean"]):
            pick = [r for r in rows if r["level"] == level and r["parameter"] == name]
            pick.sort(key=lambda r: r["sample_size"])
            xs = [r["sample_size"] for r in pick]
            color = f"C{j}"
            label = LABELS.get(name, name).split(" [")[0]
            ax.plot(xs, [r["mae"] for r in pick], "o-", color=color, label=label)
            ax.plot(xs, [r["baseline_mae"] for r in pick], ":", color=color, lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes, [f"{s}³" for s in sizes])
        ax.set_xlabel("sample size (voxels)")
        ax.set_ylabel("test MAE (unitPar)")
        ax.set_title(f"per {level}" + (" (predictions averaged)" if level == "universe" else ""))
        ax.grid(alpha=0.3)
    fig.axes[0].legend(title="dotted: predict the mean", fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def read_run(eval_dir: Path) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """(predictions, train mean unitPar) of one run's eval folder."""
    import json

    path = Path(eval_dir) / "predictions.npz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: predictions not found (run `cosmocub evaluate`)")
    with np.load(path) as npz:
        missing = {"pred_unit", "true_unit", "universe_index"} - set(npz.files)
        if missing:
            raise ValueError(f"{path}: arrays {sorted(missing)} missing")
        predictions = {k: npz[k] for k in ("pred_unit", "true_unit", "universe_index")}
    metrics = json.loads((Path(eval_dir) / "metrics.json").read_text())
    return predictions, np.asarray(metrics["train_mean_unit"], np.float64)


def point_rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    size = int(outputs.point.name)
    predictions, train_mean = read_run(outputs.eval_dir)
    spatial = dict(zip(cfg.sample_size_study.sizes, cfg.sample_size_study.spatial, strict=True))
    return study_rows({size: predictions}, spatial=spatial, train_mean_unit={size: train_mean})


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per point, the same names: test MAE per level and parameter, and the mean's ratio."""
    metrics = {f"{r['level']}_mae_{r['parameter']}": r["mae"] for r in rows}
    metrics |= {f"{r['level']}_mae_ratio": r["mae_ratio"] for r in rows if r["parameter"] == "mean"}
    return metrics


STUDY = StudyDefinition(
    name="sample_size",
    config_key="sample_size_study",
    columns=COLUMNS,
    points=size_points,
    rows=point_rows,
    plot=plot_study,
    point_metrics=point_metrics,
    evaluate=True,
    description=(
        "Test MAE (unitPar) per parameter against crop size, per sample and per universe "
        "(predictions averaged over a universe's crops); baseline: predict the training mean."
    ),
)
