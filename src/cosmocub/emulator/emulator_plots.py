"""Figures of a U-Net evaluation: slices, P(k) with transfer and r(k), and the one-point PDF.

matplotlib's object API on the Agg canvas, as cosmocub.evaluation.parameter_plots (safe in batch
jobs).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import NullFormatter


def plot_slices(
    n_input: np.ndarray,
    n_true: np.ndarray,
    n_pred: np.ndarray,
    *,
    z_in: float,
    z_out: float,
    path: str | os.PathLike,
) -> None:
    """The middle depth slice of one test sample: input, truth, prediction and residual, in
    log(1 + counts)."""
    mid = n_true.shape[0] // 2
    panels = [
        (f"input z={z_in:g}", np.log1p(np.clip(n_input[mid], 0, None))),
        (f"truth z={z_out:g}", np.log1p(np.clip(n_true[mid], 0, None))),
        ("prediction", np.log1p(np.clip(n_pred[mid], 0, None))),
    ]
    vmax = max(float(p.max()) for _, p in panels)
    fig = Figure(figsize=(16, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    for j, (title, image) in enumerate(panels):
        ax = fig.add_subplot(1, 4, j + 1)
        im = ax.imshow(image, vmin=0, vmax=vmax, cmap="magma")
        ax.set_title(title)
        ax.set_axis_off()
    fig.colorbar(im, ax=fig.axes, shrink=0.8, label="log(1 + counts)")
    residual = panels[2][1] - panels[1][1]
    ax = fig.add_subplot(1, 4, 4)
    lim = float(np.abs(residual).max()) or 1.0
    im = ax.imshow(residual, vmin=-lim, vmax=lim, cmap="RdBu_r")
    ax.set_title("prediction − truth")
    ax.set_axis_off()
    fig.colorbar(im, ax=ax, shrink=0.8)
    fig.savefig(path, dpi=100)


def plot_power(
    metrics: dict[str, Any],
    sums: dict[str, np.ndarray],
    shot: dict[str, float],
    *,
    num_samples: int,
    path: str | os.PathLike,
) -> None:
    """P(k) of truth, model and baseline (shot noise subtracted, as the transfer and r(k)), the
    raw truth and its shot-noise level; the transfer P/P_true; r(k), raw dotted; k_N/2 marked."""
    k = np.asarray(metrics["k"])
    half = 0.5 * metrics["k_nyquist"]
    fig = Figure(figsize=(15, 4.4), layout="constrained")
    FigureCanvasAgg(fig)
    ax_p, ax_t, ax_r = (fig.add_subplot(1, 3, j) for j in (1, 2, 3))
    for key, label, style in (
        ("tt", "truth", "k-"),
        ("pp", "U-Net", "C0-o"),
        ("bb", "linear growth", "C3--"),
    ):
        ax_p.loglog(k, (sums[key] - shot.get(key, 0.0)) / num_samples, style, ms=3, label=label)
    ax_p.loglog(k, sums["tt"] / num_samples, "k:", label="truth, raw")
    ax_p.axhline(shot["tt"] / num_samples, color="0.6", lw=1, label="truth shot noise")
    ax_p.set_ylabel(r"$P(k)$ [(Mpc/h)$^3$]")
    for name, label, style in (("model", "U-Net", "C0-o"), ("baseline", "linear growth", "C3--")):
        ax_t.semilogx(k, metrics[f"transfer_{name}"], style, ms=3, label=label)
        ax_r.semilogx(k, metrics[f"r_{name}"], style, ms=3, label=label)
        ax_r.semilogx(k, metrics["raw"][f"r_{name}"], style[:2] + ":", lw=1, label=f"{label}, raw")
    ax_t.axhspan(0.9, 1.1, color="0.9")
    ax_t.set_ylabel(r"$P_{pred}/P_{true}$")
    ax_r.axhline(0.9, color="0.5", lw=1)
    ax_r.set_ylabel(r"$r(k) = P_{pt}/\sqrt{P_{pp}P_{tt}}$")
    lowest = np.nanmin([metrics["r_baseline"], metrics["raw"]["r_baseline"]])
    ax_r.set_ylim(min(0.0, float(lowest)), 1.1)
    for ax in (ax_p, ax_t, ax_r):
        ax.axvline(half, color="0.5", ls=":", lw=1, label=r"$k_N/2$")
        ax.set_xlabel(r"$k$ [h/Mpc]")
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels overlap on short k ranges
        ax.legend(fontsize=8)
    ax_p.set_title(f"power spectra ({num_samples} test samples)")
    ax_t.set_title("transfer")
    ax_r.set_title("cross-correlation")
    fig.savefig(path, dpi=100)


def plot_pdf(edges: np.ndarray, pdfs: dict[str, np.ndarray], *, path: str | os.PathLike) -> None:
    """One-point PDF of log(1 + counts) of truth, model and baseline."""
    centres = 0.5 * (edges[1:] + edges[:-1])
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for name, style in (("truth", "k-"), ("model", "C0-"), ("baseline", "C3--")):
        ax.semilogy(centres, pdfs[name], style, label=name)
    ax.set_xlabel("log(1 + counts)")
    ax.set_ylabel("PDF")
    ax.set_title("one-point PDF (test split)")
    ax.legend(fontsize=8)
    fig.savefig(path, dpi=100)
