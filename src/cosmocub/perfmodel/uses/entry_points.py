"""The stages of `cosmocub perf-model …`: bench (every link), bench-ranks (one link, under a
launcher), fit, validate and extrapolate; cosmocub.cli.perf_model_commands parses their
arguments."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import torch.distributed as dist

from cosmocub.config import Config, load_config
from cosmocub.io import atomic_path, write_json, write_tsv
from cosmocub.perfmodel.measure.calibration_cache import calibration_path, load_or_calibrate
from cosmocub.perfmodel.measure.cpu_model import Calibration, describe
from cosmocub.perfmodel.measure.cpu_model import calibrate as measure
from cosmocub.perfmodel.measure.link_fits import fit_per_link, read_fits, write_fits
from cosmocub.perfmodel.measure.link_samples import bench_links
from cosmocub.perfmodel.measure.microbench import read_samples, run_microbench, write_samples
from cosmocub.perfmodel.uses.extrapolate import (
    COLUMNS,
    assumptions_text,
    headline,
    plot_extrapolation,
)
from cosmocub.perfmodel.uses.extrapolate import extrapolate as extrapolate_rows
from cosmocub.perfmodel.uses.validate import (
    HELD_OUT,
    compare,
    cpu_predictor,
    fit_correction,
    in_fit_set,
    plot_results,
    read_points,
    scaled_predictor,
    set_summaries,
    skip_reason,
    usable,
    write_results,
)

log = logging.getLogger(__name__)


def bench(config_path: str | None, out: Path) -> None:
    """The micro-benchmark on loopback and on the emulated link at every study rate
    (cosmocub.perfmodel.measure.link_samples), one samples table at `out`."""

    bench_links(load_config(config_path), config_path=config_path, out=out)


def bench_ranks(
    config_path: str | None,
    *,
    link: str,
    out: Path,
    sizes_bytes: Sequence[int] | None = None,
    repeats: int | None = None,
) -> None:
    """Every rank runs the micro-benchmark in the process group the launcher set up; rank 0
    writes the samples, named `link`, to `out`. Sizes and repeats: perf_model.bench's unless
    given."""

    if "RANK" not in os.environ:
        raise ValueError(
            "perf-model bench-ranks: no launcher environment (RANK); run it as `cosmocub launch "
            "--ranks-per-node N -- perf-model bench-ranks --link NAME --out FILE`, or "
            "`cosmocub perf-model bench` for every link"
        )
    settings = load_config(config_path).perf_model.bench
    dist.init_process_group("gloo")
    try:
        samples = run_microbench(
            sizes_bytes=sizes_bytes or settings.sizes_bytes,
            repeats=repeats or settings.repeats,
        )
        if dist.get_rank() == 0:
            write_samples({link: samples}, out)
    finally:
        dist.destroy_process_group()


def fit(samples: Path, out: Path) -> None:
    """The α–β fit per link and collective kind of the bench's `samples`, as a TSV at `out`."""

    fits = fit_per_link(read_samples(samples))
    write_fits(fits, out)
    for link, by_kind in fits.items():
        for kind, r in by_kind.items():
            c = r.costs
            log.info(
                "%s %s: alpha %.1f us, beta %.3g s/B (%.3g Gbit/s), smallest call %.1f us; fit "
                "error median %.1f %%, worst %.1f %%",
                link,
                kind,
                1e6 * c.alpha_s,
                c.beta_s_per_byte,
                c.bandwidth_gbit,
                1e6 * r.call_latency_s,
                100 * r.median_rel_error,
                100 * r.worst_rel_error,
            )


def calibrate(cfg: Config, *, out: Path | None) -> None:
    """Time the compute calibration grid on this machine and write it to `out` (default:
    perf_model.calibration.path, else {results}/perf_model/calibration.json), replacing one
    there."""

    path = calibration_path(cfg, out)
    cal = measure(cfg.perf_model.calibration, cores=_cores(cfg))
    write_json(path, cal.as_dict())
    log.info("%s\n%s", path, describe(cal))


def this_cpu_calibration(cfg: Config) -> tuple[Calibration, int]:
    """(this machine's calibration grid, timed now where none is cached, and its cores)."""
    cores = _cores(cfg)
    path = calibration_path(cfg, None)
    return load_or_calibrate(path, cfg.perf_model.calibration, cores=cores), cores


def _cores(cfg: Config) -> int:
    return cfg.perf_model.cores or len(os.sched_getaffinity(0))


