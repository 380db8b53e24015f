"""`cosmocub perf-model …`: bench (under `cosmocub launch`), fit, validate, extrapolate."""

from __future__ import annotations

import argparse
import csv
import logging
import os
from pathlib import Path

from cosmocub.config import load_config
from cosmocub.io import atomic_path, read_tsv, write_json

log = logging.getLogger(__name__)
FIT_COLUMNS = (
    "kind",
    "alpha_s",
    "beta_s_per_byte",
    "bandwidth_gbit",
    "samples",
    "median_rel_error",
    "worst_rel_error",
)


def bench(args: argparse.Namespace) -> int:
    """Every rank runs the micro-benchmark in the process group the launcher set up."""
    import torch.distributed as dist

    from cosmocub.perfmodel.microbench import run_microbench, write_samples

    if "RANK" not in os.environ:
        raise ValueError(
            "perf-model bench: no launcher environment (RANK); run it as "
            "`cosmocub launch --tasks-per-node N -- perf-model bench --out FILE`"
        )
    cfg = load_config(args.config)
    dist.init_process_group("gloo")
    try:
        samples = run_microbench(
            sizes_bytes=cfg.perf_model.bench.sizes_bytes, repeats=cfg.perf_model.bench.repeats
        )
        if dist.get_rank() == 0:
            write_samples(samples, Path(args.out))
    finally:
        dist.destroy_process_group()
    return 0


