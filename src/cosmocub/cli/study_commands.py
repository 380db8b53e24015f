"""`cosmocub study-point-config | study-point | study-gather`: one point of a study, its config
and its training, and the study's table, plot and report section from its points.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config, add_stage
from cosmocub.config import load_config


def _cmd_study_point_config(args: argparse.Namespace) -> int:
    from cosmocub.studies.runners import prepare_point

    prepare_point(load_config(args.config), args.study, args.point, Path(args.out))
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
    from cosmocub.studies.gather import gather_study

    gather_study(load_config(args.config), args.study, folder=Path(args.dir))
    return 0


def add_study_point_config(sub) -> None:
    p = add_stage(
        sub,
        "study-point-config",
        _cmd_study_point_config,
        "write the config of one point of a study (the base config and the point's overrides)",
    )
    p.add_argument("--study", required=True)
    p.add_argument("--point", required=True)
    p.add_argument("--out", required=True)
    add_config(p)


def add_study_point(sub) -> None:
    p = add_stage(
        sub,
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
    # No --config: the point's own config and its launch plan (study-point-config) are all it reads.


def add_study_gather(sub) -> None:
    p = add_stage(
        sub,
        "study-gather",
        _cmd_study_gather,
        "a study's table (points.tsv), plot and report section from its points; MLflow parent run",
    )
    p.add_argument("--study", required=True)
    p.add_argument("--dir", required=True, help="the study's folder (one subfolder per point)")
    add_config(p)
