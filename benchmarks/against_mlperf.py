"""Published MLPerf HPC CosmoFlow runs against the performance model: per system and scale, the
logs' medians beside the model's step, training epoch, evaluation and time to train, three ways:

  uncalibrated   specifications and sources only (roofline, the software profile's host work,
                 NCCL's collectives), with the GPU ranks' spread fitted on the scale pairs
  calibrated     leave one out: each run predicted from another run's device time
                 (`perf-model calibrate --from-run`), the same accelerator and software at another
                 scale where there is one, else the nearest (same GPU family), the table says which
  scale pairs    one system and software at two scales: published and predicted step growth,
                 the ranks' spread fitted on the other pairs, and each term's share

    python benchmarks/against_mlperf.py LOGDIR [--config config/cosmoflow-mlperf.yaml]
        [--gpu-calibration CAL.json ...]

LOGDIR holds the results repositories' folders as fetched (never committed here), e.g.
LOGDIR/v3.0/NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow/result_*.txt beside
LOGDIR/v3.0/NVIDIA/systems/eos_n64_ngc23.09_pytorch.json. From each run the model takes only
what the run was (nodes, GPUs a node, global batch, dropout, epochs, where staging falls).
--gpu-calibration takes the layer times `perf-model calibrate --device cuda --batch 1` wrote on a
GPU (benchmarks/gpu_feed_point.sh): the uncalibrated rows of that GPU's family take them in place
of the roofline, and their note says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS
from cosmocub.perfmodel.cost_model.software import SoftwareProfile
from cosmocub.perfmodel.cost_model.stragglers import ScalePair, Stragglers, fit_cv, leave_one_out
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.mllog import RunTimes, run_times, system_description
from cosmocub.perfmodel.uses.run_calibration import (
    GPU_STRAGGLERS,
    RunCalibration,
    calibrate_run,
    mllog_preset,
)
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import (
    MLPERF_COSMOFLOW,
    TimeToTrain,
    predict_cluster,
    staged_beyond_memory,
)

KEYS = ("step", "train", "eval", "ttt")


@dataclasses.dataclass
class Row:
    label: str
    runs: list[RunTimes]
    preset: str | None = None
    software: SoftwareProfile | None = None
    note: str = ""
    uncalibrated: TimeToTrain | None = None
    calibrated: TimeToTrain | None = None
    partner: str = ""

    @property
    def gpus(self) -> int:
        return self.runs[0].nodes * self.runs[0].accelerators_per_node

    @property
    def pytorch(self) -> bool:
        return self.software is not None and self.software.name != "mxnet_v1"

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


def predicted(t: TimeToTrain) -> dict[str, float]:
    return {
        "step": t.full_step_s,
        "train": t.train_epoch_s,
        "eval": t.median_eval_s,
        "ttt": t.total_s,
    }


def collect(logdir: Path) -> list[Row]:
    """One row per system and scale, in round order; copies of an earlier round's runs (the
    same run_start times) and systems without a preset are noted, not predicted. A one-line
    ValueError where LOGDIR is missing, empty, or not laid out as the results repositories."""
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
    rows, seen = [], {}
    for folder, paths in groups.items():
        system, desc = system_description(paths[0])
        label = f"{folder.relative_to(logdir).parts[0]} {system} ({folder.parent.name})"
        runs = []
        for path in paths:
            try:
                runs.append(run_times(path))
            except ValueError as err:
                print(f"skipped: {err}")
        if not runs:
            continue
        key = tuple(sorted(r.run_start_ms for r in runs))
        row = Row(label, runs)
        if key in seen:
            row.note = f"a copy of {seen[key]}"
        elif str((desc or {}).get("accelerators_per_node", "")) in ("0", ""):
            row.note = f"{len(runs)} logs: no accelerator in its systems file (a CPU system)"
        else:
            seen[key] = label
            try:
                row.preset, row.software = mllog_preset(runs[0].path, runs[0])
            except ValueError as err:
                row.note = str(err).split(": ", 1)[1]
        rows.append(row)
    return rows


def predict(
    row: Row,
    base: Workload,
    stragglers: Stragglers,
    cal: RunCalibration | None = None,
    layers: GpuLayerTimes | None = None,
) -> TimeToTrain:
    run = row.median_run()
    gpus = row.gpus
    model = (
        base.model if run.dropout is None else dataclasses.replace(base.model, dropout=run.dropout)
    )
    work = dataclasses.replace(base, model=model, local_batch=max(1, run.global_batch // gpus))
    _, t = predict_cluster(
        work,
        CLUSTERS[row.preset or ""],
        nodes=run.nodes,
        epochs=run.epochs,
        dataset=dataclasses.replace(
            MLPERF_COSMOFLOW, train_samples=run.train_samples, val_samples=run.eval_samples
        ),
        staging_in_run=run.staging_in_run,
        software=row.software,
        stragglers=stragglers,
        calibration=layers,
        layer_scale=1.0 if cal is None else cal.layer_scale,
        eval_scale=1.0 if cal is None else cal.eval_scale,
    )
    return t


def beyond_memory(row: Row) -> bool:
    """Whether a node's staged share outgrows its memory (its later evaluations read from the
    node's drives, priced where the preset knows their rate)."""
    run = row.runs[0]
    dataset = dataclasses.replace(
        MLPERF_COSMOFLOW, train_samples=run.train_samples, val_samples=run.eval_samples
    )
    return staged_beyond_memory(CLUSTERS[row.preset or ""], dataset, run.nodes)


