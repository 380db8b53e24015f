"""Published MLPerf HPC CosmoFlow runs against the performance model: per system and scale, the
logs' medians beside the model's step, training epoch, evaluation and time to train, three ways:

  uncalibrated   specifications and sources only (roofline, the software profile's host work,
                 NCCL's collectives), with the GPU ranks' spread fitted on the scale pairs
  calibrated     leave one out: each run predicted from another run's device time
                 (`perf-model calibrate --from-run`), the same accelerator and software at another
                 scale where there is one, else the nearest (same GPU family), the table says which;
                 strict (mlperf_strict.py): every constant the table learned from the logs (the
                 ranks' spread, the drives' rate, the reader threads) refitted without the row
                 and its partner, beside the figures with the constants as the package has them,
                 and where each constant came from
  scale pairs    one system and software at two scales: published and predicted step growth,
                 the ranks' spread fitted on the other pairs, and each term's share

    python benchmarks/against_mlperf.py LOGDIR [--config config/cosmoflow-mlperf.yaml]
        [--gpu-calibration CAL.json ...] [--write-spread FILE [--spread-source TEXT]]

LOGDIR holds the results repositories' folders as fetched (never committed here), e.g.
LOGDIR/v3.0/NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow/result_*.txt beside
LOGDIR/v3.0/NVIDIA/systems/eos_n64_ngc23.09_pytorch.json. From each run the model takes only
what the run was (nodes, GPUs a node, global batch, dropout, epochs, where staging falls).
--gpu-calibration takes the layer times `perf-model calibrate --device cuda --batch 1` wrote on a
GPU (benchmarks/gpu_feed_point.sh): the uncalibrated rows of that GPU's family take them in place
of the roofline, and their note says so. --write-spread writes the uncalibrated rows' range of
published ÷ predicted per stack family (GPU family and framework), the file `perf-model predict`
reads (cosmocub/perfmodel/uses/uncalibrated_spread.json). A tree with no row to predict says
why, one line a system, and exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlperf_rows import (  # the rows, their partners and pairs (shared with the strict table)
    Row,
    beyond_memory,
    calibrate,
    collect,
    family,
    no_row_lines,
    partner_of,
    predict,
    scale_pairs,
    spread_table,
)
from mlperf_strict import TODAY, Strict, drive_rows, provenance, strict_constants

from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS
from cosmocub.perfmodel.cost_model.stragglers import Stragglers, fit_cv, leave_one_out
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import TimeToTrain

KEYS = ("step", "train", "eval", "ttt")
SCALES = {"step": 1e3}  # the step in ms, the rest in seconds


def predicted(t: TimeToTrain) -> dict[str, float]:
    return {
        "step": t.full_step_s,
        "train": t.train_epoch_s,
        "eval": t.median_eval_s,
        "ttt": t.total_s,
    }


def ratio_cell(pub: float, pred: float | None, scale: float = 1.0) -> str:
    if pred is None:
        return "-"
    if pub <= 0:  # v0.7's logs number no evaluation by its epoch
        return f"not in the logs / {pred * scale:.3g}"
    return f"{pub * scale:.3g} / {pred * scale:.3g} ({pred / pub:.2f}x)"


def table(head: tuple[str, ...], body: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def row_cells(row: Row, t: TimeToTrain | None, today: TimeToTrain | None = None) -> list[str]:
    """Published / predicted (ratio) for each key; with `today`, its ratio after it."""
    pub = row.published()
    cells = []
    for k in KEYS:
        cell = ratio_cell(pub[k], None if t is None else predicted(t)[k], SCALES.get(k, 1.0))
        if today is not None and pub[k] > 0:
            cell += f" [{predicted(today)[k] / pub[k]:.2f}x]"
        cells.append(cell)
    return cells


Which = str | Callable[[Row], TimeToTrain | None]  # a Row's attribute, or a lookup


def ratios(rows: list[Row], which: Which, key: str, *, pytorch: bool = True) -> list[float]:
    out = []
    for r in rows:
        t = getattr(r, which) if isinstance(which, str) else which(r)
        if t is None or r.software is None or r.pytorch != pytorch or r.published()[key] <= 0:
            continue
        out.append(predicted(t)[key] / r.published()[key])
    return out


def summary(rows: list[Row], which: Which, title: str) -> str:
    parts = []
    for key in ("train", "eval", "ttt"):
        errs = [abs(x - 1) for x in ratios(rows, which, key)]
        if errs:
            parts.append(
                f"{key}: median |error| {100 * statistics.median(errs):.1f} %, worst "
                f"{100 * max(errs):.1f} %"
            )
    return f"PyTorch rows ({title}): " + "; ".join(parts)


def mxnet_evaluations(rows: list[Row], which: str, title: str) -> str:
    """The MXNet rows' evaluation errors, a line of their own (the summaries count PyTorch's)."""
    found = ratios(rows, which, "eval", pytorch=False)
    if not found:
        return f"MXNet rows' evaluation ({title}): none"
    errs = [abs(x - 1) for x in found]
    return (
        f"MXNet rows' evaluation ({title}): median |error| {100 * statistics.median(errs):.1f} "
        f"%, worst {100 * max(errs):.1f} % ({', '.join(f'{x:.2f}x' for x in found)})"
    )


def strict_tables(
    rows: list[Row], live: list[Row], base: Workload
) -> tuple[dict[str, Strict], Callable[[list[Row]], Strict]]:
    """Every live row predicted strict: uncalibrated without its own row, calibrated without
    it and its partner (row.strict_uncalibrated, row.strict); the constants of each, and the
    refit itself (the rows to leave out -> the constants)."""
    pairs = scale_pairs(rows, base, TODAY)
    drives = drive_rows(live, beyond_memory)
    pytorch = [r for r in live if r.pytorch]
    cache: dict[tuple[str, int], float] = {}

    def eval_ratio(row: Row, threads: int) -> float:
        if (row.label, threads) not in cache:
            t = predict(row, base, dataclasses.replace(TODAY, reader_threads=threads))
            cache[row.label, threads] = t.median_eval_s / row.published()["eval"]
        return cache[row.label, threads]

    def refit(judged: list[Row]) -> Strict:
        return strict_constants(judged, pairs, drives, pytorch, eval_ratio)

    stricts, alone = {}, {}
    for row in live:
        alone[row.label] = refit([row])
        row.strict_uncalibrated = predict(row, base, alone[row.label].constants)
        if row.partner_row is None or row.calibrated is None:
            continue
        stricts[row.label] = refit([row, row.partner_row])
        cal = calibrate(row.partner_row, base, stricts[row.label].constants)
        row.strict = predict(row, base, stricts[row.label].constants, cal)
    print("\n".join(provenance(pairs, drives, stricts, alone)))
    return stricts, refit


def choice_lines(
    live: list[Row], base: Workload, refit: Callable[[list[Row]], Strict]
) -> list[str]:
    """What each choice carries: the strict table's PyTorch summary with the other choice (the
    partner, and the constants refitted without it)."""
    out = []
    for title, by_accelerator, first_eval in (
        ("partner rule without 'same accelerator model', ties in round order", False, True),
        ("evaluation calibrated from the median one where staging outgrows memory", True, False),
    ):
        found: dict[str, TimeToTrain] = {}
        for row in live:
            partner, _ = partner_of(row, live, by_accelerator=by_accelerator)
            if partner is None or row.strict is None:
                continue
            constants = refit([row, partner]).constants
            try:
                cal = calibrate(partner, base, constants, first_eval=first_eval)
            except ValueError:
                continue
            found[row.label] = predict(row, base, constants, cal)
        out.append(summary(live, lambda r, f=found: f.get(r.label), f"strict, {title}"))
    return out


def calibrate_today(live: list[Row], base: Workload) -> None:
    """Each row from its partner's device time, with the constants as the package has them."""
    for row in live:
        partner, how = partner_of(row, live)
        if partner is None:
            row.partner = how
            continue
        try:
            cal = calibrate(partner, base, TODAY)
        except ValueError as err:
            row.partner = f"{how}: {partner.label} cannot calibrate: {err}"
            continue
        row.partner_row = partner
        row.calibrated = predict(row, base, TODAY, cal)
        row.partner = f"{how}: {partner.label} (device x{cal.layer_scale:.2f})"
        if beyond_memory(row):
            drives = CLUSTERS[row.preset or ""].drive_gbyte_s_per_node
            row.partner += (
                "; staged share > node memory: evaluations after the first unpriced"
                if drives is None
                else f"; staged share > node memory: evaluations after the first read from the "
                f"node's drives ({drives:.3g} GB/s, Eos weak's evaluations)"
            )


