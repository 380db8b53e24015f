"""The ridge regression every linear fit on field statistics uses: the evaluation's classical
baselines (evaluation/baselines.py) and the fixed linear start of a CosmoFlow on its input tap
(model.pooled.tap_ridge, train/ridge_start.py), so that the two are the same estimator.

scikit-learn does it: standardised features, then RidgeCV, which picks the penalty per target
by efficient leave-one-out on the rows it is given.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import RidgeCV
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler

RIDGE_ALPHAS = np.logspace(-3, 4, 15)


def fit_ridge(features: np.ndarray, targets: np.ndarray) -> Pipeline:
    """StandardScaler → RidgeCV (one penalty per target) fitted on (N, F) → (N, P)."""
    if features.shape[0] != targets.shape[0] or features.shape[0] < 3:
        raise ValueError(
            f"fit_ridge: {features.shape[0]} feature rows and {targets.shape[0]} targets; need "
            "as many, and at least 3"
        )
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=RIDGE_ALPHAS, alpha_per_target=True))
    return model.fit(features, targets)


def affine_coefficients(model: Pipeline) -> tuple[np.ndarray, np.ndarray]:
    """(weight (P, F), bias (P,)) of a `fit_ridge` model on the raw features: its prediction is
    features @ weight.T + bias."""
    scaler, ridge = model.named_steps["standardscaler"], model.named_steps["ridgecv"]
    weight = np.atleast_2d(ridge.coef_) / scaler.scale_  # (P, F)
    bias = np.atleast_1d(ridge.intercept_) - weight @ scaler.mean_
    return weight, bias
