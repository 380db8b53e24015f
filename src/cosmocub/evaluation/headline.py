"""What a cosmologist asks of a trained run: per universe and per crop, is the CNN better than
predict-the-mean and than ridge fits on field statistics (one-point; P(k)), and, for the gaussian
head, do its intervals cover the truth?

`field_level_metrics` assembles metrics.json's "comparison" and "calibration" sections from
predictions (`cosmocub.evaluation.split_predictions.split_predictions` makes them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from cosmocub.evaluation import uncertainty as unc
from cosmocub.evaluation.baselines import fit_baselines

# The CNN and the baselines it is compared with, in table order ("classical": the best
# classical fit, evaluation.baselines.classical_predictions).
ESTIMATORS = ("cnn", "mean", "one_point", "pk", "classical")
BOOTSTRAP = 2000
# Folds of the calibration's check on validation alone (`uncertainty.held_out_coverage`): each
# fold's universes scaled by the factor fitted on the other four.
HELD_OUT_FOLDS = 5


def comparison_table(
    preds: Mapping[str, np.ndarray],
    true: np.ndarray,
    names: Sequence[str],
    *,
    bootstrap: int = 0,
    seed: int = 0,
) -> dict[str, dict[str, float]]:
    """Per parameter: unitPar MAE of every estimator, and the CNN's MAE over each baseline's.

    With `bootstrap` > 0, also `cnn_over_<baseline>_lo` and `_hi`: the 16th and 84th percentiles
    of each ratio over `bootstrap` resamplings of the rows (the test universes), i.e. its ±1σ
    range; and `<estimator>_lo` / `_hi`, the same range of each estimator's MAE. An estimator
    missing from `preds` (a run evaluated before it existed) is left out.
    """
    table: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(seed)
    resamples = rng.integers(0, len(true), size=(bootstrap, len(true)))
    estimators = [est for est in ESTIMATORS if est in preds]
    for j, name in enumerate(names):
        errors = {est: np.abs(preds[est][:, j] - true[:, j]) for est in estimators}
        row = {est: float(err.mean()) for est, err in errors.items()}
        for est in estimators[1:]:
            row[f"cnn_over_{est}"] = row["cnn"] / row[est] if row[est] > 0 else math.nan
        if bootstrap:
            cnn = errors["cnn"][resamples].mean(1)
            for est in estimators[1:]:
                with np.errstate(divide="ignore", invalid="ignore"):
                    ratios = cnn / errors[est][resamples].mean(1)
                lo, hi = np.nanpercentile(ratios, [16, 84])
                row[f"cnn_over_{est}_lo"], row[f"cnn_over_{est}_hi"] = float(lo), float(hi)
            for est, err in errors.items():
                lo, hi = np.percentile(err[resamples].mean(1), [16, 84])
                row[f"{est}_lo"], row[f"{est}_hi"] = float(lo), float(hi)
        table[name] = row
    return table


def field_level_metrics(
    *,
    shards_dir: Path,
    names: Sequence[str],
    test: Mapping[str, np.ndarray],
    val: Mapping[str, np.ndarray] | None,
    split: str = "test",
    train_universes: int | None = None,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(metrics, arrays): the CNN against the baselines per crop and per universe, and for the
    gaussian head the coverage of its intervals before and after calibration on validation.

    `test` and `val` hold "mean" (N, P), "true" (N, P), "universe_index" (N,) and, for the
    gaussian head, "var" (N, P); `val` is needed for the gaussian head only. A universe's
    estimate is its crops' mean (point head) or their inverse-variance weighted mean (gaussian).
    `split` names the shard `test` comes from (the baselines predict the same samples);
    `train_universes` (train.universes) the training universes the baselines are fitted on.
    """
    baselines, classical_choice = fit_baselines(shards_dir, split, train_universes=train_universes)
    true, where = test["true"], test["universe_index"]
    crop_preds = {"cnn": test["mean"], **baselines}
    cnn_u, var_u, true_u = universe_estimates(test)
    univ_preds = {"cnn": cnn_u}
    univ_preds |= {est: unc.mean_per_universe(p, where) for est, p in baselines.items()}
    arrays = {f"crop_{est}_unit": p for est, p in crop_preds.items() if est != "cnn"}
    val_u = universe_estimates(val) if val is not None else None
    calibration = None
    if var_u is not None:
        if val is None or val_u is None:
            raise ValueError(
                f"{shards_dir}/val.h5: no validation samples; the gaussian head's calibration "
                "is fitted on them"
            )
        calibration, var_u_cal = _calibration(test, val, val_u, cnn_u, var_u, true_u, names)
        arrays.update(universe_var_unit=var_u_cal, crop_var_unit=test["var"])
    arrays.update(
        {f"universe_{est}_unit": p for est, p in univ_preds.items()},
        universe_true_unit=true_u,
        universes=np.unique(where),  # the universe_index of each universe_* row
    )
    metrics: dict[str, Any] = {
        "comparison": {
            # Few test universes: the ratio's bootstrap range says how far to trust it.
            "per_universe": comparison_table(univ_preds, true_u, names, bootstrap=BOOTSTRAP),
            "per_crop": comparison_table(crop_preds, true, names),
            "num_universes": len(true_u),
            "num_crops": len(true),
            "classical_choice": {
                name: choice._asdict() for name, choice in zip(names, classical_choice, strict=True)
            },
        }
    }
    if calibration is not None:
        metrics["calibration"] = calibration
    if val_u is not None:
        metrics["validation"] = validation_mae(val_u, names)
    return metrics, arrays


