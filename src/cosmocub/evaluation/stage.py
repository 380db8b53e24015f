"""Test-set evaluation of a trained run: per-parameter MAE / RMSE / R² beside a predict-the-mean
baseline, in unitPar and physical units, with plots, written to runs/<run>/eval and to MLflow.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from cosmocub.config import Config
from cosmocub.cosmology.parameters import BASE_PHYS_PAR, NAME_PAR, phys_from_unit
from cosmocub.data.augment import cube_symmetry
from cosmocub.evaluation.headline import field_level_metrics, plot_calibration
from cosmocub.evaluation.headline import tracker_metrics as field_tracker_metrics
from cosmocub.io import atomic_path, json_safe
from cosmocub.models.heads import split_output, variance
from cosmocub.models.memory_layout import memory_format

log = logging.getLogger(__name__)

# Files of the eval folder (docs/formats.md), in the order they are logged.
OUTPUT_FILES = (
    "metrics.json",
    "predictions.npz",
    "pred_vs_true.png",
    "loss_curves.png",
    "calibration.png",
)


# ---------------------------------------------------------------------------------------------
# Pure metrics


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
) -> dict[str, Any]:
    """Model and predict-the-train-mean baseline metrics per parameter, unit and physical units.

    pred_unit, true_unit: (N, P); train_mean_unit: (P,). Returns
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
    pred_phys, true_phys, base_phys = (
        to_physical(a) for a in (pred_unit, true_unit, baseline_unit)
    )
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


# ---------------------------------------------------------------------------------------------
# The stage


def evaluate(
    cfg: Config,
    *,
    shards_dir: Path,
    run_dir: Path,
    out_dir: Path,
    tracker: Any,
) -> dict[str, Any]:
    """Predict the test shard with run_dir/model.pt; write out_dir (atomically); return metrics.

    out_dir receives metrics.json, predictions.npz, pred_vs_true.png and loss_curves.png (see
    docs/formats.md); the metrics and files also go to `tracker` (a
    cosmocub.tracking.tracker Tracker).
    """
    from cosmocub.data.dataset import open_split
    from cosmocub.evaluation.plots import plot_loss_curves, plot_pred_vs_true
    from cosmocub.models.factory import load_model_file

    shards_dir, run_dir, out_dir = Path(shards_dir), Path(run_dir), Path(out_dir)
    model_path = run_dir / "model.pt"
    if not model_path.is_file():
        raise FileNotFoundError(f"{model_path}: trained model not found (run `cosmocub train`)")
    model = load_model_file(model_path)
    model_cfg = model.config
    if model_cfg.name != "cosmoflow":
        raise ValueError(
            f"{model_path}: a {model_cfg.name} model predicts fields; evaluate it with "
            "`cosmocub evaluate-fields`"
        )
    if model_cfg.num_outputs != len(NAME_PAR):
        raise ValueError(
            f"{model_path}: model has {model_cfg.num_outputs} outputs, evaluation needs "
            f"{len(NAME_PAR)} ({', '.join(NAME_PAR)})"
        )
    test = open_split(shards_dir, "test", model_cfg)
    if len(test) == 0:
        raise ValueError(f"{test.path}: test shard holds 0 samples, nothing to evaluate")
    train_mean_unit = _train_target_mean(shards_dir / "train.h5")

    opts = {"batch_size": cfg.evaluate.batch_size, "symmetries": cfg.evaluate.symmetries}
    test_pred = split_predictions(model, test, **opts)
    pred_unit, true_unit = test_pred["mean"], test_pred["true"]
    # Validation fits the gaussian head's calibration (never the test split).
    val_pred = (
        split_predictions(model, open_split(shards_dir, "val", model_cfg), **opts)
        if model_cfg.gaussian
        else None
    )
    metrics = parameter_metrics(pred_unit, true_unit, train_mean_unit)
    field_level, field_arrays = field_level_metrics(
        shards_dir=shards_dir, names=NAME_PAR, test=test_pred, val=val_pred
    )
    metrics.update(field_level)
    metrics.update(
        num_samples=len(test),
        params=list(NAME_PAR),
        base_phys=BASE_PHYS_PAR.tolist(),
        train_mean_unit=train_mean_unit.tolist(),
        model=str(model_path),
        test_shard=str(test.path),
        config_hash=cfg.hash,
    )
    with h5py.File(test.path, "r") as f:
        extra = {k: f[k][:] for k in ("universe_index", "crop_origin") if k in f}
    records = read_metrics_jsonl(run_dir / "metrics.jsonl")

    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        (tmp / "metrics.json").write_text(json.dumps(json_safe(metrics), indent=2) + "\n")
        np.savez(
            tmp / "predictions.npz",
            pred_unit=pred_unit.astype(np.float32),
            true_unit=true_unit.astype(np.float32),
            pred_phys=to_physical(pred_unit),
            true_phys=to_physical(true_unit),
            param_names=np.array(NAME_PAR),
            **extra,
            **field_arrays,
        )
        plot_calibration(metrics.get("calibration"), names=NAME_PAR, path=tmp / "calibration.png")
        plot_pred_vs_true(
            to_physical(pred_unit),
            to_physical(true_unit),
            baseline=to_physical(train_mean_unit),
            names=NAME_PAR,
            metrics=metrics["per_parameter"],
            path=tmp / "pred_vs_true.png",
        )
        plot_loss_curves(records, path=tmp / "loss_curves.png", source=run_dir / "metrics.jsonl")

    tracker.log_metrics({**tracker_metrics(metrics), **field_tracker_metrics(metrics)})
    for name in OUTPUT_FILES:
        tracker.log_artifact(out_dir / name, artifact_path="eval")
    per_universe = metrics["comparison"]["per_universe"]
    log.info(
        "per universe, CNN MAE / P(k) fit MAE: %s",
        ", ".join(f"{name} {row['cnn_over_pk']:.3f}" for name, row in per_universe.items()),
    )
    mean = metrics["mean"]
    log.info(
        "test MAE %.4f (unit space) vs predict-the-mean %.4f: ratio %.3f on %d samples",
        mean["mae"],
        mean["baseline_mae"],
        mean["mae_ratio"],
        len(test),
    )
    return metrics


