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


def validate(
    cfg: Config,
    *,
    points: Sequence[Path],
    fit_path: Path,
    tsv: Path,
    plot: Path,
    calibrate_on: str | None = None,
) -> None:
    """Measured (the studies' `points` tables) against predicted: the TSV, its plot and the
    error summary beside the TSV (.json)."""
    from cosmocub.perfmodel.links import read_fits
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
    from cosmocub.train.conditions import is_marked, kept

    cores = cfg.perf_model.cores or len(os.sched_getaffinity(0))
    fits = read_fits(fit_path)
    point = calibrate_on or cfg.perf_model.calibrate_on
    # The first table is the one holding the calibration point; its scale applies to the others.
    scale = None
    results = []
    left_out: dict[str, list[str]] = {}  # study -> its contended points (shown, not counted)
    for path in map(Path, points):
        rows = usable(read_points(path))
        predict = cpu_predictor(path.parent, fits, cores=cores)
        if contended := [r["point"] for r in rows if is_marked(r)]:
            left_out[path.parent.name] = contended
        if point and scale is None:
            if point in contended:
                raise ValueError(
                    f"{path}: calibration point {point!r} is marked contended (the machine was "
                    "busy on both of its runs): rerun it, or calibrate on another point"
                )
            predict = calibrated(predict, kept(rows), point)
            scale = predict.scale
            rows = [r for r in rows if r["point"] != point]
        elif scale is not None:
            predict = scaled_predictor(predict, scale)
        results += [{"study": path.parent.name, **r} for r in compare(rows, predict)]
    write_results(results, tsv)
    plot_results(results, plot)
    for part in ("step", "compute", "exchange"):
        s = error_summary(results, part)
        log.info(
            "%s time: median |error| %.1f %%, worst %.1f %% over %d points",
            part,
            100 * s["median"],
            100 * s["worst"],
            s["points"],
        )
    for study, names in left_out.items():
        log.info("%s: %d contended points left out of the errors: %s", study, len(names), names)
    summary = {part: error_summary(results, part) for part in ("step", "compute", "exchange")}
    write_json(tsv.with_suffix(".json"), {**summary, "left_out_contended": left_out})


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
    if len(names) != 2:
        raise ValueError(
            f"key 'perf_model.extrapolate.optimizers': {len(names)} given ({names}); the "
            "headline compares two (reference first, then the candidate)"
        )
    from cosmocub.perfmodel.extrapolate import extrapolate as extrapolate_rows

    rows = extrapolate_rows(base, settings)
    write_tsv(rows, COLUMNS, out / "extrapolation.tsv")
    top = headline(
        rows, reference=names[0], candidate=names[1], halo_limit=settings.halo_share_limit
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
        cfg, accelerator, fits, rates_mbit, nodes=nodes, ranks_per_node=ranks_per_node
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
