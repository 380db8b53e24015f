"""Linear probes: where a trained CosmoFlow's knowledge of each parameter sits. Ridges (the
baselines' own, `baselines.ridge_predictions`), fitted on the training split, on what the model
computes, and their per-sample test MAE per parameter beside the model's own on every split.

- "model <split>": the model itself;
- "last layer input": what its output layer reads (the last hidden layer, and with the pooled
  branch joined there, the pooled statistics);
- "tap <name>": the pooled branch's statistics of one tap
  (models.statistics_branch.tap_channels), and "all taps" together; each as the branch takes
  them (before its normalisation: a ridge standardises its features itself).

A parameter the model misses but a ridge on one of these reads is lost in the readout (its
head, its training); one that no ridge on them reads never reached its features. Whole boxes
(one sample a universe) give per-universe errors. docs/explanation/known_answer.md ("Over seeds")
reads
the Gaussian slope with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
import torch
from torch.utils.data import DataLoader

from cosmocub.data.dataset import open_split
from cosmocub.evaluation.baselines import ridge_predictions
from cosmocub.models.statistics_branch import tap_channels

SPLITS = ("train", "val", "test")


def split_outputs(
    model: torch.nn.Module, shards: str | os.PathLike, split: str, hook_on: torch.nn.Module
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(predicted means, targets, the input of `hook_on`) over a split's samples, in order."""
    captured: list[np.ndarray] = []

    def keep(module: torch.nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        first = inputs[0]  # the pooled branch takes its taps' statistics as a list
        first = torch.cat(first, dim=1) if isinstance(first, list) else first
        captured.append(first.float().numpy().copy())

    handle = hook_on.register_forward_hook(keep)
    preds, targets = [], []
    try:
        with torch.inference_mode():
            for x, y in DataLoader(open_split(shards, split, model.config), batch_size=32):
                preds.append(model(x).float().numpy()[:, : y.shape[1]])
                targets.append(y.numpy())
    finally:
        handle.remove()
    return np.concatenate(preds), np.concatenate(targets), np.concatenate(captured)


def _mae(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    return np.abs(pred - true).mean(axis=0)


def probe_maes(model: torch.nn.Module, shards: str | os.PathLike) -> dict[str, np.ndarray]:
    """{probe: per-parameter MAE} (module docstring): the model on every split, then ridges
    fitted on the training split and scored on the test split."""
    model = model.eval()
    last = [m for m in model.modules() if isinstance(m, torch.nn.Linear)][-1]
    out = {s: split_outputs(model, shards, s, last) for s in SPLITS}
    maes = {f"model {s}": _mae(pred, true) for s, (pred, true, _) in out.items()}
    (_, y_train, x_train), (_, y_test, x_test) = out["train"], out["test"]
    maes["last layer input"] = _mae(ridge_predictions(x_train, y_train, x_test), y_test)
    pooled = getattr(model, "pooled", None)
    if pooled is None:
        return maes
    taps = {s: split_outputs(model, shards, s, pooled)[2] for s in ("train", "test")}
    widths = tap_widths(model.config)
    start = 0
    for name, width in widths.items():
        cols = slice(start, start + width)
        start += width
        probe = ridge_predictions(taps["train"][:, cols], y_train, taps["test"][:, cols])
        maes[f"tap {name}"] = _mae(probe, y_test)
    maes["all taps"] = _mae(ridge_predictions(taps["train"], y_train, taps["test"]), y_test)
    return maes


def tap_widths(cfg) -> Mapping[str, int]:
    """Columns of each tap in the pooled branch's concatenated statistics: its per-channel
    statistics times its channels, and for the input tap its spectrum's bins besides."""
    widths = {name: cfg.pooled.per_channel * c for name, c in tap_channels(cfg).items()}
    if "input" in widths:
        spectra = 1 + int(cfg.pooled.counts_spectrum)
        widths["input"] += spectra * cfg.pooled.spectrum_bins * cfg.in_channels
    return widths
