"""The 4-gloo-rank programs of tests/test_lion_cub.py (every collective gives the same vote) and
tests/test_lion_cub_hierarchy.py (2 nodes × 2 vote over the nodes' means), run one after the
other in ONE torchrun spawn (process start-up is the cost: a 4-rank spawn is ~9 s on 2 cores).

Each program runs in a namespace of its own in the process group RUNNER opens, and prints one
line per rank that its test counts; a failing program fails the spawn, whose stderr names it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv

RUNNER = """
import runpy, sys, torch.distributed as dist
dist.init_process_group("gloo")
for path in sys.argv[1:]:
    runpy.run_path(path, run_name="__main__")
dist.destroy_process_group()
"""

# tests/test_lion_cub.py::test_four_gloo_ranks_collectives_agree
COLLECTIVES_AGREE = """
import itertools, sys, torch, torch.distributed as dist
from torch import nn
from cosmocub.optim.collectives import COLLECTIVES, CommStats, build_collective
from cosmocub.optim.lion_cub import LionCub, LionCubSettings
from cosmocub.optim.quantize import quantize, quantizer_levels, wire_bits
from cosmocub.optim.vote import tie_pattern, vote
from cosmocub.optim.wire import WireSpec, wire_values

rank, P = dist.get_rank(), dist.get_world_size()
group = dist.new_group(list(range(P)))
EXCHANGES = [(name, "int8") for name in COLLECTIVES] + [("allreduce", "fp16")]

# The fp16 sum over gloo is exact wherever quantizer_levels lets it run: at N = 2048/s ranks of
# codes at ±s every partial sum is an integer in [-2048, 2048], and every addition a reduction
# can make (ring or tree, any order) adds two such integers. Ranks 0 and 1 (each standing for
# N/2 ranks, their codes pre-summed) all-reduce every pair of them, 4097² sums: each must be
# a + b rounded to fp16, which is a + b itself wherever |a + b| <= 2048 (12,589,057 pairs; every
# integer there is an fp16 value, 2049 is not: the bound is tight).
pair = dist.new_group([0, 1])
if rank < 2:
    m = 2048
    v = torch.arange(-m, m + 1, dtype=torch.float16)
    assert torch.equal(v.float(), torch.arange(-m, m + 1, dtype=torch.float32))
    a, b = v.repeat_interleave(2 * m + 1), v.repeat(2 * m + 1)  # the square, row-major
    total = (a if rank == 0 else b).clone()
    dist.all_reduce(total, group=pair)
    expected = a.float() + b.float()  # exact in fp32
    assert torch.equal(total, expected.half()), "gloo's fp16 sum is not the rounded a + b"
    assert int((expected.abs() <= m).sum()) == 12_589_057
    assert float(torch.tensor(2049.0).half()) == 2048.0

def q_of(r, n, quantizer, levels, case):
    c = torch.randn(n, generator=torch.Generator().manual_seed(1000 * case + r))
    c[::5] = 0.0  # zeros: a 1-bit wire must send them as the tie pattern
    if case % 3 == 0:
        c[: n // 2] = 0.0  # whole runs of zeros: many ties
    return quantize(c, quantizer=quantizer, levels=levels, segments=[n // 2, n - n // 2])

# The wiring (chunks, padding, async handles) of each exchange; the sums' arithmetic at up to
# 4,096 ranks is tests/test_lion_cub_levels.py's. Equal levels (the int8 all-reduce's at P), so
# that every exchange must give the same update.
cases = 0
for case, (quantizer, bits, n, step) in enumerate(itertools.product(
        ("sign", "l1", "linf", "l0"), (2, 8), (1, 33, 1000), (0, 1))):
    if quantizer == "sign" and bits != 2:
        continue
    bits = 1 if quantizer == "sign" else bits
    levels = quantizer_levels(quantizer, bits, P, collective="allreduce")
    tie = tie_pattern(n, step=step)
    q = q_of(rank, n, quantizer, levels, case)
    spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels))
    # Every rank can rebuild every rank's q: the expected vote without any communication.
    total = sum(wire_values(q_of(r, n, quantizer, levels, case), tie, spec).to(torch.int16)
                for r in range(P))
    expected = vote(total, tie)
    for name, dtype in EXCHANGES:
        spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), dtype)
        stats = CommStats()
        coll = build_collective(name, group, stats)
        got = coll.finish(coll.start(q, tie, spec), spec)
        assert torch.equal(got, expected), (name, dtype, quantizer, bits, n, step)
        assert stats.bytes_sent > 0
    cases += 1

