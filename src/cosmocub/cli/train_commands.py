"""`cosmocub launch | model-summary | train`: start the ranks, describe the model, train it."""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config, add_stage
from cosmocub.config import load_config


def _stage_config(command: list[str]) -> str | None:
    """The --config the launched stage names (`-- train --config c.yaml …`), if any."""
    for i, arg in enumerate(command):
        if arg == "--config" and i + 1 < len(command):
            return command[i + 1]
        if arg.startswith("--config="):
            return arg.removeprefix("--config=")
    return None


def _cmd_launch(args: argparse.Namespace) -> int:
    from cosmocub.launch.launcher import RankLayout, run_launch

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    nodes, ranks_per_node = args.nodes, args.ranks_per_node
    if nodes is None or ranks_per_node is None:
        # The world the stage's own config asks for (training refuses any other), so the
        # command names the config once.
        cfg = load_config(_stage_config(command))
        nodes = cfg.cluster.train.nodes if nodes is None else nodes
        ranks_per_node = cfg.train.ranks_per_node if ranks_per_node is None else ranks_per_node
    layout = RankLayout(
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        cpus_per_rank=args.cpus_per_rank,
        max_restarts=args.max_restarts,
    )
    return run_launch(layout, command)


def _cmd_model_summary(args: argparse.Namespace) -> int:
    from cosmocub.models.summary import config_summary_text

    print(config_summary_text(load_config(args.config), split=args.split))
    return 0


def _cmd_train(args: argparse.Namespace) -> int:
    from cosmocub.train.main import check_launched_world, train

    cfg = load_config(args.config)
    check_launched_world(cfg)
    train(cfg, shards_dir=Path(args.shards), run_dir=Path(args.out))
    return 0


def _split_arg(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: need three positive integers, e.g. 2,1,1")
    return int(parts[0]), int(parts[1]), int(parts[2])


def add_launch(sub) -> None:
    p = add_stage(
        sub, "launch", _cmd_launch, "start the ranks of `cosmocub <stage>` with the right launcher"
    )
    p.add_argument("--nodes", type=int, help="default: the stage's --config's cluster.train.nodes")
    p.add_argument(
        "--ranks-per-node",
        type=int,
        help="ranks started on each node; default: the stage's --config's train.ranks_per_node",
    )
    p.add_argument("--cpus-per-rank", type=int, default=1)
    p.add_argument(
        "--max-restarts", type=int, default=0, help="starts again after a crash (not a user error)"
    )
    p.add_argument("command_args", nargs=argparse.REMAINDER, help="-- <stage> <arguments>")


def add_model_summary(sub) -> None:
    p = add_stage(
        sub,
        "model-summary",
        _cmd_model_summary,
        "layer table, parameter count and FLOPs per sample",
    )
    add_config(p)
    p.add_argument(
        "--split",
        type=_split_arg,
        help="ranks along D,H,W for the activation memory per rank, e.g. 2,1,1 "
        "(default: the config's parallel.split)",
    )


def add_train(sub) -> None:
    p = add_stage(
        sub,
        "train",
        _cmd_train,
        "train the config's model (run under torchrun or srun for several ranks)",
    )
    p.add_argument("--shards", required=True)
    p.add_argument("--out", required=True, help="run folder (checkpoints, metrics, final model)")
    add_config(p)
