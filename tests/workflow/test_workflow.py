"""The Snakemake workflow: dry runs for every shipped config, lint, and a tiny real run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def snakemake(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    env.pop("COSMOCUB_CONFIG", None)
    env.pop("COSMOCUB_PARENT_RUN_ID", None)
    cmd = [str(BIN / "snakemake"), "-s", str(REPO / "Snakefile"), *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def job_counts(stdout: str) -> dict[str, int]:
    """Parse the 'Job stats' table of a dry run."""
    counts, in_table = {}, False
    for line in stdout.splitlines():
        if line.startswith("job ") and "count" in line:
            in_table = True
            continue
        if in_table:
            parts = line.split()
            if len(parts) == 2 and parts[1].isdigit():
                counts[parts[0]] = int(parts[1])
            elif parts and parts[0] == "total":
                break
    return counts


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ("config.yaml", {"simulate": 48, "preprocess": 1, "train": 1, "evaluate": 1}),
        ("test.yaml", {"simulate": 6, "preprocess": 1, "train": 1, "evaluate": 1}),
    ],
)
def test_dry_run(tmp_path, config, expected):
    proc = snakemake("-n", "--configfile", str(REPO / "config" / config), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    for rule, n in expected.items():
        assert counts.get(rule) == n, (rule, counts)


def test_dry_run_mlperf_links_public_universes(tmp_path):
    import numpy as np

    from cosmocub.data.universe import write_universe

    public = tmp_path / "public"
    public.mkdir()
    for name in ["univ_ics_2019-03_a1", "univ_ics_2019-03_a2", "univ_ics_2019-03_a3"]:
        write_universe(
            public / f"{name}.hdf5",
            np.ones((8, 8, 8, 4), np.int16),
            unit_par=np.zeros(4, np.float32),
            phys_par=np.array([0.3, 0.8, 0.96, 70], np.float32),
            redshifts=np.array([0.0, 0.5, 1.5, 3.0], np.float32),
        )
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "cosmoflow-mlperf.yaml"),
        "--config",
        f"universes={{source: cosmoflow, cosmoflow_dir: {public}}}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert counts.get("link_universe") == 3 and "simulate" not in counts


def test_empty_public_folder_is_a_clear_error(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = snakemake(
        "-n",
        "--configfile",
        str(REPO / "config" / "cosmoflow-mlperf.yaml"),
        "--config",
        f"universes={{source: cosmoflow, cosmoflow_dir: {tmp_path / 'empty'}}}",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "holds no univ_*.hdf5 files" in proc.stdout + proc.stderr


def test_lint_is_clean(tmp_path):
    proc = snakemake("--lint", cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Congratulations" in proc.stdout + proc.stderr


def test_ci_runs_the_readme_test_command(tmp_path):
    readme = (REPO / "README.md").read_text()
    extracted = subprocess.run(
        [
            "awk",
            "/^Run the tests:/{found=1} found && /^```bash/{getline; print; exit}",
            "README.md",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert extracted.endswith("&& pytest")
    assert extracted in readme
    assert "constraints/cpu.txt" in extracted
    ci = (REPO / ".ci" / "run").read_text()
    assert "README.md" in ci and "Run the tests:" in ci


@pytest.mark.slow
def test_tiny_simulate_preprocess_run(tmp_path):
    config = REPO / "config" / "test.yaml"
    proc = snakemake(
        "--cores",
        "2",
        "--configfile",
        str(config),
        "--config",
        "tracking={enabled: false}",
        "results-test/shards/manifest.json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "results-test/shards/manifest.json").read_text())
    # 6 universes of 16³ cut into 8³ crops: 8 per universe, split 3/2/1... by universe.
    total = sum(manifest["counts"].values())
    assert total == 6 * 8
    with h5py.File(tmp_path / "results-test/shards/train.h5") as f:
        assert f["x"].shape[1:] == (4, 8, 8, 8)
    universes = sorted((tmp_path / "results-test/universes").glob("synth_*.hdf5"))
    assert len(universes) == 6
