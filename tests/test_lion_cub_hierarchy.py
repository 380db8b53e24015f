"""Lion Cub's two-level exchange (hierarchy node): the node layout of the data axis, the slices'
per-tensor scales, the byte split, and 4 gloo ranks as 2 nodes × 2 against a vote computed from
every rank's c (tests/test_lion_cub_hybrid.py trains it and resumes it bit for bit)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from cosmocub.config import ConfigError, load_config
from cosmocub.optim.hierarchy import partial_stats, scales_from_stats, slice_segments
from cosmocub.optim.quantize import quantize, tensor_scales
from cosmocub.parallel.node_layout import NodeLayout, pairwise_inter_fraction, ring_inter_fraction


def test_node_layout_groups_and_refusals() -> None:
    # 8 ranks, 4 a node, spatial 2: 2 data ranks a node, 2 nodes; global = data · 2 + spatial.
    layout = NodeLayout(data=4, spatial=2, ranks_per_node=4)
    assert (layout.data_per_node, layout.nodes, layout.two_level) == (2, 2, True)
    assert layout.intra_groups() == [[0, 2], [4, 6], [1, 3], [5, 7]]
    assert layout.inter_groups() == [[0, 4], [2, 6], [1, 5], [3, 7]]
    # Every intra group lies on one node (global rank // 4), every rail on distinct ones.
    assert all(len({r // 4 for r in g}) == 1 for g in layout.intra_groups())
    assert all(len({r // 4 for r in g}) == len(g) for g in layout.inter_groups())
    # A spatial group spanning nodes: one data rank a node, one level.
    assert NodeLayout(data=2, spatial=4, ranks_per_node=2).data_per_node == 1
    assert not NodeLayout(data=4, spatial=1, ranks_per_node=4).two_level  # one node
    with pytest.raises(ValueError, match=r"ranks per node 3 does not divide the world of 8"):
        NodeLayout(data=4, spatial=2, ranks_per_node=3)
    with pytest.raises(ValueError, match=r"ranks per node 6 and spatial 4: a node must hold"):
        NodeLayout(data=3, spatial=4, ranks_per_node=6)


def test_inter_node_fractions() -> None:
    assert ring_inter_fraction(8, 4) == 1 / 4 and ring_inter_fraction(4, 4) == 0.0
    assert ring_inter_fraction(4, 1) == 1.0
    assert pairwise_inter_fraction(8, 4) == 4 / 7 and pairwise_inter_fraction(4, 4) == 0.0
    assert pairwise_inter_fraction(4, 1) == 1.0 and pairwise_inter_fraction(1, 1) == 0.0


@pytest.mark.parametrize("quantizer", ["l1", "linf", "l0"])
def test_slices_scales_are_the_whole_tensors(quantizer: str) -> None:
    sizes = [5, 0, 13, 7]
    c = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(3))
    c[::4] = 0.0
    c[5:9] = 0.0  # a tensor's run of zeros, for l0's count
    total, parts = sum(sizes), 4
    m = -(-total // parts)
    padded = torch.nn.functional.pad(c, (0, parts * m - total))
    stats = []
    for j in range(parts):
        segments = slice_segments(sizes, j * m, (j + 1) * m)
        assert len(segments) == len(sizes) + 1 and sum(segments) == m
        stats.append(partial_stats(padded[j * m : (j + 1) * m].abs(), segments, quantizer))
    combined = torch.stack(stats).amax(0) if quantizer == "linf" else torch.stack(stats).sum(0)
    got = scales_from_stats(combined, sizes, quantizer).float()
    assert torch.allclose(got, tensor_scales(c, sizes, quantizer), rtol=1e-6)
    # Quantized slice by slice with the whole tensors' scales = quantized whole.
    whole = quantize(c, quantizer=quantizer, levels=7, segments=sizes, scales=got)
    pieces = [
        quantize(
            padded[j * m : (j + 1) * m],
            quantizer=quantizer,
            levels=7,
            segments=slice_segments(sizes, j * m, (j + 1) * m),
            scales=torch.cat([got, got.new_zeros(1)]),
        )
        for j in range(parts)
    ]
    assert torch.equal(torch.cat(pieces)[:total], whole)
    assert not torch.cat(pieces)[total:].any()  # the padding sends 0


def test_hierarchy_key() -> None:
    cfg = load_config(None, overrides={"optimizer": {"name": "lion_cub"}})
    assert cfg.optimizer.lion_cub is not None and cfg.optimizer.lion_cub.hierarchy == "flat"
    assert cfg.parallel.assumed_ranks_per_node is None
    with pytest.raises(ConfigError, match="hierarchy"):
        load_config(
            None, overrides={"optimizer": {"name": "lion_cub", "lion_cub": {"hierarchy": "rack"}}}
        )


@pytest.mark.slow
def test_two_nodes_of_two_vote_over_the_nodes_means(
    four_gloo_ranks: subprocess.CompletedProcess,
) -> None:
    # The program is tests/four_gloo_ranks.py's TWO_NODES, in a spawn shared with
    # tests/test_lion_cub.py's collectives.
    proc = four_gloo_ranks
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("two levels OK") == 4, proc.stdout
