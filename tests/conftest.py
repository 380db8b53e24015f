"""Shared pytest fixtures: small random universes written with the package's own writer, and the
one 4-gloo-rank spawn that tests in two modules read (tests/four_gloo_ranks.py)."""

from __future__ import annotations

import atexit
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from four_gloo_ranks import run_four_gloo_ranks

from cosmocub.config import ModelConfig, load_config
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.data.universe import write_universe

REDSHIFTS = np.array([0.0, 0.5, 1.5, 3.0], dtype=np.float32)
REAL_SAMPLES = Path(__file__).resolve().parents[2] / "shared/data/cosmoflow-real-samples"

# Snakemake imports every installed executor plugin at start, and the Slurm plugin's settings ask
# `scontrol show config` for MinJobAge: with Slurm installed but no controller running (here,
# outside tests/cluster/test_slurm.py, which starts one), scontrol waits ~9 s before it fails,
# in every Snakemake the tests start. Tests that run Snakemake without Slurm put an `scontrol`
# first on PATH that fails at once, as the real one does after its wait (exit 1).
_NO_SLURM_BIN = Path(tempfile.mkdtemp(prefix="cosmocub-no-slurm-"))
atexit.register(shutil.rmtree, _NO_SLURM_BIN, ignore_errors=True)
_FAKE_SCONTROL = _NO_SLURM_BIN / "scontrol"
_FAKE_SCONTROL.write_text(
    "#!/bin/sh\necho 'scontrol: no Slurm controller in this test' >&2\nexit 1\n"
)
_FAKE_SCONTROL.chmod(_FAKE_SCONTROL.stat().st_mode | stat.S_IXUSR)


def snakemake_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a Snakemake that runs no Slurm job: this venv's tools first on PATH,
    then the failing `scontrol` (see above)."""
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join([bin_dir, str(_NO_SLURM_BIN), env.get("PATH", "")])
    return env


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """tests/workflow/ first. pytest-xdist's `--dist loadscope` hands out whole modules in
    collection order, and tests/workflow/ collects last while holding the longest modules (each
    runs Snakemake jobs): started last, one worker ran them alone while the other had finished."""
    items.sort(key=lambda item: item.path.parent.name != "workflow")  # stable: order kept within


@pytest.fixture
def make_universe(tmp_path: Path) -> Callable[..., Path]:
    """Factory: `make_universe(name, size=16, seed=0)` writes Poisson(1) counts, gives its path."""

    def make(name: str = "univ.hdf5", *, size: int = 16, seed: int = 0) -> Path:
        rng = np.random.default_rng(seed)
        counts = rng.poisson(1.0, size=(size, size, size, 4)).astype(np.int16)
        unit_par = rng.uniform(-1, 1, size=4).astype(np.float32)
        path = tmp_path / name
        write_universe(
            path,
            counts,
            unit_par=unit_par,
            phys_par=phys_from_unit(unit_par),
            redshifts=REDSHIFTS,
            attrs={"cosmocub_seed": seed},
        )
        return path

    return make


@pytest.fixture
def real_samples() -> list[Path]:
    files = sorted(REAL_SAMPLES.glob("*.tfrecord"))
    if not files:
        pytest.skip(f"real CosmoFlow samples not found under {REAL_SAMPLES}")
    return files


@pytest.fixture
def mlperf_model_cfg() -> ModelConfig:
    """The MLPerf HPC reference model, as config/cosmoflow-mlperf.yaml builds it."""
    return load_config(Path(__file__).resolve().parents[1] / "config/cosmoflow-mlperf.yaml").model


@pytest.fixture(scope="session")
def four_gloo_ranks(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess:
    """The one torchrun of 4 gloo ranks that runs every program of tests/four_gloo_ranks.py."""
    return run_four_gloo_ranks(tmp_path_factory.mktemp("four_gloo_ranks"))
