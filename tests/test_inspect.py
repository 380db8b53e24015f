"""`inspect_path` / `format_report` (src/cosmocub/data/inspect.py) on universes and real samples."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmocub.cli import main
from cosmocub.data import inspect as inspect_mod
from cosmocub.data.inspect import format_report, inspect_path
from cosmocub.data.universe import read_universe


def test_universe_stats_in_slabs_equal_numpy(make_universe, monkeypatch) -> None:
    path = make_universe(size=16, seed=4)
    counts, meta = read_universe(path)
    # Force 3-voxel slabs (16 is not a multiple: the last slab is short) to test the chunking.
    monkeypatch.setattr(inspect_mod, "_SLAB_BYTES", 3 * 16 * 16 * 4 * 2)
    report = inspect_path(path)
    assert report["format"] == "cosmoUniverse-hdf5"
    assert report["shape"] == [16, 16, 16, 4] and report["dtype"] == "int16"
    np.testing.assert_allclose(report["unitPar"], meta.unit_par, rtol=1e-6)
    np.testing.assert_allclose(report["physPar"], meta.phys_par, rtol=1e-6)
    for c, row in enumerate(report["channels"]):
        channel = counts[..., c]
        assert row["redshift"] == [0.0, 0.5, 1.5, 3.0][c]
        assert row["mean"] == pytest.approx(channel.mean(), rel=1e-12)
        assert row["std"] == pytest.approx(channel.std(), rel=1e-12)
        assert row["max"] == channel.max()
        assert row["empty_fraction"] == pytest.approx((channel == 0).mean(), rel=1e-12)
    assert report["attrs"] == {"cosmocub_seed": 4}
    json.dumps(report)  # JSON-ready


@pytest.mark.realdata
def test_real_tfrecord(real_samples: list[Path]) -> None:
    report = inspect_path(real_samples[0])
    assert report["format"] == "mlperf-tfrecord" and report["shape"] == [128, 128, 128, 4]
    assert report["records"] == 1  # every record read and CRC-checked
    assert report["unitPar"][0] == pytest.approx(-0.5267246, abs=1e-6)
    # physPar derived: Omega_m = 0.3 * (1 + 0.1 * u)
    assert report["physPar"][0] == pytest.approx(0.3 * (1 - 0.05267246), rel=1e-6)
    assert report["physPar"][3] == pytest.approx(70 * (1 - 0.02802058), rel=1e-6)
    z0 = report["channels"][0]
    assert z0["max"] == 1019 and z0["mean"] == pytest.approx(0.958, abs=1e-3)
    # Structure grows with time: z = 0 is clumpier (more empty voxels) than z = 3.
    empties = [row["empty_fraction"] for row in report["channels"]]
    assert empties == sorted(empties, reverse=True)


def test_format_report_table(make_universe) -> None:
    text = format_report(inspect_path(make_universe(size=8, seed=1)))
    assert "cosmoUniverse-hdf5" in text and "(8, 8, 8, 4) int16" in text
    assert "Omega_m" in text and "cosmocub_seed: 1" in text
    assert len([ln for ln in text.splitlines() if ln[:1].isdigit()]) == 4  # one row per channel


def test_unknown_file_and_cli(tmp_path: Path, make_universe, capsys) -> None:
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"hello world")
    with pytest.raises(ValueError, match=r"junk.bin: neither a cosmoUniverse HDF5 file"):
        inspect_path(junk)
    assert main(["inspect", str(junk)]) == 2
    assert "junk.bin: neither" in capsys.readouterr().err
    path = make_universe(size=8)
    assert main(["inspect", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["shape"] == [8, 8, 8, 4]
