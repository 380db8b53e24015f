"""What every family of `cosmocub` subcommands adds its stages with: the subparser and --config.

A stage's handler takes the parsed arguments and returns the exit status; `main` turns errors.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from cosmocub.config import CONFIG_ENV

Handler = Callable[[argparse.Namespace], int]


def add_stage(sub, name: str, handler: Handler, help: str) -> argparse.ArgumentParser:
    """The subcommand `name` of `sub` (an add_subparsers action), run by `handler`."""
    p = sub.add_parser(name, help=help, description=help)
    p.set_defaults(handler=handler)
    return p


def add_config(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=os.environ.get(CONFIG_ENV),
        help=f"YAML config (validated; defaults from the schema); default: ${CONFIG_ENV}",
    )
