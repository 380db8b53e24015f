"""The network study: every optimizer variant at every link rate on emulated nodes
(cosmocub.netemu), one training each, and how much sooner each reaches the reference's final
validation loss than the reference (Lion) does at the same rate. With `runner: local` the points
run on a scheduler's nodes instead (`cosmocub launch`, srun on Slurm), at the cluster's one rate,
which labels them and which cosmocub does not set (`rate_set_by_runner` false).

Points are `<variant>_<rate>mbit` (rate 0 = unshaped, still on the emulated network), with
`_seed<s>` after it when the study has several `seeds` (train.seed: initial weights, data order;
every point trains on the same shards). Each seed is its own comparison: its target, times and
speedups are against the reference's run of the same seed, and the report's second table gives
each variant and rate over the seeds (median [min, max]). Validation
losses are noisy (a small validation set), so the target is set and met on a smoothed curve: the
trailing mean over `target_smoothing` = k evaluations (k = min(that, the reference's evaluations)),
defined from a run's k-th evaluation on. The target is the reference variant's last smoothed loss
on its unshaped run (or on its run at the first rate when 0 is not among the rates);
`time_to_target_s` is the wall time since training start (metrics.jsonl `elapsed_s`, validation
included) of the first evaluation whose smoothed loss is at or below it, blank if none is. Beside
each speedup stands the reference's exchange share of its step at that rate (exchange_s /
step_s), which places a point among real clusters: a CPU rank computes far slower than a GPU, so
a link rate here is not a cluster's.
"""

from __future__ import annotations

import math
import os
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import Config, NetworkStudyConfig, optimizer_variant
from cosmocub.contention.marks import CONDITION_COLUMNS
from cosmocub.io import atomic_path
from cosmocub.studies.engine import (
    Point,
    PointOutputs,
    StudyDefinition,
    step_weighted_mean_after_first,
    training_row,
)
from cosmocub.studies.launch_plan import PointLaunch
from cosmocub.studies.training_columns import COMM_BYTES_COLUMNS, STEP_TIME_COLUMNS

COLUMNS = (
    "variant",
    "rate_mbit",
    "seed",
    "nodes",
    "ranks_per_node",
    "cores_per_rank",
    "world_size",
    "data",
    "steps",
    *STEP_TIME_COLUMNS,
    *COMM_BYTES_COLUMNS,
    "wire_bytes_per_step",
    "wire_over_counted",
    "rate_set_by_runner",
    "final_val_loss",
    "final_val_loss_smoothed",
    "target_val_loss",
    "time_to_target_s",
    "speedup_vs_reference",
    "step_speedup_vs_reference",
    "reference_exchange_share",
    *CONDITION_COLUMNS,
    "skipped",
)


def point_name(variant: str, mbit: float, seed: int | None = None) -> str:
    """`<variant>_<rate>mbit`, then `_seed<s>` where the study has several seeds."""
    return f"{variant}_{mbit:g}mbit" + (f"_seed{seed}" if seed is not None else "")


def points(cfg: Config) -> list[Point]:
    study = cfg.network_study
    out = []
    for variant, settings in study.variants.items():
        # A whole optimizer section: the base's options for another optimizer do not apply; the
        # base's schedule is kept.
        optimizer = optimizer_variant(cfg.values["optimizer"], settings.section)
        if study.lr is not None:
            optimizer["lr"] = study.lr
        overrides = {
            "model": study.model,
            "optimizer": optimizer,
            "parallel": {"spatial": 1, "split": None},
            "train": {
                "ranks_per_node": study.ranks_per_node,
                "epochs": study.epochs,
                "max_steps_per_epoch": study.max_steps_per_epoch,
                "local_batch_size": study.local_batch_size,
            },
        }
        for mbit in study.rates_mbit:
            for seed in study.seeds:
                named_seed = seed if len(study.seeds) > 1 else None
                out.append(
                    Point(
                        name=point_name(variant, mbit, named_seed),
                        overrides={**overrides, "train": {**overrides["train"], "seed": seed}},
                        labels={"variant": variant, "rate_mbit": mbit, "seed": seed},
                        launch=PointLaunch(
                            nodes=study.nodes,
                            ranks_per_node=study.ranks_per_node,
                            rate_mbit=mbit,
                        ),
                        runner=study.runner,
                    )
                )
    return out


def rows(outputs: PointOutputs, cfg: Config) -> list[dict[str, Any]]:
    row = training_row(outputs)
    # False: the rate is the cluster's, as the config says it is, not shaped by cosmocub.
    row["rate_set_by_runner"] = outputs.record().get("rate_set_by_runner")
    epochs = outputs.metrics()
    row["wire_bytes_per_step"] = step_weighted_mean_after_first(epochs, "wire_bytes_per_step")
    if row["wire_bytes_per_step"] is not None and row["comm_bytes_per_step"]:
        row["wire_over_counted"] = row["wire_bytes_per_step"] / row["comm_bytes_per_step"]
    # Not a column: finish() reads the validation curve for the time to target.
    row["_curve"] = [(e["elapsed_s"], e["val_loss"]) for e in epochs if "elapsed_s" in e]
    return [row]


