"""`cosmocub link-universe | tracking start/end/sync | unet-config | resolve-config`: the helpers
the workflow's rules call around the stages (inputs, MLflow parent run, derived configs).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cosmocub.cli.common import add_config, add_stage
from cosmocub.config import load_config


def _cmd_link_universe(args: argparse.Namespace) -> int:
    from cosmocub.data.universe import link_universe

    link_universe(Path(args.source), Path(args.dest))
    return 0


def _cmd_tracking_start(args: argparse.Namespace) -> int:
    from cosmocub.tracking.runs import start_workflow_run

    print(start_workflow_run(load_config(args.config), name=args.name))
    return 0


def _cmd_tracking_end(args: argparse.Namespace) -> int:
    from cosmocub.tracking.runs import end_workflow_run

    end_workflow_run(load_config(args.config), args.run_id, args.status)
    return 0


def _cmd_tracking_sync(args: argparse.Namespace) -> int:
    from cosmocub.tracking.runs import sync_pending

    count = sync_pending(load_config(args.config))
    print(f"cosmocub tracking sync: delivered {count} pending record(s)")
    return 0


def _cmd_unet_config(args: argparse.Namespace) -> int:
    from cosmocub.config import write_config
    from cosmocub.emulator.unet_run_config import unet_config_values

    write_config(unet_config_values(load_config(args.config)), args.out)
    return 0


def _cmd_resolve_config(args: argparse.Namespace) -> int:
    from cosmocub.config import write_config

    cfg = load_config(args.config)
    write_config(cfg.values, args.out)
    return 0


def add_link_universe(sub) -> None:
    p = add_stage(
        sub, "link-universe", _cmd_link_universe, "validate a public universe file and link it"
    )
    p.add_argument("source")
    p.add_argument("dest")


def add_tracking(sub) -> None:
    p = add_stage(
        sub, "tracking", _cmd_tracking_start, "open/close the MLflow parent run of a workflow"
    )
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
    t = tracking.add_parser(
        "sync", help="deliver what jobs kept in mlflow-pending/ while the store was away"
    )
    t.set_defaults(handler=_cmd_tracking_sync)
    add_config(t)


def add_unet_config(sub) -> None:
    p = add_stage(
        sub,
        "unet-config",
        _cmd_unet_config,
        "write the config of the `snakemake unet` run (the config with its unet section merged)",
    )
    p.add_argument("--out", required=True)
    add_config(p)


def add_resolve_config(sub) -> None:
    p = add_stage(
        sub, "resolve-config", _cmd_resolve_config, "write the config with every default filled in"
    )
    p.add_argument("--out", required=True)
    add_config(p)
