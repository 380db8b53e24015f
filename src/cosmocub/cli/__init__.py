"""The one command-line entry: `cosmocub <stage> …`, called by the Snakemake rules and by hand.

Each subcommand parses its arguments, loads the config through `cosmocub.config`, and calls one
function of the package. User mistakes (ValueError and subclasses) become one line on stderr and
exit status 2; nothing half-written is left behind because every stage writes atomically.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from cosmocub.config import load_config
from cosmocub.launch.agent import arm_rank
from cosmocub.launch.launcher import record_user_error
from cosmocub.workflow_support import CONFIG_ENV


def _cmd_inspect(args: argparse.Namespace) -> int:
    from cosmocub.data.inspect import format_report, inspect_path

    report = inspect_path(args.path)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from cosmocub.data.simulate import run_simulate
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    params = {"size": args.size, "seed": args.seed}
    # Deferred: inside a workflow, MLflow would cost this job more time than the simulation.
    with job_run(cfg, stage="simulate", params=params, defer=True) as tracker:
        metrics = run_simulate(args.out, size=args.size, seed=args.seed, settings=cfg.simulate)
        tracker.log_metrics(metrics)
    return 0


def _cmd_preprocess(args: argparse.Namespace) -> int:
    from cosmocub.data.preprocess import preprocess
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    with job_run(cfg, stage="preprocess") as tracker:
        manifest = preprocess(
            [Path(p) for p in args.universes],
            Path(args.out),
            settings=_granted_threads(cfg.preprocess, args.threads),
            seed=cfg.seed,
            config_hash=cfg.hash,
        )
        tracker.log_metrics({f"samples_{k}": v for k, v in manifest["counts"].items()})
    return 0


def _granted_threads(settings, threads: int | None):
    """The job's settings with Dask's threads set to what the executor granted (if the config
    leaves num_workers to the machine); the config itself, and so its hash, stays as it is."""
    import dataclasses

    if threads is None or settings.num_workers is not None:
        return settings
    return dataclasses.replace(settings, num_workers=threads)


def _cmd_preprocess_plan(args: argparse.Namespace) -> int:
    from cosmocub.data.preprocess import plan_shards
    from cosmocub.workflow_support import universe_ids

    cfg = load_config(args.config)
    folder = Path(args.universes_dir)
    plan = plan_shards(
        [folder / f"{name}.hdf5" for name in universe_ids(cfg)],
        Path(args.staging),
        settings=cfg.preprocess,
        seed=cfg.seed,
        universes_per_job=cfg.cluster.preprocess.universes_per_job,
    )
    print(f"preprocess-plan: {len(plan['place'])} universes in {len(plan['groups'])} groups")
    return 0


def _cmd_preprocess_group(args: argparse.Namespace) -> int:
    from cosmocub.data.preprocess import crop_group
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    with job_run(cfg, stage="preprocess", params={"group": args.group}):
        crop_group(
            Path(args.staging),
            args.group,
            Path(args.out),
            settings=_granted_threads(cfg.preprocess, args.threads),
        )
    return 0


def _cmd_preprocess_gather(args: argparse.Namespace) -> int:
    import json as _json

    from cosmocub.data.preprocess import PLAN_FILE, gather_shards
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    staging = Path(args.staging)
    num_groups = len(_json.loads((staging / PLAN_FILE).read_text())["groups"])
    groups = [Path(args.groups_dir) / f"{g}.npz" for g in range(num_groups)]
    with job_run(cfg, stage="preprocess") as tracker:
        manifest = gather_shards(
            staging, groups, Path(args.out), settings=cfg.preprocess, config_hash=cfg.hash
        )
        tracker.log_metrics({f"samples_{k}": v for k, v in manifest["counts"].items()})
    return 0


def _cmd_launch(args: argparse.Namespace) -> int:
    from cosmocub.launch.launcher import RankLayout, run_launch

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    layout = RankLayout(
        nodes=args.nodes,
        tasks_per_node=args.tasks_per_node,
        cpus_per_rank=args.cpus_per_rank,
        max_restarts=args.max_restarts,
    )
    return run_launch(layout, command)


def _cmd_model_summary(args: argparse.Namespace) -> int:
    from cosmocub.models.summary import format_summary, summarize

    cfg = load_config(args.config)
    if cfg.model.name != "cosmoflow":
        raise ValueError(f"{cfg.source}: model-summary describes CosmoFlow, not {cfg.model.name}")
    split = args.split or cfg.parallel.split_dhw
    print(format_summary(summarize(cfg.model, split=split)))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from cosmocub.train.main import train

    cfg = load_config(args.config)
    train(cfg, shards_dir=Path(args.shards), run_dir=Path(args.out))
    return 0


def _cmd_evaluate(args: argparse.Namespace) -> int:
    from cosmocub.evaluation.stage import evaluate
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    with job_run(cfg, stage="evaluate") as tracker:
        evaluate(
            cfg,
            shards_dir=Path(args.shards),
            run_dir=Path(args.run_dir),
            out_dir=Path(args.out),
            tracker=tracker,
        )
    return 0


def _cmd_features(args: argparse.Namespace) -> int:
    from cosmocub.data.features import FEATURES_FILE, write_features

    shards = Path(args.shards)
    write_features(shards, shards / FEATURES_FILE, num_workers=args.threads)
    return 0


def _cmd_link_universe(args: argparse.Namespace) -> int:
    from cosmocub.workflow_support import link_universe

    link_universe(Path(args.source), Path(args.dest))
    return 0


def _cmd_summarize(args: argparse.Namespace) -> int:
    from cosmocub.evaluation.report import write_summary

    write_summary(
        manifest_path=Path(args.manifest),
        metrics_paths=[Path(p) for p in args.metrics],
        out_path=Path(args.out),
        study_sections=[Path(p) for p in args.studies or ()],
    )
    return 0


def _cmd_tracking_start(args: argparse.Namespace) -> int:
    from cosmocub.tracking.tracker import start_workflow_run

    print(start_workflow_run(load_config(args.config), name=args.name))
    return 0


def _cmd_tracking_end(args: argparse.Namespace) -> int:
    from cosmocub.tracking.tracker import end_workflow_run

    end_workflow_run(load_config(args.config), args.run_id, args.status)
    return 0


def _cmd_resolve_config(args: argparse.Namespace) -> int:
    from cosmocub.config import write_config

    cfg = load_config(args.config)
    write_config(cfg.values, args.out)
    return 0


def _cmd_study_point_config(args: argparse.Namespace) -> int:
    from cosmocub.studies.runners import prepare_point

    prepare_point(load_config(args.config), args.study, args.point, Path(args.out))
    return 0


def _cmd_unet_config(args: argparse.Namespace) -> int:
    from cosmocub.config import write_config
    from cosmocub.fields.run_config import unet_config_values

    write_config(unet_config_values(load_config(args.config)), args.out)
    return 0


def _cmd_evaluate_fields(args: argparse.Namespace) -> int:
    from cosmocub.fields.evaluate import evaluate_fields
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    with job_run(cfg, stage="evaluate_fields") as tracker:
        evaluate_fields(
            cfg,
            shards_dir=Path(args.shards),
            run_dir=Path(args.run_dir),
            out_dir=Path(args.out),
            tracker=tracker,
        )
    return 0


def _cmd_study_point(args: argparse.Namespace) -> int:
    from cosmocub.studies.runners import run_point

    return run_point(
        study=args.study,
        point=args.point,
        point_config_path=Path(args.point_config),
        shards_dir=Path(args.shards),
        out=Path(args.out),
        cpus_per_rank=args.cpus_per_rank,
        max_restarts=args.max_restarts,
    )


def _cmd_study_gather(args: argparse.Namespace) -> int:
    from cosmocub.studies.engine import gather, study_points
    from cosmocub.tracking.tracker import job_run

    cfg = load_config(args.config)
    study_points(cfg, args.study)  # a bad study name or block fails before MLflow is opened
    folder = Path(args.dir)
    with job_run(cfg, stage=f"{args.study}_study", params={"study": args.study}) as tracker:
        gather(
            cfg,
            args.study,
            folder=folder,
            out_tsv=folder / "points.tsv",
            out_png=folder / f"{args.study}.png",
            out_summary=folder / "summary.md",
            tracker=tracker,
        )
    return 0


def _split_arg(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: need three positive integers, e.g. 2,1,1")
    return int(parts[0]), int(parts[1]), int(parts[2])


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosmocub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, handler: Callable[[argparse.Namespace], int], help: str):
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        return p

    def add_config(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--config",
            default=os.environ.get(CONFIG_ENV),
            help=f"YAML config (validated; defaults from the schema); default: ${CONFIG_ENV}",
        )

    p = add("inspect", _cmd_inspect, "describe a universe (HDF5) or an MLPerf sample (TFRecord)")
    p.add_argument("path")
    p.add_argument("--json", action="store_true", help="machine-readable output")

    p = add(
        "simulate", _cmd_simulate, "make one synthetic N-body universe in the cosmoUniverse layout"
    )
    p.add_argument("out", help="output .hdf5 path")
    p.add_argument("--size", type=int, required=True, help="voxels per side")
    p.add_argument("--seed", type=int, required=True)
    add_config(p)

    p = add("preprocess", _cmd_preprocess, "crop universes into train/val/test shards")
    p.add_argument("universes", nargs="+", help="universe .hdf5 files")
    p.add_argument("--out", required=True, help="shard folder")
    p.add_argument("--threads", type=int, help="Dask threads when preprocess.num_workers is null")
    add_config(p)

    p = add(
        "preprocess-plan",
        _cmd_preprocess_plan,
        "allocate the shards and split the config's universes into groups (one job each)",
    )
    p.add_argument("--universes-dir", required=True, help="folder of <universe id>.hdf5 files")
    p.add_argument("--staging", required=True, help="folder for the shards while groups write")
    add_config(p)

    p = add("preprocess-group", _cmd_preprocess_group, "crop one group of the plan's universes")
    p.add_argument("--staging", required=True)
    p.add_argument("--group", type=int, required=True)
    p.add_argument("--out", required=True, help="the group's histogram and checksums (.npz)")
    p.add_argument("--threads", type=int, help="Dask threads when preprocess.num_workers is null")
    add_config(p)

    p = add(
        "preprocess-gather",
        _cmd_preprocess_gather,
        "statistics and manifest from every group; move the shards into place",
    )
    p.add_argument("--staging", required=True)
    p.add_argument("--groups-dir", required=True, help="folder of the groups' <g>.npz files")
    p.add_argument("--out", required=True, help="shard folder")
    add_config(p)

    p = add("launch", _cmd_launch, "start the ranks of `cosmocub <stage>` with the right launcher")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--tasks-per-node", type=int, default=1)
    p.add_argument("--cpus-per-rank", type=int, default=1)
    p.add_argument(
        "--max-restarts", type=int, default=0, help="starts again after a crash (not a user error)"
    )
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="-- <stage> <arguments>")

    p = add(
        "model-summary", _cmd_model_summary, "layer table, parameter count and FLOPs per sample"
    )
    add_config(p)
    p.add_argument(
        "--split",
        type=_split_arg,
        help="ranks along D,H,W for the activation memory per rank, e.g. 2,1,1 "
        "(default: the config's parallel.split)",
    )

    p = add(
        "train",
        _cmd_train,
        "train the config's model (run under torchrun or srun for several ranks)",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--out", required=True, help="run folder (checkpoints, metrics, final model)")
    add_config(p)

    p = add("evaluate", _cmd_evaluate, "test-set metrics and plots for a trained run")
    p.add_argument("--shards", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True)
    add_config(p)

    p = add(
        "features",
        _cmd_features,
        "(re)compute a shard folder's features.h5 (preprocessing writes it; for older folders)",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--threads", type=int, default=None, help="Dask threads (default: all cores)")

    p = add("link-universe", _cmd_link_universe, "validate a public universe file and link it")
    p.add_argument("source")
    p.add_argument("dest")

    p = add("summarize", _cmd_summarize, "one-page markdown summary of shards and evaluations")
    p.add_argument("--manifest", required=True)
    p.add_argument("--metrics", nargs="+", required=True, help="evaluation metrics.json files")
    p.add_argument("--studies", nargs="*", help="studies' summary.md sections to append")
    p.add_argument("--out", required=True)

    p = add("tracking", _cmd_tracking_start, "open/close the MLflow parent run of a workflow")
    tracking = p.add_subparsers(dest="tracking_command", required=True)
    t = tracking.add_parser("start", help="open the parent run; print its id ('' when disabled)")
    t.set_defaults(handler=_cmd_tracking_start)
    t.add_argument("--name", help="run name (default workflow-<timestamp>)")
    add_config(t)
    t = tracking.add_parser("end", help="close the parent run")
    t.set_defaults(handler=_cmd_tracking_end)
    t.add_argument("--run-id", required=True, help="id printed by 'tracking start' ('' = no-op)")
    t.add_argument("--status", required=True, choices=["FINISHED", "FAILED", "KILLED"])
    add_config(t)

    p = add(
        "study-point-config",
        _cmd_study_point_config,
        "write the config of one point of a study (the base config and the point's overrides)",
    )
    p.add_argument("--study", required=True)
    p.add_argument("--point", required=True)
    p.add_argument("--out", required=True)
    add_config(p)

    p = add(
        "study-point",
        _cmd_study_point,
        "train one point of a study with its runner (locally: cosmocub launch -- train)",
    )
    p.add_argument("--study", required=True)
    p.add_argument("--point", required=True)
    p.add_argument("--point-config", required=True, help="the point's config (study-point-config)")
    p.add_argument("--shards", required=True)
    p.add_argument("--out", required=True, help="the point's folder (run/ and point.json)")
    p.add_argument("--cpus-per-rank", type=int, default=1)
    p.add_argument("--max-restarts", type=int, default=0)
    add_config(p)

    p = add(
        "unet-config",
        _cmd_unet_config,
        "write the config of the `snakemake unet` run (the config with its unet section merged)",
    )
    p.add_argument("--out", required=True)
    add_config(p)

    p = add(
        "evaluate-fields",
        _cmd_evaluate_fields,
        "test-set P(k) transfer, r(k), one-point PDF and slices of a U-Net run vs linear growth",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--run-dir", required=True)
    p.add_argument("--out", required=True)
    add_config(p)

    p = add(
        "study-gather",
        _cmd_study_gather,
        "a study's table (points.tsv), plot and report section from its points; MLflow parent run",
    )
    p.add_argument("--study", required=True)
    p.add_argument("--dir", required=True, help="the study's folder (one subfolder per point)")
    add_config(p)

    from cosmocub.perfmodel.cli import add_parser as add_perf_model

    add_perf_model(sub, add_config)

    p = add("resolve-config", _cmd_resolve_config, "write the config with every default filled in")
    p.add_argument("--out", required=True)
    add_config(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arm_rank()  # a rank of `cosmocub launch`'s torchrun dies with it (no orphaned ranks)
    args = _build_parser().parse_args(argv)
    # Stages report through `logging`; plain lines on stderr, as the workflow's job logs want.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as err:
        # User mistakes: one line, naming the file/key/numbers (the raiser's job), non-zero exit.
        message = f"cosmocub {args.command}: error: {err}".replace("\n", " ")
        print(message, file=sys.stderr)
        record_user_error(message)  # under `cosmocub launch`: no restart for this
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