def print_uncalibrated(rows: list[Row]) -> None:
    print(
        "Uncalibrated: published / predicted strict (predicted ÷ published), medians over each "
        "row's runs, every learned constant refitted without the row; [the ratio as today]"
    )
    head = ("run", "GPUs", "step ms", "train epoch s", "eval s", "time to train s", "where (ms)")
    body = []
    for row in rows:
        if row.preset is None:
            body.append((row.label, "", "", "", "", "", row.note))
            continue
        t = row.uncalibrated
        assert t is not None and row.strict_uncalibrated is not None
        other = t.own_s - t.compute_s - t.host_s
        software = row.software.name if row.software else "no profile"
        where = (
            f"layers {1e3 * t.compute_s:.2f}, other device {1e3 * other:.2f}, "
            f"host {1e3 * t.host_s:.2f}, exchange {1e3 * t.exchange_s:.2f}, "
            f"wait {1e3 * t.straggler_s:.2f}"
            + (f", loader {1e3 * t.data_wait_s:.2f}" if t.data_wait_s > 0 else "")
            + f" [{row.preset}, {software}] {row.note}"
        )
        cells = row_cells(row, row.strict_uncalibrated, t)
        body.append((row.label, f"{row.gpus} ({len(row.runs)})", *cells, where))
    print(table(head, body))
    print(summary(rows, "uncalibrated", "uncalibrated, as today"))
    print(summary(rows, "strict_uncalibrated", "uncalibrated, strict"))


