"""The cluster model at scale: the wait for the slowest rank against simulated draws, a software
profile's launches and syncs in the step, NCCL_PROTO, one measured run (a synthetic MLPerf log)
to another scale (against_mlperf.py's tests: test_against_mlperf.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cosmocub.cli import main
from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import cluster, described_cluster
from cosmocub.perfmodel.cost_model.machines import accelerator_spec
from cosmocub.perfmodel.cost_model.nccl_collectives import choose
from cosmocub.perfmodel.cost_model.software import LAUNCH_S, NVIDIA_V2, NVIDIA_V3, SYNC_S
from cosmocub.perfmodel.cost_model.stragglers import (
    ScalePair,
    Stragglers,
    expected_max_normal,
    leave_one_out,
)
from cosmocub.perfmodel.uses.mllog import RunTimes
from cosmocub.perfmodel.uses.run_calibration import calibrate_run
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import (
    MLPERF_COSMOFLOW,
    predict_cluster,
    staged_beyond_memory,
)

ROOT = Path(__file__).resolve().parents[1]
MLPERF = ROOT / "config" / "cosmoflow-mlperf.yaml"


@pytest.mark.parametrize("n", [2, 8, 32, 512])
def test_expected_max_matches_a_simulation_of_n_draws(n: int) -> None:
    rng = np.random.default_rng(n)
    simulated = rng.standard_normal((20_000, n)).max(axis=1).mean()
    assert expected_max_normal(n) == pytest.approx(simulated, abs=0.015)
    assert expected_max_normal(1) == 0.0


def test_the_wait_for_the_slowest_rank_is_the_simulated_synchronous_step() -> None:
    """N ranks whose steps scatter by cv: the synchronous step (the slowest rank's) of many
    simulated steps against own × (1 + cv·e_N)."""
    rng = np.random.default_rng(7)
    own, cv, ranks = 4e-3, 0.15, 64
    steps = (own * (1 + cv * rng.standard_normal((20_000, ranks)))).max(axis=1)
    s = Stragglers(cv=cv, source="test")
    assert own + s.wait_s(own, ranks) == pytest.approx(steps.mean(), rel=0.003)
    with pytest.raises(ValueError, match=r"cv 1\.5"):
        Stragglers(cv=1.5, source="test")


def test_a_pair_recovers_its_cv_and_leave_one_out_skips_pairs_sharing_a_run() -> None:
    s = Stragglers(cv=0.12, source="truth")
    own = 4e-3

    def pair(name: str, ranks: tuple[int, int], runs: tuple[str, str]) -> ScalePair:
        steps = (own * s.factor(ranks[0]) + 3e-4, own * s.factor(ranks[1]) + 5e-4)
        return ScalePair(name=name, ranks=ranks, step_s=steps, outside_s=(3e-4, 5e-4), runs=runs)

    pairs = [
        pair("a", (32, 512), ("a32", "a512")),
        pair("b", (128, 1024), ("b128", "b1024")),
        pair("b2", (64, 1024), ("b64", "b1024")),
    ]
    assert pairs[0].cv() == pytest.approx(0.12, rel=1e-6)
    for p, cv, growth in leave_one_out(pairs):
        assert cv == pytest.approx(0.12, abs=1e-3)
        assert growth == pytest.approx(p.growth, abs=1e-4)
    # b and b2 share the 1024-GPU run: neither may be fitted on the other.
    bent = [pairs[0], pairs[1], dataclasses.replace(pairs[2], step_s=(1.0, 2.0))]
    _, cv_b, _ = leave_one_out(bent)[1]
    assert cv_b == pytest.approx(0.12, abs=1e-3)


# A loader fast enough never to pace a step: the host's terms alone move it.
FAST_LOADER = dataclasses.replace(cluster("eos"), loader_gbyte_s_per_core=100.0)


def _eos_step(software=None, stragglers=None, nodes: int = 4, preset=FAST_LOADER, **kwargs):
    cfg = load_config(MLPERF, overrides={"train": {"local_batch_size": 1}})
    if stragglers is not None:
        kwargs["stragglers"] = stragglers
    return predict_cluster(
        Workload.of(cfg), preset, nodes=nodes, epochs=1, software=software, **kwargs
    )[1]


def test_a_profiles_launches_and_syncs_change_the_step_as_stated() -> None:
    base = _eos_step(NVIDIA_V3)
    more = dataclasses.replace(NVIDIA_V3, serial_launches=NVIDIA_V3.serial_launches + 10)
    synced = dataclasses.replace(NVIDIA_V3, host_syncs=NVIDIA_V3.host_syncs + 3)
    assert _eos_step(more).full_step_s - base.full_step_s == pytest.approx(10 * LAUNCH_S)
    assert _eos_step(synced).full_step_s - base.full_step_s == pytest.approx(3 * SYNC_S)
    # The host's share waits for the slowest rank too: a straggler factor on it.
    s = Stragglers(cv=0.2, source="test")
    delta = _eos_step(more, s).full_step_s - _eos_step(NVIDIA_V3, s).full_step_s
    assert delta == pytest.approx(10 * LAUNCH_S * s.factor(32))
    # The input's log1p and copy: 7 bytes of HBM traffic per int16 byte of a 16.8 MB sample.
    assert base.host_s - NVIDIA_V3.host_s() == pytest.approx(
        7 * 16_777_216 / cluster("eos").spec.rate_bytes
    )


def test_nccl_proto_simple_keeps_ncclto_simple() -> None:
    node = cluster("perlmutter").network(("Simple",)).node
    assert choose(node, "allreduce", 4096.0, 512, 128).protocol == "Simple"
    free = cluster("perlmutter").network().node
    assert choose(free, "allreduce", 4096.0, 512, 128).protocol != "Simple"


def test_a_machine_by_flags_is_priced_as_its_preset() -> None:
    cfg = load_config(MLPERF)
    eos = predict_cluster(Workload.of(cfg), cluster("eos"), nodes=64, epochs=1)[0]
    spec = accelerator_spec("h100", cfg.perf_model.extrapolate.accelerators["h100"])
    flags = described_cluster(spec, ranks_per_node=8, node_gbit_s=3200.0)
    by_flags = predict_cluster(Workload.of(cfg), flags, nodes=64, epochs=1)[0]
    assert by_flags.step.step_s == pytest.approx(eos.step.step_s, rel=0.10)


def _mllog(path: Path, *, nodes: int, gpus_per_node: int, step_s: float, eval_s: float) -> None:
    """A result log as MLPerf HPC writes them: one epoch's training and evaluation."""
    gpus = nodes * gpus_per_node
    train_samples = 524_288
    epoch_ms = 1e3 * step_s * train_samples / gpus
    t0 = 1_700_000_000_000 + 1e6 * len(path.parts[-4])  # another start for another system

    def line(key, value, time_ms, **meta) -> str:
        record = {"key": key, "value": value, "time_ms": time_ms, "metadata": meta}
        return ":::MLLOG " + json.dumps(record)

    lines = [
        line("submission_org", "NVIDIA", t0),
        line("submission_platform", f"{nodes}xNVIDIA DGX H100", t0),
        line("number_of_nodes", nodes, t0),
        line("accelerators_per_node", gpus_per_node, t0),
        line("global_batch_size", gpus, t0),
        line("train_samples", train_samples, t0),
        line("eval_samples", 65_536, t0),
        line("run_start", None, t0),
        line("epoch_start", None, t0 + 10, epoch_num=1),
        line("eval_start", None, t0 + 10 + epoch_ms, epoch_num=1),
        line("eval_stop", None, t0 + 10 + epoch_ms + 1e3 * eval_s, epoch_num=1),
        line("epoch_stop", None, t0 + 20 + epoch_ms + 1e3 * eval_s, epoch_num=1),
        line("run_stop", None, t0 + 30 + epoch_ms + 1e3 * eval_s),
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def _tree(root: Path, system: str, benchmark: str = "cosmoflow", **kw) -> Path:
    log = root / "v3.0" / "NVIDIA" / "results" / system / "strong" / benchmark / "result_0.txt"
    _mllog(log, **kw)
    desc = {
        "accelerator_model_name": "NVIDIA H100 80GB HBM3",
        "accelerators_per_node": str(kw["gpus_per_node"]),
        "framework": "PyTorch NVIDIA Release 23.09",
        "submitter": "NVIDIA",
    }
    systems = root / "v3.0" / "NVIDIA" / "systems"
    systems.mkdir(parents=True, exist_ok=True)
    (systems / f"{system}.json").write_text(json.dumps(desc))
    return log


def test_from_run_on_a_synthetic_mllog_prices_its_own_scale_and_another(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = _tree(tmp_path, "eos_n4_test", nodes=4, gpus_per_node=8, step_s=4.5e-3, eval_s=5.7)
    cal = tmp_path / "cal.json"
    args = ["perf-model", "calibrate", "--config", str(MLPERF), "--from-run", str(log)]
    assert main([*args, "--out", str(cal)]) == 0
    written = json.loads(cal.read_text())
    assert (written["preset"], written["software"]) == ("eos", "nvidia_v3")
    assert written["layer_scale"] > 1.0  # the roofline is faster than the log's 4.5 ms
    capsys.readouterr()

    def predict(nodes: int) -> dict:
        flags = ["--cluster", "eos", "--nodes", str(nodes), "--train-samples", "524288"]
        batch = ["--override", "{train: {local_batch_size: 1}}", "--gpu-calibration", str(cal)]
        assert (
            main(["perf-model", "predict", "--config", str(MLPERF), *flags, *batch, "--json"]) == 0
        )
        return json.loads(capsys.readouterr().out)["predictions"][0]

    own = predict(4)
    assert own["full_step_s"] == pytest.approx(4.5e-3, rel=0.01)  # its own scale, round trip
    assert own["evaluation_s"] == pytest.approx(5.7, rel=0.02)
    far = predict(64)  # 512 GPUs: the wait for the slowest grows, the exchange with it
    assert 1.05 < far["full_step_s"] / own["full_step_s"] < 1.25


def test_from_run_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cal.json"
    base = ["perf-model", "calibrate", "--config", str(MLPERF), "--out", str(out), "--from-run"]
    assert main([*base, str(tmp_path / "missing.txt")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
    bad = tmp_path / "result_0.txt"
    bad.write_text(':::MLLOG {"key": "run_start", "time_ms": 1}\n')
    assert main([*base, str(bad)]) == 2
    assert "no run_start/run_stop event" in capsys.readouterr().err
    log = _tree(tmp_path / "t", "mystery_n4", nodes=4, gpus_per_node=8, step_s=5e-3, eval_s=1.0)
    desc = log.parents[4] / "systems" / "mystery_n4.json"
    desc.write_text(json.dumps({"accelerator_model_name": "Gaudi 2", "accelerators_per_node": "8"}))
    assert main([*base, str(log)]) == 2
    err = capsys.readouterr().err
    assert "'Gaudi 2'" in err and "no cluster preset" in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def test_from_run_on_a_tiny_real_cpu_run_scales_this_cpus_calibration(tmp_path: Path) -> None:
    """A real (tiny) training on this CPU: its measured compute (the fastest epoch after the
    first) ÷ the calibration's price is the scale, and the calibration times it gives back the
    measured compute at that point."""
    from calibration_fixtures import synthetic_calibration
    from shard_fixtures import make_random_shards
    from test_train import tiny_cfg

    from cosmocub.perfmodel.cost_model.machines import THIS_CPU, this_cpu
    from cosmocub.perfmodel.uses.run_calibration import RunCalibration
    from cosmocub.perfmodel.uses.run_folder import calibrate_from_run
    from cosmocub.train.main import train

    cfg = tiny_cfg()
    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    run = tmp_path / "run"
    summary = train(cfg, shards_dir=shards, run_dir=run)
    assert summary["accelerator"].startswith("cpu") and summary["ranks_per_node"] == 1
    calibration = synthetic_calibration()
    cal = calibrate_from_run(run, cfg, cpu=lambda: (calibration, 2))
    assert cal.preset == THIS_CPU and cal.layer_scale > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    measured = min(r["time_compute_s"] for r in records[1:])
    assert cal.step_s == measured
    device = this_cpu(threads_per_rank=1, ranks_per_node=1, cores=2, calibration=calibration)
    layers = device.layer_seconds(cfg.model, batch=4, split=(1, 1, 1))
    priced = sum(layers.values()) + device.optimizer_seconds(cfg.model, cfg.optimizer)
    assert cal.layer_scale * priced == pytest.approx(measured, rel=1e-9)
    cal.write(tmp_path / "cpu.json")
    assert RunCalibration.read(tmp_path / "cpu.json") == cal
    with pytest.raises(ValueError, match=r"no train_summary\.json"):
        calibrate_from_run(tmp_path, cfg, cpu=lambda: (calibration, 2))


def test_evaluation_is_paced_by_the_slowest_of_device_host_and_the_staged_read() -> None:
    sample = 4 * 128**3 * 2
    eos = cluster("eos")
    t = _eos_step(NVIDIA_V3, preset=eos)
    # Uncalibrated, a core's 5 GB/s copy of the 16.8 MB sample (one reader thread) is slowest.
    read = sample / (1 * eos.loader_gbyte_s_per_core * 1e9)
    assert t.eval_step_s == pytest.approx(read)
    assert t.eval_steps == 65_536 // 32
    # The score's all-reduce and its one .item() close the evaluation.
    assert t.eval_s == pytest.approx(t.eval_steps * read + t.eval_reduce_s)
    assert t.eval_reduce_s > SYNC_S
    # A tmpfs staging area reads 2.5x slower.
    shm = dataclasses.replace(eos, staging_read_factor=2.5)
    assert _eos_step(NVIDIA_V3, preset=shm).eval_step_s == pytest.approx(2.5 * read)
    # With a fast loader the device paces: the forward plus its log1p (3 bytes of HBM traffic
    # per input byte), not the 50 launches' 0.40 ms.
    fast = _eos_step(NVIDIA_V3)
    no_transform = dataclasses.replace(NVIDIA_V3, eval_input_passes=0.0)
    transform = _eos_step(NVIDIA_V3).eval_step_s - _eos_step(no_transform).eval_step_s
    assert transform == pytest.approx(3 * sample / eos.spec.rate_bytes)
    assert fast.eval_step_s > NVIDIA_V3.eval_launches * LAUNCH_S
    # ... and where the launches outlast the device, they pace it.
    chatty = dataclasses.replace(NVIDIA_V3, eval_launches=1000)
    assert _eos_step(chatty).eval_step_s == pytest.approx(1000 * LAUNCH_S)


def test_a_run_whose_staged_share_outgrows_memory_calibrates_from_its_first_evaluation() -> None:
    selene = cluster("selene")  # 2 TB a node; a share of 590k samples of 16.8 MB each
    assert staged_beyond_memory(selene, MLPERF_COSMOFLOW, 4)  # 2.5 TB a node
    assert not staged_beyond_memory(selene, MLPERF_COSMOFLOW, 64)  # 155 GB a node
    base = Workload.of(load_config(MLPERF, overrides={"train": {"local_batch_size": 1}}))

    def run(nodes: int) -> RunTimes:
        gpus = nodes * 8
        return RunTimes(
            path=Path("synthetic"),
            org="NVIDIA",
            platform="DGX A100",
            nodes=nodes,
            accelerators_per_node=8,
            global_batch=gpus,
            train_samples=524_288,
            eval_samples=65_536,
            run_start_ms=0.0,
            run_s=1.0,
            train_epoch_s=(8e-3 * 524_288 / gpus,) * 3,
            eval_s=(2.25e-3 * 65_536 / gpus, 3.6e-3 * 65_536 / gpus, 3.6e-3 * 65_536 / gpus),
            staging_s=None,
            staging_in_run=None,
        )

    weak = calibrate_run(run(4), "selene", NVIDIA_V2, base)
    assert weak.eval_step_s == pytest.approx(2.25e-3, rel=0.01)  # the first, from memory
    strong = calibrate_run(run(64), "selene", NVIDIA_V2, base)
    assert strong.eval_step_s == pytest.approx(3.6e-3, rel=0.01)  # the median


def test_later_evaluations_read_from_the_drives_where_the_staged_share_outgrows_memory() -> None:
    """DGX A100 at 4 nodes: 2.5 TB staged a node against 2 TB of memory. The first evaluation
    is priced from the page cache; the later ones read each step's 8 samples a node from the
    drives (47.7 GB/s a node, from Eos weak's O_DIRECT evaluations), the slower of that and the
    step pacing them; at 64 nodes (155 GB a node) every evaluation is the first's."""
    sample = 4 * 128**3 * 2
    selene = cluster("selene")
    assert selene.drive_gbyte_s_per_node == pytest.approx(8 * sample * 2048 / 5.76 / 1e9)
    epochs = 4

    def times(nodes: int, eval_scale: float = 1.0):
        cfg = load_config(MLPERF, overrides={"train": {"local_batch_size": 1}})
        work = Workload.of(cfg)
        return predict_cluster(
            work, selene, nodes=nodes, epochs=epochs, software=NVIDIA_V2, eval_scale=eval_scale
        )[1]

    drive_step = 8 * sample / (selene.drive_gbyte_s_per_node * 1e9)  # 2.81 ms
    fast = times(4, eval_scale=0.5)  # the page cache's step under the drives'
    assert fast.eval_step_s < drive_step
    assert fast.later_eval_step_s == pytest.approx(drive_step)
    assert fast.later_eval_s == pytest.approx(2048 * drive_step + fast.eval_reduce_s)
    assert fast.median_eval_s == pytest.approx(fast.later_eval_s)  # 3 of the 4
    staging = fast.staging_s if fast.staging_in_run and fast.staging_s else 0.0
    assert fast.total_s == pytest.approx(
        staging + epochs * fast.train_epoch_s + fast.eval_s + (epochs - 1) * fast.later_eval_s
    )
    slow = times(4, eval_scale=2.0)  # the step slower than the drives: it paces them
    assert slow.later_eval_step_s == pytest.approx(slow.eval_step_s)
    within = times(64, eval_scale=0.5)
    assert within.later_eval_step_s is None
    assert within.median_eval_s == pytest.approx(within.eval_s)


def test_the_samples_copy_to_the_device_paces_where_the_host_link_is_slower() -> None:
    sample = 4 * 128**3 * 2
    narrow = dataclasses.replace(cluster("eos"), host_link_gbyte_s=1.0)  # 16.8 ms a sample
    t = _eos_step(NVIDIA_V3, preset=narrow)
    assert t.eval_step_s == pytest.approx(sample / 1e9)
    assert t.data_wait_s == pytest.approx(sample / 1e9 - (t.step_s + t.host_s + t.straggler_s))
