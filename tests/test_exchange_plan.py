"""Lion Cub's exchange plan: its bytes by hand, flat and two-level; the performance model prices
the plan the optimizer builds (the same object), and over 4 gloo ranks (2 nodes × 2) a change of
the plan (the bucket size, the level split) moves the bytes the optimizer counts and the bytes
the model prices together, with nothing in perfmodel/ told of it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from cosmocub.config import load_config
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.exchange_plan import plan_exchange
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.perfmodel.alpha_beta import AlphaBeta
from cosmocub.perfmodel.cost_model.overlap import parameter_layers
from cosmocub.perfmodel.cost_model.step_model import exchange, lion_cub_plan, parameter_sizes
from cosmocub.perfmodel.cost_model.topology import Mesh, Network

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config" / "test.yaml"
MLPERF_CONFIG = ROOT / "config" / "cosmoflow-mlperf.yaml"
LINK = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
TWO_A_NODE = Network.uniform(LINK, LINK, ranks_per_node=2)


def test_flat_plan_bytes_by_hand() -> None:
    # 4 ranks, 1-bit all-to-all of 100 values: padded to 8·4 = 128, 16 bytes, 3/4 of them sent;
    # then each rank's 32 voted bits (4 bytes) to the 3 others. Momenta: a ring all-reduce.
    plan = plan_exchange(
        LionCubSettings(), [[60, 40]], data_ranks=4, data_per_node=2, synced_elements=100
    )
    (bucket,) = plan.buckets
    assert (plan.hierarchy, plan.voters, plan.wire.levels, bucket.voted_elements) == (
        "flat",
        4,
        1,
        100,
    )
    phases = [(t.collective, t.group, t.group_size, t.sent_bytes) for t in bucket.transfers]
    assert phases == [("alltoall", "data", 4, 12.0), ("allgather", "data", 4, 12.0)]
    (sync,) = plan.momentum_sync
    assert (sync.collective, sync.sent_bytes) == ("allreduce", 2 * 3 / 4 * 400)


def test_two_level_plan_bytes_by_hand() -> None:
    # 2 nodes × 2, l1 4-bit: the slice of 100 values is 112 / 2 = 56 (padded to 8·G); the vote
    # is over 2 nodes (7 levels, 4-bit codes) on the slice padded to 64.
    settings = LionCubSettings(quantizer="l1", bits=4, hierarchy="node")
    plan = plan_exchange(settings, [[60, 40]], data_ranks=4, data_per_node=2, synced_elements=100)
    (bucket,) = plan.buckets
    assert (plan.hierarchy, plan.voters, plan.wire.levels, plan.wire.bits) == ("node", 2, 7, 4)
    assert bucket.voted_elements == 56
    steps = [(t.collective, t.group, t.data_stride, t.sent_bytes) for t in bucket.transfers]
    assert steps == [
        ("reducescatter", "node", 1, 56 * 4.0),  # c's node mean, fp32
        ("allreduce", "node", 1, 16.0),  # 2 tensors' |c| sums in float64, a ring of 2
        ("alltoall", "rail", 2, 16.0),  # 64 · 4 bits / 8 = 32 bytes, half sent
        ("allgather", "rail", 2, 4.0),  # 32 voted bits
        ("allgather", "node", 1, 7.0),  # the 56 voted bits to the other local rank
    ]
    sync = [(t.collective, t.group, t.sent_bytes) for t in plan.momentum_sync]
    # The slice of 100 values is 50: 200 bytes to the other local rank, twice; the rail's ring.
    assert sync == [
        ("reducescatter", "node", 200.0),
        ("allreduce", "rail", 200.0),
        ("allgather", "node", 200.0),
    ]
    # One node holds every rank: nothing to split, the flat vote exactly.
    one_node = plan_exchange(settings, [[60, 40]], data_ranks=4, data_per_node=4, synced_elements=0)
    assert one_node.hierarchy == "flat" and one_node.momentum_sync == ()


@pytest.mark.parametrize(
    "overrides",
    [
        {"name": "distributed_lion"},
        {"name": "lion_cub", "lion_cub": {"quantizer": "l1", "bits": 4, "bucket_mb": 0.25}},
    ],
)
def test_the_model_prices_the_plan_the_optimizer_builds(overrides: dict) -> None:
    cfg = load_config(MLPERF_CONFIG, overrides={"optimizer": overrides})
    opt = build_optimizer(CosmoFlow(cfg.model).named_parameters(), cfg.optimizer, global_batch=8)
    mesh = Mesh(data=1, split=(1, 1, 1))
    assert opt.plan == lion_cub_plan(cfg.model, cfg.optimizer, mesh, TWO_A_NODE)
    assert len(opt.plan.buckets) > 1  # small buckets: the split itself is compared


def priced(lion_cub: dict, data: int = 4) -> tuple[float, float]:
    """(bytes sent, of which across nodes) the model prices for one step and one momentum sync
    of the test model's Lion Cub over `data` ranks, 2 a node."""
    options = {**lion_cub, "momentum_sync": {"schedule": "every", "every_steps": 1}}
    cfg = load_config(
        TEST_CONFIG, overrides={"optimizer": {"name": "lion_cub", "lion_cub": options}}
    )
    mesh = Mesh(data=data, split=(1, 1, 1))
    ex = exchange(cfg.model, cfg.optimizer, mesh, TWO_A_NODE, steps=1, layer_seconds={})
    return ex.sent, ex.inter_node_bytes


