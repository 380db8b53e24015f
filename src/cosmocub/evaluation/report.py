"""The pipeline's results on one page: shard counts and, per trained run, test metrics vs baseline.

Reads only what earlier stages wrote (manifest.json, eval/metrics.json, train_summary.json).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmocub.io import atomic_path, format_cell, read_json


def format_run(metrics_path: Path) -> list[str]:
    metrics = read_json(metrics_path)
    run_dir = metrics_path.parent.parent
    lines = [f"## Run `{run_dir.name}`", ""]
    summary_path = run_dir / "train_summary.json"
    if summary_path.exists():
        summary = read_json(summary_path)
        facts = {
            k: summary[k]
            for k in ("epochs", "steps", "world_size", "global_batch_size", "wall_time_s")
            if k in summary
        }
        if facts:
            lines += ["Training: " + ", ".join(f"{k} {_fmt(v)}" for k, v in facts.items()), ""]
        final = summary.get("final", {})
        if "data_wait_share" in final:  # how well the step was fed, in its last epoch
            lines += [
                f"Feeding (last epoch): {_fmt(final.get('samples_per_s'))} samples/s, data wait "
                f"{100 * final['data_wait_share']:.1f} %, device busy "
                f"{100 * final.get('device_busy_share', float('nan')):.1f} %, batches cut by "
                f"{summary.get('data_placement', 'loader')}",
                "",
            ]
    lines += format_comparison(metrics)
    lines += [
        f"Test set: {metrics.get('num_samples', '?')} samples. MAE in unitPar space "
        "(u in [-1, 1));",
        "ratio < 1 means better than predicting the training mean.",
        "",
        "| parameter | MAE | baseline MAE | ratio | RMSE | R² | MAE (physical) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, m in metrics["per_parameter"].items():
        cells = [_num(m.get(k), f) for k, f in zip(_COLUMNS, _FORMATS, strict=True)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    mean = metrics["mean"]
    cells = [_num(mean.get(k), f) for k, f in zip(_COLUMNS, _FORMATS, strict=True)]
    lines += ["| **mean** | " + " | ".join(cells) + " |", ""]
    return lines


def format_comparison(metrics: dict[str, Any]) -> list[str]:
    """The headline: per universe, the CNN's MAE over the best classical fit's, beside every
    baseline and the other ratios; then per crop; then the gaussian head's coverage before and
    after calibration on validation."""
    comparison = metrics.get("comparison")
    if not comparison:
        return []
    lines = [
        f"**Does the CNN know more than the classical statistics?** Test MAE in unitPar space "
        f"per universe ({comparison['num_universes']} universes; each universe's estimate "
        "combines its crops) and per crop. Baselines fitted on the training split: "
        "predict-the-mean, ridge on one-point statistics of log1p counts, ridge on log P(k) of "
        "each channel, and the best classical fit (per parameter, the ridge on P(k), on the "
        "one-point statistics or on both with the bispectrum where the features have it, and "
        "its penalty, chosen on validation). CNN ÷ best classical < 1: the CNN extracts more "
        "than these statistics; in brackets the ratios' 16–84 % ranges over bootstrap "
        "resamplings of the test universes.",
        "",
    ]
    for scope, title in (("per_universe", "per universe"), ("per_crop", "per crop")):
        lines += [
            f"| parameter ({title}) | CNN | mean | one-point fit | P(k) fit | best classical | "
            "**CNN ÷ best classical** | CNN ÷ P(k) | CNN ÷ one-point | CNN ÷ mean |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, row in comparison[scope].items():
            cells = [_num(row.get(k), f) for k, f in _COMPARISON]
            for i, (key, _) in enumerate(_COMPARISON):
                # Per universe: the ratios' bootstrap ±1σ ranges.
                if key.startswith("cnn_over") and row.get(f"{key}_lo") is not None:
                    cells[i] += f" ({row[f'{key}_lo']:.2f}–{row[f'{key}_hi']:.2f})"
            if choice := comparison.get("classical_choice", {}).get(name):
                cells[4] += f" ({classical_features_label(choice['features'])})"
            cells[5] = f"**{cells[5]}**"
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    calibration = metrics.get("calibration")
    if calibration:
        lines += [
            "Coverage of the gaussian head's intervals on test (nominal 0.68 / 0.95; "
            f"goal within ±{100 * calibration['tolerance']:.0f} points). Before: the head's "
            "variances (per universe: crops combined as if independent); after: scaled by a "
            "per-parameter factor fitted on validation (crop temperature; universe inflation "
            "for the crops' correlation).",
            "",
            "| parameter | crop 68 % before | after | crop 95 % before | after "
            "| universe 68 % before | after | universe 95 % before | after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for name in calibration["per_crop"]["before"]["coverage"]:
            cells = [
                _num(calibration[scope][stage]["coverage"][name][level], ".2f")
                for scope in ("per_crop", "per_universe")
                for level in ("0.68", "0.95")
                for stage in ("before", "after")
            ]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        lines += _held_out_lines(calibration.get("validation_held_out"))
    return lines


def _held_out_lines(held_out: dict[str, Any] | None) -> list[str]:
    """The calibration checked on validation alone, beside the test's errors ÷ calibrated σ."""
    if not held_out:
        return []
    lines = [
        f"The same calibration on the {held_out['num_universes']} validation universes alone, "
        f"each of {held_out['folds']} folds scaled by the factor fitted on the others (what the "
        "method gives on universes it was not fitted on, without the test split's sampling "
        "noise); and the RMS of the universes' errors ÷ their calibrated σ (1: errors as "
        "predicted; below 1 on test: its universes' errors smaller than validation's).",
        "",
        "| parameter | held-out 68 % | held-out 95 % | error ÷ σ, validation | error ÷ σ, test |",
        "|---|---|---|---|---|",
    ]
    rms = held_out["error_rms"]
    for name, cov in held_out["coverage"].items():
        cells = [
            _num(cov["0.68"], ".3f"),
            _num(cov["0.95"], ".3f"),
            _num(rms["validation"][name], ".2f"),
            _num(rms["test"][name], ".2f"),
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


_COMPARISON = (
    ("cnn", ".4f"),
    ("mean", ".4f"),
    ("one_point", ".4f"),
    ("pk", ".4f"),
    ("classical", ".4f"),
    ("cnn_over_classical", ".3f"),
    ("cnn_over_pk", ".3f"),
    ("cnn_over_one_point", ".3f"),
    ("cnn_over_mean", ".3f"),
)

# How the report names the datasets of features.h5 a best classical fit chose.
FEATURE_LABELS = {
    "pk": "P(k)",
    "log_pk": "log-density P(k)",
    "one_point": "one-point",
    "bispectrum": "bispectrum",
}


def classical_features_label(features: Sequence[str]) -> str:
    """The features a best classical fit chose, as the report writes them: "P(k) + one-point"."""
    return " + ".join(FEATURE_LABELS.get(name, name) for name in features)


_COLUMNS = ("mae", "baseline_mae", "mae_ratio", "rmse", "r2", "mae_phys")
_FORMATS = (".4f", ".4f", ".3f", ".4f", ".3f", ".4g")


def _num(value: Any, spec: str) -> str:
    # metrics.json stores an undefined value (R² of a constant target, say) as null.
    return "" if value is None else format(value, spec)


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def format_study_section(
    *,
    title: str,
    description: str,
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    plot: str | None = None,
    max_rows: int = 60,
) -> str:
    """A study's report section: what it shows, its table (the first max_rows rows) and plot."""
    lines = [f"## {title}", ""]
    if description:
        lines += [description, ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows[:max_rows]:
        lines.append("| " + " | ".join(format_cell(row.get(c), digits=4) for c in columns) + " |")
    if len(rows) > max_rows:
        lines.append(f"\n({len(rows) - max_rows} more rows in the TSV)")
    if plot:
        lines += ["", f"![{title}]({plot})"]
    return "\n".join([*lines, ""])


def _source_universes(source: dict | None) -> list[str]:
    """What a dataset's own split says of the universes behind its samples (the MLPerf
    folders, whose records are crops of universes): how many, and any in two splits."""
    if not source:
        return []
    per_split = ", ".join(f"{s} {n}" for s, n in source["universes"].items())
    leaked = source["universes_in_two_splits"]
    where = (
        "no universe has crops in two splits"
        if not leaked
        else f"**{leaked} universes have crops in two splits** (e.g. "
        f"{', '.join(source['universes_in_two_splits_first'])}): their test figures are flattered"
    )
    return [
        f"The samples are records of the {source['source']} dataset, crops of universes "
        f"(read from the file names): {per_split}; {where}.",
        "",
    ]


def write_summary(
    *,
    manifest_path: Path,
    metrics_paths: list[Path],
    out_path: Path,
    study_sections: Sequence[Path] = (),
) -> str:
    manifest = read_json(manifest_path)
    counts = manifest.get("counts", {})
    universes = manifest.get("universes", {})
    lines = [
        "# cosmocub summary",
        "",
        f"Shards: `{manifest_path.parent}` (config hash {manifest.get('config_hash', '?')}, "
        f"sample shape {manifest.get('sample_shape', '?')}, {manifest.get('dtype', '?')}).",
        "",
        "| split | universes | samples |",
        "|---|---|---|",
        *(f"| {s} | {universes.get(s, '?')} | {n} |" for s, n in counts.items()),
        "",
        *_source_universes(manifest.get("source_universes")),
    ]
    for path in metrics_paths:
        lines += format_run(path)
    for path in study_sections:  # written by each study's gather (cosmocub study-gather)
        lines += [Path(path).read_text()]
    text = "\n".join(lines)
    with atomic_path(out_path) as tmp:
        tmp.write_text(text)
    return text
