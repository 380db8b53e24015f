"""`perf-model predict`'s flags shared by the CPU's and the clusters' predictions: the mesh
(--mesh, --data, --spatial, --split against --nodes × --ranks-per-node) and what to price and
print (--epochs, --train-samples, --gpu-calibration, --accept-calibration, --software, --json)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from cosmocub.config import Config
from cosmocub.perfmodel.cost_model.topology import Mesh


@dataclass(frozen=True, kw_only=True)
class MeshFlags:
    """--data, --spatial (or --mesh), --split, --nodes and --ranks-per-node (None: a preset's)."""

    data: int | None
    spatial: int | None
    split: tuple[int, int, int] | None
    nodes: int
    ranks_per_node: int | None

    def mesh(self, cfg: Config, ranks_per_node: int | None = None) -> Mesh:
        """The mesh on `ranks_per_node` a node (a preset's), else on the flag's."""
        per_node = ranks_per_node or self.ranks_per_node
        if per_node is None:
            raise ValueError("--ranks-per-node: needed unless --cluster names the nodes")
        return mesh_from_flags(
            cfg, self.data, self.spatial, self.split, nodes=self.nodes, ranks_per_node=per_node
        )


@dataclass(frozen=True, kw_only=True)
class PricingFlags:
    """--epochs and --train-samples (None: the config's), --gpu-calibration (and
    --accept-calibration: one made against another accelerator or software), --software (the
    stack to price; None: a calibration's own, else cosmocub's eager step), --json."""

    epochs: int | None
    train_samples: int | None
    gpu_calibration: Path | None
    as_json: bool
    accept_calibration: bool = False
    software: str | None = None


def mesh_from_flags(
    cfg: Config,
    data: int | None,
    spatial: int | None,
    split: tuple[int, int, int] | None,
    *,
    nodes: int,
    ranks_per_node: int,
) -> Mesh:
    """The mesh of --mesh / --data / --spatial / --split, checked against --nodes × --ranks-per-
    node; spatial defaults to the split's or parallel.spatial, data to what the ranks leave."""
    world = nodes * ranks_per_node
    if split is not None and spatial is not None and math.prod(split) != spatial:
        raise ValueError(
            f"--split {','.join(map(str, split))} multiplies to {math.prod(split)}, not the "
            f"mesh's spatial {spatial}"
        )
    if spatial is None:
        spatial = math.prod(split) if split is not None else cfg.parallel.spatial
    if data is None:
        if world % spatial:
            raise ValueError(
                f"spatial {spatial} does not divide --nodes {nodes} x --ranks-per-node "
                f"{ranks_per_node} = {world} ranks"
            )
        data = world // spatial
    if data * spatial != world:
        raise ValueError(
            f"--mesh {data}x{spatial} is {data * spatial} ranks, not --nodes {nodes} x "
            f"--ranks-per-node {ranks_per_node} = {world}"
        )
    if split is None:
        # As training splits it: the config's split at its spatial, else depth only.
        split = cfg.parallel.split_dhw if cfg.parallel.spatial == spatial else (spatial, 1, 1)
    return Mesh(data=data, split=split)
