"""The known-answer study's plot: one mark per seed for every goal's ratio, with its bootstrap
range, the pooled value beside them and the goal's band; and case (c) against the band
bispectrum's own fit with and without the axis-Nyquist modes, per seed."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.io import atomic_path

POOLED = "pooled"


def goal_text(low: float, high: float) -> str:
    """A goal's band as the table and plot write it: ≤ high, ≥ low or in [low, high]."""
    if low == 0:
        return f"≤ {high:g}"
    return f"≥ {low:g}" if math.isinf(high) else f"in [{low:g}, {high:g}]"


def _goal_ratios(parameter: str, base: str, low: float, high: float) -> dict[str, Any]:
    goal = goal_text(low, high)
    return {"parameter": parameter, "base": base, "low": low, "high": high, "goal": goal}


def _bar(row: Mapping[str, Any], key: str) -> list[list[float]]:
    # The bootstrap range as error bars (clipped at 0: a range of one value rounds either way).
    return [[max(row[key] - row[f"{key}_lo"], 0.0)], [max(row[f"{key}_hi"] - row[key], 0.0)]]


def _marks(ax, panels, chosen, pooled, seeds) -> None:
    """Per panel (a ratio of a parameter), a mark per seed with its bootstrap range, the pooled
    value (black) and the goal's band where it has one."""
    step = 0.7 / max(len(seeds), 1)
    for i, panel in enumerate(panels):
        key = f"cnn_over_{panel['base']}"
        for k, seed in enumerate(seeds):
            row = chosen.get((seed, panel["parameter"]))
            if row is None or key not in row:
                continue
            x = i - 0.35 + (k + 0.5) * step
            err = _bar(row, key)
            label = f"seed {seed}" if i == 0 else None
            ax.errorbar(x, row[key], yerr=err, fmt="o", color=f"C{k}", ms=4, capsize=2, label=label)
        if (row := pooled.get(panel["parameter"])) is not None and key in row:
            err = _bar(row, key)
            label = "pooled" if i == 0 else None
            ax.errorbar(
                i + 0.42, row[key], yerr=err, fmt="s", color="k", ms=5, capsize=2, label=label
            )
        if "high" in panel:
            # An open band (≥ low) shaded to twice its end: the axis keeps to the marks.
            top = panel["high"] if math.isfinite(panel["high"]) else 2 * panel["low"]
            band = ([i - 0.45, i + 0.45], panel["low"], top)
            ax.fill_between(*band, color="g", alpha=0.12, lw=0)
    ax.set_xticks(range(len(panels)), [p["label"] for p in panels], fontsize=8)
    ax.axhline(1.0, color="k", lw=0.6)
    ax.grid(alpha=0.3, axis="y")


def plot_study(
    rows: Sequence[Mapping[str, Any]],
    path: str | os.PathLike,
    *,
    goals: Mapping[str, Sequence[tuple[str, float, float]]],
    names: Mapping[str, str],
    cases: Mapping[str, str],
    fits: Sequence[str],
    fit_parameter: str,
) -> None:
    """Left: every goal's ratio (`goals`: parameter -> (baseline, low, high)), CNN ÷ its
    baseline per universe at each seed's selected lr, one mark per seed with its bootstrap ±1σ
    range, the pooled value in black, the goal's band shaded. Right: CNN ÷ each of `fits` on
    `fit_parameter` (the band bispectrum's fits with and without the axis-Nyquist modes),
    likewise."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chosen_rows = [r for r in rows if r.get("selected") == 1 and r["level"] == "universe"]
    chosen = {(r["seed"], r["parameter"]): r for r in chosen_rows}
    pooled = {r["parameter"]: r for r in rows if r.get("seed") == POOLED}
    seeds = list(dict.fromkeys(r["seed"] for r in chosen_rows))
    goal_panels = []
    for name, entries in goals.items():
        for base, low, high in entries:
            panel = _goal_ratios(name, base, low, high)
            panel["label"] = f"{cases[name]}: {name}\n÷ {names[base]} {panel['goal']}"
            goal_panels.append(panel)
    fit_panels = [
        {"parameter": fit_parameter, "base": fit, "label": f"{fit_parameter}\n÷ {names[fit]}"}
        for fit in fits
    ]
    # ~2 inches a panel, so the two-line labels under each stay apart.
    width = 2.0 * (len(goal_panels) + len(fit_panels)) + 1.0
    fig = Figure(figsize=(max(width, 10.0), 4.6), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 2, width_ratios=[len(goal_panels), max(len(fit_panels), 1)])
    left, right = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    _marks(left, goal_panels, chosen, pooled, seeds)
    _marks(right, fit_panels, chosen, pooled, seeds)
    left.set_ylabel("CNN ÷ fit, test MAE per universe")
    left.set_title("Known-answer goals per seed (green: the goal)", fontsize=10)
    right.set_title("Case (c) beside the band bispectrum", fontsize=10)
    for label in right.get_xticklabels():
        label.set_fontsize(7)
    left.legend(fontsize=7, ncol=2)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
