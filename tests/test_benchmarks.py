"""Every script in benchmarks/ runs here in a smoke mode: tiny sizes, seconds, and a number of
its table checked, so a script that no longer runs fails the suite instead of rotting unseen.
(docs/explanation/benchmarks.md lists them, and those removed with the commit their figures came
from.)"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
TINY_MODEL = {
    "preprocess": {"sample_size": 8},
    "model": {"input_size": 8, "base_filters": 2, "num_conv_blocks": 1, "dense_sizes": [8]},
    "tracking": {"enabled": False},
}
# The scripts the integrator keeps apart (the performance model's; their smoke tests live with
# it) and those whose smoke test is below.
PERF_MODEL_SCRIPTS = {
    "against_mlperf.py",
    "mlperf_rows.py",  # against_mlperf.py's rows and mlperf_strict.py's constants (it imports them)
    "mlperf_strict.py",
    "gpu_feed_point.py",
    "gpu_feed_point.sh",
    "bench_loader.py",  # gpu_feed_point.py's loader rows and step (it imports them)
    "gpu_universes_point.sh",
    "bench_staging_read.py",  # smoke tests in test_cluster_benchmarks.py
    "from_run_study.py",
}
SMOKED = {
    "host_steal.py",
    "bench_preprocess.py",
    "bench_throughput.py",
    "bench_train_loop.py",
    "bench_lion_cub.py",
    "bench_links.py",
    "costs_at_scale.py",
    "bench_compute_calibration.py",
    "known_answer_floor.py",
    "workflow_cost.py",
    "bench_mlperf.py",
}


def run_script(
    name: str, *args: str, cwd: Path, timeout: float = 180, returncodes: tuple[int, ...] = (0,)
) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(BENCH / name), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode in returncodes, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout + done.stderr  # the tables on stdout, the stages' log lines on stderr


def test_every_benchmark_has_a_smoke_test() -> None:
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert scripts - PERF_MODEL_SCRIPTS == SMOKED, "a benchmark without a smoke test here"


def test_host_steal(tmp_path: Path) -> None:
    out = run_script("host_steal.py", "--seconds", "0.2", cwd=tmp_path)
    (row,) = [line.split() for line in out.splitlines() if line.split()[:1] == ["all"]]
    busy, stolen, share = int(row[1]), int(row[2]), float(row[3])
    # the share is of the time the cores had work: busy plus what the hypervisor took
    # (contention.probes)
    assert busy > 0 and stolen >= 0
    assert share == pytest.approx(stolen / (busy + stolen), abs=1e-3)


def test_bench_preprocess(tmp_path: Path) -> None:
    args = ["--size", "16", "--count", "4", "--sample-size", "8", "--slab-depth", "4"]
    out = run_script("bench_preprocess.py", *args, "--repeat", "1", "--workers", "1", cwd=tmp_path)
    # 4 universes of 16³ cut into 8³ crops: 8 each.
    assert "preprocess: 32 samples from 4 universes" in out
    (row,) = [line.split() for line in out.splitlines() if line.startswith("cosmocub preprocess")]
    assert float(row[2]) > 0  # seconds


def test_bench_throughput(tmp_path: Path) -> None:
    out = run_script(
        "bench_throughput.py", "--models", "default", "--steps", "1", "--batch", "1", cwd=tmp_path
    )
    (row,) = [line.split() for line in out.splitlines() if line.startswith("default ")]
    params = sum(p.numel() for p in CosmoFlow(load_config(None).model).parameters())
    assert int(row[2].replace(",", "")) == params and float(row[4]) > 0  # samples/s


def test_costs_at_scale(tmp_path: Path) -> None:
    config = REPO / "config" / "cosmoflow-mlperf.yaml"
    args = ["--config", str(config), "--ranks", "64"]
    out = run_script("costs_at_scale.py", *args, cwd=tmp_path)
    model = CosmoFlow(load_config(config).model)
    params = sum(p.numel() for p in model.parameters())
    assert f"{params:,} parameters" in out
    # A rank's Lion Cub momentum is every parameter in fp32, the MB the tables print.
    assert f"momentum {4 * params / 1e6:.2f} MB per rank" in out


def test_known_answer_floor(tmp_path: Path) -> None:
    """At 16³ on 40 test universes: the floor's row, and each fit's ratio is its MAE over the
    floor's (the floor beats the mean's 0.5 and the fits land between)."""
    out = run_script(
        "known_answer_floor.py", "--train", "60", "--test", "40", "--size", "16", cwd=tmp_path
    )
    floor = re.search(r"floor \(no fitting\)\s+-\s+([\d.]+)\s+1\.00\s+([\d.]+)", out)
    assert floor, out
    floor_mae = [float(v) for v in floor.groups()]
    assert all(0.1 < v < 0.5 for v in floor_mae), floor_mae
    rows = re.findall(
        r"^(ridge \(evaluation's\)|MLP 64-64)\s+60\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$",
        out,
        re.M,
    )
    assert len(rows) == 2, out
    for _, amplitude, amplitude_ratio, slope, slope_ratio in rows:
        assert float(amplitude_ratio) == pytest.approx(float(amplitude) / floor_mae[0], abs=0.01)
        assert float(slope_ratio) == pytest.approx(float(slope) / floor_mae[1], abs=0.01)


def test_bench_compute_calibration(tmp_path: Path) -> None:
    """On a cached (synthetic) calibration, so only the direct timings run: the predicted step
    it prints for config/test.yaml is the calibration's own."""
    import json

    from calibration_fixtures import synthetic_calibration

    from cosmocub.perfmodel.cost_model.machines import training_memory_format

    cal = synthetic_calibration((1,))
    cached = tmp_path / "calibration.json"
    cached.write_text(json.dumps(cal.as_dict()))
    args = ["--config", str(REPO / "config" / "test.yaml"), "--threads", "1", "--repeats", "1"]
    out = run_script("bench_compute_calibration.py", *args, "--out", str(cached), cwd=tmp_path)
    (row,) = [
        line for line in out.splitlines() if line.startswith("| test.yaml (batch 4) | 1 | step")
    ]
    model = load_config(REPO / "config" / "test.yaml").model
    fmt = training_memory_format((1, 1, 1))
    layers = cal.layer_seconds(model, batch=4, split=(1, 1, 1), threads=1, memory_format=fmt)
    assert float(row.split("|")[4]) == pytest.approx(1e3 * sum(layers.values()), abs=1e-3)
    assert "|error| over 4 steps" in out


