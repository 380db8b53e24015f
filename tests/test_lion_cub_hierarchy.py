"""Lion Cub's two-level exchange (hierarchy node): the node layout of the data axis, the slices'
per-tensor scales, the byte split, and 4 gloo ranks as 2 nodes × 2 against a vote computed from
every rank's c (tests/test_lion_cub_hybrid.py trains it and resumes it bit for bit)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cosmocub.config import ConfigError, load_config
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.optim.hierarchy import partial_stats, scales_from_stats, slice_segments
from cosmocub.optim.quantize import quantize, tensor_scales
from cosmocub.parallel.nodes import NodeLayout, pairwise_inter_fraction, ring_inter_fraction


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
    assert cfg.parallel.ranks_per_node is None
    with pytest.raises(ConfigError, match="hierarchy"):
        load_config(
            None, overrides={"optimizer": {"name": "lion_cub", "lion_cub": {"hierarchy": "rack"}}}
        )


TWO_NODES = """
import itertools, torch, torch.distributed as dist
from torch import nn
from cosmocub.optim import LionCub, world_node_groups
from cosmocub.optim.hierarchy import partial_stats, scales_from_stats
from cosmocub.optim.quantize import quantize, quantizer_levels
from cosmocub.optim.vote import tie_pattern, vote
from cosmocub.optim.wire import WireSpec, wire_values

dist.init_process_group("gloo")
rank, P, G = dist.get_rank(), dist.get_world_size(), 2
nodes = P // G
data = dist.new_group(list(range(P)))
intra, rail = world_node_groups(G)  # the public helper: [0, 1], [2, 3]; rails [0, 2], [1, 3]
assert dist.get_process_group_ranks(intra) == [rank // G * G, rank // G * G + 1]
assert dist.get_process_group_ranks(rail) == [rank % G, rank % G + G]

def model_and_grads(seed, before_backward=None):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(7, 9), nn.Tanh(), nn.Linear(9, 3))
    out = before_backward(model) if before_backward else None
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(5, 7, generator=gen), torch.randn(5, 3, generator=gen)
    nn.functional.mse_loss(model(x), y).backward()
    return (model, out) if before_backward else model

def expected_update(quantizer, bits, collective, beta1, buckets):
    # Every rank's c at step 1 (momentum 0): (1 - beta1)·g; the nodes' means; each quantized
    # with its tensors' scales; the vote over nodes; bucket by bucket (lists of parameter
    # indices, as LionCub laid them out), each with its own tie pattern.
    grads = [[p.grad for p in model_and_grads(r).parameters()] for r in range(P)]
    levels = quantizer_levels(quantizer, bits, nodes, collective=collective)
    spec = WireSpec(quantizer, levels, 1)
    out = {}
    for indices in buckets:
        sizes = [grads[0][i].numel() for i in indices]
        cs = [torch.cat([((1 - beta1) * g[i]).reshape(-1) for i in indices]) for g in grads]
        n = sum(sizes)
        tie = tie_pattern(n, step=1)
        total = torch.zeros(n, dtype=torch.int32)
        for k in range(nodes):
            mean = (cs[k * G] + cs[k * G + 1]) / G
            scales = None
            if quantizer != "sign":
                stats = partial_stats(mean.abs(), sizes + [0], quantizer)
                scales = scales_from_stats(stats, sizes, quantizer).float()
            q = quantize(mean, quantizer=quantizer, levels=levels, segments=sizes, scales=scales)
            total += wire_values(q, tie, spec).to(torch.int32)
        update, offset = vote(total, tie), 0
        for i, size in zip(indices, sizes):
            out[i] = update[offset : offset + size]
            offset += size
    return torch.cat([out[i] for i in sorted(out)])

# The one-bucket case and several buckets (a slice crosses tensors and buckets have padding).
for (quantizer, bits), collective, bucket in itertools.product(
        (("sign", 1), ("l1", 4), ("linf", 3), ("l0", 2)), ("alltoall", "allgather", "allreduce"),
        (1e-3, 40 * 4 / 2**20)):  # one bucket; four
    model = model_and_grads(rank)
    before = [p.detach().clone() for p in model.parameters()]
    opt = LionCub(model.named_parameters(), group=data, lr=1e-3, betas=(0.9, 0.99),
                  quantizer=quantizer, bits=bits, collective=collective, bucket_mb=bucket,
                  ranks_per_node=G, hierarchy="node", node_groups=(intra, rail))
    assert opt.two_level and opt.spec.levels == quantizer_levels(
        quantizer, bits, nodes, collective=collective)
    opt.step()
    moved = zip(before, model.parameters())
    got = torch.cat([(b - p.detach()).sign().reshape(-1) for b, p in moved])
    index = {id(p): i for i, p in enumerate(model.parameters())}
    buckets = [[index[id(p)] for p in b.params] for b in opt.buckets]
    want = expected_update(quantizer, bits, collective, 0.9, buckets)
    assert torch.equal(got.to(torch.int8), want), (quantizer, collective, bucket)
    s = opt.comm_stats
    assert s.bytes_inter > 0 and s.bytes_intra > 0 and s.bytes_sent == s.bytes_inter + s.bytes_intra

