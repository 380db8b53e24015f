"""against_mlperf.py's rows: one per published system and scale, read from the results
repositories as fetched, predicted on its preset with a given set of the constants the table
learns from the logs (mlperf_strict.Constants), the partner each calibrates from, the scale
pairs; what a tree with no row to predict says, and the uncalibrated spread's table."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlperf_strict import Constants

from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS
from cosmocub.perfmodel.cost_model.software import SoftwareProfile
from cosmocub.perfmodel.cost_model.stragglers import ScalePair
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.mllog import RunTimes, run_times, system_description, with_system
from cosmocub.perfmodel.uses.run_calibration import (
    RunCalibration,
    RunScale,
    calibrate_run,
    mllog_preset,
    predict_scale,
)
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import TimeToTrain, staged_beyond_memory


@dataclasses.dataclass
class Row:
    label: str
    runs: list[RunTimes]
    system: str = ""
    description: dict[str, Any] = dataclasses.field(default_factory=dict)
    preset: str | None = None
    software: SoftwareProfile | None = None
    note: str = ""
    uncalibrated: TimeToTrain | None = None
    calibrated: TimeToTrain | None = None
    # With every constant learned from the logs refitted without the row (and its partner).
    strict_uncalibrated: TimeToTrain | None = None
    strict: TimeToTrain | None = None
    partner: str = ""
    partner_row: Row | None = None

    @property
    def gpus(self) -> int:
        return self.runs[0].nodes * self.runs[0].accelerators_per_node

    @property
    def pytorch(self) -> bool:
        return self.software is not None and self.software.name != "mxnet_v1"

    @property
    def framework(self) -> str:
        """The systems file's framework as a stack family's name (pytorch, mxnet, tensorflow)."""
        text = str(self.description.get("framework", "")).lower()
        known = [f for f in ("pytorch", "mxnet", "tensorflow") if f in text]
        return known[0] if known else text.split()[0] if text else "unknown"

    def median_run(self) -> RunTimes:
        """The row's runs as one: the medians of their epochs and evaluations, the median of
        their first evaluations first (calibrate_run takes it where the staged data outgrows
        a node's memory)."""
        first = self.runs[0]
        median_eval = statistics.median(r.median_eval_s for r in self.runs)
        first_eval = statistics.median(r.eval_s[0] for r in self.runs)
        return dataclasses.replace(
            first,
            train_epoch_s=(statistics.median(r.median_train_epoch_s for r in self.runs),)
            * round(statistics.median(r.epochs for r in self.runs)),
            eval_s=(first_eval, median_eval, median_eval),
            staging_in_run=statistics.mode(r.staging_in_run for r in self.runs),
        )

    def published(self) -> dict[str, float]:
        return {
            "step": statistics.median(r.step_s for r in self.runs),
            "train": statistics.median(r.median_train_epoch_s for r in self.runs),
            "eval": statistics.median(r.median_eval_s for r in self.runs),
            "ttt": statistics.median(r.run_s for r in self.runs),
        }


def cpu_name(description: dict[str, Any]) -> str:
    """The host processor of a systems file, less the vendor's word and 'Processor' (Fugaku's
    'FUJITSU Processor A64FX' is the A64FX)."""
    words = [w for w in str(description.get("host_processor_model_name", "")).split()]
    words = [w for w in words if w.lower() != "processor"]
    if len(words) > 1 and words[0].isalpha() and words[0].isupper():
        words = words[1:]
    return " ".join(words) or "not named in its systems file"


def collect(logdir: Path) -> tuple[list[Row], list[str]]:
    """(one row per system and scale, in round order; the logs skipped, one line each). Copies
    of an earlier round's runs (the same run_start times) and systems without a preset are
    noted, not predicted. A one-line ValueError where LOGDIR is missing, empty, or not laid
    out as the results repositories."""
    if not logdir.is_dir():
        raise ValueError(f"{logdir}: no such folder (the MLPerf HPC result logs, fetched)")
    logs = sorted(p for p in logdir.rglob("result_*.txt") if "pruned_results" not in p.parts)
    if not logs:
        raise ValueError(f"{logdir}: no result_*.txt below it (want the results repositories)")
    # The v3.0 repositories keep every benchmark's logs side by side (weak/oc20, strong/deepcam):
    # only a `cosmoflow` folder's are CosmoFlow's.
    found = len(logs)
    logs = [
        p for p in logs if p.parent.name == "cosmoflow" and "results" in p.relative_to(logdir).parts
    ]
    if not logs:
        raise ValueError(
            f"{logdir}: {found} result logs but none under <submitter>/results/<system>/"
            "<scale>/cosmoflow/ (want the results repositories as fetched, systems/ beside)"
        )
    groups: dict[Path, list[Path]] = defaultdict(list)
    for log in logs:
        groups[log.parent].append(log)
    rows, seen, skipped = [], {}, []
    for folder, paths in groups.items():
        system, desc = system_description(paths[0])
        desc = desc or {}
        # v0.7 has no scale folder: results/<system>/cosmoflow/.
        scale = "" if folder.parent.name == system else f" ({folder.parent.name})"
        label = f"{folder.relative_to(logdir).parts[0]} {system}{scale}"
        runs = []
        for path in paths:
            try:
                # v0.7's logs name no nodes nor GPUs a node: its systems file does.
                runs.append(with_system(run_times(path), desc))
            except ValueError as err:
                skipped.append(f"skipped: {err}")
        if not runs:
            continue
        key = tuple(sorted(r.run_start_ms for r in runs))
        row = Row(label, runs, system=system, description=desc)
        if key in seen:
            row.note = f"a copy of {seen[key]}"
        elif str(desc.get("accelerators_per_node", "")) in ("0", ""):
            row.note = f"{len(runs)} logs: CPU system: {cpu_name(desc)} (no accelerator)"
        else:
            seen[key] = label
            try:
                row.preset, row.software = mllog_preset(runs[0].path, runs[0])
            except ValueError as err:
                row.note = str(err).split(": ", 1)[1]
        rows.append(row)
    return rows, skipped


def predict(
    row: Row,
    base: Workload,
    constants: Constants,
    cal: RunCalibration | None = None,
    layers: GpuLayerTimes | None = None,
) -> TimeToTrain:
    """The row's median run on its preset with `constants`, from `cal`'s device time where
    given (else the roofline, or `layers` timed on its GPU)."""
    return predict_scale(
        base,
        RunScale.of(row.median_run()),
        constants.cluster(row.preset or ""),
        constants.software(row.software),
        constants.stragglers(),
        layers=layers,
        layer_scale=1.0 if cal is None else cal.layer_scale,
        eval_scale=1.0 if cal is None else cal.eval_scale,
    )


def calibrate(
    row: Row, base: Workload, constants: Constants, *, first_eval: bool = True
) -> RunCalibration:
    """`row`'s device time (calibrate --from-run on its median run) with `constants`;
    first_eval: evaluation from the first one where staging outgrows memory (the choice made)."""
    return calibrate_run(
        row.median_run(),
        row.preset or "",
        constants.software(row.software),
        base,
        stragglers=constants.stragglers(),
        cluster=constants.cluster(row.preset or ""),
        first_eval_beyond_memory=first_eval,
    )


def beyond_memory(row: Row) -> bool:
    """Whether a node's staged share outgrows its memory (its later evaluations read from the
    node's drives, priced where the preset knows their rate)."""
    scale = RunScale.of(row.runs[0])
    return staged_beyond_memory(CLUSTERS[row.preset or ""], scale.dataset, scale.nodes)


def family(row: Row) -> str:
    return CLUSTERS[row.preset or ""].spec.name.split()[0]


def machine(row: Row) -> tuple[str | None, SoftwareProfile | None, str, str, str]:
    """One system and software: its preset and profile, submitter, division and host processor
    (a preset stands in for every system of its accelerator: v0.7's V100 systems are priced as
    Longhorn, and are not one machine)."""
    keys = ("submitter", "division", "host_processor_model_name")
    submitter, division, cpu = (str(row.description.get(k, "")) for k in keys)
    return row.preset, row.software, submitter, division, cpu


def partner_of(row: Row, rows: list[Row], *, by_accelerator: bool = True) -> tuple[Row | None, str]:
    """The run to calibrate `row` from: the same preset and software at another scale, else the
    nearest of the same GPU family: the same framework, then the same accelerator model (not
    by_accelerator: the rule as first written, ties in round order), then the same system, then
    the closest GPU count."""
    others = [r for r in rows if r is not row and r.preset and r.uncalibrated is not None]
    same = [r for r in others if machine(r) == machine(row) and r.gpus != row.gpus]
    if same:
        return min(same, key=lambda r: abs(math.log(r.gpus / row.gpus))), "same system"
    near = [r for r in others if family(r) == family(row)]
    if not near:
        return None, "no run of its GPU family"

    def distance(r: Row) -> tuple[bool, bool, bool, float]:
        same_framework = (r.software is None) == (row.software is None) and r.pytorch == row.pytorch
        same_gpu = CLUSTERS[r.preset or ""].accelerator == CLUSTERS[row.preset or ""].accelerator
        return (
            not same_framework,
            by_accelerator and not same_gpu,
            r.preset != row.preset,
            abs(math.log(r.gpus / row.gpus)),
        )

    return min(near, key=distance), "nearest"


def scale_pairs(rows: list[Row], base: Workload, constants: Constants) -> list[ScalePair]:
    """Every pair of rows of one system and software (machine) at two GPU counts (the smaller
    first), with the model's exposed exchange at each."""
    out = []
    live = [r for r in rows if r.uncalibrated is not None]
    for a in live:
        for b in live:
            if machine(a) == machine(b) and a.gpus < b.gpus:
                ta, tb = (predict(r, base, constants) for r in (a, b))
                pair = ScalePair(
                    name=f"{a.system} {a.gpus}->{b.gpus}",
                    ranks=(a.gpus, b.gpus),
                    step_s=(a.published()["step"], b.published()["step"]),
                    outside_s=(ta.exchange_s, tb.exchange_s),
                    runs=(a.label, b.label),
                )
                out.append(pair)
    return out


def no_row_lines(rows: list[Row]) -> list[str]:
    """One line a system of a tree with no row to predict: its rounds and scales, and why (the
    accelerator without a preset, a CPU system's processor)."""
    systems: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        systems[row.system].append(row)
    lines = []
    for system, found in systems.items():
        where = ", ".join(sorted({" ".join(r.label.replace(system, "").split()) for r in found}))
        reasons = sorted({r.note.split("logs: ", 1)[-1] for r in found})
        lines.append(f"against_mlperf: {system} [{where}]: {'; '.join(reasons)}")
    return lines


def spread_table(rows: list[Row], source: str) -> dict:
    """Per stack family (GPU family and framework), the range of published ÷ uncalibrated
    prediction over its rows, for the step and the training epoch (perf-model predict's
    uncalibrated answers carry it)."""
    families: dict[str, list[tuple[Row, TimeToTrain]]] = defaultdict(list)
    for row in rows:
        if row.uncalibrated is not None:
            families[f"{family(row)} {row.framework}"].append((row, row.uncalibrated))
    out = {}
    for name, found in sorted(families.items()):
        step = [r.published()["step"] / t.full_step_s for r, t in found]
        train = [r.published()["train"] / t.train_epoch_s for r, t in found]
        out[name] = {
            "step": [min(step), max(step)],
            "training_epoch": [min(train), max(train)],
            "rows": [r.label for r, _ in found],
        }
    return {
        "measure": "published / uncalibrated prediction (medians over each row's runs)",
        "source": source,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "families": out,
    }
