"""The stages of `cosmocub perf-model …`: bench (every link), bench-ranks (one link, under a
launcher), fit, validate and extrapolate; cosmocub.cli.perf_model parses their arguments."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config, load_config
from cosmocub.io import atomic_path, write_json

log = logging.getLogger(__name__)


def bench(config_path: str | None, out: Path) -> None:
    """The micro-benchmark on loopback and on the emulated link at every study rate
    (cosmocub.perfmodel.bench_links), one samples table at `out`."""
    from cosmocub.perfmodel.bench_links import bench_links

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
    import torch.distributed as dist

    from cosmocub.perfmodel.microbench import run_microbench, write_samples

    if "RANK" not in os.environ:
        raise ValueError(
            "perf-model bench-ranks: no launcher environment (RANK); run it as `cosmocub launch "
            "--tasks-per-node N -- perf-model bench-ranks --link NAME --out FILE`, or "
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
    from cosmocub.perfmodel.links import fit_per_link, write_fits
    from cosmocub.perfmodel.microbench import read_samples

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
    from cosmocub.perfmodel.cpu_model import calibrate as measure
    from cosmocub.perfmodel.cpu_model import calibration_path, describe

    path = calibration_path(cfg, out)
    cal = measure(cfg.perf_model.calibration, cores=_cores(cfg))
    write_json(path, cal.as_dict())
    log.info("%s\n%s", path, describe(cal))


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
    from cosmocub.perfmodel.cpu_model import calibration_path, load_or_calibrate
    from cosmocub.perfmodel.links import read_fits
    from cosmocub.perfmodel.validate import (
        HELD_OUT,
        compare,
        cpu_predictor,
        plot_results,
        read_points,
        scaled_predictor,
        set_summaries,
        skip_reason,
        usable,
        write_results,
    )

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
    for study, rows, predict in tables:
        predict = scaled_predictor(predict, scale) if names else predict
        results += [
            {"study": study, **r} for r in compare(rows, predict, study=study, fit_set=names)
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
    from cosmocub.perfmodel.validate import fit_correction, in_fit_set

    fit_rows, predictors = [], {}
    for study, rows, predict in tables:
        for row in rows:
            if in_fit_set(study, row["point"], names):
                fit_rows.append(row)
                predictors[id(row)] = predict
    return fit_correction(lambda r: predictors[id(r)](r), fit_rows)


def extrapolate(cfg: Config, *, model_config: str, out: Path) -> None:
    """Step time of `model_config`'s model on GPU clusters: the TSVs, plot and assumptions in
    `out`."""
    from cosmocub.io import write_tsv
    from cosmocub.perfmodel.extrapolate import (
        COLUMNS,
        assumptions_text,
        headline,
        plot_extrapolation,
    )

    settings = cfg.perf_model.extrapolate
    base = load_config(model_config)
    names = list(settings.optimizers)
    if len(names) < 2:
        raise ValueError(
            f"key 'perf_model.extrapolate.optimizers': {len(names)} given ({names}); the "
            "headline compares at least two (the reference first, then the candidates)"
        )
    from cosmocub.perfmodel.extrapolate import extrapolate as extrapolate_rows

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


def predict(
    cfg: Config,
    *,
    data: int | None,
    spatial: int | None,
    split: tuple[int, int, int] | None,
    nodes: int,
    ranks_per_node: int,
    rates_mbit: Sequence[float] | None,
    accelerator: str | None,
    fit_path: Path | None,
    epochs: int | None,
    train_samples: int | None,
    as_json: bool,
    calibration: Path | None = None,
) -> None:
    """Print the step of `cfg` on a data × spatial mesh of nodes × ranks_per_node, one column per
    link rate (a table, or JSON); the arguments are `perf-model predict`'s flags."""
    import dataclasses
    import json

    from cosmocub.perfmodel.links import read_fits
    from cosmocub.perfmodel.model import DDP_OPTIMIZERS
    from cosmocub.perfmodel.predict import Workload, format_table, lion_reference, predict
    from cosmocub.perfmodel.predict_args import (
        machine_from_flags,
        mesh_from_flags,
        samples_from_flags,
    )

    mesh = mesh_from_flags(cfg, data, spatial, split, nodes=nodes, ranks_per_node=ranks_per_node)
    fits = None if fit_path is None else read_fits(fit_path)
    device, networks, rates = machine_from_flags(
        cfg,
        accelerator,
        fits,
        rates_mbit,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        calibration=calibration,
    )
    samples, note = samples_from_flags(cfg, train_samples, epochs)
    work = Workload.of(cfg)
    if epochs is not None:
        work = dataclasses.replace(work, epochs=epochs)
    lion = lion_reference(cfg)
    predictions = [
        predict(work, mesh, network, device, lion=lion, train_samples=samples)
        for network in networks
    ]
    if as_json:
        out = [{"rate_mbit": r, **p.as_dict()} for r, p in zip(rates, predictions, strict=True)]
        print(json.dumps({"config": cfg.source, "note": note, "predictions": out}, indent=1))
        return
    p = predictions[0]
    links = (
        f"alpha-beta fitted in {fit_path} (between nodes: the fit's alpha, beta at the rate)"
        if fit_path
        else f"assumed: {cfg.perf_model.extrapolate.latency_us:g} us a message round between "
        f"nodes, {cfg.perf_model.extrapolate.intra_latency_us:g} us within one"
    )
    ddp = ""
    if cfg.optimizer.name in DDP_OPTIMIZERS:
        how = "overlapped with backward" if p.ddp_overlap else "blocking"
        ddp = f", DDP all-reduce {how} (train.ddp_exchange_timing)"
    print(
        f"{cfg.source}: {cfg.optimizer.name}{ddp}, {cfg.model.input_size}^3 samples, local "
        f"batch {cfg.train.local_batch_size}\n"
        f"mesh {mesh.data} data x {mesh.spatial} spatial (split "
        f"{'x'.join(map(str, mesh.split))}) = {mesh.world} ranks on {p.nodes} nodes x "
        f"{ranks_per_node}\n{device.describe()}\nlinks: {links}\n"
    )
    print(format_table(rates, predictions))
    if note:
        print(note)
