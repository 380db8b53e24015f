"""What the accuracy studies (sample size, universes, known answer) read from an evaluated point,
and how they pick a learning rate on validation.

Per point, eval/metrics.json's `comparison` (and, for the gaussian head, `calibration`) becomes
rows per (level, parameter): the unitPar test MAE of the CNN and of each baseline it is compared
with, their bootstrap ranges over the test universes, the CNN's ratios, the calibrated 68% widths
and coverages. The study's gather then keeps, per group of points (a crop size, a number of
training universes), the learning rate with the lowest per-universe validation MAE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from cosmocub.io import read_json
from cosmocub.studies.engine import PointOutputs

LEVELS = ("universe", "sample")
# metrics.json's comparison / calibration scope of each level.
SCOPES = {"universe": "per_universe", "sample": "per_crop"}
# The estimators of metrics.json's comparison, each a `<est>_mae` column here (those of
# evaluation.headline, not imported: it loads matplotlib and scikit-learn at plan time).
ESTIMATORS = ("cnn", "mean", "one_point", "pk")
# A value's column, then its bootstrap ±1σ range's (metrics.json's suffixes too).
RANGE_ENDS = ("", "_lo", "_hi")
# Coverage levels of the gaussian head's calibrated intervals and their column.
COVERAGES = {"0.68": "coverage68", "0.95": "coverage95"}


def level_rows(
    metrics: Mapping[str, Any], *, estimators: Sequence[str] = ESTIMATORS
) -> list[dict[str, Any]]:
    """Rows per (level, parameter and "mean") from one point's eval/metrics.json: the unitPar
    MAE of each of `estimators` ("cnn" and the baselines of its comparison; by default the CNN,
    predict-the-mean, the one-point and the P(k) ridge fits) as `<est>_mae`, with `<est>_mae_lo`
    / `_hi`, the bootstrap ±1σ range over the test universes, where the evaluation gives one;
    the CNN's ratio to each baseline, `cnn_over_<baseline>` with its range likewise; and, for
    the gaussian head, the mean width and the coverage of its calibrated intervals. The "mean"
    row averages the MAEs, widths and coverages over parameters and gives the ratios of those
    averages."""
    baselines = [est for est in estimators if est != "cnn"]
    comparison = metrics["comparison"]
    calibration = metrics.get("calibration")
    names = list(comparison["per_universe"])  # the parameters, in metrics.json's order
    rows = []
    for level in LEVELS:
        scope = SCOPES[level]
        table = comparison[scope]
        count = comparison["num_universes" if level == "universe" else "num_crops"]
        after = calibration[scope]["after"] if calibration else {}
        level_out = []
        for name in names:
            t = table[name]
            row: dict[str, Any] = {"level": level, "parameter": name, "count": count}
            for est in estimators:
                for end in RANGE_ENDS:
                    row[f"{est}_mae{end}"] = t.get(f"{est}{end}", math.nan)
            for base in baselines:
                for end in RANGE_ENDS:
                    row[f"cnn_over_{base}{end}"] = t.get(f"cnn_over_{base}{end}", math.nan)
            row["width68"] = after.get("width68", {}).get(name, math.nan)
            coverage = after.get("coverage", {}).get(name, {})
            row |= {col: coverage.get(level_key, math.nan) for level_key, col in COVERAGES.items()}
            level_out.append(row)
        averaged = (*(f"{est}_mae" for est in estimators), "width68", *COVERAGES.values())
        mean = {k: float(np.mean([r[k] for r in level_out])) for k in averaged}
        mean_row = {"level": level, "parameter": "mean", "count": count, **mean}
        for base in baselines:
            mean_row[f"cnn_over_{base}"] = ratio(mean["cnn_mae"], mean[f"{base}_mae"])
            mean_row |= {f"cnn_over_{base}{end}": math.nan for end in RANGE_ENDS[1:]}
        rows += [*level_out, mean_row]
    return rows


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan  # undefined where the baseline is exact


def evaluated_point_rows(
    outputs: PointOutputs, *, estimators: Sequence[str] = ESTIMATORS
) -> list[dict[str, Any]]:
    """A point's level_rows with the optimizer steps it took and its final validation loss."""
    path = outputs.eval_dir / "metrics.json"
    metrics = read_json(path, not_found="not found (run `cosmocub evaluate`)")
    if "comparison" not in metrics:
        raise ValueError(f"{path}: no 'comparison' block (evaluated by an older cosmocub)")
    epochs = outputs.metrics()
    point = {
        "steps": outputs.train_summary()["steps"],
        "final_val_loss": epochs[-1].get("val_loss") if epochs else None,
        "val_universe_mae": metrics.get("validation", {}).get("mean_per_universe_mae"),
    }
    return [{**point, **r} for r in level_rows(metrics, estimators=estimators)]


def select_lr_per_group(
    rows: list[dict[str, Any]],
    *,
    group: str,
    grid: Callable[[Any], Sequence[float]],
    budget_key: str,
) -> list[dict[str, Any]]:
    """Per value of column `group`, mark the learning rate with the lowest per-universe
    validation MAE (`val_universe_mae`, the mean over parameters; `selected` = 1, the others 0;
    the first of the grid on a tie) and say so in `selected_by`; where a point of the group has
    no such MAE (evaluated before metrics.json held it), the lowest final validation loss, and
    `selected_by` says that instead. Record the group's grid (`grid(value)`) in `lr_grid`;
    refuse unequal budgets (points that took different numbers of optimizer steps), naming the
    config key `budget_key` that sets them."""
    steps: dict[str, int] = {}
    for r in rows:
        if r.get("steps") is not None:
            steps.setdefault(r["point"], r["steps"])
    if len(set(steps.values())) > 1:
        raise ValueError(
            f"unequal budgets, optimizer steps per point {steps} (a point has fewer batches "
            f"per epoch than {budget_key})"
        )
    members: dict[Hashable, list[dict[str, Any]]] = {}
    for r in rows:
        members.setdefault(r[group], []).append(r)
    for key, group_rows in members.items():
        by_mae = all(_finite_or_none(r.get("val_universe_mae")) is not None for r in group_rows)
        column = "val_universe_mae" if by_mae else "final_val_loss"
        scored = [
            (v, r["lr"]) for r in group_rows if (v := _finite_or_none(r.get(column))) is not None
        ]
        chosen = min(scored, key=lambda pair: pair[0])[1] if scored else None
        for r in group_rows:
            r["selected"] = int(chosen is not None and r["lr"] == chosen)
            r["selected_by"] = column
            r["lr_grid"] = " ".join(f"{lr:g}" for lr in grid(key))
    return rows


def _finite_or_none(value: Any) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None


def selected_rows(rows: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("selected") == 1]


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per point, the same names: per-universe CNN ÷ mean and CNN ÷ P(k) per parameter."""
    out = {}
    for r in rows:
        if r["level"] == "universe":
            out[f"univ_cnn_over_mean_{r['parameter']}"] = r["cnn_over_mean"]
            out[f"univ_cnn_over_pk_{r['parameter']}"] = r["cnn_over_pk"]
    return out
