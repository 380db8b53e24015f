"""`run_simulate`, `cosmocub simulate` and `cosmocub simulate-group`: universe files that the
data package reads back, the same whether made one by one or several to a job."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from cosmocub.config import ConfigError, SimulateConfig, load_config
from cosmocub.data import naming, simulate_jobs, universe, universe_groups
from cosmocub.data.simulate import SNAPSHOT_REDSHIFTS, run_simulate, simulate_universe
from cosmocub.io import atomic_path, sha256_file
from cosmocub.launch.resources import simulate_runtime

REPO = Path(__file__).resolve().parents[1]
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


def _group_config(tmp_path, **cluster):
    """config/test.yaml (16³ universes) with 5 universes, 2 to a simulate job."""
    values = yaml.safe_load((REPO / "config" / "test.yaml").read_text())
    values.update(
        results=str(tmp_path / "results"),
        seed=2,
        tracking={"enabled": False},
        universes={"count": 5, "size": 16},
        simulate={"pm_steps": 4, "initial_redshift": 5.0, "force_mesh_factor": 1},
        cluster={"simulate": {"universes_per_job": 2, **cluster}},
    )
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(values))
    return config


def test_groups_cover_the_seeds_in_order_and_ask_for_time_by_size(tmp_path):
    cfg = load_config(_group_config(tmp_path, minutes_per_universe=0.3))
    groups = naming.group_seeds(cfg)
    assert groups == [[2000000, 2000001], [2000002, 2000003], [2000004]]
    assert len(groups) == 3
    assert simulate_runtime(cfg) == 1  # 2 × 0.3 min, rounded up
    with pytest.raises(ConfigError, match=r"group 3 does not exist.*make 3 groups"):
        naming.seeds_of_group(cfg, 3)


def test_cli_simulate_group_makes_the_universes_simulate_makes(tmp_path, capsys):
    from cosmocub.cli import main

    config = _group_config(tmp_path)
    out = tmp_path / "universes"
    # Two processes: each universe is its seed's alone, whichever process made it.
    argv = ["simulate-group", "--group", "1", "--out", str(out), "--threads", "2"]
    assert main([*argv, "--config", str(config)]) == 0
    assert sorted(p.name for p in out.glob("*.hdf5")) == [
        "synth_2000002.hdf5",
        "synth_2000003.hdf5",
    ]
    # The group's manifest: what preprocessing reads of it, a checksum of each file.
    listed = json.loads((out / "groups" / "seed2-1.json").read_text())["universes"]
    assert [(u["seed"], Path(u["path"]).name) for u in listed] == [
        (2000002, "synth_2000002.hdf5"),
        (2000003, "synth_2000003.hdf5"),
    ]
    assert [u["sha256"] for u in listed] == [
        sha256_file(out / f"synth_{seed}.hdf5") for seed in (2000002, 2000003)
    ]
    assert all(u["size"] == 16 and u["bytes"] > 16**3 * 4 * 2 for u in listed)
    settings = load_config(config).simulate
    for seed in (2000002, 2000003):
        alone = tmp_path / f"alone_{seed}.hdf5"
        assert (
            main(
                [
                    "simulate",
                    str(alone),
                    "--size",
                    "16",
                    "--seed",
                    str(seed),
                    "--config",
                    str(config),
                ]
            )
            == 0
        )
        grouped, meta = universe.read_universe(out / f"synth_{seed}.hdf5")
        np.testing.assert_array_equal(grouped, universe.read_universe(alone)[0])
        expected = simulate_universe(size=16, seed=seed, settings=settings)
        np.testing.assert_array_equal(grouped, expected.counts_dhwc)
        assert meta.attrs["cosmocub_seed"] == seed
    # A group the config does not have: one line naming the numbers, exit 2, nothing written
    assert (
        main(
            [
                "simulate-group",
                "--group",
                "7",
                "--out",
                str(tmp_path / "g7"),
                "--config",
                str(config),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "group 7 does not exist" in err and "make 3 groups" in err and err.count("\n") == 1
    assert not (tmp_path / "g7").exists()


def test_a_failing_universe_fails_its_group_and_leaves_no_partial_file(tmp_path, monkeypatch):
    real = simulate_jobs.run_simulate

    def second_fails(out, *, size, seed, settings):
        if seed == 2000001:
            with atomic_path(out) as tmp:  # half-way through writing it
                tmp.write_bytes(b"partial")
                raise RuntimeError(f"seed {seed} failed")
        return real(out, size=size, seed=seed, settings=settings)

    monkeypatch.setattr(simulate_jobs, "run_simulate", second_fails)
    cfg = load_config(_group_config(tmp_path))
    out = tmp_path / "universes"
    with pytest.raises(RuntimeError, match="seed 2000001 failed"):
        universe_groups.make_group(cfg, 0, out)
    # The first universe whole; no partial file, and no manifest: the group runs again.
    assert [p.name for p in out.iterdir()] == ["synth_2000000.hdf5"]
    assert universe.read_universe(out / "synth_2000000.hdf5")[0].shape == (16, 16, 16, 4)