def fit(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.costs import fit_per_kind
    from cosmocub.perfmodel.microbench import read_samples

    fits = fit_per_kind(read_samples(Path(args.samples)))
    with atomic_path(args.out) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(FIT_COLUMNS)
        for kind, r in fits.items():
            c = r.costs
            writer.writerow(
                [
                    kind,
                    f"{c.alpha_s:.6g}",
                    f"{c.beta_s_per_byte:.6g}",
                    f"{c.bandwidth_gbit:.4g}",
                    r.samples,
                    f"{r.median_rel_error:.3g}",
                    f"{r.worst_rel_error:.3g}",
                ]
            )
            log.info(
                "%s: alpha %.1f us, beta %.3g s/B (%.2f Gbit/s); fit error median %.1f %%, "
                "worst %.1f %%",
                kind,
                1e6 * c.alpha_s,
                c.beta_s_per_byte,
                c.bandwidth_gbit,
                100 * r.median_rel_error,
                100 * r.worst_rel_error,
            )
    return 0


def read_fits(path: Path):
    from cosmocub.perfmodel.costs import AlphaBeta, Fit

    rows = read_tsv(path, not_found="alpha-beta fit not found (cosmocub perf-model fit)")
    if not rows or "allreduce" not in {r["kind"] for r in rows}:
        raise ValueError(f"{path}: needs an 'allreduce' row (kinds: {[r['kind'] for r in rows]})")
    return {
        r["kind"]: Fit(
            costs=AlphaBeta(
                alpha_s=float(r["alpha_s"]), beta_s_per_byte=float(r["beta_s_per_byte"])
            ),
            samples=int(r["samples"]),
            median_rel_error=float(r["median_rel_error"]),
            worst_rel_error=float(r["worst_rel_error"]),
        )
        for r in rows
    }


def validate(args: argparse.Namespace) -> int:
    from cosmocub.perfmodel.validate import (
        calibrated,
        compare,
        cpu_predictor,
        error_summary,
        plot_results,
        read_points,
        scaled_predictor,
        usable,
        write_results,
    )

    cfg = load_config(args.config)
    cores = cfg.perf_model.cores or len(os.sched_getaffinity(0))
    fits = read_fits(Path(args.fit))
    point = args.calibrate_on or cfg.perf_model.calibrate_on
    # The first table is the one holding the calibration point; its scale applies to the others.
    scale = None
    results = []
    for path in map(Path, args.points):
        rows = usable(read_points(path))
        predict = cpu_predictor(path.parent, fits, cores=cores)
        if point and scale is None:
            predict = calibrated(predict, rows, point)
            scale = predict.scale
            rows = [r for r in rows if r["point"] != point]
        elif scale is not None:
            predict = scaled_predictor(predict, scale)
        results += [{"study": path.parent.name, **r} for r in compare(rows, predict)]
    write_results(results, Path(args.tsv))
    plot_results(results, Path(args.plot))
    for part in ("step", "compute", "exchange"):
        s = error_summary(results, part)
        log.info(
            "%s time: median |error| %.1f %%, worst %.1f %% over %d points",
            part,
            100 * s["median"],
            100 * s["worst"],
            s["points"],
        )
    summary = {part: error_summary(results, part) for part in ("step", "compute", "exchange")}
    write_json(Path(args.tsv).with_suffix(".json"), summary)
    return 0


def extrapolate(args: argparse.Namespace) -> int:
    from cosmocub.io import write_tsv
    from cosmocub.perfmodel.extrapolate import (
        COLUMNS,
        assumptions_text,
        headline,
        plot_extrapolation,
    )

    cfg = load_config(args.config)
    settings = cfg.perf_model.extrapolate
    base = load_config(args.model_config)
    names = list(settings.optimizers)
    if len(names) != 2:
        raise ValueError(
            f"key 'perf_model.extrapolate.optimizers': {len(names)} given ({names}); the "
            "headline compares two (reference first, then the candidate)"
        )
    from cosmocub.perfmodel.extrapolate import extrapolate as extrapolate_rows

    rows = extrapolate_rows(base, settings)
    out = Path(args.out)
    write_tsv(rows, COLUMNS, out / "extrapolation.tsv")
    top = headline(
        rows, reference=names[0], candidate=names[1], halo_limit=settings.halo_share_limit
    )
    write_tsv(top, list(top[0]), out / "headline.tsv")
    plot_extrapolation(rows, out / "extrapolation.png")
    with atomic_path(out / "assumptions.md") as tmp:
        tmp.write_text(assumptions_text(base, settings, args.model_config))
    biggest = max(settings.gpus)
    for r in top:
        if r["gpus"] == biggest and "speedup" in r:
            log.info(
                "%s %d³ %g Gbit/s %d GPUs: %s %.3f s/step, %s %.3f s (%.2fx); spatial >= %s; "
                "halo < %.0f %% of the step up to spatial %s, of compute up to %s",
                r["accelerator"],
                r["sample_size"],
                r["link_gbit"],
                biggest,
                names[0],
                r[f"{names[0]}_step_s"],
                names[1],
                r[f"{names[1]}_step_s"],
                r["speedup"],
                r["min_spatial"],
                100 * settings.halo_share_limit,
                r["max_spatial_halo_of_step"],
                r["max_spatial_halo_of_compute"],
            )
    return 0


def add_parser(sub, add_config) -> None:
    p = sub.add_parser("perf-model", help="the step-time performance model (α–β + compute)")
    cmds = p.add_subparsers(dest="perf_command", required=True)
    b = cmds.add_parser("bench", help="time collectives (run under `cosmocub launch`)")
    b.set_defaults(handler=bench)
    b.add_argument("--out", required=True, help="samples TSV (kind, group_size, nbytes, seconds)")
    add_config(b)
    f = cmds.add_parser("fit", help="α–β per collective kind from the samples")
    f.set_defaults(handler=fit)
    f.add_argument("--samples", required=True)
    f.add_argument("--out", required=True)
    v = cmds.add_parser("validate", help="measured (a study's points.tsv) against predicted")
    v.set_defaults(handler=validate)
    v.add_argument(
        "--points",
        required=True,
        nargs="+",
        help="points.tsv files, the first holding the calibration point; configs beside them",
    )
    v.add_argument("--fit", required=True, help="the α–β fit (perf-model fit)")
    v.add_argument("--tsv", required=True)
    v.add_argument("--plot", required=True)
    v.add_argument(
        "--calibrate-on",
        help="a one-rank point whose measured compute sets this machine's speed (left out of "
        "the errors); default: perf_model.calibrate_on",
    )
    add_config(v)
    e = cmds.add_parser("extrapolate", help="step time on GPU clusters, with its assumptions")
    e.set_defaults(handler=extrapolate)
    e.add_argument("--model-config", required=True, help="config whose model is extrapolated")
    e.add_argument("--out", required=True, help="folder for the TSVs, plot and assumptions")
    add_config(e)