# overlap: each bucket's two-level exchange starts in backward, as soon as its gradients are in.
def build(model):
    return LionCub(model.named_parameters(), group=data, lr=1e-3, quantizer="l1", bits=4,
                   overlap=True, bucket_mb=40 * 4 / 2**20, ranks_per_node=G, hierarchy="node",
                   node_groups=(intra, rail))
model, opt = model_and_grads(rank, build)
before = [p.detach().clone() for p in model.parameters()]  # backward does not move them
assert all(b.pending is not None for b in opt.buckets)  # started in backward
opt.step()
moved = zip(before, model.parameters())
got = torch.cat([(b - p.detach()).sign().reshape(-1) for b, p in moved])
index = {id(p): i for i, p in enumerate(model.parameters())}
buckets = [[index[id(p)] for p in b.params] for b in opt.buckets]
assert torch.equal(got.to(torch.int8), expected_update("l1", 4, "alltoall", 0.9, buckets))

# Bytes, one bucket of n = 8·G·nodes·k values, 1-bit alltoall over the rail on n/G values:
# inter (nodes-1)/nodes·2·(n/G)/8; intra: the fp32 reduce-scatter (G-1)·(n/G)·4 and the 1-bit
# all-gather (G-1)·(n/G)/8.
n = 8 * G * nodes * 64
w = torch.nn.Parameter(torch.zeros(n))
w.grad = torch.randn(n, generator=torch.Generator().manual_seed(rank))
opt = LionCub([("w", w)], group=data, lr=1e-3, ranks_per_node=G, hierarchy="node",
              node_groups=(intra, rail))
opt.step()
m = n // G
assert opt.comm_stats.bytes_inter == 2 * (nodes - 1) / nodes * m / 8, opt.comm_stats
assert opt.comm_stats.bytes_intra == (G - 1) * m * 4 + (G - 1) * m / 8, opt.comm_stats
flat = LionCub([("w", w)], group=data, lr=1e-3, ranks_per_node=G)
flat.step()
# Flat all-to-all of n 1-bit values: (P-G)/(P-1) of its chunks leave the node (pairwise), and
# a ring all-gather's one crossing a node (1/G per rank).
a2a, ag = (P - 1) / P * n / 8, (P - 1) * n / P / 8
assert flat.comm_stats.bytes_sent == a2a + ag
assert abs(flat.comm_stats.bytes_inter - (a2a * (P - G) / (P - 1) + ag / G)) < 1e-6
# The all-to-all phase leaves the node 1/G as often; the 1-bit result crosses every node in both
# (the flat ring's all-gather once a node): 4/7 of flat's inter-node bytes here, not 1/2.
assert opt.comm_stats.bytes_inter / flat.comm_stats.bytes_inter == 4 / 7

# Momentum sync in two levels: every rank ends with the mean over all 4 ranks.
mom = torch.randn(n, generator=torch.Generator().manual_seed(10 + rank))
opt.buckets[0].momentum.copy_(mom)
everyone = [torch.empty_like(mom) for _ in range(P)]
dist.all_gather(everyone, mom, group=data)
opt._average_momenta()
assert torch.allclose(opt.buckets[0].momentum, torch.stack(everyone).mean(0), atol=1e-6)
after = [torch.empty_like(mom) for _ in range(P)]
dist.all_gather(after, opt.buckets[0].momentum, group=data)
assert all(torch.equal(after[0], a) for a in after)
print(f"rank {rank}: two levels OK", flush=True)
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_two_nodes_of_two_vote_over_the_nodes_means(tmp_path: Path) -> None:
    script = tmp_path / "two_nodes.py"
    script.write_text(TWO_NODES)
    proc = multirank.run_ranks(torchrun_argv(4, str(script)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("two levels OK") == 4, proc.stdout
