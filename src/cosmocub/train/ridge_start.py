"""model.pooled.tap_ridge: fit a CosmoFlow's fixed linear start on the training universes.

The means of a CosmoFlow with the input tap are tanh(ridge + network) · output_scale, where the
ridge is a regression of the parameters on the tap's statistics (its moments, and its log power
spectrum with spectrum_bins): data/ridge.py's estimator, the one the classical baselines use.
It is fitted here once, before the first step, and held fixed; the network, whose output means
start at zero, learns what it leaves. So at step 0 the model is the ridge, and how far training
takes it below is what the convolutions add to the statistics the head also reads.
"""

from __future__ import annotations

import logging

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from cosmocub.data.ridge import affine_coefficients, fit_ridge
from cosmocub.models.cosmoflow import CosmoFlow

log = logging.getLogger(__name__)

# |target| / output_scale is clipped below 1 before atanh, so that a target at the scale's edge
# gives a finite pre-tanh value (unitPar in [-1, 1) and the default scale 1.2 never reach it).
MAX_TANH = 1.0 - 1e-6


@torch.no_grad()
def fit_tap_ridge(
    model: CosmoFlow, train_set: Dataset, *, batch_size: int, device: torch.device
) -> dict[str, np.ndarray]:
    """Fit `model.pooled.ridge` on every sample of `train_set` (as stored: the tap's statistics
    do not change under the cube symmetries or a periodic shift) and, with the gaussian head,
    start the log-variances at the ridge's residual variance on them. Every rank does the same
    and gets the same fit, with no communication. Returns the ridge's per-parameter mean
    absolute error and penalty on the training samples."""
    ridge, cfg = model.pooled.ridge, model.config
    # A generator of its own: the loader's iterator draws a seed, and from the global RNG it
    # would shift every draw after it (dropout masks) against a run without the fit.
    loader = DataLoader(train_set, batch_size=batch_size, generator=torch.Generator())
    stats, targets = [], []
    for x_bcdhw, y_bp in loader:  # the tap's moments and spectrum: no train/eval difference
        stats.append(model.pooled.input_statistics(x_bcdhw.to(device).float()).double().cpu())
        targets.append(y_bp.double())
    features = torch.cat(stats).numpy()  # (N, F)
    y = torch.cat(targets).numpy()  # (N, P)
    if not np.all(np.isfinite(features)):
        bad = np.flatnonzero(~np.all(np.isfinite(features), axis=0)).tolist()
        raise ValueError(
            f"model.pooled.tap_ridge: the input tap's statistics of the training samples are "
            f"not finite in columns {bad} of {features.shape[1]}"
        )
    scale = cfg.output_scale
    fit = fit_ridge(features, np.arctanh(np.clip(y / scale, -MAX_TANH, MAX_TANH)))
    weight, bias = affine_coefficients(fit)
    ridge.set_fit(torch.from_numpy(weight).float(), torch.from_numpy(bias).float())
    predicted = np.tanh(features @ weight.T + bias) * scale
    residual = predicted - y
    if cfg.gaussian:
        p = cfg.num_outputs
        variance = np.maximum(residual.var(axis=0), 1e-8)
        model.head.output.bias[p:].copy_(torch.from_numpy(np.log(variance)))
    mae = np.abs(residual).mean(axis=0)
    penalty = np.atleast_1d(fit.named_steps["ridgecv"].alpha_)
    log.info(
        "tap_ridge: fitted on %d training samples, %d statistics; training MAE %s, penalty %s",
        len(y),
        features.shape[1],
        np.array2string(mae, precision=4),
        np.array2string(penalty, precision=3),
    )
    return {"train_mae": mae, "penalty": penalty}
