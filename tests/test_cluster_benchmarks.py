"""Smoke tests of the cluster model's two measurement scripts (tests/test_benchmarks.py keeps
them apart as the performance model's): the staging area's read and the one-run-to-a-study
check, each at tiny sizes with a number of its table checked."""

from __future__ import annotations

import re
from pathlib import Path

from calibration_fixtures import TEST_CONFIG, synthetic_calibration
from test_benchmarks import run_script

from cosmocub.io import write_json


def test_bench_staging_read(tmp_path: Path) -> None:
    args = ["--files", "2", "--reps", "6", "--disk", str(tmp_path)]
    out = run_script("bench_staging_read.py", *args, cwd=tmp_path)
    found = re.findall(r"^(tmpfs|page cache)\s+mmap: ([\d.]+) ms", out, re.M)
    ms = {store: float(value) for store, value in found}
    assert set(ms) == {"tmpfs", "page cache"} and all(v > 0 for v in ms.values())
    (ratio,) = re.findall(r"tmpfs / page cache: ([\d.]+)x", out)
    # the ratio of the two medians (printed to 0.01 ms: within rounding)
    assert abs(float(ratio) - ms["tmpfs"] / ms["page cache"]) < 0.05 * float(ratio)


def test_from_run_study_calibrates_on_one_point_and_predicts_the_others(tmp_path: Path) -> None:
    cal = tmp_path / "calibration.json"
    write_json(cal, synthetic_calibration(threads=(1,)).as_dict())
    args = ["--config", str(TEST_CONFIG), "--batches", "2", "4", "--calibrate-on", "2"]
    args += ["--rounds", "2", "--epochs", "2", "--steps", "2"]
    args += ["--calibration", str(cal), "--keep", str(tmp_path)]
    # Exit 1 only where every held-out point was contended (the suite's other ranks beside it).
    out = run_script("from_run_study.py", *args, cwd=tmp_path, timeout=300, returncodes=(0, 1))
    rows = {
        int(m[0]): (float(m[1]), float(m[2]), float(m[3]), [float(r) for r in m[4].split()])
        for m in re.findall(
            r"^\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+[+-].*  ([\d. ]+)$", out, re.M
        )
    }
    assert set(rows) == {2, 4}
    measured, _, calibrated, rounds = rows[2]
    assert calibrated == measured  # the calibrated point round-trips
    # each point is one of its rounds' runs (the fastest uncontended one)
    assert len(rounds) == 2 and measured in rounds
    assert rows[4][0] in rows[4][3]
    assert "held out (1 points)" in out or "no held-out point left (all contended)" in out
