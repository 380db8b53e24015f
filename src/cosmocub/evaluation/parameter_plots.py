"""Evaluation figures: predicted vs true parameters, and training/validation curves per epoch.

Figures are built on matplotlib's object API with the Agg canvas (no pyplot state, no display),
so they are safe in batch jobs and threads.
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

# Axis labels for the cosmoUniverse parameters (physical units).
LABELS = {
    "Omega_m": r"$\Omega_m$",
    "sigma_8": r"$\sigma_8$",
    "N_spec": r"$n_s$",
    "H_0": r"$H_0$ [km/s/Mpc]",
}


def plot_pred_vs_true(
    pred: np.ndarray,
    true: np.ndarray,
    *,
    names: Sequence[str],
    metrics: Mapping[str, Mapping[str, float]],
    path: str | os.PathLike,
    baseline: np.ndarray | None = None,
) -> None:
    """One panel per parameter: predicted vs true (N, P) with the identity line.

    Titles carry the physical-unit MAE, R² and the MAE ratio to the predict-the-mean baseline
    (`metrics[name]` as from evaluate.parameter_metrics); `baseline` (P,) draws that mean.
    """
    pred, true = np.asarray(pred), np.asarray(true)
    num = len(names)
    fig = Figure(figsize=(4.2 * num, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    # Many test samples overlap: fade points as their number grows.
    alpha = float(np.clip(60.0 / max(len(true), 1), 0.35, 0.9))
    for j, name in enumerate(names):
        ax = fig.add_subplot(1, num, j + 1)
        ax.scatter(
            true[:, j], pred[:, j], s=8, alpha=alpha, edgecolors="none", label="test samples"
        )
        lo = float(min(true[:, j].min(), pred[:, j].min()))
        hi = float(max(true[:, j].max(), pred[:, j].max()))
        pad = 0.05 * (hi - lo) if hi > lo else 0.05 * abs(hi) + 1e-6
        ax.plot([lo - pad, hi + pad], [lo - pad, hi + pad], "k--", lw=1, label="identity")
        if baseline is not None:
            ax.axhline(float(baseline[j]), color="tab:red", ls=":", lw=1, label="train mean")
        ax.set_xlim(lo - pad, hi + pad)
        ax.set_ylim(lo - pad, hi + pad)
        ax.set_aspect("equal")
        label = LABELS.get(name, name)
        ax.set_xlabel(f"true {label}")
        ax.set_ylabel(f"predicted {label}")
        m = metrics[name]
        ax.set_title(
            f"{label}\nMAE {m['mae_phys']:.3g}  R² {_fmt(m['r2'])}  "
            f"MAE/baseline {_fmt(m['mae_ratio'])}",
            fontsize=10,
        )
        if j == 0:
            ax.legend(loc="upper left", fontsize=8)
    fig.savefig(Path(path), dpi=110)


def plot_loss_curves(
    records: Sequence[Mapping[str, Any]],
    *,
    path: str | os.PathLike,
    source: str | os.PathLike | None = None,
) -> None:
    """Train/val loss (log scale) and val MAE (mean and per parameter) per epoch.

    `records` are metrics.jsonl objects (epoch, train_loss, val_loss, val_mae, val_mae_<param>);
    with none, the figure states that no training metrics were found (naming `source`).
    """
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax_loss, ax_mae = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    if not records:
        for ax in (ax_loss, ax_mae):
            ax.text(
                0.5,
                0.5,
                f"no training metrics\n({source or 'metrics.jsonl'})",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
        fig.savefig(Path(path), dpi=110)
        return
    epochs = [r.get("epoch", i + 1) for i, r in enumerate(records)]
    for key, style in (("train_loss", "-o"), ("val_loss", "-s")):
        values = _series(records, key)
        if np.isfinite(values).any():
            ax_loss.plot(epochs, values, style, ms=3, label=key.replace("_", " "))
    ax_loss.set_yscale("log")
    ax_loss.set_xlabel("epoch")
    ax_loss.set_ylabel("MSE loss (unitPar)")
    ax_loss.set_title("loss")
    ax_loss.legend(fontsize=8)

    mean_mae = _series(records, "val_mae")
    if np.isfinite(mean_mae).any():
        ax_mae.plot(epochs, mean_mae, "-o", ms=3, lw=2, color="k", label="val MAE (mean)")
    per_param = sorted({k for r in records for k in r if k.startswith("val_mae_")})
    for key in per_param:
        ax_mae.plot(epochs, _series(records, key), lw=1, label=key.removeprefix("val_mae_"))
    ax_mae.set_xlabel("epoch")
    ax_mae.set_ylabel("MAE (unitPar)")
    ax_mae.set_title("validation MAE")
    if ax_mae.lines:
        ax_mae.legend(fontsize=8)
    fig.savefig(Path(path), dpi=110)


def _series(records: Sequence[Mapping[str, Any]], key: str) -> np.ndarray:
    # A missing or null value (e.g. no validation split) becomes a gap, not a zero.
    return np.array([float(r[key]) if r.get(key) is not None else math.nan for r in records])


def _fmt(value: float) -> str:
    return f"{value:.3f}" if math.isfinite(value) else "n/a"