def smoothed(curve: Sequence[tuple[float, float]], k: int) -> list[tuple[float, float]]:
    """(time, trailing mean of the last k losses) from the curve's k-th evaluation on."""
    losses = [loss for _, loss in curve]
    return [(curve[i][0], sum(losses[i + 1 - k : i + 1]) / k) for i in range(k - 1, len(curve))]


def time_to(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """Wall time of the first validation at or below target (None: never)."""
    return next((t for t, loss in curve if loss <= target), None)


def finish(all_rows: list[dict[str, Any]], cfg: Config) -> list[dict[str, Any]]:
    """Per seed: the target from that seed's reference run, and every point against the
    reference's run of its seed at its rate."""
    study = cfg.network_study
    measured = [r for r in all_rows if not r.get("skipped")]
    for seed in dict.fromkeys(r.get("seed") for r in measured):
        _finish_seed([r for r in measured if r.get("seed") == seed], study)
    return all_rows


def _finish_seed(measured: list[dict[str, Any]], study: NetworkStudyConfig) -> None:
    rates = list(study.rates_mbit)
    ref_rate = 0 if 0 in rates else rates[0]
    by_key = {(r["variant"], r["rate_mbit"]): r for r in measured}
    reference = by_key.get((study.reference, ref_rate))
    k = study.target_smoothing
    if reference is not None and reference["_curve"]:
        k = min(k, len(reference["_curve"]))
    curves = {id(r): smoothed(r.pop("_curve"), k) for r in measured}
    for r in measured:
        r["final_val_loss_smoothed"] = curves[id(r)][-1][1] if curves[id(r)] else None
    target = reference["final_val_loss_smoothed"] if reference else None
    for r in measured:
        r["target_val_loss"] = target
        r["time_to_target_s"] = time_to(curves[id(r)], target) if target is not None else None
    for r in measured:
        ref = by_key.get((study.reference, r["rate_mbit"]))
        if ref is None:
            continue
        if ref["step_s"]:
            r["reference_exchange_share"] = (ref["exchange_s"] + ref["momentum_sync_s"]) / ref[
                "step_s"
            ]
            if r.get("step_s"):
                r["step_speedup_vs_reference"] = ref["step_s"] / r["step_s"]
        if ref.get("time_to_target_s") and r.get("time_to_target_s"):
            r["speedup_vs_reference"] = ref["time_to_target_s"] / r["time_to_target_s"]


# The report's table over seeds: per variant and rate, these columns as median [min, max].
OVER_SEEDS = (
    "step_s",
    "step_speedup_vs_reference",
    "time_to_target_s",
    "speedup_vs_reference",
    "final_val_loss_smoothed",
    "reference_exchange_share",
)


def over_seeds(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per (variant, rate) of the measured points: how many seeds ran, how many met
    the target, and each OVER_SEEDS column's median and range over the seeds that have it
    (`<column>`: the median, `<column>_min`, `<column>_max`)."""
    measured = [r for r in rows if not r.get("skipped")]
    out = []
    for key in dict.fromkeys((r["variant"], r["rate_mbit"]) for r in measured):
        group = [r for r in measured if (r["variant"], r["rate_mbit"]) == key]
        row: dict[str, Any] = {
            "variant": key[0],
            "rate_mbit": key[1],
            "seeds": len(group),
            "met_target": sum(r.get("time_to_target_s") is not None for r in group),
        }
        for column in OVER_SEEDS:
            values = sorted(r[column] for r in group if r.get(column) is not None)
            if values:
                row[column] = statistics.median(values)
                row[f"{column}_min"], row[f"{column}_max"] = values[0], values[-1]
        out.append(row)
    return out


def over_seeds_section(rows: Sequence[Mapping[str, Any]], cfg: Config) -> str:
    """The report's table over seeds (markdown), "" with a single seed."""
    from cosmocub.evaluation.report import format_study_section

    if len(cfg.network_study.seeds) < 2:
        return ""

    def ranged(row: Mapping[str, Any], column: str) -> str:
        if column not in row:
            return ""
        lo, mid, hi = row[f"{column}_min"], row[column], row[f"{column}_max"]
        return f"{mid:.3g} [{lo:.3g}, {hi:.3g}]"

    table = [{**r, **{c: ranged(r, c) for c in OVER_SEEDS}} for r in over_seeds(rows)]
    return format_study_section(
        title="Over seeds",
        description=(
            f"Median [min, max] over the seeds {list(cfg.network_study.seeds)}, each seed "
            "against the reference's run of the same seed; met_target: the seeds whose point "
            "reached its seed's target."
        ),
        rows=table,
        columns=("variant", "rate_mbit", "seeds", "met_target", *OVER_SEEDS),
    )


def point_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    (row,) = rows
    keys = ("step_s", "compute_s", "exchange_s", "momentum_sync_s", "comm_bytes_per_step")
    out = {k: row[k] for k in keys}
    for k in ("wire_bytes_per_step", "time_to_target_s", "speedup_vs_reference"):
        if row.get(k) is not None:
            out[k] = row[k]
    return out


def plot(rows: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Left: speedup over the reference in time to target against link rate (unshaped drawn at
    the right edge; the median over seeds, their range as error bars), the reference's exchange
    share on a second axis. Right: counted and wire bytes per step per variant."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    measured = [r for r in rows if not r.get("skipped") and r.get("step_s") is not None]
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    shaped = sorted({r["rate_mbit"] for r in measured if r["rate_mbit"]})
    unshaped_x = (max(shaped) * 10) if shaped else 1.0

    def x_of(mbit: float) -> float:
        return mbit if mbit else unshaped_x

    variants = list(dict.fromkeys(r["variant"] for r in measured))
    # Over seeds: the median, with the range over the seeds as error bars (none with one seed).
    summed = over_seeds(measured)
    for variant in variants:
        pts = sorted(
            (
                (x_of(r["rate_mbit"]), r)
                for r in summed
                if r["variant"] == variant and "speedup_vs_reference" in r
            ),
            key=lambda point: point[0],
        )
        xs = [x for x, _ in pts]
        ys = [r["speedup_vs_reference"] for _, r in pts]
        low = [r["speedup_vs_reference"] - r["speedup_vs_reference_min"] for _, r in pts]
        high = [r["speedup_vs_reference_max"] - r["speedup_vs_reference"] for _, r in pts]
        ax.errorbar(xs, ys, yerr=[low, high], fmt="o-", capsize=3, label=variant)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ticks = [*shaped, unshaped_x]
    ax.set_xticks(ticks, [f"{t:g}" for t in shaped] + ["unshaped"])
    ax.set_xlabel("link rate per node (Mbit/s)")
    ax.set_ylabel("speedup over the reference (time to target)")
    # One value per rate: every variant's row there carries the same reference's share.
    share = sorted(
        {
            x_of(r["rate_mbit"]): r["reference_exchange_share"]
            for r in summed
            if r.get("reference_exchange_share") is not None
        }.items()
    )
    if share:
        twin = ax.twinx()
        twin.plot(*zip(*[(x, 100 * s) for x, s in share], strict=True), "k--", lw=1)
        twin.set_ylabel("reference's exchange share of its step (%, dashed)")
        twin.set_ylim(0, 100)
    if variants:
        ax.legend(fontsize=8)
    ax.set_title("time to the reference's final validation loss")

    width = 0.4
    xs = range(len(variants))
    counted = [_mean(measured, v, "comm_bytes_per_step") for v in variants]
    wire = [_mean(measured, v, "wire_bytes_per_step") for v in variants]
    bx.bar([x - width / 2 for x in xs], counted, width, label="counted (optimizer)")
    bx.bar([x + width / 2 for x in xs], wire, width, label="wire (tx bytes per node)")
    bx.set_xticks(list(xs), variants, rotation=20, fontsize=8)
    bx.set_yscale("log")
    bx.set_ylabel("bytes per step (mean over rates)")
    bx.legend(fontsize=8)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")


def _mean(rows: Sequence[Mapping[str, Any]], variant: str, key: str) -> float:
    values = [r[key] for r in rows if r["variant"] == variant and r.get(key) is not None]
    return sum(values) / len(values) if values else math.nan


STUDY = StudyDefinition(
    name="network",
    config_key="network_study",
    columns=COLUMNS,
    points=points,
    rows=rows,
    plot=plot,
    point_metrics=point_metrics,
    finish=finish,
    extra_section=over_seeds_section,
    description=(
        "Each optimizer variant at each link rate on emulated nodes (0 = unshaped), or with "
        "runner local on the scheduler's nodes at the cluster's own rate, which labels the "
        "points and which cosmocub did not set (rate_set_by_runner false). Per-step "
        "means after the first epoch; exchange_s is what the step waited for the optimizer's "
        "exchange (for Lion/AdamW the part of DDP's all-reduce left after backward, which it "
        "overlaps: exchange_exposed_s, the same; the distributed Lions' voted exchange), "
        "exchange_busy_s how long the exchange ran; "
        "wire_bytes_per_step is the mean over nodes of interface tx bytes per step. "
        "Validation losses are smoothed: a trailing mean over network_study.target_smoothing "
        "evaluations (final_val_loss_smoothed: the last). "
        "time_to_target_s: wall time since training start (validation included) of the first "
        "smoothed validation at or below target_val_loss, the reference's last smoothed loss "
        "unshaped; "
        "speedup_vs_reference = the reference's time to target at the same rate (and seed) / the "
        "point's; step_speedup_vs_reference the same of step_s; "
        "reference_exchange_share = the reference's exchange share of its step at that rate. "
        "A point skipped here (no CAP_NET_ADMIN) has blank measurements and says why."
    ),
)
