"""The workflow at spatial = 2 (one sample split over two ranks), the sample-size study, the U-Net
and the network study: each target through Snakemake, 4-5 minutes for the module at the suite's
load, so `long` (on request: `pytest -m long tests/workflow/test_spatial_workflow.py`). The same
code runs in the default suite without Snakemake: tests/test_spatial_train.py,
test_sample_size_study.py, test_unet_train.py, test_network_study.py."""

import csv
import json
import math
from pathlib import Path

import pytest
from test_workflow import REPO, job_counts, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.long]
TEST_CONFIG = str(REPO / "config" / "test.yaml")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder where the spatial = 1 run of the test config has trained."""
    cwd = tmp_path_factory.mktemp("workflow")
    proc = snakemake(
        "--cores",
        "2",
        "--configfile",
        TEST_CONFIG,
        "--config",
        "train={run_name: s1, deterministic: true}",
        "tracking={enabled: false}",
        "--",
        "results-test/runs/s1/metrics.jsonl",
        cwd=cwd,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cwd


def records(path: Path) -> list[dict[str, float]]:
    """What a run computed per epoch (losses, metrics, lr), without its timings and traffic."""
    lines = path.read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if computed(k)} for x in lines]


def computed(key: str) -> bool:
    return key in ("epoch", "step", "train_loss", "lr") or key.startswith("val_")


def test_spatial2_trains_through_the_workflow_like_spatial1(workdir: Path) -> None:
    proc = snakemake(
        "--cores",
        "2",
        "--configfile",
        TEST_CONFIG,
        "--config",
        "parallel={spatial: 2}",
        "train={run_name: s2, deterministic: true, ranks_per_node: 2}",
        "tracking={enabled: false}",
        "--",
        "results-test/runs/s2/metrics.jsonl",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # Only training ran: the universes and shards of the spatial = 1 run serve it.
    assert job_counts(proc.stdout + proc.stderr) == {"train": 1}
    runs = workdir / "results-test/runs"
    summary = json.loads((runs / "s2/train_summary.json").read_text())
    assert (summary["world_size"], summary["data_parallel"], summary["spatial_parallel"]) == (
        2,
        1,
        2,
    )
    one, two = records(runs / "s1/metrics.jsonl"), records(runs / "s2/metrics.jsonl")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [6, 12]
    for a, b in zip(one, two, strict=True):
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), (a["epoch"], key)


def test_sample_size_study_target(workdir: Path) -> None:
    proc = snakemake(
        "sample_size_study",
        "--cores",
        "2",
        "--configfile",
        TEST_CONFIG,
        "--config",
        "tracking={enabled: false}",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    study = workdir / "results-test/studies/sample_size"
    with open(study / "points.tsv") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    # 2 sizes × 1 learning rate × 2 levels × (4 parameters + their mean).
    assert len(rows) == 20
    assert {(r["sample_size"], r["lr"]) for r in rows} == {("4", "0.003"), ("8", "0.003")}
    # Equal budgets: 1 epoch of 3 steps at every size; the grid's one lr selected per size.
    assert {r["steps"] for r in rows} == {"3"}
    assert {r["selected"] for r in rows} == {"1"}
    assert {r["lr_grid"] for r in rows} == {"0.003"}
    counts = {(r["sample_size"], r["level"]): int(r["count"]) for r in rows}
    # One test universe of 16³: 64 crops of 4³ or 8 of 8³, combined into one per universe.
    assert counts == {
        ("4", "sample"): 64,
        ("4", "universe"): 1,
        ("8", "sample"): 8,
        ("8", "universe"): 1,
    }
    for r in rows:
        # The TSV holds 6 significant digits.
        for base in ("mean", "pk"):
            ratio = float(r["cnn_mae"]) / float(r[f"{base}_mae"])
            assert float(r[f"cnn_over_{base}"]) == pytest.approx(ratio, rel=2e-5)
    assert (study / "sample_size.png").stat().st_size > 10_000
    train = json.loads((study / "8_lr0.003/run/train_summary.json").read_text())
    assert (train["world_size"], train["spatial_parallel"]) == (2, 2)


def test_unet_target(workdir: Path) -> None:
    """`snakemake unet` on the test config: a tiny U-Net, each sample split over two ranks,
    trained on the shards already there and evaluated against linear growth."""
    options = ("--cores", "2", "--configfile", TEST_CONFIG, "--config", "tracking={enabled: false}")
    proc = snakemake(*options, "--", "unet", cwd=workdir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = job_counts(proc.stdout + proc.stderr)
    assert counts == {"unet_config": 1, "unet_train": 1, "unet_evaluate": 1, "unet": 1}
    results = workdir / "results-test/unet"
    summary = json.loads((results / "run/train_summary.json").read_text())
    assert (summary["world_size"], summary["spatial_parallel"], summary["steps"]) == (2, 2, 12)
    metrics = json.loads((results / "eval/metrics.json").read_text())
    assert metrics["num_samples"] == 8 and metrics["target_redshift"] == 0.0
    # 8³ crops: k bins from the fundamental to Nyquist. Without shot-noise subtraction r(k) is
    # a correlation in [-1, 1] (Cauchy-Schwarz); with it, null where the corrected power is <= 0.
    assert len(metrics["k"]) == len(metrics["r_model"]) == len(metrics["raw"]["r_model"]) == 4
    for name in ("r_model", "r_baseline"):
        assert all(-1.0 - 1e-9 <= r <= 1.0 + 1e-9 for r in metrics["raw"][name]), name
        assert math.isfinite(metrics[name][0]), metrics[name]
    for name in ("model", "baseline"):
        assert set(metrics["summary"][name]) == {
            "min_r_to_half_nyquist",
            "max_transfer_error_to_half_nyquist",
            "meets_goal",
            "pdf_l1_distance",
        }
    rows = (results / "eval/spectra.tsv").read_text().splitlines()
    assert rows[0].split("\t")[:4] == ["k", "k_over_nyquist", "transfer_model", "r_model"]
    assert len(rows) == 5
    again = snakemake(*options, "--", "unet", cwd=workdir)
    assert "Nothing to be done" in again.stdout + again.stderr


def test_network_study_target(workdir: Path) -> None:
    """The tiny network study (Lion and Lion Cub 1-bit on 2 emulated nodes at 10 Mbit/s, on the
    shards the fixture made): one row each, Lion's wire bytes within the netemu tests' framing
    tolerance of its counted bytes, and the reference reaching its own target."""
    from test_netemu import NO_NETNS, _ratio_within_framing

    proc = snakemake(
        "network_study",
        "--cores",
        "2",
        "--configfile",
        TEST_CONFIG,
        "--config",
        "tracking={enabled: false}",
        cwd=workdir,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(workdir / "results-test/studies/network/points.tsv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f, delimiter="\t")}
    assert set(rows) == {"lion", "lion_cub_1bit"}
    for r in rows.values():
        assert (r["rate_mbit"], r["nodes"], r["ranks_per_node"]) == ("10", "2", "1")
    if NO_NETNS:  # the points are recorded as skipped, with blank measurements
        assert all(r["skipped"] and not r["step_s"] for r in rows.values())
        return
    lion, cub = rows["lion"], rows["lion_cub_1bit"]
    assert not lion["skipped"] and not cub["skipped"]
    # Lion's DDP all-reduce: 2 nodes, a ring of 2 sends the whole fp32 gradient per step.
    assert float(lion["comm_bytes_per_step"]) == 4 * 49012
    _ratio_within_framing(
        {k: float(lion[k]) for k in ("comm_bytes_per_step", "wire_bytes_per_step")},
        steps_per_epoch=3,  # config/test.yaml's network_study.max_steps_per_epoch
    )
    assert float(lion["wire_over_counted"]) == pytest.approx(
        float(lion["wire_bytes_per_step"]) / float(lion["comm_bytes_per_step"]), rel=1e-4
    )
    # Lion Cub 1-bit sends 1 bit per parameter (plus its scale words), far below Lion's 32.
    assert float(cub["comm_bytes_per_step"]) < float(lion["comm_bytes_per_step"]) / 20
    # The step's parts add up; at 10 Mbit/s most of Lion's step is its exchange.
    for r in (lion, cub):
        parts = sum(float(r[k]) for k in ("compute_s", "exchange_s", "momentum_sync_s"))
        assert float(r["step_s"]) == pytest.approx(parts, rel=1e-4)
    assert float(lion["reference_exchange_share"]) > 0.5
    # The target is Lion's final validation loss: Lion reaches it (at its last epoch at the
    # latest) and its speedup over itself is 1.
    assert float(lion["target_val_loss"]) == float(lion["final_val_loss"])
    assert float(lion["time_to_target_s"]) > 0
    assert float(lion["speedup_vs_reference"]) == 1.0
    metrics = workdir / "results-test/studies/network/lion_10mbit/run/metrics.jsonl"
    elapsed = [json.loads(x)["elapsed_s"] for x in metrics.read_text().splitlines()]
    assert len(elapsed) == 3 and elapsed == sorted(elapsed)
    assert float(lion["time_to_target_s"]) in [pytest.approx(e, rel=1e-5) for e in elapsed]
    assert (workdir / "results-test/studies/network/network.png").stat().st_size > 10_000
