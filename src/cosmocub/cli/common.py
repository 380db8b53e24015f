"""What every family of `cosmocub` subcommands adds its stages with: the subparser and --config.

A stage's handler takes the parsed arguments and returns the exit status; `main` turns errors.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

Handler = Callable[[argparse.Namespace], int]


def add_stage(sub, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
    """The subcommand `name` of `sub` (an add_subparsers action), run by `handler`."""
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(handler=handler)
    return p


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        help="YAML config (validated; what it leaves out comes from the schema's defaults); "
        "without it, the schema's defaults alone, said on stderr",
    )


def note_default_config(args: argparse.Namespace) -> None:
    """One line on stderr where a stage that reads a config was given none: it runs on the
    schema's defaults (a complete, valid config: the laptop default), and says so, since a job
    that meant to name one would otherwise train something else without a word."""
    if "config" in vars(args) and args.config is None:
        print(
            f"cosmocub {args.command}: no --config: using the schema's defaults "
            "(cosmocub/schemas/config.schema.yaml)",
            file=sys.stderr,
        )
