"""Metrics of point predictions against the truth: MAE / RMSE / R² per parameter, in unitPar and
physical units, beside a predict-the-train-mean baseline, and their flat MLflow names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from cosmocub.cosmology.parameters import NAME_PAR, phys_from_unit


def regression_metrics(pred: np.ndarray, true: np.ndarray) -> dict[str, float]:
    """MAE, RMSE and R² of one parameter: `pred`, `true` of shape (N,).

    R² = 1 − SS_res / SS_tot with SS_tot about the mean of `true`; NaN when `true` is constant
    (R² is undefined there, and a number would mislead).
    """
    pred = np.asarray(pred, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    if pred.shape != true.shape or pred.ndim != 1 or pred.size == 0:
        raise ValueError(
            f"regression_metrics: pred {pred.shape} and true {true.shape} must be equal, "
            "non-empty 1-D arrays"
        )
    err = pred - true
    ss_res = float(np.sum(err**2))
    ss_tot = float(np.sum((true - true.mean()) ** 2))
    return {
        "mae": float(np.mean(np.abs(err))),
        "rmse": math.sqrt(ss_res / err.size),
        "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else math.nan,
    }


def to_physical(unit: np.ndarray) -> np.ndarray:
    """unitPar (…, 4) → physPar in float64, for metrics."""
    return phys_from_unit(unit, dtype=np.float64)


def parameter_metrics(
    pred_unit: np.ndarray,
    true_unit: np.ndarray,
    train_mean_unit: np.ndarray,
    *,
    names: Sequence[str] = NAME_PAR,
    physical: Callable[[np.ndarray], np.ndarray] = to_physical,
) -> dict[str, Any]:
    """Model and predict-the-train-mean baseline metrics per parameter, unit and physical units.

    pred_unit, true_unit: (N, P); train_mean_unit: (P,); `physical` maps unitPar to the
    parameters' physical values (the N-body ones' by default). Returns
    `{"per_parameter": {name: {...}}, "mean": {...}}` where each parameter holds mae, rmse, r2,
    mae_phys, rmse_phys, r2_phys, baseline_mae, baseline_rmse, baseline_r2, baseline_mae_phys,
    baseline_rmse_phys and mae_ratio (model MAE / baseline MAE; < 1 means better than the mean).
    `mean` averages mae, rmse, baseline_mae over parameters in unit space (the MLPerf val MAE).
    """
    pred_unit = np.asarray(pred_unit, dtype=np.float64)
    true_unit = np.asarray(true_unit, dtype=np.float64)
    num_params = len(names)
    if (
        pred_unit.shape != true_unit.shape
        or pred_unit.ndim != 2
        or pred_unit.shape[1] != num_params
    ):
        raise ValueError(
            f"parameter_metrics: pred {pred_unit.shape} and true {true_unit.shape} must both be "
            f"(N, {num_params})"
        )
    baseline_unit = np.broadcast_to(np.asarray(train_mean_unit, np.float64), true_unit.shape)
    pred_phys, true_phys, base_phys = (physical(a) for a in (pred_unit, true_unit, baseline_unit))
    per_parameter: dict[str, dict[str, float]] = {}
    for j, name in enumerate(names):
        model_u = regression_metrics(pred_unit[:, j], true_unit[:, j])
        model_p = regression_metrics(pred_phys[:, j], true_phys[:, j])
        base_u = regression_metrics(baseline_unit[:, j], true_unit[:, j])
        base_p = regression_metrics(base_phys[:, j], true_phys[:, j])
        per_parameter[name] = {
            **model_u,
            **{f"{k}_phys": v for k, v in model_p.items()},
            **{f"baseline_{k}": v for k, v in base_u.items()},
            "baseline_mae_phys": base_p["mae"],
            "baseline_rmse_phys": base_p["rmse"],
            "mae_ratio": _ratio(model_u["mae"], base_u["mae"]),
        }
    mean = {
        key: float(np.mean([m[key] for m in per_parameter.values()]))
        for key in ("mae", "rmse", "baseline_mae")
    }
    mean["mae_ratio"] = _ratio(mean["mae"], mean["baseline_mae"])
    return {"per_parameter": per_parameter, "mean": mean}


def tracker_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Flat MLflow metric names: test_mae_<param>, test_r2_<param>, baseline_mae_<param>, …"""
    flat: dict[str, float] = {}
    for name, m in metrics["per_parameter"].items():
        for key in ("mae", "rmse", "r2", "mae_phys", "rmse_phys"):
            flat[f"test_{key}_{name}"] = m[key]
        flat[f"baseline_mae_{name}"] = m["baseline_mae"]
        flat[f"baseline_mae_phys_{name}"] = m["baseline_mae_phys"]
        flat[f"mae_ratio_{name}"] = m["mae_ratio"]
    flat["test_mae"] = metrics["mean"]["mae"]
    flat["test_rmse"] = metrics["mean"]["rmse"]
    flat["baseline_mae"] = metrics["mean"]["baseline_mae"]
    flat["mae_ratio"] = metrics["mean"]["mae_ratio"]
    # NaN (an undefined R²) is no use as a metric value in MLflow's charts.
    return {k: float(v) for k, v in flat.items() if math.isfinite(v)}


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else math.nan