def universe_estimates(
    pred: Mapping[str, np.ndarray],
) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """(mean, variance or None, truth) per universe of a split's predictions: a universe's
    estimate is its crops' mean (point head) or their inverse-variance weighted mean with its
    variance (gaussian head, where `pred` has "var")."""
    where = pred["universe_index"]
    true_u = unc.mean_per_universe(pred["true"], where)
    if "var" not in pred:
        return unc.mean_per_universe(pred["mean"], where), None, true_u
    mean_u, var_u = unc.combine_crops(pred["mean"], pred["var"], where)
    return mean_u, var_u, true_u


def validation_mae(
    val_u: tuple[np.ndarray, np.ndarray | None, np.ndarray], names: Sequence[str]
) -> dict[str, Any]:
    """The CNN's unitPar MAE per universe on the validation split (`universe_estimates` of its
    predictions, each universe estimated as the test's are): what a study chooses a learning
    rate by (issue 38: the per-universe MAE, not the loss, which weighs the crops and, for the
    gaussian head, the variances as well)."""
    mean_u, _, true_u = val_u
    err = np.abs(mean_u - true_u).mean(axis=0)  # (P,)
    return {
        "per_universe_mae": dict(zip(names, err.tolist(), strict=True)),
        "mean_per_universe_mae": float(err.mean()),
        "num_universes": len(mean_u),
    }


def _calibration(
    test: Mapping[str, np.ndarray],
    val: Mapping[str, np.ndarray],
    val_u: tuple[np.ndarray, np.ndarray | None, np.ndarray],
    mean_u: np.ndarray,
    var_u: np.ndarray,
    true_u: np.ndarray,
    names: Sequence[str],
) -> tuple[dict[str, Any], np.ndarray]:
    # Scales fitted on validation only, on the coverage they give there: a temperature² for
    # single crops, an inflation factor for the combination of a universe's correlated crops.
    temperature_sq = unc.coverage_scale(val["mean"], val["var"], val["true"])
    inflation = unc.coverage_scale(*val_u)
    var_u_cal = var_u * inflation
    crop_var_cal = test["var"] * temperature_sq
    cases = {
        "per_crop": {
            "before": (test["mean"], test["var"], test["true"]),
            "after": (test["mean"], crop_var_cal, test["true"]),
        },
        "per_universe": {
            "before": (mean_u, var_u, true_u),
            "after": (mean_u, var_u_cal, true_u),
        },
    }
    out: dict[str, Any] = {
        "levels": list(unc.COVERAGE_LEVELS),
        "tolerance": unc.COVERAGE_TOLERANCE,
        "curve_levels": unc.CURVE_LEVELS.tolist(),
        "temperature": np.sqrt(temperature_sq).tolist(),
        "inflation": inflation.tolist(),
    }
    for scope, by_stage in cases.items():
        block: dict[str, Any] = {}
        for stage, (m, v, t) in by_stage.items():
            observed = unc.coverage(m, v, t)
            block[stage] = {
                "coverage": _coverage_by_name(observed, names),
                "curve": unc.coverage(m, v, t, unc.CURVE_LEVELS).T.tolist(),  # (P, L)
                "width68": _by_name(unc.interval_width(v, 0.68), names),
                "nll": _by_name(unc.gaussian_nll(m, v, t), names),
                "miscalibrated": unc.miscalibrated(observed),
            }
        out[scope] = block
    if (num_val := len(val_u[0])) >= 2:
        folds = min(HELD_OUT_FOLDS, num_val)
        val_mean, val_var, val_true = val_u
        held_out = unc.held_out_coverage(val_mean, val_var, val_true, folds=folds)
        out["validation_held_out"] = {
            "folds": folds,
            "num_universes": num_val,
            "coverage": _coverage_by_name(held_out, names),
            "miscalibrated": unc.miscalibrated(held_out),
            # The universes' errors ÷ their calibrated σ: ~1 on validation (the scale is fitted
            # there), and on test whatever its universes' errors make of it.
            "error_rms": {
                "validation": _by_name(
                    unc.error_rms(val_mean, val_var * inflation, val_true), names
                ),
                "test": _by_name(unc.error_rms(mean_u, var_u_cal, true_u), names),
            },
        }
    return out, var_u_cal


