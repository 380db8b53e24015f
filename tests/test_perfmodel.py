"""The performance model: the α–β fit per link and kind and its lookup, its byte counts against
what the optimizers count on two gloo ranks, the micro-benchmark on loopback and an emulated link,
and the measured-vs-predicted validation."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from cosmocub.config import load_config
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.perfmodel.alpha_beta import KINDS, AlphaBeta
from cosmocub.perfmodel.cost_model.overlap import ddp_buckets
from cosmocub.perfmodel.cost_model.step_model import parameter_sizes, predict_step
from cosmocub.perfmodel.cost_model.topology import Mesh, Network
from cosmocub.perfmodel.measure.alpha_beta_fit import Sample, fit_alpha_beta, fit_per_kind
from cosmocub.perfmodel.measure.link_fits import (
    LOOPBACK,
    LinkFits,
    emulated_link,
    emulated_rate,
    fit_per_link,
    read_fits,
    write_fits,
)

TRUE = {"allreduce": (40e-6, 1 / 1.1e9), "alltoall": (90e-6, 1 / 0.7e9), "halo": (25e-6, 1e-9)}


def test_fit_recovers_alpha_and_beta_from_synthetic_timings() -> None:
    rng = np.random.default_rng(0)
    samples = []
    for kind, (alpha, beta) in TRUE.items():
        costs = AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta)
        for p in (2, 3, 4, 8):
            for nbytes in (64, 4e3, 2.5e5, 1.6e7):
                noise = 1 + 0.03 * rng.standard_normal()  # 3 % timing noise
                t = costs.time(kind, nbytes, p) * noise
                samples.append(Sample(kind=kind, nbytes=nbytes, group_size=p, seconds=t))
    fits = fit_per_kind(samples)
    assert sorted(fits) == sorted(TRUE)
    for kind, (alpha, beta) in TRUE.items():
        got = fits[kind].costs
        assert got.alpha_s == pytest.approx(alpha, rel=0.1), kind
        assert got.beta_s_per_byte == pytest.approx(beta, rel=0.05), kind
        assert fits[kind].median_rel_error < 0.05
    # A ring all-reduce of 1 MB over 4 ranks: 6 rounds, 1.5 MB sent.
    ab = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    assert ab.time("allreduce", 1e6, 4) == pytest.approx(6e-5 + 1.5e-3)
    assert ab.time("alltoall", 1e6, 4) == pytest.approx(3e-5 + 0.75e-3)
    assert ab.time("halo", 1e6, 2) == pytest.approx(2e-5 + 2e-3)


def test_fit_needs_two_kinds_of_information() -> None:
    one = [Sample(kind="allreduce", nbytes=1e6, group_size=2, seconds=1e-3)]
    with pytest.raises(ValueError, match="1 usable samples, need at least 2"):
        fit_alpha_beta(one)
    same = [Sample(kind="allreduce", nbytes=1e6, group_size=2, seconds=t) for t in (1e-3, 2e-3)]
    with pytest.raises(ValueError, match="same bytes per round"):
        fit_alpha_beta(same)


# Per link and kind: (α s per round, β s per byte), loopback fast, the emulated links at about
# their rates with gloo's larger per-call cost over veth and a bridge.
TRUE_LINKS = {
    "loopback": {
        "allreduce": (40e-6, 1 / 1.1e9),
        "allgather": (30e-6, 1 / 0.9e9),
        "alltoall": (35e-6, 1 / 0.8e9),
        "halo": (25e-6, 1e-9),
    },
    "emulated_100mbit": {
        "allreduce": (0.9e-3, 8.4e-8),
        "allgather": (1.1e-3, 8.2e-8),
        "alltoall": (1.3e-3, 8.8e-8),
        "halo": (0.7e-3, 8.1e-8),
    },
    "emulated_10mbit": {
        "allreduce": (1.6e-3, 8.1e-7),
        "allgather": (1.9e-3, 8.0e-7),
        "alltoall": (2.2e-3, 8.3e-7),
        "halo": (1.2e-3, 8.0e-7),
    },
}
# What the micro-benchmark sends: a few hundred bytes to several MB, Lion Cub's 4-48 kB among them.
SIZES = (256, 1024, 4096, 16384, 49152, 262144, 1048576, 4194304)


def _synthetic_samples(group_sizes=(2,)) -> dict[str, list[Sample]]:
    rng = np.random.default_rng(1)
    out: dict[str, list[Sample]] = {}
    for link, kinds in TRUE_LINKS.items():
        for kind, (alpha, beta) in kinds.items():
            costs = AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta)
            for p in group_sizes:
                for nbytes in SIZES:
                    t = costs.time(kind, nbytes, p) * (1 + 0.03 * rng.standard_normal())
                    sample = Sample(kind=kind, nbytes=nbytes, group_size=p, seconds=t)
                    out.setdefault(link, []).append(sample)
    return out


def test_alpha_and_beta_are_recovered_per_link_and_kind(tmp_path: Path) -> None:
    from cosmocub.perfmodel.measure.microbench import read_samples, write_samples

    # Two ranks, as the bench runs every link (one group size: α is the per-round intercept).
    write_samples(_synthetic_samples(), tmp_path / "bench.tsv")
    header = (tmp_path / "bench.tsv").read_text().splitlines()[0]
    assert header.split("\t") == ["link", "kind", "group_size", "nbytes", "seconds"]
    fits = fit_per_link(read_samples(tmp_path / "bench.tsv"))
    write_fits(fits, tmp_path / "fit.tsv")
    read = read_fits(tmp_path / "fit.tsv")
    assert sorted(read.fits) == sorted(TRUE_LINKS)
    for link, kinds in TRUE_LINKS.items():
        assert sorted(read.fits[link]) == sorted(kinds), link
        for kind, (alpha, beta) in kinds.items():
            got = read.fits[link][kind]
            assert got.costs.alpha_s == pytest.approx(alpha, rel=0.1), (link, kind)
            assert got.costs.beta_s_per_byte == pytest.approx(beta, rel=0.05), (link, kind)
            assert got.median_rel_error < 0.05, (link, kind)
            # The smallest call's measured time (256 B: mostly gloo's per-call latency).
            smallest = AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta).time(kind, SIZES[0], 2)
            assert got.call_latency_s == pytest.approx(smallest, rel=0.15), (link, kind)


def test_the_lookup_picks_the_link_a_collective_crosses(caplog) -> None:
    from cosmocub.perfmodel.uses.validate import network_for

    fits = LinkFits(fits=fit_per_link(_synthetic_samples()), source="fit.tsv")
    assert (emulated_link(10), emulated_link(0), emulated_link(2.5)) == (
        "emulated_10mbit",
        "emulated_unshaped",
        "emulated_2.5mbit",
    )
    assert [emulated_rate(n) for n in ("emulated_10mbit", "emulated_unshaped", LOOPBACK)] == [
        10.0,
        0.0,
        None,
    ]

    def alpha(costs: AlphaBeta) -> float:
        return costs.alpha_s

    loop = TRUE_LINKS["loopback"]["allreduce"][0]
    slow = TRUE_LINKS["emulated_10mbit"]["allreduce"][0]
    # 2 nodes × 1 rank at 10 Mbit/s: the data group crosses the link, its fit; 2 ranks on one
    # node: loopback.
    two_nodes = {"point": "p", "data": "2", "world_size": "2", "nodes": "2", "rate_mbit": "10"}
    net = network_for(two_nodes, fits)
    assert alpha(net.costs(2, 1, "allreduce")) == pytest.approx(slow, rel=0.1)
    one_node = {"point": "q", "data": "2", "world_size": "2", "nodes": "1"}
    net = network_for(one_node, fits)
    assert alpha(net.costs(2, 1, "allreduce")) == pytest.approx(loop, rel=0.1)
    with pytest.raises(ValueError, match="no alpha-beta of 'allreduce' between nodes"):
        net.costs(4, 1, "allreduce")  # a one-node point has no inter-node fit to fall back on
    # 4 ranks on 2 nodes: a spatial pair within a node, the data pair across.
    mixed = {**two_nodes, "world_size": "4"}
    net = network_for(mixed, fits)
    assert alpha(net.costs(2, 1, "halo")) == pytest.approx(
        TRUE_LINKS["loopback"]["halo"][0], rel=0.1
    )
    assert alpha(net.costs(2, 2, "alltoall")) == pytest.approx(
        TRUE_LINKS["emulated_10mbit"]["alltoall"][0], rel=0.1
    )
    # A rate not measured: the nearest measured one's, with a note naming both.
    with caplog.at_level(logging.WARNING, logger="cosmocub.perfmodel.uses.validate"):
        net = network_for({**two_nodes, "rate_mbit": "20"}, fits)
    assert alpha(net.costs(2, 1, "allreduce")) == pytest.approx(slow, rel=0.1)
    assert "'emulated_20mbit' was not measured: using the fit of 'emulated_10mbit'" in caplog.text
    assert fits.inter_node(1000)[0] == "emulated_100mbit"
    assert fits.inter_node(0)[0] == "emulated_100mbit"  # unshaped: the fastest measured
    # None measured: an error naming the link.
    only_loopback = LinkFits(fits={LOOPBACK: fits.fits[LOOPBACK]}, source="fit.tsv")
    with pytest.raises(
        ValueError, match=r"no alpha-beta fit for link 'emulated_10mbit' \(measured: loopback\)"
    ):
        network_for(two_nodes, only_loopback)
    no_loopback = LinkFits(fits={"emulated_10mbit": fits.fits["emulated_10mbit"]}, source="f")
    with pytest.raises(ValueError, match="no alpha-beta fit for link 'loopback'"):
        network_for(one_node, no_loopback)
    with pytest.raises(ValueError, match="'p': 2 nodes but no rate_mbit"):
        network_for({**two_nodes, "rate_mbit": ""}, fits)
    partial = LinkFits(fits={LOOPBACK: {"allreduce": fits.fits[LOOPBACK]["allreduce"]}}, source="f")
    with pytest.raises(
        ValueError, match=r"link 'loopback' has no fit of \['allgather', 'alltoall', 'halo'\]"
    ):
        partial.costs(LOOPBACK)
    assert sorted(KINDS) == sorted(TRUE_LINKS[LOOPBACK])


def test_the_bench_covers_every_study_rate_and_sizes_that_fit_the_rate() -> None:
    from cosmocub.perfmodel.measure.link_samples import sizes_for_rate, study_rates
    from cosmocub.perfmodel.measure.microbench import buffer_elements

    cfg = load_config(None)
    assert study_rates(cfg) == (0, 100, 10, 1000)  # network_study's, then scaling_study's 1000
    # At 10 Mbit/s a 2 s call carries 2.5 MB: the halo swap of 1 MiB (2 MiB) fits, 4 MiB not.
    assert sizes_for_rate(SIZES, 10, 2.0) == list(SIZES[:-1])
    assert sizes_for_rate(SIZES, 0, 2.0) == list(SIZES)
    with pytest.raises(ValueError, match=r"max_call_s': 0.001 s leaves 1 of the sizes"):
        sizes_for_rate(SIZES, 10, 0.001)
    # fp32 all-reduce, uint8 codes for Lion Cub's all-to-all and all-gather; whole shares.
    assert buffer_elements("allreduce", 1000, 2) == 250
    assert buffer_elements("alltoall", 1000, 3) == 999
    assert buffer_elements("allgather", 1, 2) == 2


def test_without_namespaces_the_bench_skips_the_emulated_links_saying_why(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu import namespaces as netemu_nodes
    from cosmocub.perfmodel.measure import link_samples
    from cosmocub.perfmodel.measure.microbench import read_samples, write_samples

    def no_netns() -> None:
        raise EmulationUnavailableError("network namespaces need root or CAP_NET_ADMIN (uid 1)")

    def fake_launch(layout, args) -> int:  # the loopback ranks: what rank 0 would write
        assert (layout.nodes, layout.ranks_per_node) == (1, 2)
        assert args[:4] == ["perf-model", "bench-ranks", "--link", LOOPBACK]
        loopback = {LOOPBACK: _synthetic_samples()[LOOPBACK]}
        write_samples(loopback, Path(args[args.index("--out") + 1]))
        return 0

    monkeypatch.setattr(netemu_nodes, "check_privileges", no_netns)
    monkeypatch.setattr(link_samples, "run_launch", fake_launch)
    out = tmp_path / "perf" / "bench.tsv"
    link_samples.bench_links(load_config(None), config_path=None, out=out)
    assert capsys.readouterr().err.splitlines() == [
        "emulated points skipped: perf-model bench emulated_unshaped, emulated_100mbit, "
        "emulated_10mbit, emulated_1000mbit: network namespaces need root or CAP_NET_ADMIN (uid 1)"
    ]
    assert list(read_samples(out)) == [LOOPBACK]


# The link benchmark on loopback and an emulated link (42 s at the suite's load): on request,
# beside tests/test_benchmarks.py's bench_links smoke (a message's time on an emulated link).
@pytest.mark.long
def test_the_bench_runs_on_loopback_and_an_emulated_link(tmp_path: Path) -> None:
    """`cosmocub perf-model bench` at one rate and two sizes, then the fit of both links."""
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu.namespaces import check_privileges

    try:
        check_privileges()
    except EmulationUnavailableError as err:
        pytest.skip(f"emulated points skipped: {err}")
    root = Path(__file__).resolve().parents[1]
    values = yaml.safe_load((root / "config/test.yaml").read_text())
    values["perf_model"]["bench"] = {
        "ranks": 2,
        "nodes": 2,
        "sizes_bytes": [1024, 262144],
        "repeats": 2,
    }
    values["network_study"]["rates_mbit"] = [10]
    values["scaling_study"]["rate_mbit"] = 10
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(values))
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    cli = [sys.executable, "-m", "cosmocub.cli", "perf-model"]
    bench, fit = tmp_path / "bench.tsv", tmp_path / "fit.tsv"
    proc = subprocess.run(
        [*cli, "bench", "--config", str(config), "--out", str(bench)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run(
        [*cli, "fit", "--samples", str(bench), "--out", str(fit)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    fits = read_fits(fit)
    assert sorted(fits.fits) == ["emulated_10mbit", LOOPBACK]
    for link in fits.fits:
        assert sorted(fits.costs(link)) == sorted(KINDS), link
    # 256 kB cross the 10 Mbit/s link in >= 0.15 s whatever the shaping's burst (64 KiB today):
    # far slower than loopback.
    slow, fast = (fits.fits[k]["allreduce"].costs for k in ("emulated_10mbit", LOOPBACK))
    assert slow.time("allreduce", 262144, 2) > max(0.1, 5 * fast.time("allreduce", 262144, 2))


VARIANTS = {
    "adamw": {"name": "adamw"},
    "lion": {"name": "lion"},
    "distributed_lion": {"name": "distributed_lion"},
    "lion_cub_1bit": {"name": "lion_cub", "lion_cub": {"quantizer": "sign", "bucket_mb": 0.01}},
    "lion_cub_4bit_sync": {
        "name": "lion_cub",
        "lion_cub": {
            "quantizer": "l1",
            "bits": 4,
            "collective": "allreduce",
            "momentum_sync": {"schedule": "every", "every_steps": 2},
        },
    },
    "lion_cub_allgather": {"name": "lion_cub", "lion_cub": {"collective": "allgather"}},
    "lion_cub_4bit_fp16": {
        "name": "lion_cub",
        "lion_cub": {
            "quantizer": "l1",
            "bits": 4,
            "collective": "allreduce",
            "allreduce_dtype": "fp16",
        },
    },
}
STEPS = 4

# Each rank: every variant's optimizer on the test config's CosmoFlow, gradients synced and
# counted as the training loop does (build_gradient_sync, CommMeter, steps on the device's clock),
# for STEPS steps; the DDP variants under both train.ddp_exchange_timing values ("<name>
# blocking" beside the default, overlapped).
COUNT_BYTES = """
import json, sys
import torch
from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.parallel.parallel_dims import build_parallel_dims
from cosmocub.parallel.timing import clock_for
from cosmocub.train.comm_meter import CommMeter
from cosmocub.train.grad_sync import build_gradient_sync