def validate(
    cfg: Config,
    *,
    points: Sequence[Path],
    fit_path: Path,
    tsv: Path,
    plot: Path,
    calibration: Path | None = None,
    fit_set: Sequence[str] | None = None,
) -> None:
    """Measured (the studies' `points` tables) against predicted from the compute calibration
    (measured now where there is none) and the links' fit: the TSV (column `set`: fit or
    held-out), its plot and the error summary per set beside the TSV (.json). Contended and
    oversubscribed points are skipped and counted; with a fit set, the cores' speed is fitted on
    its points and applied to all."""

    cores = _cores(cfg)
    fits = read_fits(fit_path)
    cal_path = calibration_path(cfg, calibration)
    cal = load_or_calibrate(cal_path, cfg.perf_model.calibration, cores=cores)
    names = tuple(cfg.perf_model.fit_set if fit_set is None else fit_set)
    tables = []
    skipped: dict[str, dict[str, list[str]]] = {}  # study -> reason -> points
    for path in map(Path, points):
        study = path.parent.name
        rows = []
        for row in usable(read_points(path)):
            if reason := skip_reason(row):
                skipped.setdefault(study, {}).setdefault(reason, []).append(row["point"])
            else:
                rows.append(row)
        tables.append((study, rows, cpu_predictor(path.parent, fits, cores=cores, calibration=cal)))
    scale = 1.0
    if names:
        scale = _fit_scale(tables, names)
    results = []
    for study, rows, predictor in tables:
        scaled = scaled_predictor(predictor, scale) if names else predictor
        results += [
            {"study": study, **r} for r in compare(rows, scaled, study=study, fit_set=names)
        ]
    if not results:
        raise ValueError(f"{', '.join(map(str, points))}: no point left to validate on")
    write_results(results, tsv)
    plot_results(results, plot)
    summaries = set_summaries(results)
    for name, parts in summaries.items():
        for part, s in parts.items():
            if s["points"]:
                log.info(
                    "%s %s: median |error| %.1f %%, worst %.1f %% over %d points",
                    name,
                    part,
                    100 * s["median"],
                    100 * s["worst"],
                    s["points"],
                )
    for study, reasons in skipped.items():
        for reason, skipped_points in reasons.items():
            log.info(
                "%s: %d %s points skipped: %s", study, len(skipped_points), reason, skipped_points
            )
    held = sum(r["set"] == HELD_OUT for r in results)
    write_json(
        tsv.with_suffix(".json"),
        {
            "sets": summaries,
            "held_out_points": held,
            "fit_points": len(results) - held,
            "fit_set": list(names),
            "cpu_speed_correction": scale,
            "skipped": {
                study: {reason: {"count": len(p), "points": p} for reason, p in reasons.items()}
                for study, reasons in skipped.items()
            },
            "calibration": {
                "path": str(cal_path),
                "timings": len(cal.timings),
                "wall_s": cal.wall_s,
                "load_1m": list(cal.load_1m),
                "steal_share": cal.steal_share,
            },
            "part_share": "a part's errors: over the points where it is >= 10 % of the step",
        },
    )


def _fit_scale(tables, names: Sequence[str]) -> float:
    """The cores' speed correction fitted on the fit set's points, across the tables."""

    fit_rows, predictors = [], {}
    for study, rows, predictor in tables:
        for row in rows:
            if in_fit_set(study, row["point"], names):
                fit_rows.append(row)
                predictors[id(row)] = predictor
    return fit_correction(lambda r: predictors[id(r)](r), fit_rows)


def extrapolate(cfg: Config, *, model_config: str, out: Path) -> None:
    """Step time of `model_config`'s model on GPU clusters: the TSVs, plot and assumptions in
    `out`."""

    settings = cfg.perf_model.extrapolate
    base = load_config(model_config)
    names = list(settings.optimizers)
    if len(names) < 2:
        raise ValueError(
            f"key 'perf_model.extrapolate.optimizers': {len(names)} given ({names}); the "
            "headline compares at least two (the reference first, then the candidates)"
        )

    rows = extrapolate_rows(base, settings)
    write_tsv(rows, COLUMNS, out / "extrapolation.tsv")
    top = headline(
        rows,
        reference=names[0],
        candidate=names[1],
        halo_limit=settings.halo_share_limit,
        others=names[2:],
    )
    write_tsv(top, list(top[0]), out / "headline.tsv")
    plot_extrapolation(rows, out / "extrapolation.png")
    with atomic_path(out / "assumptions.md") as tmp:
        tmp.write_text(assumptions_text(base, settings, model_config))
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
            for name in names[2:]:
                log.info("  %s %.3f s (%.2fx)", name, r[f"{name}_step_s"], r[f"{name}_speedup"])
