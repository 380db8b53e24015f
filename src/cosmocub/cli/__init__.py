"""The one command-line entry: `cosmocub <stage> …`, called by the Snakemake rules and by hand.

Each subcommand parses its arguments, loads the config through `cosmocub.config`, and calls one
function of the package. User mistakes (ValueError and subclasses) become one line on stderr and
exit status 2; nothing half-written is left behind because every stage writes atomically.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from cosmocub.cli import (
    data_commands,
    evaluate_commands,
    perf_model_commands,
    study_commands,
    train_commands,
    workflow_commands,
)
from cosmocub.cli.common import note_default_config
from cosmocub.launch.agent import arm_rank
from cosmocub.launch.launcher import peer_lost, record_peer_lost, record_user_error

# Every subcommand, in the order `cosmocub --help` lists them; each family module adds its own.
SUBCOMMANDS = (
    data_commands.add_inspect,
    data_commands.add_simulate,
    data_commands.add_simulate_group,
    data_commands.add_link_group,
    data_commands.add_mlperf_group,
    data_commands.add_export_mlperf,
    data_commands.add_preprocess,
    data_commands.add_preprocess_plan,
    data_commands.add_preprocess_group,
    data_commands.add_preprocess_gather,
    train_commands.add_launch,
    train_commands.add_model_summary,
    train_commands.add_train,
    evaluate_commands.add_evaluate,
    data_commands.add_features,
    workflow_commands.add_link_universe,
    evaluate_commands.add_summarize,
    workflow_commands.add_tracking,
    study_commands.add_study_point_config,
    study_commands.add_study_point,
    workflow_commands.add_unet_config,
    evaluate_commands.add_evaluate_fields,
    study_commands.add_study_gather,
    perf_model_commands.add_perf_model,
    workflow_commands.add_resolve_config,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cosmocub", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    arm_rank()  # a rank of `cosmocub launch`'s torchrun dies with it (no orphaned ranks)
    args = build_parser().parse_args(argv)
    # Stages report through `logging`; plain lines on stderr, as the workflow's job logs want.
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    note_default_config(args)
    try:
        return args.handler(args)
    except (ValueError, FileNotFoundError) as err:
        # User mistakes: one line, naming the file/key/numbers (the raiser's job), non-zero exit.
        message = f"cosmocub {args.command}: error: {err}".replace("\n", " ")
        print(message, file=sys.stderr)
        record_user_error(message)  # under `cosmocub launch`: no restart for this
        return 2
    except RuntimeError as err:
        if not peer_lost(err):
            raise  # a bug: its traceback is what to read
        # A peer gone (a lost node, a cut link) is no bug here: one line, and the launcher
        # decides whether to start the ranks again (not inside the allocation that lost it).
        first = " ".join(str(err).split())[:300].rstrip()
        message = f"cosmocub {args.command}: error: lost a peer rank: {first}"
        print(message, file=sys.stderr)
        record_peer_lost(message)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