def family(row: Row) -> str:
    return CLUSTERS[row.preset or ""].spec.name.split()[0]


def partner_of(row: Row, rows: list[Row]) -> tuple[Row | None, str]:
    """The run to calibrate `row` from: the same preset and software at another scale, else the
    nearest of the same GPU family: the same framework, then the same accelerator model, then
    the same system, then the closest GPU count."""
    others = [r for r in rows if r is not row and r.preset and r.uncalibrated is not None]
    same = [r for r in others if r.preset == row.preset and r.software == row.software]
    same = [r for r in same if r.gpus != row.gpus]
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
            not same_gpu,
            r.preset != row.preset,
            abs(math.log(r.gpus / row.gpus)),
        )

    return min(near, key=distance), "nearest"


def scale_pairs(rows: list[Row], base: Workload) -> list[tuple[ScalePair, Row, Row]]:
    """Every pair of rows of one preset and software at two GPU counts (the smaller first), with
    the model's exposed exchange at each."""
    out = []
    live = [r for r in rows if r.uncalibrated is not None]
    for a in live:
        for b in live:
            if (a.preset, a.software) == (b.preset, b.software) and a.gpus < b.gpus:
                ta, tb = (predict(r, base, GPU_STRAGGLERS) for r in (a, b))
                pair = ScalePair(
                    name=f"{a.label.split()[1]} {a.gpus}->{b.gpus}",
                    ranks=(a.gpus, b.gpus),
                    step_s=(a.published()["step"], b.published()["step"]),
                    outside_s=(ta.exchange_s, tb.exchange_s),
                    runs=(a.label, b.label),
                )
                out.append((pair, a, b))
    return out


def ratio_cell(pub: float, pred: float | None, scale: float = 1.0) -> str:
    if pred is None:
        return "-"
    return f"{pub * scale:.3g} / {pred * scale:.3g} ({pred / pub:.2f}x)"


def table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def row_cells(row: Row, t: TimeToTrain | None) -> list[str]:
    pub = row.published()
    pred = None if t is None else predicted(t)
    scales = {"step": 1e3}
    return [ratio_cell(pub[k], None if pred is None else pred[k], scales.get(k, 1.0)) for k in KEYS]


def ratios(rows: list[Row], which: str, key: str) -> list[float]:
    out = []
    for r in rows:
        t = getattr(r, which)
        if t is not None and r.pytorch:
            out.append(predicted(t)[key] / r.published()[key])
    return out


