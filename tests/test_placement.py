"""Ranks per node from where the ranks run (cosmocub.parallel.placement)."""

import pytest

from cosmocub.parallel.placement import RankPlace, my_place, ranks_per_node


def _places(*nodes: str) -> list[RankPlace]:
    return [RankPlace(rank=r, host=n, local_rank=0, node=n) for r, n in enumerate(nodes)]


def test_blocks_of_consecutive_ranks_give_the_node_size() -> None:
    assert ranks_per_node(_places("a", "a", "b", "b")) == 2
    assert ranks_per_node(_places("a", "a", "a")) == 3
    assert ranks_per_node(_places("a", "b", "c")) == 1


@pytest.mark.parametrize(
    ("nodes", "said"),
    [
        (("a", "b", "a", "b"), "a: 1, b: 1, a: 1, b: 1"),  # srun --distribution=cyclic
        (("a", "a", "a", "b"), "a: 3, b: 1"),  # uneven
    ],
)
def test_other_placements_are_refused_naming_the_nodes(nodes, said) -> None:
    with pytest.raises(ValueError, match=said):
        ranks_per_node(_places(*nodes))


def test_a_node_is_a_host_and_a_network_namespace() -> None:
    import os
    import socket

    place = my_place(rank=3, local_rank=1)
    assert (place.rank, place.local_rank, place.host) == (3, 1, socket.gethostname())
    netns = os.stat("/proc/self/ns/net").st_ino
    assert place.node == f"{socket.gethostname()}/netns:{netns}"
