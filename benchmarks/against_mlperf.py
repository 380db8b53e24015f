"""Published MLPerf HPC CosmoFlow runs against the performance model: per system and scale, the
logs' medians beside `perf-model predict --cluster`'s step, training epoch, evaluation,
staging and time to train, and the H100 ÷ A100 ratio of the training epoch.

    python benchmarks/against_mlperf.py LOGDIR [--config config/cosmoflow-mlperf.yaml]
        [--gpu-calibration CAL.json ...]

LOGDIR holds the results repositories' folders as fetched (never committed here), e.g.
LOGDIR/v3.0/NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow/result_*.txt beside
LOGDIR/v3.0/NVIDIA/systems/eos_n64_ngc23.09_pytorch.json. Each system is matched to a cluster
preset by its description (perfmodel.cost_model.cluster_presets); nothing is fitted to the logs:
from each run the model takes only what the run was (nodes, GPUs a node, global batch, dropout,
the number of epochs it trained, whether it staged inside the timed run).

--gpu-calibration takes the layer times `perf-model calibrate --device cuda --batch 1` wrote on a
GPU (CUDA events, this repository's PyTorch CosmoFlow): the rows whose preset has that GPU
(matched by its family, H100 or A100 …, in the calibration's device name) take them in place of
the roofline, and their note says so; the others keep the roofline.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import cluster
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.mllog import RunTimes, run_times, system_description
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import predict_cluster

# Perlmutter's NICs went from 2 (Slingshot-10) to 4 (Slingshot-11) a node in 2022 [R].
PERLMUTTER_UPGRADE = datetime(2022, 1, 1, tzinfo=UTC)


def preset_for(system: str, desc: dict[str, Any] | None, run: RunTimes) -> str | None:
    """The cluster preset a system's description names, by its accelerator and system name;
    None where the model has none (a CPU system)."""
    gpu = (desc or {}).get("accelerator_model_name", "")
    name = system.lower()
    if "H100" in gpu:
        return "eos"
    if "dgxa100" in name or "A100-SXM4-80GB" in gpu:
        return "selene"
    if "perlmutter" in name:
        when = datetime.fromtimestamp(run.run_start_ms / 1e3, tz=UTC)
        return "perlmutter" if when >= PERLMUTTER_UPGRADE else "perlmutter_2021"
    if "horeka" in name:
        return "horeka"
    if "juwels" in name:
        return "juwels_booster"
    if "longhorn" in name or "V100" in gpu:
        return "longhorn"
    return None


@dataclasses.dataclass
class Row:
    label: str
    preset: str | None
    runs: list[RunTimes]
    note: str = ""
    predicted: dict[str, float | None] = dataclasses.field(default_factory=dict)

    def published(self) -> dict[str, float | None]:
        staged = [r.staging_s for r in self.runs if r.staging_s is not None]
        return {
            "step": statistics.median(r.step_s for r in self.runs),
            "train": statistics.median(r.median_train_epoch_s for r in self.runs),
            "eval": statistics.median(r.median_eval_s for r in self.runs),
            "staging": statistics.median(staged) if staged else None,
            "ttt": statistics.median(r.run_s for r in self.runs),
        }


GPU_FAMILIES = ("GH200", "H200", "H100", "A100", "V100", "MI250X")


def gpu_family(name: str) -> str | None:
    """The GPU family a device or accelerator name holds ("NVIDIA H100 80GB HBM3" → H100)."""
    upper = name.upper()
    return next((f for f in GPU_FAMILIES if f in upper), None)


def calibration_for(spec_name: str, calibrations: list[GpuLayerTimes]) -> GpuLayerTimes | None:
    """The first calibration timed on the family of GPU `spec_name` names, if any."""
    family = gpu_family(spec_name)
    return next((c for c in calibrations if family and gpu_family(c.device) == family), None)


def predict_row(row: Row, base: Workload, calibrations: list[GpuLayerTimes]) -> None:
    first = row.runs[0]
    gpus = first.nodes * first.accelerators_per_node
    preset = cluster(row.preset or "")
    calibration = calibration_for(preset.spec.name, calibrations)
    if first.accelerators_per_node != preset.ranks_per_node:
        row.note = f"{first.accelerators_per_node} GPUs a node, preset {preset.ranks_per_node}"
        return
    rate = first.dropout
    model = base.model if rate is None else dataclasses.replace(base.model, dropout=rate)
    epochs = round(statistics.median(r.epochs for r in row.runs))
    work = dataclasses.replace(base, model=model, local_batch=first.global_batch // gpus)
    in_run = [r.staging_in_run for r in row.runs if r.staging_in_run is not None]
    p, t = predict_cluster(
        work, preset, nodes=first.nodes, epochs=epochs,
        staging_in_run=statistics.mode(in_run) if in_run else None, calibration=calibration,
    )  # fmt: skip
    row.predicted = {
        "step": t.step_s + t.data_wait_s,
        "train": t.train_epoch_s,
        "eval": t.eval_s,
        "staging": t.staging_s,
        "ttt": t.total_s,
    }
    s = p.step
    parts = f"compute {1e3 * s.compute_s:.2f} + exchange {1e3 * s.exchange_s:.2f} + update "
    parts += f"{1e3 * s.optimizer_s:.2f} ms"
    row.note = f"{parts}; {epochs} epochs; staging {'in' if t.staging_in_run else 'out of'} run"
    if calibration is not None:
        row.note += f"; layers timed on {calibration.device}"


def collect(logdir: Path) -> list[Row]:
    """One row per system and scale, in round order; copies of an earlier round's runs (the
    same run_start times) and systems without a preset are noted, not predicted."""
    groups: dict[Path, list[Path]] = defaultdict(list)
    for log in sorted(logdir.rglob("result_*.txt")):
        if "pruned_results" not in log.parts:
            groups[log.parent].append(log)
    rows, seen = [], {}
    for folder, logs in groups.items():
        system, desc = system_description(logs[0])
        scale = folder.parent.name
        label = f"{folder.relative_to(logdir).parts[0]} {system} ({scale})"
        if (desc or {}).get("accelerators_per_node") in (0, "0", None) and "fugaku" in system:
            rows.append(Row(label, None, [], note=f"{len(logs)} logs: a CPU system, no preset"))
            continue
        runs = []
        for log in logs:
            try:
                runs.append(run_times(log))
            except ValueError as err:
                print(f"skipped: {err}")
        if not runs:
            continue
        key = tuple(sorted(r.run_start_ms for r in runs))
        if key in seen:
            rows.append(Row(label, None, [], note=f"a copy of {seen[key]}"))
            continue
        seen[key] = label
        rows.append(Row(label, preset_for(system, desc, runs[0]), runs))
    return rows


def fmt(x: float | None, scale: float = 1.0, digits: int = 3) -> str:
    return "-" if x is None else f"{x * scale:.{digits}g}"


def ratio(pred: float | None, pub: float | None) -> str:
    return "" if not pred or not pub else f" ({pred / pub:.2f}x)"


def table(rows: list[Row]) -> str:
    head = ("run", "GPUs", "step ms", "train epoch s", "eval s", "staging s", "time to train s",
            "note")  # fmt: skip
    out = [head]
    for row in rows:
        if not row.runs or not row.predicted:
            out.append((row.label, "", "", "", "", "", "", row.note))
            continue
        pub, pred = row.published(), row.predicted
        first = row.runs[0]
        cells = [row.label, f"{first.nodes}x{first.accelerators_per_node} ({len(row.runs)})"]
        for key, scale in (("step", 1e3), ("train", 1), ("eval", 1), ("staging", 1), ("ttt", 1)):
            cells.append(
                f"{fmt(pub[key], scale)} / {fmt(pred[key], scale)}{ratio(pred[key], pub[key])}"
            )
        out.append((*cells, f"{row.preset}: {row.note}"))
    widths = [max(len(r[i]) for r in out) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in out]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def h100_over_a100(rows: list[Row]) -> list[str]:
    """Training epoch of v3.0 Eos ÷ each A100 system's at the same 512 GPUs and batch."""
    by = {r.label: r for r in rows if r.predicted}
    eos = next((r for k, r in by.items() if "eos_n64" in k), None)
    if eos is None:
        return []
    out = []
    for label, r in by.items():
        same = (
            r.runs[0].global_batch == 512
            and r.runs[0].nodes * r.runs[0].accelerators_per_node == 512
        )
        if r.preset in ("perlmutter", "selene") and same:
            pub = r.published()["train"] / eos.published()["train"]
            pred = r.predicted["train"] / eos.predicted["train"]
            out.append(f"H100 / A100 per training epoch, {label} over Eos: published {pub:.2f}, "
                       f"predicted {pred:.2f} ({pred / pub:.2f}x)")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--config", default="config/cosmoflow-mlperf.yaml")
    parser.add_argument("--gpu-calibration", type=Path, action="append", default=[],
                        help="a perf-model calibrate --device cuda file (repeatable)")  # fmt: skip
    args = parser.parse_args()
    cfg = load_config(args.config)
    base = Workload.of(cfg)
    calibrations = [GpuLayerTimes.read(path) for path in args.gpu_calibration]
    rows = collect(args.logdir)
    for row in rows:
        if row.preset is not None:
            predict_row(row, base, calibrations)
    print("published (median over runs of each run's median) / predicted (predicted ÷ published)")
    print(table(rows))
    print()
    print("\n".join(h100_over_a100(rows)))


if __name__ == "__main__":
    main()
