"""How a study point's training is started: the seam between the study engine and the machines.

A runner is `runner(point, *, config_path, shards_dir, out_dir, cpus_per_rank, max_restarts)`
returning (exit status, a dict for point.json); the point names its runner (`Point.runner`),
so an emulated-network runner plugs in here without touching the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from cosmocub.studies.engine import Point


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
    from cosmocub.launch import RankLayout, run_launch

    layout = RankLayout(
        nodes=int(point.launch.get("nodes", 1)),
        tasks_per_node=nproc_per_node,
        cpus_per_rank=cpus_per_rank,
        max_restarts=max_restarts,
    )
    args = ["train", "--config", str(config_path), "--shards", str(shards_dir)]
    rc = run_launch(layout, [*args, "--out", str(out_dir)])
    return rc, {"nodes": layout.nodes, "nproc_per_node": nproc_per_node}


RUNNERS: dict[str, Runner] = {"local": run_local}


def runner(name: str) -> Runner:
    if name not in RUNNERS:
        raise ValueError(f"study runner {name!r}: unknown ({', '.join(sorted(RUNNERS))})")
    return RUNNERS[name]
