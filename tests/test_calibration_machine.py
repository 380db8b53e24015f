"""A run calibration knows the machine it was made against: `predict` refuses it on another
accelerator or software (--software) in one line unless --accept-calibration, and the links an
accelerator entry states are the ones NCCL's collectives use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_cluster_scale import MLPERF, _mllog, _tree

from cosmocub.cli import main
from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.cluster_presets import cluster, described_cluster
from cosmocub.perfmodel.cost_model.machines import accelerator_spec

LONGHORN_STEP_S = 84.65e-3  # v1.0 TACC longhorn-tf's published median step


def _longhorn(root: Path) -> Path:
    """A Longhorn-like log (32 nodes x 4 V100, TensorFlow) laid out as the v1.0 repository."""
    log = root / "v1.0" / "TACC" / "results" / "longhorn-tf" / "strong" / "cosmoflow"
    _mllog(log / "result_0.txt", nodes=32, gpus_per_node=4, step_s=LONGHORN_STEP_S, eval_s=40.0)
    systems = root / "v1.0" / "TACC" / "systems"
    systems.mkdir(parents=True, exist_ok=True)
    desc = {
        "accelerator_model_name": "NVIDIA Tesla V100-SXM2-16GB",
        "accelerators_per_node": "4",
        "framework": "TensorFlow 2.3",
        "submitter": "TACC",
    }
    (systems / "longhorn-tf.json").write_text(json.dumps(desc))
    return log / "result_0.txt"


def _predict(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, str, str]:
    base = ["perf-model", "predict", "--config", str(MLPERF)]
    if "--nodes" not in flags:
        base += ["--nodes", "32"]
    samples = ["--train-samples", "524288", "--override", "{train: {local_batch_size: 1}}"]
    rc = main([*base, *samples, *flags, "--json"])
    out, err = capsys.readouterr()
    return rc, out, err


def _calibrated(root: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    """calibrate --from-run on the Longhorn-like log."""
    cal = root / "longhorn.json"
    run = ["perf-model", "calibrate", "--config", str(MLPERF), "--from-run"]
    assert main([*run, str(_longhorn(root)), "--out", str(cal)]) == 0
    capsys.readouterr()
    return cal


def test_a_calibration_is_refused_on_another_accelerator_unless_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = _calibrated(tmp_path, capsys)
    machine = json.loads(cal.read_text())["machine"]
    assert machine["accelerator"]["name"] == "V100 SXM2 16GB" and machine["software"] is None
    # Its own machine: the published step back, within the fixed point's rounding.
    rc, out, err = _predict(capsys, "--cluster", "longhorn", "--gpu-calibration", str(cal))
    assert rc == 0, err
    own = json.loads(out)["predictions"][0]["full_step_s"]
    assert own == pytest.approx(LONGHORN_STEP_S, rel=0.01)
    # The config's v100 entry prices its layers at efficiency 0.3, the preset at a GEMM's share:
    # the same file there would scale another roofline.
    flags = ["--accelerator", "v100", "--ranks-per-node", "4", "--rate-mbit", "100000"]
    rc, out, err = _predict(capsys, *flags, "--gpu-calibration", str(cal))
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert str(cal) in err and "accelerator.conv3d_share" in err
    assert "0.3" in err and "--accept-calibration" in err
    rc, out, err = _predict(capsys, *flags, "--gpu-calibration", str(cal), "--accept-calibration")
    assert rc == 0, err
    moved = json.loads(out)["predictions"][0]["full_step_s"]
    assert moved != pytest.approx(own, rel=0.05)  # what the refusal was for


def test_a_calibration_is_refused_for_another_software_unless_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An Eos-like run (PyTorch 23.09: profile nvidia_v3) calibrates its own stack; pricing
    cosmocub's eager step with it is another machine, refused in one line unless accepted, and
    then priced as that stack (its host time, its evaluation)."""
    log = _tree(tmp_path, "eos_n64", nodes=64, gpus_per_node=8, step_s=0.01, eval_s=2.0)
    cal = tmp_path / "eos.json"
    run = ["perf-model", "calibrate", "--config", str(MLPERF), "--from-run", str(log)]
    assert main([*run, "--out", str(cal)]) == 0
    capsys.readouterr()
    assert json.loads(cal.read_text())["machine"]["software"] == "nvidia_v3"
    flags = ["--nodes", "64", "--cluster", "eos", "--gpu-calibration", str(cal)]
    rc, out, err = _predict(capsys, *flags, "--software", "cosmocub_eager")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"{cal}: made against software 'nvidia_v3', asked for 'cosmocub_eager'" in err
    rc, out, err = _predict(capsys, *flags, "--software", "nvidia_v3")  # its own, named
    assert rc == 0, err
    own = json.loads(out)["predictions"][0]
    assert own["full_step_s"] == pytest.approx(0.01, rel=0.01)
    rc, out, err = _predict(capsys, *flags, "--software", "cosmocub_eager", "--accept-calibration")
    assert rc == 0, err
    eager = json.loads(out)["predictions"][0]
    assert own["host_s"] > 0 and eager["host_s"] == 0.0
    assert eager["full_step_s"] < own["full_step_s"]
    rc, out, err = _predict(capsys, *flags, "--software", "no_such_stack")
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "--software: software profile 'no_such_stack': not one of" in err


def test_a_calibration_without_a_machine_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cal = _calibrated(tmp_path, capsys)
    data = json.loads(cal.read_text())
    del data["machine"]
    cal.write_text(json.dumps(data))
    rc, _, err = _predict(capsys, "--cluster", "longhorn", "--gpu-calibration", str(cal))
    assert rc == 2 and "records no machine" in err and len(err.strip().splitlines()) == 1


def test_links_an_entry_states_are_the_ones_nccl_uses() -> None:
    """The config's v100 states 1,200 Gbit/s between a node's GPUs: NCCL's node takes 150 GB/s.
    A preset's V100 states no rate of its own to NCCL: 3 NVLinks at NCCL's 20 GB/s a link."""
    cfg = load_config(MLPERF)
    entry = cfg.perf_model.extrapolate.accelerators["v100"]
    spec = accelerator_spec("v100", entry)
    node = described_cluster(spec, ranks_per_node=4, node_gbit_s=100.0).nccl_node()
    assert node.intra_gbyte_s == pytest.approx(entry.intra_node_gbit / 8) == 150.0
    assert cluster("longhorn").nccl_node().intra_gbyte_s == pytest.approx(60.0)
