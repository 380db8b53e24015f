"""How a study point's training is started: the seam between the study engine and the machines.

A runner is `runner(plan, *, config_path, shards_dir, out_dir, cpus_per_rank, max_restarts)`
returning (exit status, a dict for point.json); the point's launch plan (written by
`cosmocub study-point-config`) names its runner, so an emulated-network runner plugs in here
without touching the engine.

A runner that cannot run its point here (emulated nodes without CAP_NET_ADMIN) raises
PointSkipped; `cosmocub study-point` then records the point as skipped (point.json
`"skipped": why`) and the study's gather gives it a row of labels with blank measurements.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from cosmocub.config import Config, StudiesConfig, load_config, write_config
from cosmocub.contention.marks import is_contended, own_share, point_conditions, why_contended
from cosmocub.io import read_jsonl
from cosmocub.studies.engine import (
    check_study,
    definition,
    find_point,
    point_config,
    point_launch_plan,
    point_record,
    write_point_record,
)
from cosmocub.studies.launch_plan import LaunchPlan, plan_path, read_launch_plan, write_launch_plan


class PointSkipped(RuntimeError):
    """The point cannot run on this machine (message: why, in one line)."""


class Runner(Protocol):
    def __call__(
        self,
        plan: LaunchPlan,
        *,
        config_path: Path,
        shards_dir: Path,
        out_dir: Path,
        cpus_per_rank: int,
        max_restarts: int,
    ) -> tuple[int, Mapping[str, Any]]: ...


def run_local(
    plan: LaunchPlan,
    *,
    config_path: Path,
    shards_dir: Path,
    out_dir: Path,
    cpus_per_rank: int,
    max_restarts: int,
) -> tuple[int, Mapping[str, Any]]:
    """The point as the `train` rule runs: `cosmocub launch --ranks-per-node N -- train …` in
    the allocation this job runs in (torchrun here, srun/flux/blaunch on a cluster). A point
    given a link rate runs on the allocation's links as they are: the record keeps the rate it
    was planned at and says that this runner did not set it."""
    from cosmocub.launch.launcher import RankLayout, detect_scheduler, run_launch

    if plan.nodes > 1 and detect_scheduler(os.environ) == "local":
        key = definition(plan.study).config_key
        raise ValueError(
            f"study {plan.study} point {plan.name}: runner local on {plan.nodes} nodes needs a "
            f"scheduler's allocation (run through --profile profiles/slurm), or set "
            f"{key}.runner: emulated to emulate the nodes on this machine"
        )
    layout = RankLayout(
        nodes=plan.nodes,
        ranks_per_node=plan.ranks_per_node,
        cpus_per_rank=cpus_per_rank,
        max_restarts=max_restarts,
    )
    args = ["train", "--config", str(config_path), "--shards", str(shards_dir)]
    rc = run_launch(layout, [*args, "--out", str(out_dir)])
    record: dict[str, Any] = {"nodes": layout.nodes, "ranks_per_node": plan.ranks_per_node}
    if plan.launch.rate_mbit is not None:  # a network point: its rate is a label here
        record |= {"rate_mbit": plan.rate_mbit, "rate_set_by_runner": False}
    return rc, record


def run_emulated(
    plan: LaunchPlan,
    *,
    config_path: Path,
    shards_dir: Path,
    out_dir: Path,
    cpus_per_rank: int,
    max_restarts: int,
) -> tuple[int, Mapping[str, Any]]:
    """The point on `plan.nodes` emulated nodes (cosmocub.netemu) of plan.ranks_per_node ranks
    each, links at `plan.rate_mbit` (0: unshaped, but still on the
    emulated network, so its bytes on the wire are counted). Each rank runs cpus_per_rank
    threads on cores of its own where the job's cores hold them all, else the ranks share the
    cores (recorded: `oversubscribed`, and the cores each rank really had)."""
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu.runner import run_training_on_nodes

    nodes, ranks_per_node, rate_mbit = plan.nodes, plan.ranks_per_node, plan.rate_mbit
    try:
        result = run_training_on_nodes(
            config_path=config_path,
            shards_dir=shards_dir,
            out_dir=out_dir,
            nodes=nodes,
            ranks_per_node=ranks_per_node,
            rate_mbit=rate_mbit,
            cpus_per_rank=cpus_per_rank,
            max_restarts=max_restarts,
        )
    except EmulationUnavailableError as err:
        raise PointSkipped(f"emulated nodes unavailable: {err}") from None
    steps = (result.summary or {}).get("steps") or 0
    tx = result.node_tx_bytes
    return result.returncode, {
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "rate_mbit": rate_mbit,
        "rate_set_by_runner": True,  # netemu shaped every node's link (0: left unshaped)
        "cores_per_rank": result.cores_per_rank,
        "threads_per_rank": result.threads_per_rank,
        "oversubscribed": result.oversubscribed,
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


def prepare_point(cfg: Config, study: str, point: str, config_out: Path) -> None:
    """`cosmocub study-point-config`: the point's config at `config_out` and its launch plan
    beside it (launch.json), the only things `cosmocub study-point` reads."""
    check_study(cfg, study)
    found = find_point(cfg, study, point)
    point_cfg = point_config(cfg, study, found)
    write_config(point_cfg.values, config_out)
    write_launch_plan(point_launch_plan(study, found, point_cfg), plan_path(config_out))


def run_point(
    *,
    study: str,
    point: str,
    point_config_path: Path,
    shards_dir: Path,
    out: Path,
    cpus_per_rank: int,
    max_restarts: int,
) -> int:
    """`cosmocub study-point`: the plan beside the point's config run by its runner (once more
    if the machine was busy: `rerun_if_contended`); point.json in `out` when it succeeded or was
    skipped here."""
    plan = read_launch_plan(plan_path(point_config_path))
    if (plan.study, plan.name) != (study, point):
        raise ValueError(
            f"{plan_path(point_config_path)}: the plan of study {plan.study!r} point "
            f"{plan.name!r}, not of study {study!r} point {point!r}"
        )
    attempt = functools.partial(
        runner(plan.runner),
        plan,
        config_path=point_config_path,
        shards_dir=shards_dir,
        cpus_per_rank=cpus_per_rank,
        max_restarts=max_restarts,
    )
    limits = load_config(point_config_path).studies
    try:
        rc, extra = attempt(out_dir=out / "run")
        if rc == 0:
            rc, extra = rerun_if_contended(
                attempt,
                extra,
                run_dir=out / "run",
                limits=limits,
                rerun=definition(study).timed,
            )
    except PointSkipped as why:
        # One line; the study goes on and its table shows the point with blank measurements.
        print(f"emulated points skipped: {study} point {point}: {why}", file=sys.stderr)
        rc, extra = 0, {"skipped": str(why), "ranks_per_node": plan.ranks_per_node}
    if rc == 0:
        write_point_record(point_record(plan, cores_per_rank=cpus_per_rank, extra=extra), out)
    return rc


def rerun_if_contended(
    attempt: Callable[..., tuple[int, Mapping[str, Any]]],
    extra: Mapping[str, Any],
    *,
    run_dir: Path,
    limits: StudiesConfig,
    rerun: bool = True,
) -> tuple[int, dict[str, Any]]:
    """Judge the finished run by the conditions it recorded (cosmocub.contention.marks); a
    contended run is moved aside (`<run>_contended`) and the point runs once more in a fresh
    folder, unless `rerun` is false (a study whose numbers are not times: StudyDefinition.timed).
    The runner's report gains `contended` and `runs`, each run's conditions."""
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        return 0, dict(extra)  # a runner that trained nothing here (a test's stand-in)
    first = point_conditions(read_jsonl(metrics))
    expected = own_share(extra.get("cores_per_rank"), extra.get("threads_per_rank"))
    contended = is_contended(first, limits, expected_ready=expected)
    runs = [{**first, "contended": contended, "run": run_dir.name}]
    if contended and rerun:
        aside = run_dir.with_name(f"{run_dir.name}_contended")
        shutil.rmtree(aside, ignore_errors=True)  # an earlier job's, of a run now redone
        run_dir.rename(aside)
        runs[0]["run"] = aside.name
        print(
            f"study point {run_dir.parent.name}: contended "
            f"({why_contended(first, limits, expected_ready=expected)}, "
            f"load {first['load_1m']:.2f}): running it once more",
            file=sys.stderr,
        )
        rc, extra = attempt(out_dir=run_dir)
        if rc != 0:
            return rc, dict(extra)
        second = point_conditions(read_jsonl(metrics))
        contended = is_contended(second, limits, expected_ready=expected)
        runs.append({**second, "contended": contended, "run": run_dir.name})
    # `runs`, not `attempts`: that is the launcher's restarts within one run (emulated runner).
    return 0, {**extra, "contended": contended, "runs": runs}
