"""Collectives as NCCL prices them (perfmodel.cost_model.nccl_collectives), against NCCL's
tuning formulas worked by hand on small cases (NVIDIA/nccl v2.18.5 src/graph/tuning.cc)."""

from __future__ import annotations

import pytest

from cosmocub.perfmodel.cost_model.cluster_network import NcclNetwork
from cosmocub.perfmodel.cost_model.nccl_collectives import (
    NcclNode,
    algorithm_time_us,
    channels,
    choose,
)

DGX_H100 = NcclNode(
    arch="hopper",
    cpu_vendor="intel",
    intra_link="nvlink",
    intra_gbyte_s=360.0,
    nics=8,
    nic_gbyte_s=50.0,
    ranks_per_node=8,
    ll128=True,
)
A100_AMD = NcclNode(
    arch="ampere",
    cpu_vendor="amd",
    intra_link="nvlink",
    intra_gbyte_s=240.0,
    nics=4,
    nic_gbyte_s=25.0,
    ranks_per_node=4,
    ll128=False,
)


def test_one_node_ring_is_base_plus_a_step_per_hop_and_busbw_over_2_p_minus_1_over_p() -> None:
    # 360 GB/s of NVLink: 6 channels at 60, duplicated to 12 at 30 (search.cc).
    assert channels(DGX_H100, 1, 8) == (12, 30.0)
    # baseLat 8.4 + 2(P-1) steps of NVLink Simple 3.4 us; busBw 360, algBw = busBw·P/(2(P-1))
    lat = 8.4 + 14 * 3.4
    expected = lat + 1e6 / (1000 * 360 * 8 / 14)
    assert algorithm_time_us(DGX_H100, "allreduce", "ring", "Simple", 1e6, 8, 1) == pytest.approx(
        expected, rel=1e-12
    )


def test_ring_across_nodes_pays_network_steps_net_overhead_and_the_plateau() -> None:
    # 4 NICs of 25 GB/s: 4 channels at 24 (no duplication below 25); AMD: 2 us × 3 (Simple)
    # floors the intra-node steps; v2.18.5 counts 2·nNodes inter-node steps; ×1.4 plateau.
    assert channels(A100_AMD, 2, 4) == (4, 24.0)
    lat = (8.4 + (14 - 4) * 6.0 + 4 * 14.0) * 1.4
    expected = lat + 1e6 / (1000 * 96 * 8 / 14)
    assert algorithm_time_us(A100_AMD, "allreduce", "ring", "Simple", 1e6, 8, 2) == pytest.approx(
        expected, rel=1e-12
    )


def test_tree_latency_is_logarithmic_in_nodes_and_its_bandwidth_half_the_capped_bus() -> None:
    # 2·((ppn-1)·NVLink 4.0 + log2(nodes)·NET 14) and Tree Simple baseLat 0; busBw
    # min(0.92·8·48, 8·36.0) = 288, algBw 144, ×0.8 correction at 2^26 bytes (log2(2^20)).
    lat = 2 * (7 * 4.0 + 2 * 14.0)
    expected = lat + 2**26 / (1000 * 144 * 0.8)
    got = algorithm_time_us(DGX_H100, "allreduce", "tree", "Simple", 2**26, 32, 4)
    assert got == pytest.approx(expected, rel=1e-12)
    assert algorithm_time_us(DGX_H100, "allgather", "tree", "Simple", 2**26, 32, 4) is None


def test_nccl_picks_by_size_tree_at_scale_ring_within_a_node() -> None:
    small, large = 1024, 2**28

    def picked(size: int, ranks: int, nodes: int) -> tuple[str, str]:
        c = choose(DGX_H100, "allreduce", size, ranks, nodes)
        return c.algorithm, c.protocol

    assert picked(small, 512, 64) == ("tree", "LL")
    assert picked(2**20, 512, 64) == ("tree", "LL128")
    assert picked(large, 512, 64) == ("tree", "Simple")
    assert picked(small, 8, 1) == ("ring", "LL")
    assert picked(large, 8, 1) == ("ring", "Simple")
    # LL128 is off where the GPU-NIC path does not qualify (A100_AMD): never chosen
    for size in (2**10, 2**16, 2**20, 2**24, 2**28):
        assert choose(A100_AMD, "allreduce", size, 512, 128).protocol != "LL128"
    # At 512 ranks a flat ring's latency alone is milliseconds; the tree's, tenths of one
    ring = algorithm_time_us(DGX_H100, "allreduce", "ring", "Simple", small, 512, 64)
    tree = algorithm_time_us(DGX_H100, "allreduce", "tree", "Simple", small, 512, 64)
    assert ring is not None and tree is not None and ring > 15 * tree


def test_a_node_of_eight_sends_seven_eighths_of_a_rings_bytes_over_nvlink() -> None:
    net = NcclNetwork(node=DGX_H100)
    inter = 800.0 * net.inter_fraction("allreduce", 512, 1)  # 512 ranks on 64 nodes
    assert (800.0 - inter, inter) == (700.0, 100.0)
    assert 800.0 * net.inter_fraction("allreduce", 8, 1) == 0.0  # one node


def test_an_all_to_all_sends_its_other_nodes_peers_chunks_across_nodes() -> None:
    """Of what a rank sends in an all-to-all (one chunk to each of P − 1 peers), the chunks of
    the P − g peers on other nodes cross: 8 of 15 at 16 ranks, 8 a node (not 8 of 16)."""
    net = NcclNetwork(node=DGX_H100)
    assert net.inter_fraction("alltoall", 16, 1) == 8 / 15
    assert net.inter_fraction("alltoall", 8, 1) == 0.0


def test_nccl_network_lays_groups_out_node_by_node_and_inverts_sent_bytes() -> None:
    net = NcclNetwork(node=DGX_H100)
    assert net.layout(8, 1) == (1, 8)
    assert net.layout(512, 1) == (64, 8)
    assert net.layout(64, 8) == (64, 1)  # one rank a node: its own NIC (a rail)
    assert channels(DGX_H100, 64, 1) == (2, 24.0)  # one 50 GB/s NIC: 48, duplicated
    n, p = 4e6, 512
    assert net.sent_s("allreduce", 2 * (p - 1) / p * n, p) == pytest.approx(
        net.collective_s("allreduce", n, p)
    )
    assert net.sent_s("allgather", (p - 1) / p * n, p) == pytest.approx(
        net.collective_s("allgather", n, p)
    )
    assert net.collective_s("allreduce", n, 1) == 0.0
    # An all-to-all across nodes costs more than within one
    assert net.collective_s("alltoall", n, 64, 8) > net.collective_s("alltoall", n, 8)