def _by_name(values: np.ndarray, names: Sequence[str]) -> dict[str, float]:
    """{parameter: value} of a (P,) array."""
    return dict(zip(names, values.tolist(), strict=True))


def _coverage_by_name(observed: np.ndarray, names: Sequence[str]) -> dict[str, dict[str, float]]:
    """{parameter: {level: share}} of an (L, P) coverage array."""
    return {
        name: {f"{lvl:g}": float(observed[i, j]) for i, lvl in enumerate(unc.COVERAGE_LEVELS)}
        for j, name in enumerate(names)
    }


def plot_calibration(
    calibration: Mapping[str, Any] | None, *, names: Sequence[str], path: str | os.PathLike
) -> None:
    """Observed against expected coverage, per crop and per universe, before and after the
    calibration on validation; the diagonal is perfect calibration. Without `calibration` (the
    point head) the figure says there are no intervals, so the report always has the file."""
    fig = Figure(figsize=(9, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    if calibration is None:
        ax = fig.add_subplot(1, 1, 1)
        ax.axis("off")
        ax.text(0.5, 0.5, "model.head: point — no intervals to calibrate", ha="center")
        fig.savefig(path, dpi=110)
        return
    levels = np.asarray(calibration["curve_levels"])
    for i, scope in enumerate(("per_crop", "per_universe")):
        ax = fig.add_subplot(1, 2, i + 1)
        ax.plot([0, 1], [0, 1], "k--", lw=1)
        for j, name in enumerate(names):
            color = f"C{j}"
            for stage, style in (("before", ":"), ("after", "-")):
                curve = np.asarray(calibration[scope][stage]["curve"][j])
                label = f"{name} ({stage})"
                ax.plot(levels, curve, style, color=color, marker="o", ms=3, label=label)
        ax.set_title(scope.replace("_", " ") + " (test)")
        ax.set_xlabel("expected coverage")
        ax.set_ylabel("observed coverage")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left")
    fig.savefig(path, dpi=110)


def tracker_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Flat MLflow names: univ_mae_pk_<param>, univ_cnn_over_pk_<param>, coverage68_univ_after_…"""
    flat: dict[str, float] = {}
    short = {"per_universe": "univ", "per_crop": "crop"}
    for scope, prefix in short.items():
        for name, row in metrics["comparison"][scope].items():
            for key, value in row.items():
                label = key if key.startswith("cnn_over") else f"mae_{key}"
                flat[f"{prefix}_{label}_{name}"] = value
    calibration = metrics.get("calibration")
    if calibration:
        for scope, prefix in short.items():
            for stage in ("before", "after"):
                coverage = calibration[scope][stage]["coverage"]
                flat |= _coverage_metrics(coverage, f"{prefix}_{stage}")
        held_out = calibration.get("validation_held_out", {}).get("coverage", {})
        flat |= _coverage_metrics(held_out, "univ_val_held_out")
    return {k: float(v) for k, v in flat.items() if math.isfinite(v)}


def _coverage_metrics(coverage: dict[str, dict[str, float]], where: str) -> dict[str, float]:
    """{parameter: {level: share}} → coverage<pct>_<where>_<parameter>: share."""
    return {
        f"coverage{round(100 * float(level))}_{where}_{name}": value
        for name, cov in coverage.items()
        for level, value in cov.items()
    }
