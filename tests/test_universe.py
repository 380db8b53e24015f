"""Round trip and validation of the cosmoUniverse HDF5 layout (src/cosmocub/data/universe.py)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from cosmocub.cosmology.parameters import NAME_PAR, phys_from_unit
from cosmocub.data.universe import (
    UniverseFormatError,
    read_universe,
    read_universe_meta,
    write_universe,
)

REDSHIFTS = np.array([0.0, 0.5, 1.5, 3.0], dtype=np.float32)


def test_round_trip_keeps_counts_params_and_attrs(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    counts = rng.poisson(1.0, size=(8, 8, 8, 4)).astype(np.int16)
    counts[0, 0, 0, 3] = 3000
    unit = np.array([0.5, -0.25, 0.0, -1.0], dtype=np.float32)
    path = tmp_path / "u.hdf5"
    write_universe(
        path,
        counts,
        unit_par=unit,
        phys_par=phys_from_unit(unit),
        redshifts=REDSHIFTS,
        attrs={"cosmocub_seed": 7, "generator": "test"},
    )
    back, meta = read_universe(path)
    assert back.dtype == np.int16 and back.shape == (8, 8, 8, 4)
    np.testing.assert_array_equal(back, counts)
    assert meta.size == 8 and meta.num_channels == 4 and meta.shape == (8, 8, 8, 4)
    np.testing.assert_allclose(meta.phys_par, [0.315, 0.78, 0.96, 63.0], rtol=1e-6)
    np.testing.assert_array_equal(meta.unit_par, unit)
    np.testing.assert_array_equal(meta.redshifts, REDSHIFTS)
    assert meta.name_par == NAME_PAR
    assert meta.attrs == {"cosmocub_seed": 7, "generator": "test"}
    assert meta.nbytes == 8**3 * 4 * 2
    with h5py.File(path) as f:
        assert f["namePar"].dtype.kind == "S"
        assert f["full"].chunks == (8, 8, 8, 4)
    assert not list(tmp_path.glob(".*tmp*"))


def test_large_universe_is_chunked_in_32_cubes(tmp_path: Path) -> None:
    counts = np.zeros((64, 64, 64, 4), dtype=np.int16)
    unit = np.zeros(4, dtype=np.float32)
    path = tmp_path / "u.hdf5"
    write_universe(path, counts, unit_par=unit, phys_par=phys_from_unit(unit), redshifts=REDSHIFTS)
    with h5py.File(path) as f:
        assert f["full"].chunks == (32, 32, 32, 4)


def test_write_rejects_counts_that_overflow_int16(tmp_path: Path) -> None:
    counts = np.zeros((4, 4, 4, 4), dtype=np.int32)
    counts[1, 1, 1, 1] = 40000
    unit = np.zeros(4, dtype=np.float32)
    with pytest.raises(UniverseFormatError, match=r"\[0, 40000\] does not fit int16"):
        write_universe(
            tmp_path / "u.hdf5", counts, unit_par=unit, phys_par=unit, redshifts=REDSHIFTS
        )
    assert not (tmp_path / "u.hdf5").exists()


def _write_raw(path: Path, **overrides) -> Path:
    datasets = {
        "full": np.ones((4, 4, 4, 4), dtype=np.int16),
        "unitPar": np.array([0.1, 0.2, 0.3, 0.4], dtype=np.float32),
        "physPar": np.array([0.3, 0.8, 0.96, 70.0], dtype=np.float32),
        "namePar": np.array([n.encode() for n in NAME_PAR]),
        "redshifts": REDSHIFTS,
    }
    datasets.update(overrides)
    with h5py.File(path, "w") as f:
        for name, data in datasets.items():
            if data is not None:
                f[name] = data
    return path


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"full": None}, r"missing dataset 'full'"),
        ({"unitPar": None}, r"missing dataset 'unitPar'"),
        ({"full": np.ones((4, 4, 4, 4), dtype=np.float32)}, r"dtype float32, expected int16"),
        ({"full": np.ones((4, 4, 4), dtype=np.int16)}, r"rank 3 \(shape \(4, 4, 4\)\)"),
        ({"full": np.ones((4, 4, 8, 4), dtype=np.int16)}, r"shape \(4, 4, 8, 4\) is not a cube"),
        ({"full": np.ones((4, 4, 4, 3), dtype=np.int16)}, r"has 3 channels"),
        ({"unitPar": np.array([0.1, np.nan, 0.3, 0.4])}, r"'unitPar' \[0.1, nan.* not finite"),
        ({"unitPar": np.array([0.1, 1.5, 0.3, 0.4])}, r"'unitPar' \[0.1, 1.5.* outside \[-1, 1\]"),
        ({"unitPar": np.array([0.1, 0.2, 0.3])}, r"'unitPar' has shape \(3,\), expected \(4,\)"),
        ({"physPar": np.ones(5)}, r"'physPar' has shape \(5,\), expected \(4,\)"),
        ({"redshifts": np.ones(2)}, r"'redshifts' has shape \(2,\), expected \(4,\)"),
        ({"namePar": np.array([b"Omega_m", b"sigma_8"])}, r"'namePar' has 2 names"),
    ],
)
def test_invalid_layout_is_one_line_naming_file(tmp_path: Path, overrides, message) -> None:
    path = _write_raw(tmp_path / "bad.hdf5", **overrides)
    for reader in (read_universe_meta, read_universe):
        with pytest.raises(UniverseFormatError, match=message) as info:
            reader(path)
        assert str(info.value).startswith(str(path)) and "\n" not in str(info.value)


def test_group_instead_of_dataset(tmp_path: Path) -> None:
    path = _write_raw(tmp_path / "bad.hdf5", redshifts=None)
    with h5py.File(path, "a") as f:
        f.create_group("redshifts")
    with pytest.raises(UniverseFormatError, match=r"'redshifts' is a Group, not a dataset"):
        read_universe_meta(path)


def test_not_hdf5_truncated_corrupt_and_missing(tmp_path: Path) -> None:
    text = tmp_path / "text.hdf5"
    text.write_text("these are not the universes you are looking for\n")
    with pytest.raises(UniverseFormatError, match=r"text.hdf5: not a readable HDF5 file"):
        read_universe_meta(text)

    good = _write_raw(tmp_path / "good.hdf5")
    blob = good.read_bytes()
    truncated = tmp_path / "truncated.hdf5"
    truncated.write_bytes(blob[: len(blob) // 2])
    with pytest.raises(UniverseFormatError, match=r"truncated.hdf5: .*truncated file"):
        read_universe(truncated)

    # Overwrite the superblock after the 8-byte signature: the file still says "HDF5".
    corrupt = tmp_path / "corrupt.hdf5"
    corrupt.write_bytes(blob[:8] + b"\xff" * 64 + blob[72:])
    with pytest.raises(UniverseFormatError, match=r"corrupt.hdf5: not a readable HDF5 file"):
        read_universe_meta(corrupt)

    with pytest.raises(UniverseFormatError, match=r"nothere.hdf5: no such universe file"):
        read_universe_meta(tmp_path / "nothere.hdf5")


def test_fixture_universe_is_valid(make_universe) -> None:
    meta = read_universe_meta(make_universe(size=8, seed=3))
    assert meta.size == 8 and meta.attrs["cosmocub_seed"] == 3
    assert np.all(np.abs(meta.unit_par) <= 1)


def test_channel_histogram_over_many_pieces_is_exact() -> None:
    """More voxels than one histogram piece, counts up to int16's extremes (negative included)."""
    from cosmocub.data import universe as u

    rng = np.random.default_rng(5)
    voxels = 2 * u._HISTOGRAM_ROWS + 123
    counts = np.minimum(rng.lognormal(0, 2, size=(voxels, 3)), 32767).astype(np.int16)
    counts[7, 1], counts[-1, 2] = -32768, 32767
    hist = u.channel_histogram(counts.reshape(-1, 1, 1, 3))
    for c in range(3):
        values, n = np.unique(counts[:, c], return_counts=True)
        expected = np.zeros(2**16, np.int64)
        expected[values.view(np.uint16)] = n
        np.testing.assert_array_equal(hist[c], expected)


def test_value_lookup_over_many_pieces_is_log1p() -> None:
    from cosmocub.data import crop as pre

    rng = np.random.default_rng(6)
    block = rng.integers(0, 3000, size=(3 * pre._LOOKUP_VALUES // 4 + 5, 4), dtype=np.int16)
    expected = np.log1p(block.astype(np.float32)).astype(np.float16)
    np.testing.assert_array_equal(pre._to_values(block, True, "float16"), expected)
