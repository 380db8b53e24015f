"""Where each rank runs: its host, network namespace and node-local rank, gathered once over the
world when the process group starts, and the ranks per node that follow from it.

The node groups (Lion Cub's two-level exchange, the intra/inter-node byte split) are built from
this record of where the ranks are, not from what the launcher says about ranks per node: a
scheduler that places 3 ranks on one node and 1 on another, or cyclically, is caught here with
the hosts named instead of giving groups that cross nodes where they should not. A node is a
host and a network namespace: emulated nodes of one machine (cosmocub.netemu, the Slurm of
scripts/slurm-emulated-nodes.sh) share the machine but not its network.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch.distributed as dist


@dataclass(frozen=True, kw_only=True)
class RankPlace:
    rank: int
    host: str  # the hostname the rank saw (an emulated node's own under `unshare --uts`)
    local_rank: int  # as the launcher said (SLURM_LOCALID, LOCAL_RANK)
    node: str  # host and network namespace: what tells nodes apart

    def as_record(self) -> dict[str, object]:
        return asdict(self)


def my_place(*, rank: int, local_rank: int) -> RankPlace:
    host = socket.gethostname()
    try:
        netns = os.stat("/proc/self/ns/net").st_ino
    except OSError:  # not Linux: the hostname alone
        return RankPlace(rank=rank, host=host, local_rank=local_rank, node=host)
    return RankPlace(rank=rank, host=host, local_rank=local_rank, node=f"{host}/netns:{netns}")


def gather_places(*, rank: int, local_rank: int, world_size: int) -> tuple[RankPlace, ...]:
    """Every rank's place, in rank order (a collective over the world when world_size > 1)."""
    mine = my_place(rank=rank, local_rank=local_rank)
    if world_size == 1:
        return (mine,)
    places: list[RankPlace | None] = [None] * world_size
    dist.all_gather_object(places, mine)
    return tuple(p for p in places if p is not None)


def ranks_per_node(places: Sequence[RankPlace]) -> int:
    """G: the ranks on each node, where every node holds G consecutive ranks (srun's and
    torchrun's block layout, which cosmocub.parallel.node_layout assumes); ValueError naming the
    nodes otherwise."""
    blocks: list[tuple[str, int]] = []  # (node, ranks) in rank order
    for place in places:
        if blocks and blocks[-1][0] == place.node:
            blocks[-1] = (place.node, blocks[-1][1] + 1)
        else:
            blocks.append((place.node, 1))
    nodes = [node for node, _ in blocks]
    sizes = {size for _, size in blocks}
    if len(set(nodes)) != len(nodes) or len(sizes) != 1:
        layout = ", ".join(f"{node.split('/')[0]}: {size}" for node, size in blocks)
        raise ValueError(
            f"ranks are not placed in equal blocks of consecutive ranks per node ({layout}, in "
            "rank order): the node groups need the block layout (srun --distribution=block, "
            "the same tasks on every node)"
        )
    return sizes.pop()
