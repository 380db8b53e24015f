"""`perf-model predict`'s mesh from its flags (--mesh, --data, --spatial, --split against
--nodes × --ranks-per-node), shared by the CPU's and the clusters' predictions."""

from __future__ import annotations

import math

from cosmocub.config import Config
from cosmocub.perfmodel.cost_model.topology import Mesh


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