# Bytes at n = 1024·P, 1-bit: alltoall+allgather 2(P-1)/P·n/8; allgather (P-1)·n/8;
# allreduce 2(P-1)/P·n in int8, twice that in fp16.
n = 1024 * P
sent = {}
for name, dtype in EXCHANGES:
    spec = WireSpec("sign", 1, 1, dtype)
    stats = CommStats()
    coll = build_collective(name, group, stats)
    coll.finish(coll.start(torch.ones(n, dtype=torch.int8), tie_pattern(n, step=0), spec), spec)
    sent[name, dtype] = stats.bytes_sent
    # Each collective times its own phases: the encode, its collectives' waits, the vote.
    second = {"alltoall": {"allgather"}, "allgather": set(), "allreduce": set()}[name]
    assert set(stats.phase_s) == {"encode", name, "vote"} | second, stats.phase_s
    assert all(v >= 0 for v in stats.phase_s.values())
assert sent == {("alltoall", "int8"): 2 * (P - 1) / P * n / 8,
                ("allgather", "int8"): (P - 1) * n / 8,
                ("allreduce", "int8"): 2 * (P - 1) / P * n,
                ("allreduce", "fp16"): 2 * 2 * (P - 1) / P * n}, sent

# The optimizer: the same local gradients give the same parameters under every collective and
# with or without overlap; parameters stay identical across ranks; momenta differ until synced.
def run(collective, overlap, quantizer="l1", bits=4, dtype="int8"):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 12), nn.Tanh(), nn.Linear(12, 2))
    settings = LionCubSettings(lr=0.01, weight_decay=0.1, quantizer=quantizer, bits=bits,
                               collective=collective, overlap=overlap,
                               allreduce_dtype=dtype if collective == "allreduce" else None,
                               momentum_sync="every", sync_every=3, sync_patterns=["0.*"],
                               bucket_mb=40 * 4 / 2**20)
    opt = LionCub(model.named_parameters(), settings, group=group)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(4):
        x, y = torch.randn(6, 5, generator=gen), torch.randn(6, 2, generator=gen)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    return model, opt

# l1 4-bit at P = 4: 7 levels in every exchange, the fp16 all-reduce's included.
runs = {}
for (collective, dtype), overlap in itertools.product(EXCHANGES, (False, True)):
    if dtype == "fp16" and overlap:
        continue  # overlap starts buckets early the same way whatever the exchange
    model, opt = runs[collective, dtype, overlap] = run(collective, overlap, dtype=dtype)
    phases, exchange = opt.comm_stats.phase_s, opt.comm_stats.exchange_s
    assert "quantize" in phases and collective in phases, (collective, phases)
    if not overlap:  # the phases are disjoint parts of the timed exchange
        assert 0 < sum(phases.values()) <= exchange, (collective, phases, exchange)
ref_model, ref_opt = runs["allreduce", "int8", False]
flat = torch.cat([p.detach().reshape(-1) for p in ref_model.parameters()])
everyone = [torch.empty_like(flat) for _ in range(P)]
dist.all_gather(everyone, flat, group=group)
assert all(torch.equal(everyone[0], x) for x in everyone)
for key, (model, _) in runs.items():
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a, b), key
# Momentum synced at step 3 for layer 0 only, then one local step: layer 0's momenta are
# β2·mean + (1-β2)·g_local; check the sync itself by replaying.
def gather(t):
    out = [torch.empty_like(t) for _ in range(P)]
    dist.all_gather(out, t.contiguous(), group=group)
    return out

