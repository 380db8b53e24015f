"""The prediction loop of evaluation: a model's outputs over a split in order, averaged over the
cube's symmetries, as point predictions or (gaussian head) means and variances.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from cosmocub.data.augment import cube_symmetry
from cosmocub.models.heads import split_output, variance
from cosmocub.models.memory_layout import memory_format


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
