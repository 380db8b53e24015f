"""The pipeline's results on one page: shard counts and, per trained run, test metrics vs baseline.

Reads only what earlier stages wrote (manifest.json, eval/metrics.json, train_summary.json).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmocub.io import atomic_path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: not found") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None


def format_run(metrics_path: Path) -> list[str]:
    metrics = _read_json(metrics_path)
    run_dir = metrics_path.parent.parent
    lines = [f"## Run `{run_dir.name}`", ""]
    summary_path = run_dir / "train_summary.json"
    if summary_path.exists():
        summary = _read_json(summary_path)
        facts = {
            k: summary[k]
            for k in ("epochs", "steps", "world_size", "global_batch_size", "wall_time_s")
            if k in summary
        }
        if facts:
            lines += ["Training: " + ", ".join(f"{k} {_fmt(v)}" for k, v in facts.items()), ""]
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
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    if len(rows) > max_rows:
        lines.append(f"\n({len(rows) - max_rows} more rows in the TSV)")
    if plot:
        lines += ["", f"![{title}]({plot})"]
    return "\n".join([*lines, ""])


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def write_summary(
    *,
    manifest_path: Path,
    metrics_paths: list[Path],
    out_path: Path,
    study_sections: Sequence[Path] = (),
) -> str:
    manifest = _read_json(manifest_path)
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
    ]
    for path in metrics_paths:
        lines += format_run(path)
    for path in study_sections:  # written by each study's gather (cosmocub study-gather)
        lines += [Path(path).read_text()]
    text = "\n".join(lines)
    with atomic_path(out_path) as tmp:
        tmp.write_text(text)
    return text