def test_a_change_of_bucket_size_reaches_the_price() -> None:
    small, large = priced({"bucket_mb": 600 * 4 / 2**20}), priced({"bucket_mb": 4.0})
    # Each bucket pads to whole bytes of every rank's chunk: more buckets, more padding.
    assert small[0] > large[0]
    n = sum(parameter_sizes(load_config(TEST_CONFIG).model))
    padded = n + (-n % 32)  # one bucket: the sign all-to-all and its all-gather
    assert large[0] == pytest.approx(3 / 4 * padded / 8 + 3 * padded / 4 / 8 + 2 * 3 / 4 * 4 * n)


def test_an_overlapped_plan_hides_its_first_phases_under_backward() -> None:
    # The same plan with overlap: each bucket's all-to-all is launched in backward, once the
    # layer that completes the bucket is done; with a long backward all but the last bucket's
    # (completed by the first layer, when backward ends) run under it. Bytes do not move.
    def run(overlap: bool, layer_s: float):
        options = {"bucket_mb": 600 * 4 / 2**20, "overlap": overlap}
        cfg = load_config(
            TEST_CONFIG, overrides={"optimizer": {"name": "lion_cub", "lion_cub": options}}
        )
        mesh = Mesh(data=4, split=(1, 1, 1))
        layers = {layer: layer_s for layer, _ in parameter_layers(cfg.model)}
        plan = lion_cub_plan(cfg.model, cfg.optimizer, mesh, TWO_A_NODE)
        ex = exchange(cfg.model, cfg.optimizer, mesh, TWO_A_NODE, steps=1, layer_seconds=layers)
        return plan, ex

    plan, blocking = run(False, 1.0)
    overlapped_plan, overlapped = run(True, 1.0)
    assert len(plan.buckets) >= 3 and overlapped_plan.overlap
    first = [b.transfers[0] for b in overlapped_plan.buckets]
    assert all(t.collective == "alltoall" and t.overlaps_backward for t in first)
    assert not any(t.overlaps_backward for b in plan.buckets for t in b.transfers)
    launched = [TWO_A_NODE.sent_s("alltoall", t.sent_bytes, 4, 1) for t in first]
    assert overlapped.hidden_s == pytest.approx(sum(launched[:-1]), rel=1e-12)
    assert overlapped.seconds == pytest.approx(blocking.seconds - sum(launched[:-1]), rel=1e-12)
    assert overlapped.sent == blocking.sent
    # Without a backward to hide under (no layer times), nothing is hidden.
    assert run(True, 0.0)[1].seconds == pytest.approx(blocking.seconds, rel=1e-12)


PROGRAM = r"""
import json, sys
import torch, torch.distributed as dist
from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim import LionCub, LionCubSettings, world_node_groups

dist.init_process_group("gloo")
rank = dist.get_rank()
node_groups = world_node_groups(2)  # every rank makes every group, once
counted = []
for options in json.loads(sys.argv[2]):
    options = {**options, "momentum_sync": {"schedule": "every", "every_steps": 1}}
    overrides = {"optimizer": {"name": "lion_cub", "lion_cub": options}}
    cfg = load_config(sys.argv[1], overrides=overrides)
    torch.manual_seed(0)
    model = CosmoFlow(cfg.model)
    gen = torch.Generator().manual_seed(rank)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)
    settings = LionCubSettings.from_config(cfg.optimizer, lr=1e-3)
    opt = LionCub(model.named_parameters(), settings, group=dist.group.WORLD,
                  data_ranks_per_node=2, node_groups=node_groups)
    opt.step()  # the exchange, then the momentum sync (every step)
    stats = opt.comm_stats
    planned = opt.plan.exchange_bytes + opt.plan.sync_bytes
    counted.append([opt.plan.hierarchy, planned, stats.bytes_sent, stats.bytes_inter])
print(f"rank {rank} counted " + json.dumps(counted))
dist.destroy_process_group()
"""

PLANS = [
    {"bucket_mb": 4.0},
    {"bucket_mb": 600 * 4 / 2**20},
    {"quantizer": "l1", "bits": 4, "bucket_mb": 4.0, "hierarchy": "node"},
    {"quantizer": "l1", "bits": 4, "bucket_mb": 600 * 4 / 2**20, "hierarchy": "node"},
    {"collective": "allreduce", "quantizer": "l0", "bits": 3, "hierarchy": "node"},
]


@pytest.mark.slow
def test_a_change_of_plan_moves_counted_and_priced_bytes_together(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    argv = torchrun_argv(4, str(program), str(TEST_CONFIG), json.dumps(PLANS))
    proc = multirank.run_ranks(argv, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The ranks share one pipe: a rank's line may run into another's, so each is found by its
    # own pattern, not by line.
    counted = dict(re.findall(r"rank (\d+) counted (\[\[.*?\]\])", proc.stdout))
    assert sorted(counted) == ["0", "1", "2", "3"], proc.stdout
    rows = json.loads(counted["0"])
    totals = set()
    for options, (hierarchy, planned, sent, inter) in zip(PLANS, rows, strict=True):
        price_sent, price_inter = priced(options)
        assert hierarchy == options.get("hierarchy", "flat")
        assert sent == pytest.approx(planned, rel=1e-12), options  # what ran is what was planned
        assert sent == pytest.approx(price_sent, rel=1e-12), options
        if hierarchy == "node":  # the rails' bytes leave the node, the rest stays in it
            assert inter == pytest.approx(price_inter, rel=1e-12), options
        totals.add(round(sent))
    assert len(totals) == len(PLANS)  # every change of the plan moved the bytes
