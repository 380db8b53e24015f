"""`cosmocub inspect | simulate | simulate-group | link-group | mlperf-group | preprocess |
preprocess-plan | preprocess-group | preprocess-gather | features`: the data stages, from
universes to shards and their features.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config, add_stage
from cosmocub.config import Config, load_config


def _cmd_inspect(args: argparse.Namespace) -> int:
    from cosmocub.data.inspect import report_text

    print(report_text(args.path, as_json=args.json))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from cosmocub.data.simulate import run_simulate
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    params = {"size": args.size, "seed": args.seed}
    # Deferred: inside a workflow, MLflow would cost this job more time than the simulation.
    with job_run(cfg, stage="simulate", params=params, defer=True) as tracker:
        metrics = run_simulate(args.out, size=args.size, seed=args.seed, settings=cfg.simulate)
        tracker.log_metrics(metrics)
    return 0


def _cmd_simulate_group(args: argparse.Namespace) -> int:
    from cosmocub.data.naming import seeds_of_group
    from cosmocub.data.universe_groups import make_group
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    seeds = seeds_of_group(cfg, args.group, master_seed=args.seed)
    size = cfg.universes.size
    params = {"group": args.group, "size": size, "first_seed": seeds[0], "universes": len(seeds)}
    with job_run(cfg, stage="simulate", params=params, defer=True) as tracker:
        manifest, metrics = make_group(
            cfg, args.group, args.out, master_seed=args.seed, workers=args.threads
        )
        for step, (seed, values) in enumerate(zip(seeds, metrics, strict=True)):
            tracker.log_metrics({"seed": float(seed), **values}, step=step)
    print(f"simulate-group: {len(seeds)} universes, manifest {manifest}")
    return 0


def _cmd_link_group(args: argparse.Namespace) -> int:
    from cosmocub.data.universe_groups import link_group

    cfg = load_config(args.config)
    print(f"link-group: manifest {link_group(cfg, args.group, args.out)}")
    return 0


def _cmd_mlperf_group(args: argparse.Namespace) -> int:
    from cosmocub.data.universe_groups import mlperf_group

    cfg = load_config(args.config)
    print(f"mlperf-group: manifest {mlperf_group(cfg, args.group, args.out)}")
    return 0


def _settings_with_workers(cfg: Config, threads: int | None, log_dir: Path):
    """The preprocess settings with the job's granted threads, sent to Dask workers started as
    Slurm jobs for the block where preprocess.dask_slurm_workers asks for them."""
    from cosmocub.data.dask_slurm import slurm_workers

    return slurm_workers(
        cfg.preprocess.with_granted_threads(threads), cfg.cluster.preprocess, log_dir
    )


def _cmd_preprocess(args: argparse.Namespace) -> int:
    from cosmocub.data.preprocess import preprocess
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    out = Path(args.out)
    with (
        job_run(cfg, stage="preprocess") as tracker,
        # Workers for every group at once (preprocess.dask_slurm_workers), logging beside --out.
        _settings_with_workers(
            cfg, args.threads, out.with_name(f"{out.name}.dask-workers")
        ) as settings,
    ):
        manifest = preprocess(
            [Path(p) for p in args.universes],
            out,
            settings=settings,
            seed=cfg.seed,
            config_hash=cfg.hash,
            universes_per_job=cfg.cluster.preprocess.universes_per_job,
        )
        tracker.log_metrics({f"samples_{k}": v for k, v in manifest["counts"].items()})
    return 0


def _cmd_preprocess_plan(args: argparse.Namespace) -> int:
    from cosmocub.data.shard_jobs import plan_shards
    from cosmocub.data.universe_groups import (
        group_metas,
        mlperf_fixed_splits,
        read_group_manifests,
    )

    cfg = load_config(args.config)
    groups = read_group_manifests(cfg, args.universes_dir)
    plan = plan_shards(
        group_metas(groups),
        Path(args.staging),
        settings=cfg.preprocess,
        seed=cfg.seed,
        universes_per_job=cfg.cluster.preprocess.universes_per_job,
        fixed=mlperf_fixed_splits(groups) if cfg.universes.source == "mlperf" else None,
        known_sha256={e["path"]: e["sha256"] for g in groups for e in g if "sha256" in e},
    )
    print(f"preprocess-plan: {len(plan['place'])} universes in {len(plan['groups'])} groups")
    return 0


def _cmd_preprocess_group(args: argparse.Namespace) -> int:
    from cosmocub.data.shard_jobs import crop_group
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    # Deferred unless system metrics are on (only a live run samples them): the run holds nothing
    # a record cannot, and inside a workflow MLflow's import and store would cost this job ~3.5 s.
    with (
        job_run(
            cfg,
            stage="preprocess",
            params={"group": args.group},
            defer=not cfg.tracking.system_metrics,
        ),
        # This group's own workers (preprocess.dask_slurm_workers), logging in the staging
        # folder, which the workflow drops with the groups.
        _settings_with_workers(
            cfg, args.threads, Path(args.staging) / "dask-workers" / str(args.group)
        ) as settings,
    ):
        crop_group(Path(args.staging), args.group, Path(args.out), settings=settings)
    return 0


def _cmd_preprocess_gather(args: argparse.Namespace) -> int:
    from cosmocub.data.shard_jobs import gather_shards, group_files
    from cosmocub.tracking.runs import job_run

    cfg = load_config(args.config)
    staging = Path(args.staging)
    groups = group_files(staging, Path(args.groups_dir))
    # Deferred unless system metrics are on, as a group's run (its metrics fit a record too).
    with job_run(cfg, stage="preprocess", defer=not cfg.tracking.system_metrics) as tracker:
        manifest = gather_shards(
            staging, groups, Path(args.out), settings=cfg.preprocess, config_hash=cfg.hash
        )
        tracker.log_metrics({f"samples_{k}": v for k, v in manifest["counts"].items()})
    return 0


def _cmd_features(args: argparse.Namespace) -> int:
    from cosmocub.data.features import FEATURES_FILE, write_features

    shards = Path(args.shards)
    write_features(
        shards, shards / FEATURES_FILE, num_workers=args.threads, bispectrum=args.bispectrum
    )
    return 0


def add_inspect(sub) -> None:
    p = add_stage(
        sub, "inspect", _cmd_inspect, "describe a universe (HDF5) or an MLPerf sample (TFRecord)"
    )
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def add_simulate(sub) -> None:
    p = add_stage(
        sub,
        "simulate",
        _cmd_simulate,
        "make one synthetic N-body universe in the cosmoUniverse layout",
    )
    p.add_argument("out", help="output .hdf5 path")
    p.add_argument("--size", type=int, required=True, help="voxels per side")
    p.add_argument("--seed", type=int, required=True)
    add_config(p)


def add_simulate_group(sub) -> None:
    p = add_stage(
        sub,
        "simulate-group",
        _cmd_simulate_group,
        "make one group of the config's synthetic universes (cluster.simulate.universes_per_job) "
        "and its manifest",
    )
    p.add_argument("--group", type=int, required=True, help="group index, from 0")
    p.add_argument(
        "--seed",
        type=int,
        help="the top-level seed whose universes to make (default the config's; a study point's "
        "own seed, known_answer_study.seeds)",
    )
    p.add_argument(
        "--out",
        required=True,
        help="the universes' folder: the group's synth_<seed>.hdf5 files, and its manifest "
        "under groups/",
    )
    p.add_argument("--threads", type=int, default=1, help="universes made at once (processes)")
    add_config(p)


def add_link_group(sub) -> None:
    p = add_stage(
        sub,
        "link-group",
        _cmd_link_group,
        "validate one group of the public universes (cluster.preprocess.universes_per_job) and "
        "link them, with the group's manifest",
    )
    p.add_argument("--group", type=int, required=True, help="group index, from 0")
    p.add_argument(
        "--out", required=True, help="the universes' folder: links, and the manifest under groups/"
    )
    add_config(p)


def add_mlperf_group(sub) -> None:
    p = add_stage(
        sub,
        "mlperf-group",
        _cmd_mlperf_group,
        "validate one group of the MLPerf TFRecord folders' files (cluster.preprocess."
        "files_per_job): every record's CRCs, shape and labels; write the group's manifest",
    )
    p.add_argument("--group", type=int, required=True, help="group index, from 0")
    p.add_argument("--out", required=True, help="the universes' folder: the manifest under groups/")
    add_config(p)


def _cmd_export_mlperf(args: argparse.Namespace) -> int:
    from cosmocub.data.mlperf_export import export_mlperf

    cfg = load_config(args.config)
    universes = Path(args.universes_dir or cfg.results / "universes")
    written = export_mlperf(cfg, universes, Path(args.out))
    print(f"export-mlperf: {written} files → {args.out}")
    return 0


def add_export_mlperf(sub) -> None:
    p = add_stage(
        sub,
        "export-mlperf",
        _cmd_export_mlperf,
        "write the config's universes as an MLPerf HPC CosmoFlow TFRecord folder (train/, "
        "validation/, test/), cropped and split as its shards are",
    )
    p.add_argument("--out", required=True, help="the new folder")
    p.add_argument(
        "--universes-dir",
        help="the universes' folder with its groups/ manifests (default <results>/universes)",
    )
    add_config(p)


def add_preprocess(sub) -> None:
    p = add_stage(sub, "preprocess", _cmd_preprocess, "crop universes into train/val/test shards")
    p.add_argument("universes", nargs="+", help="universe .hdf5 files")
    p.add_argument("--out", required=True, help="shard folder")
    p.add_argument("--threads", type=int, help="Dask threads when preprocess.num_workers is null")
    add_config(p)


def add_preprocess_plan(sub) -> None:
    p = add_stage(
        sub,
        "preprocess-plan",
        _cmd_preprocess_plan,
        "allocate the shards and split the config's universes into groups (one job each)",
    )
    p.add_argument(
        "--universes-dir",
        required=True,
        help="the universes' folder, whose groups/ holds the manifests of the config's groups",
    )
    p.add_argument("--staging", required=True, help="folder for the shards while groups write")
    add_config(p)


def add_preprocess_group(sub) -> None:
    p = add_stage(
        sub, "preprocess-group", _cmd_preprocess_group, "crop one group of the plan's universes"
    )
    p.add_argument("--staging", required=True)
    p.add_argument("--group", type=int, required=True)
    p.add_argument("--out", required=True, help="the group's histogram and checksums (.npz)")
    p.add_argument("--threads", type=int, help="Dask threads when preprocess.num_workers is null")
    add_config(p)


def add_preprocess_gather(sub) -> None:
    p = add_stage(
        sub,
        "preprocess-gather",
        _cmd_preprocess_gather,
        "statistics and manifest from every group; move the shards into place",
    )
    p.add_argument("--staging", required=True)
    p.add_argument("--groups-dir", required=True, help="folder of the groups' <g>.npz files")
    p.add_argument("--out", required=True, help="shard folder")
    add_config(p)


def add_features(sub) -> None:
    p = add_stage(
        sub,
        "features",
        _cmd_features,
        "(re)compute a shard folder's features.h5 (preprocessing writes it; for older folders)",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--threads", type=int, default=None, help="Dask threads (default: all cores)")
    p.add_argument(
        "--bispectrum",
        action="store_true",
        help="add the bispectrum statistics (as preprocess.bispectrum)",
    )