# The device script's CPU smoke mode (52 s on 2 cores): what benchmarks/gpu_feed_point.sh runs on
# a lent GPU, with bench_loader's rows it imports; on request, beyond the 12-minute suite.
@pytest.mark.long
def test_gpu_feed_point_cpu_smoke(tmp_path: Path) -> None:
    out = run_script(
        "gpu_feed_point.py",
        "--device",
        "cpu",
        "--smoke",
        "--out",
        str(tmp_path / "feed"),
        cwd=REPO,
    )
    rows = {line.split("|")[1].strip(): line.split("|") for line in out.splitlines() if "|" in line}
    for variant in ("workers3_fp32", "device_fp32", "device_defaults"):
        assert float(rows[variant][2]) > 0, rows[variant]  # samples/s
    assert "skipped on a CPU" in rows["device_compile"][2]
    assert (tmp_path / "feed" / "feed_point.json").is_file()


def test_bench_train_loop(tmp_path: Path) -> None:
    args = ["--size", "8", "--base-filters", "2", "--blocks", "1", "--samples", "8"]
    out = run_script("bench_train_loop.py", *args, "--batch", "4", "--reps", "2", cwd=tmp_path)
    assert "2 steps/epoch" in out  # 8 samples, batch 4
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[2:4]}
    assert set(rows) == {"cosmocub", "bare"}
    assert all(0 < float(r[1]) <= float(r[0]) <= float(r[2]) for r in rows.values())  # min≤med≤max


def test_bench_lion_cub(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_MODEL))
    args = ["--config", str(config), "--ranks", "2", "--steps", "1", "--reps", "1"]
    out = run_script("bench_lion_cub.py", *args, "--batch", "1", "--pack-mb", "1", cwd=tmp_path)
    params = sum(p.numel() for p in CosmoFlow(load_config(config).model).parameters())
    assert f"model: CosmoFlow, {params} parameters; 2 gloo ranks" in out
    # 1-bit all-to-all against DDP's fp32 all-reduce: ~1/32 of its bytes, whatever the timing.
    got = float(re.search(r"goal: 1-bit alltoall <= 1/25 = 0.0400 measured; got (\S+)", out)[1])
    assert 1 / 40 < got <= 1 / 25


def test_bench_links(tmp_path: Path) -> None:
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu.namespaces import check_privileges

    try:
        check_privileges()
    except EmulationUnavailableError as err:
        pytest.skip(f"emulated nodes unavailable: {err}")
    out = run_script(
        "bench_links.py",
        "--rates",
        "100",
        "--sizes",
        "16000",
        "--repeats",
        "1",
        "--gap-s",
        "0.05",
        cwd=tmp_path,
    )
    (row,) = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 100 ")]
    median_ms, ideal_ms = float(row[2]), float(row[3])
    assert ideal_ms == pytest.approx(16000 * 8 / 100e6 * 1e3, abs=0.01)  # 1.28 ms
    assert 0.5 < median_ms / ideal_ms < 20


def test_workflow_cost(tmp_path: Path) -> None:
    """At 30 universes (100 a group): one universe job in each dry run, 8 jobs in all; the
    snakemake process's own CPU, read from /proc, is a part of its wall time."""
    out = run_script("workflow_cost.py", "--smoke", cwd=tmp_path)
    rows = re.findall(
        r"^dry (\w+) .*?\s+(\d+) (\w+) × (\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M
    )
    cases = {case: (int(jobs), rule, int(n)) for case, jobs, rule, n, *_ in rows}
    assert cases["public"] == (8, "link_group", 1), out
    assert cases["synthetic"] == (8, "universe_group", 1), out
    assert cases["mlperf"] == (8, "mlperf_group", 1), out  # 56 placeholder files, one group
    for *_, dry_s, cpu_s, wall_s in rows:
        assert 0 < float(cpu_s) <= float(wall_s) + 0.1 and float(dry_s) == float(wall_s)


def test_bench_mlperf(tmp_path: Path) -> None:
    """40 made files of 8³: every file checked at some rate, and every step of the workflow's
    commands timed, in one group each."""
    out = run_script("bench_mlperf.py", "--smoke", cwd=tmp_path)
    rate = re.search(r"checked (\d+) records of 8³ \(made\): ([\d.]+) records/s", out)
    assert rate and int(rate[1]) == 40 and float(rate[2]) > 0, out
    steps = re.findall(
        r"^(mlperf-group|preprocess-plan|preprocess-group|preprocess-gather)"
        r".*?\s+(\d+)\s+([\d.]+)\s+\d+$",
        out,
        re.M,
    )
    assert [(s, int(jobs)) for s, jobs, _ in steps] == [
        ("mlperf-group", 1),
        ("preprocess-plan", 1),
        ("preprocess-group", 1),
        ("preprocess-gather", 1),
    ], out