config, variants, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
dims = build_parallel_dims(backend="gloo", spatial=1)
clock = clock_for(dims.device)
runs = [(name, optimizer, "overlapped") for name, optimizer in variants.items()]
runs += [(f"{name} blocking", variants[name], "blocking") for name in ("adamw", "lion")]
counted, timed, final = {}, {}, {}
for name, optimizer, timing in runs:
    cfg = load_config(config, overrides={"optimizer": optimizer})
    torch.manual_seed(0)
    model = CosmoFlow(cfg.model)
    opt = build_optimizer(model.named_parameters(), cfg.optimizer, 8, dims=dims)
    sync = build_gradient_sync(opt, dims, ddp_timing=timing)
    wrapped = sync.wrap(model)
    meter = CommMeter(opt, model, sync)
    gen = torch.Generator().manual_seed(dims.rank)
    for _ in range(steps):
        x = torch.randn(2, 4, 8, 8, 8, generator=gen)
        start = clock.mark()
        opt.zero_grad(set_to_none=True)
        wrapped(x).square().mean().backward()
        sync.after_backward(model)
        opt.step()
        meter.add_step(clock, start, clock.mark())
    metrics = meter.metrics()
    counted[name] = metrics["comm_bytes_per_step"]
    timed[name] = {k: metrics[f"time_{k}_s"] for k in ("compute", "exchange", "exchange_busy")}
    final[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = {name: torch.equal(final[name], final[f"{name} blocking"]) for name in ("adamw", "lion")}
if dims.rank == 0:
    print("COUNTED " + json.dumps(counted), flush=True)
    print("TIMED " + json.dumps(timed), flush=True)
    print("SAME " + json.dumps(same), flush=True)
"""


def _printed(out: str, tag: str) -> Any:
    return json.loads(out.split(f"{tag} ", 1)[1].splitlines()[0])


@pytest.mark.slow
def test_model_bytes_equal_what_the_optimizers_count_and_ddp_times_both_ways(
    tmp_path: Path,
) -> None:
    """Two gloo ranks. Besides the bytes: DDP overlapped (the default) trains to the same
    parameters bit for bit as blocking — both hooks run DDP's own all-reduce of the same buckets
    (divide by the group size, gloo's sum in the same order); the overlapped one only marks when
    each finished — and times how long the all-reduce ran (busy: some bucket in flight) and what
    the step waited for once backward was done (exposed: the last bucket's launch to the last
    completion, a part of busy)."""
    config = Path(__file__).resolve().parents[1] / "config/test.yaml"
    script = tmp_path / "count.py"
    script.write_text(COUNT_BYTES)
    proc = multirank.run_ranks(  # a timeout kills every rank
        torchrun_argv(2, str(script), str(config), json.dumps(VARIANTS), str(STEPS)),
        timeout=120,
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    counted, timed = _printed(out, "COUNTED"), _printed(out, "TIMED")
    print(json.dumps(timed, indent=1))
    assert _printed(out, "SAME") == {"adamw": True, "lion": True}
    for name in ("adamw", "lion"):
        overlapped, blocking = timed[name], timed[f"{name} blocking"]
        assert 0 < overlapped["exchange"] <= overlapped["exchange_busy"], overlapped
        assert 0 < blocking["exchange"] == blocking["exchange_busy"], blocking
        assert counted[name] == counted[f"{name} blocking"]
    for name in VARIANTS:
        if name not in ("adamw", "lion"):  # the Lions wait for their exchange: all exposed
            assert timed[name]["exchange"] == timed[name]["exchange_busy"] > 0, name
    net = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    network = Network.uniform(net, net, ranks_per_node=2)
    for name, optimizer in VARIANTS.items():
        cfg = load_config(config, overrides={"optimizer": optimizer})
        predicted = predict_step(
            model_cfg=cfg.model,
            optimizer_cfg=cfg.optimizer,
            local_batch=2,
            mesh=Mesh(data=2, split=(1, 1, 1)),
            network=network,
            layer_seconds={},
            optimizer_s=0.0,
            steps=STEPS,
        )
        assert counted[name] > 0, name
        assert predicted.comm_bytes_per_step == pytest.approx(counted[name], rel=1e-12), name


def test_synced_batch_norms_cost_two_collectives_a_block_over_the_mesh() -> None:
    """The synced norm (parallel.layers._SyncBatchNorm): forward all-gathers (count, mean, M2)
    in float64, backward all-reduces (Σdy, Σdy·x̂) in float32, per conv block."""
    from cosmocub.perfmodel.cost_model.layer_collectives import norm_sync

    cfg = load_config(
        None, overrides={"model": {"base_filters": 4, "num_conv_blocks": 2, "batch_norm": True}}
    )
    net = AlphaBeta(alpha_s=1e-3, beta_s_per_byte=1e-6)
    network = Network.uniform(net, net, ranks_per_node=2)
    two = Mesh(data=2, split=(1, 1, 1))
    seconds, sent = norm_sync(cfg.model, mesh=two, network=network)
    # Block 0 (4 channels): gather 8·(1+8) = 72 B in one round, reduce 32 B in two; block 1
    # (8 channels): 136 B and 64 B. Four collectives, six rounds, 304 bytes sent.
    assert sent == pytest.approx(304)
    assert seconds == pytest.approx(6e-3 + 304e-6)
    assert norm_sync(cfg.model, mesh=Mesh(data=1, split=(1, 1, 1)), network=network) == (0, 0)
    plain = load_config(None, overrides={"model": {"batch_norm": False}}).model
    assert norm_sync(plain, mesh=two, network=network) == (0, 0)
    same = {"model_cfg": cfg.model, "optimizer_cfg": cfg.optimizer, "local_batch": 2, "mesh": two}
    same |= {"layer_seconds": {"block0": 0.01}, "optimizer_s": 0.0}
    step = predict_step(**same, network=network)
    assert step.norm_sync_s == pytest.approx(seconds)
    assert step.step_s == pytest.approx(0.01 + seconds + step.exchange_s)
    # Layer times that hold the norms' collectives as they ran within a node (a CPU's two-rank
    # calibration): the link is charged its excess over the node's costs, never below 0.
    slow = AlphaBeta(alpha_s=3e-3, beta_s_per_byte=2e-6)
    two_nodes = Network.uniform(slow, net, ranks_per_node=1)
    full, _ = norm_sync(cfg.model, mesh=two, network=two_nodes)
    local = predict_step(**same, network=two_nodes, norm_sync_local_in_layers=True)
    assert local.norm_sync_s == pytest.approx(full - seconds) and full > seconds
    on_one_node = predict_step(**same, network=network, norm_sync_local_in_layers=True)
    assert on_one_node.norm_sync_s == 0.0


def test_the_votes_host_work_is_in_the_exchange_once_a_bucket() -> None:
    cfg = load_config(None, overrides={"optimizer": {"name": "lion_cub"}})
    net = AlphaBeta(alpha_s=1e-4, beta_s_per_byte=1e-8)
    network = Network.uniform(net, net, ranks_per_node=1)
    calls = []

    def host(quantizer: str, collective: str, n: int) -> float:
        calls.append((quantizer, collective, n))
        return 1e-3

    def step(data: int, **kw):
        return predict_step(
            model_cfg=cfg.model,
            optimizer_cfg=cfg.optimizer,
            local_batch=2,
            mesh=Mesh(data=data, split=(1, 1, 1)),
            network=network,
            layer_seconds={},
            optimizer_s=0.0,
            **kw,
        )

    lc = cfg.optimizer.lion_cub
    with_host, without = step(2, vote_host=host), step(2)
    buckets = len(calls)
    assert buckets >= 1 and sum(n for *_, n in calls) == sum(parameter_sizes(cfg.model))
    assert {c[:2] for c in calls} == {(lc.quantizer, lc.collective)}
    assert with_host.exchange_s == pytest.approx(without.exchange_s + 1e-3 * buckets)
    calls.clear()
    assert step(1, vote_host=host).exchange_s == 0 and not calls  # one rank: no vote
    # A CPU's wake-up after compute: once per collective the step waits on (the vote's two
    # phases a bucket, alltoall then the all-gather of its result); nothing on one rank.
    woken = step(2, collective_wake_s=5e-4)
    phases = 2 if lc.collective == "alltoall" else 1
    assert woken.exchange_s == pytest.approx(without.exchange_s + 5e-4 * phases * buckets)
    assert step(1, collective_wake_s=5e-4).exchange_s == 0
    # DDP blocking waits on every bucket; overlapped, on the exposed tail once.
    ddp = load_config(None, overrides={"optimizer": {"name": "lion"}})

    def lion(**kw):
        return predict_step(
            model_cfg=ddp.model,
            optimizer_cfg=ddp.optimizer,
            local_batch=2,
            mesh=Mesh(data=2, split=(1, 1, 1)),
            network=network,
            layer_seconds={f"block{i}": 1e-3 for i in range(ddp.model.num_conv_blocks)}
            | {"head": 1e-4},
            optimizer_s=0.0,
            **kw,
        )

    ddp_buckets_n = len(ddp_buckets(ddp.model))
    assert lion(collective_wake_s=5e-4).exchange_s == pytest.approx(
        lion().exchange_s + 5e-4 * ddp_buckets_n
    )
    overlapped = lion(ddp_overlap=True)
    assert overlapped.exchange_s > 0
    assert lion(ddp_overlap=True, collective_wake_s=5e-4).exchange_s == pytest.approx(
        overlapped.exchange_s + 5e-4
    )


def test_validation_compares_each_part_and_reports_errors(tmp_path: Path) -> None:
    from cosmocub.perfmodel.cost_model.step_model import StepPrediction
    from cosmocub.perfmodel.uses.validate import (
        compare,
        error_summary,
        plot_results,
        set_summaries,
        write_results,
    )

    def prediction(compute: float, exchange: float) -> StepPrediction:
        return StepPrediction(
            compute_s=compute,
            halo_s=0.001,
            exchange_s=exchange,
            momentum_sync_s=0.0,
            optimizer_s=0.001,
            comm_bytes_per_step=100.0,
            halo_bytes_per_step=0.0,
        )

    # A DDP point (its all-reduce hides in measured compute) and a Lion Cub point.
    predicted = {
        "a": (prediction(0.010, 0.004), "adamw"),
        "b": (prediction(0.010, 0.008), "lion_cub"),
    }
    rows = [
        {
            "point": "a",
            "data": "2",
            "step_s": "0.016",
            "compute_s": "0.016",
            "exchange_s": "0",
            "momentum_sync_s": "0",
            "comm_bytes_per_step": "100",
        },
        {
            "point": "b",
            "data": "2",
            "step_s": "0.025",
            "compute_s": "0.015",
            "exchange_s": "0.010",
            "momentum_sync_s": "0",
            "comm_bytes_per_step": "100",
        },
    ]
    results = compare(rows, lambda row: predicted[row["point"]], study="s", fit_set=("s/a",))
    a, b = results
    assert (a["set"], b["set"]) == ("fit", "held-out")
    assert a["predicted_compute_s"] == pytest.approx(0.016)  # 10 + 1 + 1 + the hidden 4 ms
    assert a["predicted_exchange_s"] == 0.0 and a["rel_error_step"] == pytest.approx(0.0)
    assert b["predicted_step_s"] == pytest.approx(0.020)
    assert b["rel_error_step"] == pytest.approx(-0.2)
    assert b["rel_error_compute"] == pytest.approx(-0.2)  # 12 ms against 15
    assert b["rel_error_exchange"] == pytest.approx(-0.2)
    summary = error_summary(results)
    assert summary == {"median": pytest.approx(0.1), "worst": pytest.approx(0.2), "points": 2}
    sets = set_summaries(results)
    assert sets["held-out"]["step"]["worst"] == pytest.approx(0.2)
    # Exchange is 40 % of b's step (counted), 0 of a's (not: under 10 % of its step).
    assert sets["held-out"]["exchange"]["points"] == 1 and sets["fit"]["exchange"]["points"] == 0
    assert sets["fit"]["compute"]["median"] == pytest.approx(0.0)
    write_results(results, tmp_path / "v.tsv")
    plot_results(results, tmp_path / "v.png")
    header = (tmp_path / "v.tsv").read_text().splitlines()[0].split("\t")
    assert header[:4] == ["point", "set", "optimizer", "measured_step_s"]
    assert (tmp_path / "v.png").stat().st_size > 10_000


def test_extrapolation_rows_and_headline() -> None:
    from cosmocub.perfmodel.cost_model.step_model import parameter_sizes
    from cosmocub.perfmodel.uses.extrapolate import balanced_split, extrapolate, headline

    assert [balanced_split(s) for s in (1, 2, 4, 8, 16)] == [
        (1, 1, 1),
        (2, 1, 1),
        (2, 2, 1),
        (2, 2, 2),
        (4, 2, 2),
    ]
    config = Path(__file__).resolve().parents[1] / "config/test.yaml"
    settings = {"sample_sizes": [8], "gpus": [8], "gpus_per_node": 4, "link_gbit": [25]}
    cfg = load_config(config, overrides={"perf_model": {"extrapolate": settings}})
    rows = extrapolate(cfg, cfg.perf_model.extrapolate)
    # Two accelerators × splits 1..8 (8³ samples: 2³ per rank at 8 still pools) × the default
    # optimizers: Lion, and Lion Cub 1-bit and 4-bit, flat and two-level.
    variants = ("lion", "lion_cub", "lion_cub_node", "lion_cub_4bit", "lion_cub_4bit_node")
    assert {(r["accelerator"], r["spatial"], r["optimizer"]) for r in rows} == {
        (a, s, o) for a in ("v100", "h100") for s in (1, 2, 4, 8) for o in variants
    }
    lion = next(
        r for r in rows if (r["accelerator"], r["spatial"], r["optimizer"]) == ("v100", 1, "lion")
    )
    # 8 data ranks on 2 nodes: one ring all-reduce of the fp32 gradients through a 25 Gbit/s link.
    payload = 4 * sum(parameter_sizes(cfg.model))
    expected = 2 * 7 * 10e-6 + 2 * 7 / 8 * payload * 8 / 25e9
    assert lion["exchange_s"] == pytest.approx(expected)
    assert lion["halo_s"] == 0.0 and lion["halo_share"] == 0.0
    assert lion["comm_bytes_per_step"] == pytest.approx(2 * 7 / 8 * payload)
    (top,) = [
        h
        for h in headline(
            rows, reference="lion", candidate="lion_cub", halo_limit=0.2, others=variants[2:]
        )
        if h["accelerator"] == "v100"
    ]
    assert top["min_spatial"] == 1
    cub = next(
        r
        for r in rows
        if (r["accelerator"], r["spatial"], r["optimizer"]) == ("v100", 1, "lion_cub")
    )
    assert top["speedup"] == pytest.approx(lion["step_s"] / cub["step_s"])
    assert cub["comm_bytes_per_step"] < lion["comm_bytes_per_step"] / 8  # 1 bit (+1) against 32
    by_name = {r["optimizer"]: r for r in rows if (r["accelerator"], r["spatial"]) == ("v100", 1)}
    node = by_name["lion_cub_node"]
    assert top["lion_cub_node_speedup"] == pytest.approx(lion["step_s"] / node["step_s"])
    # Two nodes of 4: the two-level exchange sends at most 1/4 of the flat one's bytes across
    # the node's link (the vote on a quarter of the vector per GPU), the rest inside the node.
    assert 0 < node["inter_node_bytes_per_step"] <= cub["inter_node_bytes_per_step"] / 4
    assert node["comm_bytes_per_step"] > node["inter_node_bytes_per_step"]
    # 4-bit codes with 7 levels cost more wire than the sign, flat or two-level.
    four = by_name["lion_cub_4bit"]
    assert four["inter_node_bytes_per_step"] > cub["inter_node_bytes_per_step"]
    assert by_name["lion_cub_4bit_node"]["inter_node_bytes_per_step"] <= (
        four["inter_node_bytes_per_step"] / 4
    )


def test_the_cores_speed_is_fitted_on_the_fit_set_and_scales_the_cores_work_only() -> None:
    from cosmocub.perfmodel.cost_model.step_model import StepPrediction
    from cosmocub.perfmodel.uses.validate import fit_correction, scaled_predictor, skip_reason

    def stub(row):
        p = StepPrediction(
            compute_s=0.010,
            halo_s=0.001,
            exchange_s=0.008,
            momentum_sync_s=0.0,
            optimizer_s=0.001,
            comm_bytes_per_step=0.0,
            halo_bytes_per_step=0.0,
        )
        return p, row["optimizer"]

    rows = [
        {"point": "one", "optimizer": "adamw", "data": "1", "compute_s": "0.024"},
        {"point": "two", "optimizer": "lion", "data": "1", "compute_s": "0.030"},
        {"point": "cub", "optimizer": "lion_cub", "data": "4", "compute_s": "0.05"},
    ]
    scale = fit_correction(stub, rows[:2])  # ran at 2x and 2.5x the calibration's time
    assert scale == pytest.approx(2.25)
    p, _ = scaled_predictor(stub, scale)(rows[2])
    assert (p.compute_s, p.optimizer_s) == (pytest.approx(0.0225), pytest.approx(0.00225))
    assert (p.halo_s, p.exchange_s) == (0.001, 0.008)  # the network is not the cores
    with pytest.raises(ValueError, match="'cub' has 4 ranks; the correction is fitted on one-rank"):
        fit_correction(stub, rows)
    with pytest.raises(ValueError, match="no measured point of the tables is named in it"):
        fit_correction(stub, [])
    assert skip_reason({"contended": "True"}) == "contended"
    assert skip_reason({"contended": "False", "oversubscribed": "True"}) == "oversubscribed"
    assert skip_reason({"contended": "False", "oversubscribed": "False"}) is None
    # The scaling table's cell says why (read back from its TSV as text), blank when not.
    why = "4 ranks of 1 thread(s) on 2 core(s)"
    assert skip_reason({"contended": "False", "oversubscribed": why}) == "oversubscribed"
    assert skip_reason({"contended": "False", "oversubscribed": ""}) is None


def test_an_optimizer_without_an_update_cost_is_an_error_naming_it() -> None:
    from cosmocub.perfmodel.cost_model.machines import UPDATE_BYTES_PER_PARAM
    from cosmocub.perfmodel.uses.extrapolate import update_bytes_per_param

    assert update_bytes_per_param("lion_cub", "cub") == UPDATE_BYTES_PER_PARAM["lion_cub"]
    with pytest.raises(ValueError, match=r"optimizers\.mine: no update cost for .* 'rmsprop'"):
        update_bytes_per_param("rmsprop", "mine")
