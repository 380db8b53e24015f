"""The performance model: the α–β fit, its byte counts against what the optimizers count on two
gloo ranks, and the measured-vs-predicted validation."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmocub.config import load_config
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.perfmodel.costs import AlphaBeta, Sample, fit_alpha_beta, fit_per_kind
from cosmocub.perfmodel.model import Mesh, Network, predict_step

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
}
STEPS = 4

# Each rank: every variant's optimizer on the test config's CosmoFlow, gradients synced and
# counted as the training loop does (build_gradient_sync, CommMeter), for STEPS steps.
COUNT_BYTES = """
import json, sys
import torch
from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.factory import build_optimizer
from cosmocub.parallel.mesh import build_parallel_dims
from cosmocub.train.comm_meter import CommMeter
from cosmocub.train.grad_sync import build_gradient_sync

config, variants, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
dims = build_parallel_dims(backend="gloo", spatial=1)
counted = {}
for name, optimizer in variants.items():
    cfg = load_config(config, overrides={"optimizer": optimizer})
    torch.manual_seed(0)
    model = CosmoFlow(cfg.model)
    opt = build_optimizer(model.named_parameters(), cfg.optimizer, 8, dims=dims)
    sync = build_gradient_sync(opt, dims)
    wrapped = sync.wrap(model)
    meter = CommMeter(opt, model, sync)
    gen = torch.Generator().manual_seed(dims.rank)
    for _ in range(steps):
        x = torch.randn(2, 4, 8, 8, 8, generator=gen)
        opt.zero_grad(set_to_none=True)
        wrapped(x).square().mean().backward()
        sync.after_backward(model)
        opt.step()
        meter.add_step(0.0)
    counted[name] = meter.metrics()["comm_bytes_per_step"]
if dims.rank == 0:
    print("COUNTED " + json.dumps(counted), flush=True)
"""


@pytest.mark.slow
def test_model_bytes_equal_what_the_optimizers_count(tmp_path: Path) -> None:
    config = Path(__file__).resolve().parents[1] / "config/test.yaml"
    script = tmp_path / "count.py"
    script.write_text(COUNT_BYTES)
    proc = multirank.run_ranks(  # a timeout kills every rank
        torchrun_argv(2, str(script), str(config), json.dumps(VARIANTS), str(STEPS)),
        timeout=120,
    )
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 0, err[-3000:]
    counted = json.loads(out.split("COUNTED ", 1)[1].splitlines()[0])
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


def test_validation_compares_each_part_and_reports_errors(tmp_path: Path) -> None:
    from cosmocub.perfmodel.model import StepPrediction
    from cosmocub.perfmodel.validate import compare, error_summary, plot_results, write_results

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
        {"point": "a", "data": "2", "step_s": "0.016", "compute_s": "0.016", "exchange_s": "0",
         "momentum_sync_s": "0", "comm_bytes_per_step": "100"},
        {"point": "b", "data": "2", "step_s": "0.025", "compute_s": "0.015", "exchange_s": "0.010",
         "momentum_sync_s": "0", "comm_bytes_per_step": "100"},
    ]  # fmt: skip
    results = compare(rows, lambda row: predicted[row["point"]])
    a, b = results
    assert a["predicted_compute_s"] == pytest.approx(0.016)  # 10 + 1 + 1 + the hidden 4 ms
    assert a["predicted_exchange_s"] == 0.0 and a["rel_error_step"] == pytest.approx(0.0)
    assert b["predicted_step_s"] == pytest.approx(0.020)
    assert b["rel_error_step"] == pytest.approx(-0.2)
    assert b["rel_error_compute"] == pytest.approx(-0.2)  # 12 ms against 15
    assert b["rel_error_exchange"] == pytest.approx(-0.2)
    summary = error_summary(results)
    assert summary == {"median": pytest.approx(0.1), "worst": pytest.approx(0.2), "points": 2}
    write_results(results, tmp_path / "v.tsv")
    plot_results(results, tmp_path / "v.png")
    header = (tmp_path / "v.tsv").read_text().splitlines()[0].split("\t")
    assert header[:4] == ["point", "optimizer", "measured_step_s", "predicted_step_s"]
    assert (tmp_path / "v.png").stat().st_size > 10_000


def test_extrapolation_rows_and_headline() -> None:
    from cosmocub.perfmodel.extrapolate import balanced_split, extrapolate, headline
    from cosmocub.perfmodel.model import parameter_sizes

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
    # Two accelerators × splits 1..8 (8³ samples: 2³ per rank at 8 still pools) × two optimizers.
    assert {(r["accelerator"], r["spatial"], r["optimizer"]) for r in rows} == {
        (a, s, o) for a in ("v100", "h100") for s in (1, 2, 4, 8) for o in ("lion", "lion_cub")
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
    (top,) = [h for h in headline(rows, reference="lion", candidate="lion_cub", halo_limit=0.2)
              if h["accelerator"] == "v100"]  # fmt: skip
    assert top["min_spatial"] == 1
    cub = next(
        r
        for r in rows
        if (r["accelerator"], r["spatial"], r["optimizer"]) == ("v100", 1, "lion_cub")
    )
    assert top["speedup"] == pytest.approx(lion["step_s"] / cub["step_s"])
    assert cub["comm_bytes_per_step"] < lion["comm_bytes_per_step"] / 8  # 1 bit (+1) against 32


def test_calibration_scales_the_work_on_the_cores_only() -> None:
    from cosmocub.perfmodel.model import StepPrediction
    from cosmocub.perfmodel.validate import calibrated

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
        {"point": "cub", "optimizer": "lion_cub", "data": "4", "compute_s": "0.05"},
    ]
    p, _ = calibrated(stub, rows, "one")(rows[1])  # cores ran at half the speed: × 2
    assert (p.compute_s, p.optimizer_s) == (pytest.approx(0.020), pytest.approx(0.002))
    assert (p.halo_s, p.exchange_s) == (0.001, 0.008)  # the network is not the cores
    with pytest.raises(ValueError, match="'cub': needs one rank with a DDP optimizer"):
        calibrated(stub, rows, "cub")
    with pytest.raises(ValueError, match=r"'x' not in the table \(\['one', 'cub'\]\)"):
        calibrated(stub, rows, "x")


def test_an_optimizer_without_an_update_cost_is_an_error_naming_it() -> None:
    from cosmocub.perfmodel.extrapolate import update_bytes_per_param
    from cosmocub.perfmodel.machines import UPDATE_BYTES_PER_PARAM

    assert update_bytes_per_param("lion_cub", "cub") == UPDATE_BYTES_PER_PARAM["lion_cub"]
    with pytest.raises(ValueError, match=r"optimizers\.mine: no update cost for .* 'rmsprop'"):
        update_bytes_per_param("rmsprop", "mine")