saved = ref_opt.state_dict()  # every rank its own momentum, nothing of P × the parameters
assert (saved["data_group_size"], saved["data_rank"], saved["step_count"]) == (P, rank, 4)
w2 = saved["state"][2]["exp_avg"]  # layer 2 weight: never synced, ranks differ
assert w2.shape == (2, 12)
assert torch.equal(w2, ref_opt.state[list(ref_model.parameters())[2]]["exp_avg"])
assert not torch.equal(*gather(w2)[:2])
_, synced = run("alltoall", False, quantizer="sign", bits=1)

m0, m2 = (synced.state[synced.param_groups[0]["params"][i]]["exp_avg"] for i in (0, 2))
before0, before2 = gather(m0), gather(m2)
assert not torch.equal(before0[0], before0[1])
synced._average_momenta()  # patterns ["0.*"]: layer 0 only
after0, after2 = gather(m0), gather(m2)
assert all(torch.equal(after0[0], g) for g in after0)
assert torch.allclose(after0[0], torch.stack(before0).mean(0), atol=1e-7)
assert all(torch.equal(a, b) for a, b in zip(before2, after2))  # layer 2 untouched
print(f"rank {rank}: {cases} cases OK", flush=True)
"""

# tests/test_lion_cub_hierarchy.py::test_two_nodes_of_two_vote_over_the_nodes_means
TWO_NODES = """
import itertools, torch, torch.distributed as dist
from torch import nn
from cosmocub.optim import LionCub, LionCubSettings, world_node_groups
from cosmocub.optim.hierarchy import partial_stats, scales_from_stats
from cosmocub.optim.quantize import quantize, quantizer_levels
from cosmocub.optim.vote import tie_pattern, vote
from cosmocub.optim.wire import WireSpec, wire_values

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
    settings = LionCubSettings(lr=1e-3, betas=(0.9, 0.99), quantizer=quantizer, bits=bits,
                               collective=collective, bucket_mb=bucket, hierarchy="node")
    opt = LionCub(model.named_parameters(), settings, group=data, data_ranks_per_node=G,
                  node_groups=(intra, rail))
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
    settings = LionCubSettings(lr=1e-3, quantizer="l1", bits=4, overlap=True,
                               bucket_mb=40 * 4 / 2**20, hierarchy="node")
    return LionCub(model.named_parameters(), settings, group=data, data_ranks_per_node=G,
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
opt = LionCub([("w", w)], LionCubSettings(lr=1e-3, hierarchy="node"), group=data,
              data_ranks_per_node=G, node_groups=(intra, rail))
opt.step()
m = n // G
assert opt.comm_stats.bytes_inter == 2 * (nodes - 1) / nodes * m / 8, opt.comm_stats
assert opt.comm_stats.bytes_intra == (G - 1) * m * 4 + (G - 1) * m / 8, opt.comm_stats
flat = LionCub([("w", w)], LionCubSettings(lr=1e-3), group=data, data_ranks_per_node=G)
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
"""

PROGRAMS = {"collectives": COLLECTIVES_AGREE, "two_nodes": TWO_NODES}


def run_four_gloo_ranks(folder: Path) -> subprocess.CompletedProcess:
    """torchrun 4 gloo ranks of RUNNER over every program in PROGRAMS, killed whole on timeout."""
    runner = folder / "runner.py"
    runner.write_text(RUNNER)
    paths = []
    for name, program in PROGRAMS.items():
        paths.append(folder / f"{name}.py")
        paths[-1].write_text(program)
    return multirank.run_ranks(torchrun_argv(4, str(runner), *map(str, paths)), timeout=300)
