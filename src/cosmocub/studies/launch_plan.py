"""A study point's launch, planned once: how its study lays out its ranks (PointLaunch) and what
`cosmocub study-point` runs (LaunchPlan, written beside the point's config as launch.json).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.io import atomic_path

PLAN_FILE = "launch.json"


@dataclass(frozen=True, kw_only=True)
class PointLaunch:
    """Rank layout a study gives a point; None: not given (one node, the point config's
    train.ranks_per_node, links unshaped)."""

    nodes: int | None = None
    ranks_per_node: int | None = None
    rate_mbit: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """What the study gave (point.json's `launch`)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class LaunchPlan:
    """What runs for one point: its runner on `nodes` nodes of `ranks_per_node` ranks each."""

    study: str
    name: str
    runner: str
    labels: Mapping[str, Any]
    launch: PointLaunch  # as the study gave it
    nodes: int
    ranks_per_node: int
    rate_mbit: float

    @property
    def ranks(self) -> int:
        """The point's ranks (on one machine where its nodes are emulated)."""
        return self.nodes * self.ranks_per_node

    @property
    def allocated_nodes(self) -> int:
        """Nodes to ask a scheduler for: emulated nodes are namespaces of the one machine the
        point's job runs on, so asking for `nodes` would leave all but one of them idle."""
        return 1 if self.runner == "emulated" else self.nodes

    @property
    def ranks_per_allocated_node(self) -> int:
        return self.ranks // self.allocated_nodes


def plan_launch(
    *,
    study: str,
    name: str,
    runner: str,
    labels: Mapping[str, Any],
    launch: PointLaunch,
    point_cfg: Config,
) -> LaunchPlan:
    """The plan of a point whose config is `point_cfg`: what its study did not give is one node,
    the config's train.ranks_per_node and unshaped links."""
    given = launch.ranks_per_node
    return LaunchPlan(
        study=study,
        name=name,
        runner=runner,
        labels=dict(labels),
        launch=launch,
        nodes=1 if launch.nodes is None else launch.nodes,
        ranks_per_node=point_cfg.train.ranks_per_node if given is None else given,
        rate_mbit=0.0 if launch.rate_mbit is None else float(launch.rate_mbit),
    )


def write_launch_plan(plan: LaunchPlan, path: Path) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(dataclasses.asdict(plan), indent=2) + "\n")


def read_launch_plan(path: Path) -> LaunchPlan:
    """The plan study-point-config wrote; a missing or stale file is an error naming it."""
    try:
        values = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: not found (cosmocub study-point-config writes it beside the point's config)"
        ) from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    try:
        return LaunchPlan(**{**values, "launch": PointLaunch(**values["launch"])})
    except (KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a launch plan ({err})") from None


def plan_path(point_config: Path) -> Path:
    """The plan sits beside the point's config, in the point's folder."""
    return Path(point_config).with_name(PLAN_FILE)
