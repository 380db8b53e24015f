"""The baselines a CNN is judged against: predict-the-mean, and cross-validated ridge fits on the
shards' field statistics (one-point statistics; the power spectrum), fitted on the training
split only.

scikit-learn does the regression: standardised features, then RidgeCV, which picks the penalty
per parameter by efficient leave-one-out on the training samples.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

from cosmocub.data.features import FEATURES_FILE, read_features
from cosmocub.data.shard_file import first_universe_rows

# Feature set of each fitted baseline (datasets of features.h5).
BASELINE_FEATURES = {"one_point": "one_point", "pk": "pk"}
RIDGE_ALPHAS = np.logspace(-3, 4, 15)


def usable_columns(features: np.ndarray) -> np.ndarray:
    """Columns finite in every row: bins with no mode (NaN) or empty ones (log 0) drop out."""
    return np.all(np.isfinite(features), axis=0)


def fit_ridge(features: np.ndarray, targets: np.ndarray) -> Pipeline:
    """StandardScaler → RidgeCV (one penalty per target) fitted on (N, F) → (N, P)."""
    if features.shape[0] != targets.shape[0] or features.shape[0] < 3:
        raise ValueError(
            f"fit_ridge: {features.shape[0]} feature rows and {targets.shape[0]} targets; need "
            "as many, and at least 3"
        )
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=RIDGE_ALPHAS, alpha_per_target=True))
    return model.fit(features, targets)


def _targets(shard: Path) -> np.ndarray:
    with h5py.File(shard, "r") as f:
        return f["y"][:].astype(np.float64)


def baseline_predictions(
    shards_dir: Path, split: str, *, train_universes: int | None = None
) -> dict[str, np.ndarray]:
    """Each baseline's (N, P) unitPar predictions for `split`, every fit made on train only.

    "mean" predicts the training targets' mean; "one_point" and "pk" are ridge fits on the
    features of features.h5. Only the training split's targets are read; with
    `train_universes` (the key train.universes) only those of its first universes, the ones
    the CNN trained on.
    """
    shards_dir = Path(shards_dir)
    features_path = shards_dir / FEATURES_FILE
    y_train = _targets(shards_dir / "train.h5")
    train = read_features(features_path, "train")
    rows = first_universe_rows(shards_dir / "train.h5", train_universes)
    if rows is not None:
        y_train, train = y_train[rows], {k: v[rows] for k, v in train.items()}
    target = read_features(features_path, split)
    n = target["pk"].shape[0]
    out = {"mean": np.broadcast_to(y_train.mean(axis=0), (n, y_train.shape[1])).copy()}
    for name, dataset in BASELINE_FEATURES.items():
        out[name] = ridge_predictions(train[dataset], y_train, target[dataset])
    return out


def ridge_predictions(
    train_features: np.ndarray, train_targets: np.ndarray, features: np.ndarray
) -> np.ndarray:
    """(N, P) predictions for `features` of a `fit_ridge` on the training rows, over the columns
    finite in every training row."""
    keep = usable_columns(train_features)
    model = fit_ridge(train_features[:, keep], train_targets)
    if len(features) == 0:
        return np.zeros((0, train_targets.shape[1]))
    # A sample with a non-finite feature (an empty crop's log P) gets the column's train mean.
    x = np.where(np.isfinite(features[:, keep]), features[:, keep], model[0].mean_)
    return model.predict(x).reshape(len(x), train_targets.shape[1])  # (N,) for one target
