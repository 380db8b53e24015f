"""`run_simulate` and `cosmocub simulate`: a universe file that the data package reads back."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from cosmocub.config import SimulateConfig
from cosmocub.data import universe
from cosmocub.data.simulate import SNAPSHOT_REDSHIFTS, run_simulate, simulate_universe

SETTINGS = SimulateConfig(pm_steps=4, initial_redshift=5.0, lpt_order=2, force_mesh_factor=1)


def test_run_simulate_writes_a_readable_universe(tmp_path):
    out = tmp_path / "universes" / "univ_3.hdf5"
    run_simulate(out, size=16, seed=3, settings=SETTINGS)
    counts, meta = universe.read_universe(out)
    expected = simulate_universe(size=16, seed=3, settings=SETTINGS)
    np.testing.assert_array_equal(counts, expected.counts_dhwc)
    assert counts.dtype == np.int16 and counts.shape == (16, 16, 16, 4)
    np.testing.assert_array_equal(counts.reshape(-1, 4).sum(axis=0), [16**3] * 4)
    np.testing.assert_array_equal(meta.unit_par, expected.unit_par)
    np.testing.assert_array_equal(meta.phys_par, expected.phys_par)
    np.testing.assert_array_equal(meta.redshifts, np.float32(SNAPSHOT_REDSHIFTS))
    assert meta.name_par == ("Omega_m", "sigma_8", "N_spec", "H_0")
    assert meta.attrs["cosmocub_seed"] == 3
    assert meta.attrs["pm_steps"] == 4 and meta.attrs["force_mesh_factor"] == 1
    assert meta.attrs["box_size_mpc_h"] == pytest.approx(16 * float(meta.phys_par[3]) / 70.0)
    assert [p.name for p in out.parent.iterdir()] == ["univ_3.hdf5"]  # no temporary left over


def test_cli_simulate(tmp_path, capsys):
    from cosmocub.cli import main

    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "results": str(tmp_path / "results"),
                "tracking": {"enabled": False},
                "simulate": {"pm_steps": 4, "initial_redshift": 5.0, "force_mesh_factor": 1},
            }
        )
    )
    out = tmp_path / "u.hdf5"
    assert main(["simulate", str(out), "--size", "16", "--seed", "4", "--config", str(config)]) == 0
    counts, meta = universe.read_universe(out)
    assert counts.shape == (16, 16, 16, 4) and meta.attrs["cosmocub_seed"] == 4
    # a setting the simulation cannot honour: one line naming the key and the numbers, exit 2
    config.write_text(yaml.safe_dump({"tracking": {"enabled": False}, "simulate": {"pm_steps": 2}}))
    bad = tmp_path / "bad.hdf5"
    assert main(["simulate", str(bad), "--size", "16", "--seed", "4", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"{config}: key 'simulate.pm_steps': 2" in err and err.count("\n") == 1
    assert not bad.exists()
