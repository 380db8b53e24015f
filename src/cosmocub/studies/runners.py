"""How a study point's training is started: the seam between the study engine and the machines.

A runner is `runner(point, *, config_path, shards_dir, out_dir, cpus_per_rank, max_restarts)`
returning (exit status, a dict for point.json); the point names its runner (`Point.runner`),
so an emulated-network runner plugs in here without touching the engine.

A runner that cannot run its point here (emulated nodes without CAP_NET_ADMIN) raises
PointSkipped; `cosmocub study-point` then records the point as skipped (point.json
`"skipped": why`) and the study's gather gives it a row of labels with blank measurements.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from cosmocub.studies.engine import Point


class PointSkipped(RuntimeError):
    """The point cannot run on this machine (message: why, in one line)."""


class Runner(Protocol):
    def __call__(
        self,
        point: Point,
        *,
        config_path: Path,
        shards_dir: Path,
        out_dir: Path,
        nproc_per_node: int,
        cpus_per_rank: int,
        max_restarts: int,
    ) -> tuple[int, Mapping[str, Any]]: ...


def run_local(
    point: Point,
    *,
    config_path: Path,
    shards_dir: Path,
    out_dir: Path,
    nproc_per_node: int,
    cpus_per_rank: int,
    max_restarts: int,
) -> tuple[int, Mapping[str, Any]]:
    """The point as the `train` rule runs: `cosmocub launch --tasks-per-node N -- train …` in
    the allocation this job runs in (torchrun here, srun/flux/blaunch on a cluster)."""
    from cosmocub.launch.launcher import RankLayout, run_launch

    layout = RankLayout(
        nodes=int(point.launch.get("nodes", 1)),
        tasks_per_node=nproc_per_node,
        cpus_per_rank=cpus_per_rank,
        max_restarts=max_restarts,
    )
    args = ["train", "--config", str(config_path), "--shards", str(shards_dir)]
    rc = run_launch(layout, [*args, "--out", str(out_dir)])
    return rc, {"nodes": layout.nodes, "nproc_per_node": nproc_per_node}


def run_emulated(
    point: Point,
    *,
    config_path: Path,
    shards_dir: Path,
    out_dir: Path,
    nproc_per_node: int,
    cpus_per_rank: int,
    max_restarts: int,
) -> tuple[int, Mapping[str, Any]]:
    """The point on `point.launch["nodes"]` emulated nodes (cosmocub.netemu) of nproc_per_node
    ranks each, links at `point.launch["bandwidth_mbit"]` (0: unshaped, but still on the
    emulated network, so its bytes on the wire are counted). The nodes share this job's cores
    (cpus_per_rank is what the scheduler granted; the cores each rank really had are recorded)."""
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu.runner import run_training_on_nodes

    nodes = int(point.launch.get("nodes", 1))
    bandwidth = float(point.launch.get("bandwidth_mbit", 0))
    try:
        result = run_training_on_nodes(
            config_path=config_path,
            shards_dir=shards_dir,
            out_dir=out_dir,
            nodes=nodes,
            nproc_per_node=nproc_per_node,
            bandwidth_mbit=bandwidth,
            max_restarts=max_restarts,
        )
    except EmulationUnavailableError as err:
        raise PointSkipped(f"emulated nodes unavailable: {err}") from None
    steps = (result.summary or {}).get("steps") or 0
    tx = result.node_tx_bytes
    return result.returncode, {
        "nodes": nodes,
        "nproc_per_node": nproc_per_node,
        "bandwidth_mbit": bandwidth,
        "cores_per_rank": result.cores_per_rank,
        "node_cores": result.node_cores,
        "node_tx_bytes": tx,
        # Over the whole run (start-up, validation, every attempt): mean over nodes per step.
        "wire_bytes_per_step_run": sum(tx) / len(tx) / steps if steps else None,
        "attempts": result.attempts,
        "wall_s": result.wall_s,
    }


RUNNERS: dict[str, Runner] = {"local": run_local, "emulated": run_emulated}


def runner(name: str) -> Runner:
    if name not in RUNNERS:
        raise ValueError(f"study runner {name!r}: unknown ({', '.join(sorted(RUNNERS))})")
    return RUNNERS[name]
