"""The evaluate stage: predict the test split with a run's model.pt, compare it with the baselines
(`metrics`, `headline`) and write runs/<run>/eval, with plots, and to MLflow.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from cosmocub.config import Config
from cosmocub.cosmology.parameters import NAME_PAR
from cosmocub.data.known_answer_fields import DESIGN, PARAMETERS
from cosmocub.data.shard_file import first_universe_rows
from cosmocub.evaluation.headline import field_level_metrics, plot_calibration
from cosmocub.evaluation.headline import tracker_metrics as field_tracker_metrics
from cosmocub.evaluation.metrics import parameter_metrics, to_physical, tracker_metrics
from cosmocub.evaluation.split_predictions import split_predictions
from cosmocub.io import atomic_path, json_safe, read_jsonl, write_json

log = logging.getLogger(__name__)

# Files of the eval folder (docs/reference/formats.md), in the order they are logged.
OUTPUT_FILES = (
    "metrics.json",
    "predictions.npz",
    "pred_vs_true.png",
    "loss_curves.png",
    "calibration.png",
)


def parameter_space(source: str) -> tuple[tuple[str, ...], Callable[[np.ndarray], np.ndarray]]:
    """The unitPar slots' names and their map to physical values in universes of `source`
    (universes.source): the known-answer universes' own parameters, else the N-body ones."""
    if source == "known_answer":
        return PARAMETERS, DESIGN.physical
    return NAME_PAR, to_physical


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
    docs/reference/formats.md); the metrics and files also go to `tracker` (a
    cosmocub.tracking.tracker Tracker).
    """
    from cosmocub.data.dataset import open_split
    from cosmocub.evaluation.parameter_plots import plot_loss_curves, plot_pred_vs_true
    from cosmocub.models.model_factory import load_model_file

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
    names, physical = parameter_space(cfg.universes.source)
    if model_cfg.num_outputs != len(names):
        raise ValueError(
            f"{model_path}: model has {model_cfg.num_outputs} outputs, evaluation needs "
            f"{len(names)} ({', '.join(names)})"
        )
    test = open_split(shards_dir, "test", model_cfg)
    if len(test) == 0:
        raise ValueError(f"{test.path}: test shard holds 0 samples, nothing to evaluate")
    train_mean_unit = _train_target_mean(shards_dir / "train.h5", cfg.train.universes)

    opts = {"batch_size": cfg.evaluate.batch_size, "symmetries": cfg.evaluate.symmetries}
    test_pred = split_predictions(model, test, **opts)
    pred_unit, true_unit = test_pred["mean"], test_pred["true"]
    # Validation fits the gaussian head's calibration (never the test split), and its
    # per-universe MAE is what a study chooses a learning rate by (metrics.json "validation").
    val = open_split(shards_dir, "val", model_cfg)
    val_pred = split_predictions(model, val, **opts) if len(val) else None
    metrics = parameter_metrics(
        pred_unit, true_unit, train_mean_unit, names=names, physical=physical
    )
    field_level, field_arrays = field_level_metrics(
        shards_dir=shards_dir,
        names=names,
        test=test_pred,
        val=val_pred,
        train_universes=cfg.train.universes,
    )
    metrics.update(field_level)
    metrics.update(
        num_samples=len(test),
        params=list(names),
        base_phys=physical(np.zeros(len(names))).tolist(),
        train_mean_unit=train_mean_unit.tolist(),
        model=str(model_path),
        test_shard=str(test.path),
        config_hash=cfg.hash,
    )
    with h5py.File(test.path, "r") as f:
        extra = {k: f[k][:] for k in ("universe_index", "crop_origin") if k in f}
    # A model.pt without its training's metrics (copied in by hand, say) still evaluates: the
    # loss figure then says the metrics were not found instead of failing the stage.
    records_path = run_dir / "metrics.jsonl"
    if records_path.is_file():
        records = read_jsonl(records_path)
    else:
        log.warning(
            "%s not found: loss_curves.png will say so instead of showing curves", records_path
        )
        records = []

    with atomic_path(out_dir) as tmp:
        tmp.mkdir()
        write_json(tmp / "metrics.json", json_safe(metrics))
        np.savez(
            tmp / "predictions.npz",
            pred_unit=pred_unit.astype(np.float32),
            true_unit=true_unit.astype(np.float32),
            pred_phys=physical(pred_unit),
            true_phys=physical(true_unit),
            param_names=np.array(names),
            **extra,
            **field_arrays,
        )
        plot_calibration(metrics.get("calibration"), names=names, path=tmp / "calibration.png")
        plot_pred_vs_true(
            physical(pred_unit),
            physical(true_unit),
            baseline=physical(train_mean_unit),
            names=names,
            metrics=metrics["per_parameter"],
            path=tmp / "pred_vs_true.png",
        )
        plot_loss_curves(records, path=tmp / "loss_curves.png", source=records_path)

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


def _train_target_mean(path: Path, universes: int | None) -> np.ndarray:
    """The mean target of the training rows the run trained on (train.universes)."""
    if not path.is_file():
        raise FileNotFoundError(f"{path}: train shard not found (its targets give the baseline)")
    with h5py.File(path, "r") as f:
        if "y" not in f:
            raise ValueError(f"{path}: dataset 'y' missing (not a cosmocub shard)")
        y = f["y"][:]
    if (rows := first_universe_rows(path, universes)) is not None:
        y = y[rows]
    if y.ndim != 2 or y.shape[1] != len(NAME_PAR) or y.shape[0] == 0:
        raise ValueError(
            f"{path}: dataset 'y' has shape {y.shape}, expected (N > 0, {len(NAME_PAR)})"
        )
    return y.astype(np.float64).mean(axis=0)
