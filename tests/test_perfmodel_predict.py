"""`perf-model predict`: the same step as the validation path for a measured point, a breakdown
that sums to the step, Lion Cub against Lion by link rate, DDP's overlap, and one-line errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from cosmocub.config import ConfigError, load_config, write_config
from cosmocub.optim.collectives import ring_allreduce_bytes
from cosmocub.perfmodel.alpha_beta import AlphaBeta
from cosmocub.perfmodel.cost_model import machines
from cosmocub.perfmodel.cost_model.hardware_specs import ACCELERATORS
from cosmocub.perfmodel.cost_model.machines import Accelerator, fitted_network, this_cpu
from cosmocub.perfmodel.cost_model.overlap import exposed_allreduce
from cosmocub.perfmodel.cost_model.step_model import parameter_sizes
from cosmocub.perfmodel.cost_model.topology import Mesh, Network
from cosmocub.perfmodel.measure.alpha_beta_fit import Fit
from cosmocub.perfmodel.measure.compute import accelerator_seconds
from cosmocub.perfmodel.measure.link_fits import LinkFits
from cosmocub.perfmodel.uses.run_prediction import PARTS, Workload, lion_reference, predict_run

ROOT = Path(__file__).resolve().parents[1]
TEST_CONFIG = ROOT / "config/test.yaml"
MLPERF_CONFIG = ROOT / "config/cosmoflow-mlperf.yaml"
LION_CUB = {"name": "lion_cub", "lion_cub": {"quantizer": "sign", "collective": "alltoall"}}


def _fit(alpha: float, beta: float) -> Fit:
    costs = AlphaBeta(alpha_s=alpha, beta_s_per_byte=beta)
    return Fit(
        costs=costs, samples=8, median_rel_error=0.01, worst_rel_error=0.02, call_latency_s=alpha
    )


def _link(scale: float) -> dict[str, Fit]:
    """A link's four kinds, `scale` times slower per byte than loopback's."""
    return {
        "allreduce": _fit(60e-6, 1.2e-9 * scale),
        "allgather": _fit(45e-6, 1.5e-9 * scale),
        "alltoall": _fit(80e-6, 2e-9 * scale),
        "halo": _fit(30e-6, 1e-9 * scale),
    }


FITS = LinkFits(
    fits={"loopback": _link(1.0), "emulated_10mbit": _link(700.0)}, source="synthetic fit.tsv"
)


def _calibration():
    """A calibration of this machine with fixed rates (what the grid would fit), so that two
    paths that use it agree to the last digit."""
    from calibration_fixtures import synthetic_calibration

    return synthetic_calibration((1, 2))


POINTS = {
    # name: (overrides, measured row's labels)
    "ddp_one_node": ({}, {"data": "2", "world_size": "2", "nodes": "1"}),  # DDP overlapped
    "ddp_blocking_two_nodes": (
        {"train": {"ddp_exchange_timing": "blocking"}},
        {"data": "2", "world_size": "2", "nodes": "2", "rate_mbit": "10"},
    ),
    "cub_two_nodes": (
        {"optimizer": LION_CUB},
        {"data": "2", "world_size": "2", "nodes": "2", "rate_mbit": "10"},
    ),
    "spatial_one_node": (
        {"parallel": {"spatial": 2}},
        {"data": "1", "world_size": "2", "nodes": "1", "rate_mbit": "100"},
    ),
}


@pytest.mark.parametrize("point", sorted(POINTS))
def test_predict_equals_the_validation_path_for_the_same_point(point: str, tmp_path: Path) -> None:
    from cosmocub.perfmodel.uses.validate import cpu_predictor

    overrides, labels = POINTS[point]
    cfg = load_config(TEST_CONFIG, overrides=overrides)
    write_config(cfg.values, tmp_path / point / "config.yaml")
    cal = _calibration()
    cores = 2  # this machine's, shared by the emulated nodes' ranks
    row = {"point": point, "cores_per_rank": "1", "steps": "1000", **labels}
    measured_path, _ = cpu_predictor(tmp_path, FITS, cores=cores, calibration=cal)(row)

    nodes, world = int(labels["nodes"]), int(labels["world_size"])
    rate = float(labels["rate_mbit"]) if nodes > 1 else None
    network = fitted_network(FITS, rate_mbit=rate, ranks_per_node=world // nodes)
    device = this_cpu(
        threads_per_rank=None, ranks_per_node=world // nodes, cores=cores // nodes, calibration=cal
    )
    mesh = Mesh(data=int(labels["data"]), split=cfg.parallel.split_dhw)
    p = predict_run(Workload.of(cfg), mesh, network, device)
    assert p.step == measured_path
    assert p.step.step_s > 0 and (p.step.halo_s > 0) == (mesh.spatial > 1)


def test_the_breakdown_sums_to_the_step_and_bytes_to_their_links() -> None:
    cfg = load_config(MLPERF_CONFIG, overrides={"optimizer": LION_CUB})
    settings = cfg.perf_model.extrapolate
    h100 = Accelerator(name="h100", spec=settings.accelerators["h100"], bytes_per_value=2)
    # 4 data x 2 spatial on 2 nodes of 4: the spatial pairs within a node, the data group across.
    network = machines.assumed_network(
        settings, settings.accelerators["h100"], rate_mbit=25_000, ranks_per_node=4
    )
    mesh = Mesh(data=4, split=(2, 1, 1))
    work = Workload.of(cfg)
    p = predict_run(work, mesh, network, h100, lion=lion_reference(cfg), train_samples=524_288)
    s = p.step
    assert s.step_s == pytest.approx(sum(getattr(s, f"{part}_s") for part in PARTS), rel=1e-12)
    assert min(s.compute_s, s.halo_s, s.exchange_s, s.optimizer_s) > 0
    # Within a node: the halos and the spatial pair's fp32 gradient average; across: the vote.
    averaged = ring_allreduce_bytes(4 * sum(parameter_sizes(cfg.model)), 2)
    assert p.intra_node_bytes_per_step == pytest.approx(s.halo_bytes_per_step + averaged)
    assert p.inter_node_bytes_per_step == pytest.approx(s.comm_bytes_per_step - averaged)
    assert p.inter_node_bytes_per_step > 0 and p.nodes == 2
    assert p.steps_per_epoch == 524_288 // 4 // 4
    assert p.epochs_s == pytest.approx(cfg.train.epochs * p.steps_per_epoch * s.step_s)
    # Lion beside it: DDP's all-reduce of the whole mesh, overlapped with backward.
    assert p.lion is not None and p.lion.exchange_hidden_s > 0
    assert p.speedup == pytest.approx(p.lion.step_s / s.step_s)


def test_ddp_overlap_leaves_what_backward_cannot_hide() -> None:
    forward = ["a", "b"]
    layers = {"a": 3.0, "b": 3.0}  # backward: b done at 2 s, a at 4 s
    assert exposed_allreduce([("b", 1.0), ("a", 1.0)], layers, forward) == pytest.approx(1.0)
    assert exposed_allreduce([("b", 3.0), ("a", 1.0)], layers, forward) == pytest.approx(2.0)
    assert exposed_allreduce([("a", 1.5)], layers, forward) == pytest.approx(1.5)  # one bucket


def _lion_cub_against_lion(alpha_s: float, rate_mbit: float):
    cfg = load_config(MLPERF_CONFIG, overrides={"optimizer": LION_CUB})
    spec = cfg.perf_model.extrapolate.accelerators["h100"]
    link = AlphaBeta(alpha_s=alpha_s, beta_s_per_byte=8 / (rate_mbit * 1e6))
    nvlink = AlphaBeta(alpha_s=alpha_s, beta_s_per_byte=8 / 3.6e12)
    network = Network.uniform(link, nvlink, ranks_per_node=4)
    device = Accelerator(name="h100", spec=spec, bytes_per_value=2)
    mesh = Mesh(data=16, split=(1, 1, 1))
    return predict_run(Workload.of(cfg), mesh, network, device, lion=lion_reference(cfg))


def test_lion_cub_speedup_is_large_on_a_slow_link_and_near_one_on_a_fast_one() -> None:
    slow = _lion_cub_against_lion(10e-6, 1_000)
    assert slow.step.comm_bytes_per_step < slow.lion.comm_bytes_per_step / 16
    assert slow.speedup > 5
    fast = _lion_cub_against_lion(0.0, 1e9)
    assert fast.speedup == pytest.approx(1.0, abs=0.05)


def test_an_accelerators_efficiency_is_its_measured_conv3d_share_or_the_configs() -> None:
    cfg = load_config(MLPERF_CONFIG)
    defaults = cfg.perf_model.extrapolate.accelerators
    h100 = Accelerator(name="h100", spec=defaults["h100"], bytes_per_value=2)
    # The roofline's number: MLPerf Training unet3d on an H100 SXM at batch 1, 0.180 of peak.
    assert h100.efficiency == ACCELERATORS["h100_sxm"].conv3d_share == 0.180
    assert h100.layer_seconds(cfg.model, batch=4, split=(2, 1, 1)) == accelerator_seconds(
        cfg.model, batch=4, spatial=2, peak_flops=989e12, efficiency=0.180
    )
    assert "x 0.18 efficiency (h100_sxm's measured 3D-conv share)" in h100.describe()
    # An entry that gives its efficiency (every config written before conv3d_share_of) loads.
    old = {"peak_tflops": 989, "efficiency": 0.3, "memory_gb": 80, "memory_gbyte_s": 3350}
    old["intra_node_gbit"] = 3600

    def accelerators(h100: dict) -> dict:
        overrides = {"perf_model": {"extrapolate": {"accelerators": {"h100": h100}}}}
        return load_config(MLPERF_CONFIG, overrides=overrides).perf_model.extrapolate.accelerators

    mine = accelerators(old)["h100"]
    assert Accelerator(name="h100", spec=mine, bytes_per_value=2).efficiency == 0.3
    key = "key 'perf_model.extrapolate.accelerators.h100"
    with pytest.raises(ConfigError, match=f"{key}': both of conv3d_share_of and efficiency"):
        accelerators(old | {"conv3d_share_of": "h100_sxm"})
    with pytest.raises(ConfigError, match=f"{key}': neither of conv3d_share_of and efficiency"):
        accelerators(old | {"efficiency": None})
    for named, why in (
        ("h100x", "'h100x' is not one of a100_40gb"),
        ("v100_sxm2", "v100_sxm2 has no measured"),
    ):
        spec = dataclasses.replace(defaults["h100"], conv3d_share_of=named)
        with pytest.raises(ValueError, match=f"{key}.conv3d_share_of': {why}"):
            Accelerator(name="h100", spec=spec, bytes_per_value=2)


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from cosmocub.cli import main

    rc = main(["perf-model", "predict", "--config", str(TEST_CONFIG), *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_predict_cli_prints_a_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    flags = ("--nodes", "1", "--ranks-per-node", "2", "--accelerator", "h100")
    rc, out, _ = _cli(capsys, *flags, "--mesh", "2x1", "--rate-mbit", "1000", "25000", "--json")
    assert rc == 0
    got = json.loads(out)["predictions"]
    assert [p["rate_mbit"] for p in got] == [1000, 25000]
    assert got[0]["steps_per_epoch"] == 3  # 3 of 6 universes x 8 crops, over 2 ranks, batch 4
    rc, out, _ = _cli(capsys, *flags, "--data", "2")
    assert rc == 0 and "step (ms)" in out and "2 epochs of 3 steps" in out
    node = "{optimizer: {name: lion_cub, lion_cub: {hierarchy: node}}}"
    rc, out, _ = _cli(capsys, *flags, "--data", "2", "--override", node, "--json")
    assert rc == 0 and json.loads(out)["predictions"][0]["optimizer"] == "lion_cub"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--mesh", "4x2", "--nodes", "2", "--ranks-per-node", "2", "--accelerator", "h100"],
            "--mesh 4x2 is 8 ranks, not --nodes 2 x --ranks-per-node 2 = 4",
        ),
        (
            ["--nodes", "1", "--ranks-per-node", "2", "--accelerator", "a100"],
            "--accelerator a100: not one of v100, h100",
        ),
        (
            ["--nodes", "1", "--ranks-per-node", "2", "--accelerator", "cpu"],
            "--accelerator cpu: needs --fit FILE",
        ),
        (
            ["--nodes", "1", "--ranks-per-node", "2", "--accelerator", "h100", "--rate-mbit", "0"],
            "--rate-mbit 0: a link rate must be > 0",
        ),
        (
            ["--nodes", "1", "--ranks-per-node", "4", "--accelerator", "h100", "--spatial", "8"],
            "spatial 8 does not divide --nodes 1 x --ranks-per-node 4 = 4 ranks",
        ),
        (
            ["--nodes", "1", "--ranks-per-node", "2", "--accelerator", "h100", "--override", "[1]"],
            "--override '[1]': a mapping of config sections",
        ),
    ],
)
def test_bad_predict_input_is_one_line_naming_the_flag(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    rc, _, err = _cli(capsys, *flags)
    assert rc == 2
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_an_extrapolation_row_is_the_prediction_of_its_case() -> None:
    import dataclasses

    from cosmocub.perfmodel.uses.extrapolate import extrapolate, optimizer_configs

    settings = {"sample_sizes": [8], "gpus": [8], "gpus_per_node": 4, "link_gbit": [25]}
    cfg = load_config(TEST_CONFIG, overrides={"perf_model": {"extrapolate": settings}})
    s = cfg.perf_model.extrapolate
    rows = extrapolate(cfg, s)
    row = next(
        r for r in rows if (r["accelerator"], r["spatial"], r["optimizer"]) == ("v100", 2, "lion")
    )
    work = dataclasses.replace(
        Workload.of(cfg), optimizer=optimizer_configs(cfg, s)["lion"], ddp_overlap=True
    )
    network = machines.assumed_network(s, s.accelerators["v100"], rate_mbit=25e3, ranks_per_node=4)
    v100 = Accelerator(name="v100", spec=s.accelerators["v100"], bytes_per_value=s.activation_bytes)
    p = predict_run(work, Mesh(data=4, split=(2, 1, 1)), network, v100)
    assert row["step_s"] == p.step.step_s and row["memory_gb"] == p.memory_bytes / 1e9
    assert row["exchange_s"] == p.step.exchange_s and row["nodes"] == 2


def test_validate_holds_out_all_but_the_fit_set_and_skips_busy_points(tmp_path: Path) -> None:
    from cosmocub.io import write_json, write_tsv
    from cosmocub.perfmodel.measure.link_fits import write_fits
    from cosmocub.perfmodel.uses.entry_points import validate

    cfg = load_config(TEST_CONFIG)
    cal = _calibration()
    write_json(tmp_path / "calibration.json", cal.as_dict())
    write_fits(FITS.fits, tmp_path / "fit.tsv")
    columns = [
        "point",
        "data",
        "world_size",
        "nodes",
        "rate_mbit",
        "cores_per_rank",
        "steps",
        "step_s",
        "compute_s",
        "exchange_s",
        "momentum_sync_s",
        "contended",
        "oversubscribed",
    ]
    tables = {
        "step_time": [("dp1", {}, "1", "1", "", "2", False, False)],
        "network": [
            ("cub", {"optimizer": LION_CUB}, "2", "2", "10", "1", False, False),
            ("busy", {"optimizer": LION_CUB}, "2", "2", "10", "1", True, False),
            ("shared", {}, "2", "1", "", "0.5", False, True),
        ],
    }
    paths = []
    for study, points in tables.items():
        rows = []
        for name, overrides, world, nodes, mbit, cores, contended, over in points:
            point_cfg = load_config(TEST_CONFIG, overrides=overrides)
            write_config(point_cfg.values, tmp_path / study / name / "config.yaml")
            rows.append(
                dict(
                    zip(
                        columns,
                        [
                            name,
                            world,
                            world,
                            nodes,
                            mbit,
                            cores,
                            1000,
                            0.05,
                            0.04,
                            0.01,
                            0.0,
                            contended,
                            over,
                        ],
                        strict=True,
                    )
                )
            )
        write_tsv(rows, columns, tmp_path / study / "points.tsv")
        paths.append(tmp_path / study / "points.tsv")
    tsv = tmp_path / "validation.tsv"
    validate(
        cfg,
        points=paths,
        fit_path=tmp_path / "fit.tsv",
        tsv=tsv,
        plot=tmp_path / "validation.png",
        calibration=tmp_path / "calibration.json",
        fit_set=["step_time/dp1"],
    )
    from cosmocub.io import read_json, read_tsv

    got = {r["point"]: r["set"] for r in read_tsv(tsv)}
    assert got == {"dp1": "fit", "cub": "held-out"}
    summary = read_json(tsv.with_suffix(".json"))
    assert summary["skipped"] == {
        "network": {
            "contended": {"count": 1, "points": ["busy"]},
            "oversubscribed": {"count": 1, "points": ["shared"]},
        }
    }
    assert summary["sets"]["fit"]["step"]["points"] == 1
    assert summary["sets"]["held-out"]["step"]["points"] == 1
    # The cores' speed is fitted on dp1: its measured compute is met exactly.
    assert summary["sets"]["fit"]["compute"]["median"] == pytest.approx(0.0, abs=1e-9)
    assert summary["cpu_speed_correction"] > 0 and summary["fit_points"] == 1


def test_lion_cub_exchange_bytes_follow_the_levels_and_the_allreduce_dtype() -> None:
    from cosmocub.perfmodel.cost_model.step_model import exchange

    net = AlphaBeta(alpha_s=1e-5, beta_s_per_byte=1e-9)
    network = Network.uniform(net, net, ranks_per_node=4)

    def sent(data: int, **lion_cub: object) -> float:
        options = {"quantizer": "l1", "bits": 4, **lion_cub}
        cfg = load_config(
            TEST_CONFIG, overrides={"optimizer": {"name": "lion_cub", "lion_cub": options}}
        )
        mesh = Mesh(data=data, split=(1, 1, 1))
        return exchange(cfg.model, cfg.optimizer, mesh, network, steps=4, layer_seconds={}).sent

    n = sum(parameter_sizes(load_config(TEST_CONFIG).model))
    # The all-reduce's payload: 1 byte a value in int8, 2 in fp16 (7 levels both at 16 ranks).
    int8 = sent(16, collective="allreduce")
    assert int8 == pytest.approx(ring_allreduce_bytes(n, 16), rel=1e-12)
    assert sent(16, collective="allreduce", allreduce_dtype="fp16") == pytest.approx(2 * int8)
    # At 512 data ranks the int8 sum keeps no level; fp16 keeps 4 (3-bit codes, still 2 bytes on
    # the wire); the all-to-all keeps 7 at 4 bits and sends (4 + 1)/8 bytes a value at most.
    with pytest.raises(ValueError, match="over 512 data ranks"):
        sent(512, collective="allreduce")
    fp16 = sent(512, collective="allreduce", allreduce_dtype="fp16")
    assert fp16 == pytest.approx(ring_allreduce_bytes(2 * n, 512), rel=1e-12)
    alltoall = sent(512, collective="alltoall")
    assert 511 / 512 * 5 / 8 * n <= alltoall < fp16 / 2


def test_hierarchy_node_sends_one_gth_of_flats_inter_node_bytes() -> None:
    # 512 data ranks on 128 nodes of 4, l1 4-bit all-to-all: the vote runs on 1/4 of each bucket
    # over 128 nodes instead of on all of it over 512 ranks ((127/128) / (511/512) of 1/4), and
    # the node's fp32 reduce-scatter and 1-bit all-gather stay on its own link.
    def run(hierarchy: str):
        options = {"quantizer": "l1", "bits": 4, "collective": "alltoall", "hierarchy": hierarchy}
        cfg = load_config(
            MLPERF_CONFIG, overrides={"optimizer": {"name": "lion_cub", "lion_cub": options}}
        )
        spec = cfg.perf_model.extrapolate.accelerators["h100"]
        link = AlphaBeta(alpha_s=10e-6, beta_s_per_byte=8 / 10e9)
        nvlink = AlphaBeta(alpha_s=5e-6, beta_s_per_byte=8 / 3.6e12)
        network = Network.uniform(link, nvlink, ranks_per_node=4)
        device = Accelerator(name="h100", spec=spec, bytes_per_value=2)
        return predict_run(Workload.of(cfg), Mesh(data=512, split=(1, 1, 1)), network, device)

    flat, node = run("flat"), run("node")
    assert flat.intra_node_bytes_per_step == 0
    ratio = node.inter_node_bytes_per_step / flat.inter_node_bytes_per_step
    assert ratio == pytest.approx(1 / 4 * (127 / 128) / (511 / 512), rel=2e-3), ratio
    n = sum(parameter_sizes(load_config(MLPERF_CONFIG).model))
    # Within the node: (G - 1)/G of the fp32 vector reduce-scattered, then 1 bit a value.
    assert node.intra_node_bytes_per_step == pytest.approx(3 / 4 * n * (4 + 1 / 8), rel=1e-3)
    assert node.step.exchange_s < flat.step.exchange_s / 2
