"""The known-answer study: the recipe trained on known-answer universes (universes.source
known_answer), where each parameter sits in a statistic known beforehand, and per case and
parameter the CNN against every classical fit, with the bootstrap ranges of the ratios.

One point per learning rate of `known_answer_study.lrs` (the gather keeps the one with the lowest
final validation loss); every point reads the same shards. What each case should give, stated
before any run (docs/known_answer.md), is in GOALS; the extra section says which are met.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config, ConfigError
from cosmocub.data.known_answer_fields import PARAMETER_CASE, PARAMETERS
from cosmocub.io import atomic_path, format_cell
from cosmocub.studies.accuracy import (
    RANGE_ENDS,
    evaluated_point_rows,
    select_lr_per_group,
    selected_rows,
)
from cosmocub.studies.engine import Point, PointOutputs, StudyDefinition

# The estimators of metrics.json's comparison, and the CNN's ratios to the baselines.
ESTIMATORS = ("cnn", "pk", "one_point", "classical", "mean")
BASELINES = ESTIMATORS[1:]
NAMES = {
    "cnn": "CNN",
    "pk": "P(k) fit",
    "one_point": "one-point fit",
    "classical": "best classical",
    "mean": "predict the mean",
}
# The goals per parameter: (ratio's baseline, lowest, highest), stated before the runs.
GOALS: dict[str, tuple[tuple[str, float, float], ...]] = {
    "amplitude": (("pk", 0.95, 1.1),),
    "slope": (("pk", 0.95, 1.1),),
    "lognormal_sigma": (("one_point", 0.0, 1.05), ("pk", 0.0, 0.7)),
    "f_nl": (("classical", 0.0, 0.5),),
}
COLUMNS = (
    "lr",
    "lr_grid",
    "selected",
    "selected_by",
    "steps",
    "final_val_loss",
    "val_universe_mae",
    "level",
    "case",
    "parameter",
    "count",
    *(f"{e}_mae{end}" for e in ESTIMATORS for end in RANGE_ENDS),
    *(f"cnn_over_{b}{end}" for b in BASELINES for end in RANGE_ENDS),
)


def check_source(cfg: Config) -> None:
    if cfg.universes.source != "known_answer":
        raise ConfigError(
            f"known_answer_study: universes.source is {cfg.universes.source!r}; the study needs "
            "'known_answer' universes (config/known_answer.yaml)"
        )


def lr_points(cfg: Config) -> list[Point]:
    return [
        Point(name=f"lr{lr:g}", labels={"lr": lr}, overrides={"optimizer": {"lr": lr}})
        for lr in cfg.known_answer_study.lrs
    ]


def point_rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    """Per level (universe, sample) and parameter: each estimator's test MAE with its bootstrap
    range (per universe) and the CNN's ratio to each baseline with its range, as the accuracy
    studies read them, with the parameter's case."""
    rows = [
        r
        for r in evaluated_point_rows(outputs, estimators=ESTIMATORS)
        if r["parameter"] != "mean"  # the cases' parameters average to nothing
    ]
    if other := sorted({r["parameter"] for r in rows} - set(PARAMETERS)):
        raise ValueError(
            f"{outputs.eval_dir}/metrics.json: parameters {other}, not the known-answer "
            f"universes' {list(PARAMETERS)} (evaluated by an older cosmocub: rerun the evaluation)"
        )
    return [{**r, "case": PARAMETER_CASE[r["parameter"]]} for r in rows]


def select_lr(rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    lrs = cfg.known_answer_study.lrs
    return select_lr_per_group(rows, group="level", grid=lambda _: lrs, budget_key="train")


def goal_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The goals of GOALS against the selected point's per-universe ratios."""
    lines = [
        "| case | parameter | goal | measured (16–84 %) | met |",
        "|---|---|---|---|---|",
    ]
    chosen = {r["parameter"]: r for r in selected_rows(rows) if r["level"] == "universe"}
    for name, goals in GOALS.items():
        row = chosen.get(name)
        for base, low, high in goals:
            goal = f"CNN ÷ {NAMES[base]} " + (f"≤ {high:g}" if low == 0 else f"in [{low}, {high}]")
            if row is None:
                lines.append(f"| {PARAMETER_CASE[name]} | {name} | {goal} | not run | |")
                continue
            value = row[f"cnn_over_{base}"]
            lo, hi = row[f"cnn_over_{base}_lo"], row[f"cnn_over_{base}_hi"]
            met = "yes" if low <= value <= high else "no"
            measured = f"{format_cell(value, digits=3)} ({lo:.2f}–{hi:.2f})"
            lines.append(f"| {PARAMETER_CASE[name]} | {name} | {goal} | {measured} | {met} |")
    return lines


def extra_section(rows: Sequence[Mapping[str, Any]], cfg: Config) -> str:
    return "\n".join(
        [
            "### The known-answer goals (per universe, at the selected learning rate)",
            "",
            *goal_lines(rows),
            "",
        ]
    )


def plot_study(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Per parameter, at the selected learning rate: every estimator's per-universe test MAE
    with its bootstrap ±1σ range, as bars."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chosen = [r for r in selected_rows(rows) if r["level"] == "universe"]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    width = 0.8 / len(ESTIMATORS)
    for k, est in enumerate(ESTIMATORS):
        xs = [i + (k - (len(ESTIMATORS) - 1) / 2) * width for i in range(len(chosen))]
        ys = [r[f"{est}_mae"] for r in chosen]
        err = [
            [y - r[f"{est}_mae_lo"] for y, r in zip(ys, chosen, strict=True)],
            [r[f"{est}_mae_hi"] - y for y, r in zip(ys, chosen, strict=True)],
        ]
        ax.bar(xs, ys, width, yerr=err, color=f"C{k}", label=NAMES[est], capsize=2)
    ax.set_xticks(range(len(chosen)), [f"{r['case']}: {r['parameter']}" for r in chosen])
    ax.set_ylabel("test MAE per universe (unitPar)")
    ax.set_title("Known-answer fields: the CNN against the classical fits", fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out = {}
    for r in rows:
        if r["level"] == "universe":
            for base in BASELINES:
                out[f"univ_cnn_over_{base}_{r['parameter']}"] = r[f"cnn_over_{base}"]
    return out


STUDY = StudyDefinition(
    name="known_answer",
    config_key="known_answer_study",
    columns=COLUMNS,
    points=lr_points,
    rows=point_rows,
    plot=plot_study,
    point_metrics=point_metrics,
    evaluate=True,
    finish=select_lr,
    extra_section=extra_section,
    check=check_source,
    description=(
        "Known-answer fields (docs/known_answer.md): per case and parameter, the per-universe "
        "and per-crop test MAE (unitPar) of the CNN, the P(k) and one-point ridge fits, the best "
        "classical fit (P(k), one-point or both with the bispectrum, chosen on validation) and "
        "predict-the-mean, with bootstrap ±1σ ranges over the test universes (`_lo`, `_hi`), and "
        "the CNN's ratio to each; `selected` = 1 on the lr with the lowest per-universe "
        "validation MAE (`selected_by`; the final validation loss for points evaluated "
        "without it)."
    ),
)