def summary(rows: list[Row], which: str) -> str:
    parts = []
    for key in ("train", "eval", "ttt"):
        errs = [abs(x - 1) for x in ratios(rows, which, key)]
        if errs:
            parts.append(
                f"{key}: median |error| {100 * statistics.median(errs):.1f} %, worst "
                f"{100 * max(errs):.1f} %"
            )
    return f"PyTorch rows ({which}): " + "; ".join(parts)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("logdir", type=Path)
    parser.add_argument("--config", default="config/cosmoflow-mlperf.yaml")
    parser.add_argument(
        "--gpu-calibration",
        type=Path,
        action="append",
        default=[],
        help="a perf-model calibrate --device cuda file (repeatable)",
    )
    args = parser.parse_args()
    timed = [GpuLayerTimes.read(path) for path in args.gpu_calibration]
    try:
        rows = collect(args.logdir)
    except ValueError as err:
        print(f"against_mlperf: {err}", file=sys.stderr)
        return 2
    base = Workload.of(load_config(args.config))
    live = [r for r in rows if r.preset is not None]
    for row in live:
        layers = next((c for c in timed if family(row) in c.device.upper()), None)
        row.uncalibrated = predict(row, base, GPU_STRAGGLERS, layers=layers)
        if layers is not None:
            row.note = f"layers timed on {layers.device}"
    if not live:
        print(f"against_mlperf: {args.logdir}: no row could be predicted", file=sys.stderr)
        return 1
    for row in live:
        partner, how = partner_of(row, live)
        if partner is None:
            row.partner = how
            continue
        try:
            cal = calibrate_run(partner.median_run(), partner.preset or "", partner.software, base)
        except ValueError as err:
            row.partner = f"{how}: {partner.label} cannot calibrate: {err}"
            continue
        row.calibrated = predict(row, base, GPU_STRAGGLERS, cal)
        row.partner = f"{how}: {partner.label} (device x{cal.layer_scale:.2f})"
        if beyond_memory(row):
            drives = CLUSTERS[row.preset or ""].drive_gbyte_s_per_node
            row.partner += (
                "; staged share > node memory: evaluations after the first unpriced"
                if drives is None
                else f"; staged share > node memory: evaluations after the first read from the "
                f"node's drives ({drives:.3g} GB/s, Eos weak's evaluations)"
            )

    print(
        "Uncalibrated: published / predicted (predicted ÷ published), medians over each row's runs"
    )
    head = (
        "run",
        "GPUs",
        "step ms",
        "train epoch s",
        "eval s",
        "time to train s",
        "where the step goes (ms)",
    )
    body = []
    for row in rows:
        if row.preset is None:
            body.append((row.label, "", "", "", "", "", row.note))
            continue
        t = row.uncalibrated
        assert t is not None
        other = t.own_s - t.compute_s - t.host_s
        software = row.software.name if row.software else "no profile"
        where = (
            f"layers {1e3 * t.compute_s:.2f}, other device {1e3 * other:.2f}, "
            f"host {1e3 * t.host_s:.2f}, exchange {1e3 * t.exchange_s:.2f}, "
            f"wait {1e3 * t.straggler_s:.2f}"
            + (f", loader {1e3 * t.data_wait_s:.2f}" if t.data_wait_s > 0 else "")
            + f" [{row.preset}, {software}] {row.note}"
        )
        body.append((row.label, f"{row.gpus} ({len(row.runs)})", *row_cells(row, t), where))
    print(table(head, body))
    print(summary(rows, "uncalibrated"))

    print("\nCalibrated, leave one out: each row from another run's device time")
    head = ("run", "step ms", "train epoch s", "eval s", "time to train s", "calibrated from")
    body = [(r.label, *row_cells(r, r.calibrated), r.partner) for r in live]
    print(table(head, body))
    print(summary(rows, "calibrated"))

    print("\nScale pairs: step growth, the GPU ranks' spread (cv) fitted on the other pairs")
    pairs = scale_pairs(rows, base)
    head = ("pair", "published", "predicted", "cv (others)", "wait", "exchange", "error (points)")
    body = []
    for pair, cv, growth in leave_one_out([p for p, _, _ in pairs]):
        if cv is None or growth is None:
            body.append(
                (pair.name, f"{100 * pair.growth:+.1f} %", "-", "no other pair", "", "", "")
            )
            continue
        s = Stragglers(cv=cv, source="the other pairs")
        own = (pair.step_s[0] - pair.outside_s[0]) / s.factor(pair.ranks[0])
        wait = own * (s.factor(pair.ranks[1]) - s.factor(pair.ranks[0]))
        exchange = pair.outside_s[1] - pair.outside_s[0]
        total = wait + exchange
        body.append(
            (
                pair.name,
                f"{100 * pair.growth:+.1f} %",
                f"{100 * growth:+.1f} %",
                f"{cv:.3f}",
                f"{100 * wait / total:.0f} %" if total else "-",
                f"{100 * exchange / total:.0f} %" if total else "-",
                f"{100 * (growth - pair.growth):+.1f}",
            )
        )
    print(table(head, body))
    if pairs:
        print(
            f"cv fitted on all {len(pairs)} pairs: {fit_cv([p for p, _, _ in pairs]):.3f} "
            f"(the package's GPU_STRAGGLERS: {GPU_STRAGGLERS.cv})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
