"""The one torchrun command line: `python -m cosmocub.launch.agent …` (torchrun with one-line
failures and ranks that die with it), standalone on this machine or one node of a rendezvous.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

AGENT_MODULE = "cosmocub.launch.agent"
# What every rank of a `cosmocub` stage runs: the CLI as a module (launch starts ranks with it).
CLI_PROGRAM = ("-m", "cosmocub.cli")


@dataclass(frozen=True, kw_only=True)
class Rendezvous:
    """Where the nodes' agents of a multi-node launch meet: the c10d `endpoint` and `rdzv_id`.
    Where hostnames do not tell the nodes apart (emulated nodes share the machine's):
    `local_addr`, the address the other nodes reach this one at, and `is_host`, whether this
    agent serves the endpoint."""

    nodes: int
    endpoint: str
    rdzv_id: str
    local_addr: str | None = None
    is_host: bool | None = None


def torchrun_argv(
    ranks_per_node: int,
    *program: str,
    max_restarts: int = 0,
    python: str = sys.executable,
    rendezvous: Rendezvous | None = None,
) -> list[str]:
    """torchrun of `ranks_per_node` ranks running `program` (a script and its arguments, or
    `-m module …`): `--standalone` on this machine, or one node of `rendezvous`."""
    if rendezvous is None:
        where = ["--standalone", f"--nproc-per-node={ranks_per_node}"]
    else:
        r = rendezvous
        where = [
            f"--nnodes={r.nodes}",
            f"--nproc-per-node={ranks_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={r.endpoint}",
            f"--rdzv-id={r.rdzv_id}",
            *([] if r.is_host is None else [f"--rdzv-conf=is_host={int(r.is_host)}"]),
            *([f"--local-addr={r.local_addr}"] if r.local_addr else []),
        ]
    return [python, "-m", AGENT_MODULE, *where, f"--max-restarts={max_restarts}", *program]


def cli_program(module_args: Sequence[str]) -> list[str]:
    """`-m cosmocub.cli <module_args>`: the program of a rank of `cosmocub <stage>`."""
    return [*CLI_PROGRAM, *module_args]