def print_calibrated(
    rows: list[Row], live: list[Row], stricts: dict[str, Strict], choices: list[str]
) -> None:
    print(
        "\nCalibrated, leave one out: each row from another run's device time; published / "
        "strict (strict ratio) [ratio as today]"
    )
    head = ("run", "step ms", "train epoch s", "eval s", "time to train s", "strict", "from")
    body = []
    for r in live:
        s = stricts.get(r.label)
        constants = (
            "-"
            if s is None
            else f"cv {s.constants.cv:.3f}, drives "
            + ("-" if s.constants.drive_gbyte_s is None else f"{s.constants.drive_gbyte_s:.3g}")
            + f", reader {s.constants.reader_threads}"
        )
        cells = row_cells(r, r.strict, r.calibrated) if r.strict else row_cells(r, None)
        body.append((r.label, *cells, constants, r.partner))
    print(table(head, body))
    print(summary(rows, "strict", "calibrated, strict"))
    print(summary(rows, "calibrated", "calibrated, as today"))
    print("\n".join(choices))
    print(mxnet_evaluations(rows, "strict", "calibrated, strict"))
    print(mxnet_evaluations(rows, "calibrated", "calibrated, as today"))


def print_pairs(rows: list[Row], base: Workload) -> None:
    print("\nScale pairs: step growth, the GPU ranks' spread (cv) fitted on the other pairs")
    pairs = scale_pairs(rows, base, TODAY)
    head = ("pair", "published", "predicted", "cv (others)", "wait", "exchange", "error (points)")
    body = []
    for pair, cv, growth in leave_one_out(pairs):
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
            f"cv fitted on all {len(pairs)} pairs: {fit_cv(pairs):.3f} "
            f"(the package's GPU_STRAGGLERS: {TODAY.cv})"
        )


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
    parser.add_argument("--write-spread", type=Path, help="the uncalibrated spread's file")
    parser.add_argument("--spread-source", default="", help="what LOGDIR holds, for the file")
    args = parser.parse_args()
    timed = [GpuLayerTimes.read(path) for path in args.gpu_calibration]
    try:
        rows, skipped = collect(args.logdir)
    except ValueError as err:
        print(f"against_mlperf: {err}", file=sys.stderr)
        return 2
    live = [r for r in rows if r.preset is not None]
    if not live:
        print(f"against_mlperf: {args.logdir}: no row could be predicted:", file=sys.stderr)
        print("\n".join(no_row_lines(rows)), file=sys.stderr)
        return 1
    for line in skipped:
        print(line, file=sys.stderr)
    base = Workload.of(load_config(args.config))
    for row in live:
        layers = next((c for c in timed if family(row) in c.device.upper()), None)
        row.uncalibrated = predict(row, base, TODAY, layers=layers)
        if layers is not None:
            row.note = f"layers timed on {layers.device}"
    calibrate_today(live, base)
    stricts, refit = strict_tables(rows, live, base)
    choices = choice_lines(live, base, refit)
    print()
    print_uncalibrated(rows)
    print_calibrated(rows, live, stricts, choices)
    print_pairs(rows, base)
    if args.write_spread:
        rounds = sorted({r.label.split()[0] for r in live})
        source = f"benchmarks/against_mlperf.py over MLPerf HPC {', '.join(rounds)} result logs"
        spread = spread_table(rows, f"{source} {args.spread_source}".strip())
        args.write_spread.write_text(json.dumps(spread, indent=1) + "\n")
        print(f"\n{args.write_spread}: {len(spread['families'])} stack families")
    return 0


if __name__ == "__main__":
    sys.exit(main())