def split_predictions(
    model: Any, dataset: Any, *, batch_size: int, symmetries: int = 1
) -> dict[str, np.ndarray] | None:
    """{"mean", "true", "universe_index"} (+ "var" for the gaussian head) over a split, in order;
    None for an empty split."""
    if len(dataset) == 0:
        return None
    if model.config.gaussian:
        mean, var, true = predict_gaussian(
            model, dataset, batch_size=batch_size, symmetries=symmetries
        )
        out = {"mean": mean, "var": var, "true": true}
    else:
        mean, true = predict(model, dataset, batch_size=batch_size, symmetries=symmetries)
        out = {"mean": mean, "true": true}
    with h5py.File(dataset.path, "r") as f:
        out["universe_index"] = f["universe_index"][:]
    return out


def _symmetry_outputs(
    model: torch.nn.Module, dataset: Any, *, batch_size: int, symmetries: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per batch of `dataset`, in order: the model's fp32 outputs on the first `symmetries`
    symmetries of the cube, stacked (S, B, O), and the batch's targets. Eval mode, no grad."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device, memory_format=memory_format(device)).eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=0)
    # Quiet in batch logs: one line a minute instead of a redrawn bar.
    every = 1 if sys.stderr.isatty() else 60
    with torch.inference_mode():
        for x_bcdhw, y in tqdm(loader, desc="evaluate", unit="batch", mininterval=every):
            x_bcdhw = x_bcdhw.to(device)
            yield (
                torch.stack([model(cube_symmetry(x_bcdhw, k)).float() for k in range(symmetries)]),
                y,
            )


def predict(
    model: torch.nn.Module, dataset: Any, *, batch_size: int, symmetries: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """(pred, true) unitPar arrays (N, P) over `dataset` in order.

    With `symmetries` > 1 each prediction is the mean over the first `symmetries` symmetries of
    the cube (8: the reflections; 48: all): the parameters do not depend on orientation, so
    averaging over the group removes the part of the model's error that does.
    """
    preds, trues = [], []
    for out_sbp, y in _symmetry_outputs(
        model, dataset, batch_size=batch_size, symmetries=symmetries
    ):
        preds.append(out_sbp.mean(0).cpu().numpy())
        trues.append(y.numpy())
    return np.concatenate(preds).astype(np.float64), np.concatenate(trues).astype(np.float64)


def predict_gaussian(
    model: torch.nn.Module, dataset: Any, *, batch_size: int, symmetries: int = 1
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, variance, true) unitPar arrays (N, P) of a gaussian-head model over `dataset`.

    Over the cube's `symmetries`, the mean is the average of the means and the variance the
    average variance plus the variance of the means (the law of total variance).
    """
    means, variances, trues = [], [], []
    for out_sbo, y in _symmetry_outputs(
        model, dataset, batch_size=batch_size, symmetries=symmetries
    ):
        mean_sbp, log_var_sbp = split_output(out_sbo, model.config)
        mean_sbp, var_sbp = mean_sbp.double(), variance(log_var_sbp.double())
        total_var = var_sbp.mean(0) + mean_sbp.var(0, unbiased=False)
        means.append(mean_sbp.mean(0).cpu().numpy())
        variances.append(total_var.cpu().numpy())
        trues.append(y.numpy())
    return (
        np.concatenate(means),
        np.concatenate(variances),
        np.concatenate(trues).astype(np.float64),
    )


def _train_target_mean(path: Path) -> np.ndarray:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: train shard not found (its targets give the baseline)")
    with h5py.File(path, "r") as f:
        if "y" not in f:
            raise ValueError(f"{path}: dataset 'y' missing (not a cosmocub shard)")
        y = f["y"][:]
    if y.ndim != 2 or y.shape[1] != len(NAME_PAR) or y.shape[0] == 0:
        raise ValueError(
            f"{path}: dataset 'y' has shape {y.shape}, expected (N > 0, {len(NAME_PAR)})"
        )
    return y.astype(np.float64).mean(axis=0)


def read_metrics_jsonl(path: Path) -> list[dict[str, Any]]:
    """The per-epoch records of a run's metrics.jsonl ([] if the file is absent)."""
    if not path.is_file():
        log.warning("%s not found: loss_curves.png will say so instead of showing curves", path)
        return []
    records = []
    with open(path) as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {lineno} is not JSON ({err.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}: line {lineno} is not a JSON object")
            records.append(record)
    return records
