"""The baselines a CNN is judged against: predict-the-mean, cross-validated ridge fits on the
shards' field statistics (one-point statistics; the power spectrum), and the best classical fit,
all fitted on the training split only.

The regression is data/ridge.py's: standardised features, then RidgeCV, which picks the penalty
per parameter by efficient leave-one-out on the training samples. The best classical fit
("classical") chooses per parameter, on the validation split, among ridge fits on P(k), on the
one-point statistics and on all of them together (with the log-density P(k) and the bispectrum
where features.h5 has them), and their penalties: its coefficients come from the training rows
alone.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import NamedTuple

import h5py
import numpy as np
from sklearn.linear_model import Ridge
from sklearn.preprocessing import StandardScaler

from cosmocub.data.features import FEATURE_SETS, FEATURES_FILE, read_features
from cosmocub.data.ridge import RIDGE_ALPHAS, fit_ridge
from cosmocub.data.shard_file import first_universe_rows

log = logging.getLogger(__name__)

# Feature set of each fitted baseline (datasets of features.h5).
BASELINE_FEATURES = {"one_point": "one_point", "pk": "pk"}


def usable_columns(features: np.ndarray) -> np.ndarray:
    """Columns finite in every row: bins with no mode (NaN) or empty ones (log 0) drop out."""
    return np.all(np.isfinite(features), axis=0)


def _targets(shard: Path) -> np.ndarray:
    with h5py.File(shard, "r") as f:
        return f["y"][:].astype(np.float64)


class ClassicalChoice(NamedTuple):
    """What the best classical fit chose for one parameter on validation."""

    feature_set: str  # a name of `feature_sets`
    features: tuple[str, ...]  # its datasets of features.h5
    penalty: float  # the ridge's alpha


def baseline_predictions(
    shards_dir: Path, split: str, *, train_universes: int | None = None
) -> dict[str, np.ndarray]:
    """Each baseline's (N, P) unitPar predictions for `split` (`fit_baselines` without the best
    classical fit's choices)."""
    return fit_baselines(shards_dir, split, train_universes=train_universes)[0]


def fit_baselines(
    shards_dir: Path, split: str, *, train_universes: int | None = None
) -> tuple[dict[str, np.ndarray], list[ClassicalChoice]]:
    """Each baseline's (N, P) unitPar predictions for `split`, every fit made on train only, and
    per parameter the feature set and penalty the best classical fit chose.

    "mean" predicts the training targets' mean; "one_point" and "pk" are ridge fits on the
    features of features.h5; "classical" the best classical fit (`classical_predictions`).
    Only the training split's targets are fitted; with `train_universes` (the key
    train.universes) only those of its first universes, the ones the CNN trained on; the
    validation split's choose the classical fit's features and penalty.
    """
    shards_dir = Path(shards_dir)
    features_path = shards_dir / FEATURES_FILE
    y_train = _targets(shards_dir / "train.h5")
    train = read_features(features_path, "train")
    if "log_pk" not in train:
        log.warning(
            "%s has no log_pk (written before the log-density P(k) existed): the best classical "
            "fit goes without it; `cosmocub features --shards %s` adds it",
            features_path,
            shards_dir,
        )
    rows = first_universe_rows(shards_dir / "train.h5", train_universes)
    if rows is not None:
        y_train, train = y_train[rows], {k: v[rows] for k, v in train.items()}
    target = read_features(features_path, split)
    n = target["pk"].shape[0]
    out = {"mean": np.broadcast_to(y_train.mean(axis=0), (n, y_train.shape[1])).copy()}
    for name, dataset in BASELINE_FEATURES.items():
        out[name] = ridge_predictions(train[dataset], y_train, target[dataset])
    val = read_features(features_path, "val")
    y_val = _targets(shards_dir / "val.h5")
    out["classical"], choice = classical_predictions(
        {k: (train[k], y_train) for k in train},
        {k: (val[k], y_val) for k in val},
        target,
    )
    return out, choice


def feature_sets(available: set[str] | list[str]) -> dict[str, tuple[str, ...]]:
    """The classical fit's candidate feature sets: P(k), one-point, and everything together (the
    log-density P(k) and the bispectrum where the features file has them)."""
    combined = tuple(name for name in FEATURE_SETS if name in available)
    return {"pk": ("pk",), "one_point": ("one_point",), "combined": combined}


def classical_predictions(
    train: dict[str, tuple[np.ndarray, np.ndarray]],
    val: dict[str, tuple[np.ndarray, np.ndarray]],
    target: dict[str, np.ndarray],
    *,
    alphas: np.ndarray = RIDGE_ALPHAS,
) -> tuple[np.ndarray, list[ClassicalChoice]]:
    """The best classical fit's (N, P) predictions for `target`'s features, and per parameter
    its choice of feature set and penalty: every candidate (`feature_sets` × `alphas`) is a
    ridge fitted on the training rows (`train`: set name → (features, targets)); each parameter
    takes the one with the lowest MAE on the validation rows (`val`, the same form)."""
    y_train = next(iter(train.values()))[1]
    y_val = next(iter(val.values()))[1]
    if len(y_val) == 0:
        raise ValueError("classical_predictions: the validation split holds no rows to choose on")
    n, p = len(next(iter(target.values()))), y_train.shape[1]
    best_mae = np.full(p, np.inf)
    choice: list[ClassicalChoice] = [ClassicalChoice("", (), 0.0)] * p
    out = np.zeros((n, p))
    for set_name, names in feature_sets(list(train)).items():
        x_train = np.hstack([train[k][0] for k in names])
        keep = usable_columns(x_train)
        scaler = StandardScaler().fit(x_train[:, keep])
        x_val, x_target = (
            scaler.transform(_fill(np.hstack([rows[k] for k in names])[:, keep], scaler.mean_))
            for rows in ({k: v[0] for k, v in val.items()}, target)
        )
        x_train = scaler.transform(x_train[:, keep])
        for alpha in alphas:
            model = Ridge(alpha=float(alpha)).fit(x_train, y_train)
            mae = np.abs(model.predict(x_val).reshape(-1, p) - y_val).mean(axis=0)
            better = mae < best_mae
            if better.any() and n:
                out[:, better] = model.predict(x_target).reshape(n, p)[:, better]
            best_mae = np.where(better, mae, best_mae)
            chosen = ClassicalChoice(set_name, names, float(alpha))
            choice = [chosen if b else c for b, c in zip(better, choice, strict=True)]
    return out, choice


def _fill(features: np.ndarray, means: np.ndarray) -> np.ndarray:
    # A sample with a non-finite feature (an empty crop's log P) gets the column's train mean.
    return np.where(np.isfinite(features), features, means)


def ridge_predictions(
    train_features: np.ndarray, train_targets: np.ndarray, features: np.ndarray
) -> np.ndarray:
    """(N, P) predictions for `features` of a `fit_ridge` on the training rows, over the columns
    finite in every training row."""
    keep = usable_columns(train_features)
    model = fit_ridge(train_features[:, keep], train_targets)
    if len(features) == 0:
        return np.zeros((0, train_targets.shape[1]))
    x = _fill(features[:, keep], model[0].mean_)
    return model.predict(x).reshape(len(x), train_targets.shape[1])  # (N,) for one target
