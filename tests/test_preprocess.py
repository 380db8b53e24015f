"""Preprocessing (src/cosmocub/data/: splits, crop, shard_file, shard_jobs, preprocess): splits,
shard contents, stats, atomicity."""

from __future__ import annotations

import dataclasses
import json
import pickle
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from cosmocub.config import PreprocessConfig, SplitRatios
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.data import crop, dask_compute
from cosmocub.data.h5chunks import (
    ChunkFormatError,
    ChunkWriter,
    chunk_offsets,
    create_preallocated,
    offsets_by_coord,
    open_source,
)
from cosmocub.data.preprocess import preprocess
from cosmocub.data.splits import PreprocessError, assign_splits, split_counts
from cosmocub.data.universe import UniverseFormatError, read_universe
from cosmocub.io import sha256_file


def settings(**overrides) -> PreprocessConfig:
    values = dict(
        sample_size=8,
        log1p=True,
        standardize=True,
        dtype="float16",
        splits=SplitRatios(train=0.6, val=0.2, test=0.2),
        slab_depth=4,
        dask_scheduler=None,
        num_workers=2,
    )
    values.update(overrides)
    return PreprocessConfig(**values)


# --- splits --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "ratios", "expected"),
    [
        (10, (0.7, 0.15, 0.15), (7, 2, 1)),  # remainders tie 0.5/0.5: val first
        (20, (0.7, 0.15, 0.15), (14, 3, 3)),
        (4, (2, 1, 1), (2, 1, 1)),  # not normalised
        (5, (1, 1, 0), (3, 2, 0)),  # ratio 0: no such split
        (1, (1, 0, 0), (1, 0, 0)),
        (7, (0.5, 0.25, 0.25), (3, 2, 2)),  # 3.5 1.75 1.75: the .75s win
    ],
)
def test_split_counts_largest_remainder(n, ratios, expected) -> None:
    counts = split_counts(n, dict(zip(("train", "val", "test"), ratios, strict=True)))
    assert (counts["train"], counts["val"], counts["test"]) == expected


def test_split_counts_errors() -> None:
    with pytest.raises(
        PreprocessError,
        match=r"^3 universes cannot fill splits train=0.7 val=0.15 test=0.15: test would get 0$",
    ):
        split_counts(3, {"train": 0.7, "val": 0.15, "test": 0.15})
    with pytest.raises(PreprocessError, match=r"train=0 val=1 test=1: train would get 0"):
        split_counts(4, {"train": 0, "val": 1, "test": 1})
    with pytest.raises(PreprocessError, match=r"ratios must sum to > 0"):
        split_counts(4, {"train": 0, "val": 0, "test": 0})


def test_assign_splits_deterministic_disjoint_and_order_free() -> None:
    paths = [Path(f"u{i:02d}.hdf5") for i in range(12)]
    ratios = {"train": 0.5, "val": 0.25, "test": 0.25}
    a = assign_splits(paths, ratios, seed=3)
    assert a == assign_splits(list(reversed(paths)), ratios, seed=3)
    assert [len(a[s]) for s in ("train", "val", "test")] == [6, 3, 3]
    assert sorted(p for split in a.values() for p in split) == paths  # every universe exactly once
    assert all(a[s] == sorted(a[s]) for s in a)
    others = [assign_splits(paths, ratios, seed=s)["train"] for s in range(4, 9)]
    assert any(o != a["train"] for o in others)  # the seed matters


# --- the stage -----------------------------------------------------------------------------


@pytest.fixture
def universes(make_universe) -> list[Path]:
    return [make_universe(f"univ_{i}.hdf5", size=16, seed=i) for i in range(5)]


def _check_shards(out: Path, paths: list[Path], cfg: PreprocessConfig) -> dict:
    """Every invariant of docs/reference/formats.md that a reader relies on; returns the
    manifest."""
    s = cfg.sample_size
    manifest = json.loads((out / "manifest.json").read_text())
    seen: dict[str, set] = {str(p): set() for p in paths}
    split_of: dict[str, str] = {}
    train_values = []
    for split in ("train", "val", "test"):
        with h5py.File(out / f"{split}.h5") as f:
            x = f["x"]
            assert x.chunks == (1, 4, cfg.slab_depth, s, s)
            assert x.dtype == np.dtype(cfg.dtype)
            assert f.attrs["split"] == split and f.attrs["sample_size"] == s
            assert bool(f.attrs["log1p"]) == cfg.log1p and f.attrs["slab_depth"] == cfg.slab_depth
            sources = json.loads(f.attrs["source_files"])
            data = x[...]
            assert data.shape == (manifest["counts"][split], 4, s, s, s)
            uidx, origins, y = f["universe_index"][:], f["crop_origin"][:], f["y"][:]
            for i in range(len(data)):
                counts, meta = read_universe(sources[uidx[i]])
                d, h, w = origins[i]
                crop = counts[d : d + s, h : h + s, w : w + s].astype(np.float32)
                expect = (np.log1p(crop) if cfg.log1p else crop).transpose(3, 0, 1, 2)
                # Exact: the lookup table is the float32 log1p rounded once to the dtype.
                np.testing.assert_array_equal(data[i], expect.astype(cfg.dtype))
                np.testing.assert_array_equal(y[i], meta.unit_par)
                origin = (int(d), int(h), int(w))
                assert origin not in seen[sources[uidx[i]]], "sample duplicated"
                seen[sources[uidx[i]]].add(origin)
            for src in sources:
                assert split_of.setdefault(src, split) == split, "universe in two splits"
            if split == "train":
                train_values.append(data.astype(np.float64))
    per_universe = (16 // s) ** 3
    assert all(len(v) == per_universe for v in seen.values()), "sample lost"
    assert split_of == manifest["splits"]
    stats = json.loads((out / "stats.json").read_text())
    train = np.concatenate(train_values)
    np.testing.assert_allclose(stats["mean"], train.mean(axis=(0, 2, 3, 4)), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], train.std(axis=(0, 2, 3, 4)), rtol=1e-12)
    assert stats["split"] == "train"
    return manifest


def test_preprocess_writes_exact_shards(universes: list[Path], tmp_path: Path) -> None:
    cfg = settings()
    out = tmp_path / "shards"
    manifest = preprocess(
        universes, out, settings=cfg, seed=7, config_hash="abc123", universes_per_job=2
    )
    assert manifest == json.loads((out / "manifest.json").read_text())
    _check_shards(out, universes, cfg)
    assert manifest["counts"] == {"train": 3 * 8, "val": 8, "test": 8}
    assert manifest["sample_shape"] == [4, 8, 8, 8] and manifest["config_hash"] == "abc123"
    assert manifest["dtype"] == "float16" and manifest["log1p"] is True
    by_path = {src["path"]: src for src in manifest["sources"]}
    for p in universes:
        assert by_path[str(p)]["sha256"] == sha256_file(p)
        assert by_path[str(p)]["size"] == p.stat().st_size
        np.testing.assert_allclose(by_path[str(p)]["unitPar"], read_universe(p)[1].unit_par)
    assert sorted(x.name for x in out.iterdir()) == [
        "features.h5",
        "manifest.json",
        "stats.json",
        "test.h5",
        "train.h5",
        "val.h5",
    ]
    assert not list(tmp_path.glob(".shards.tmp*"))
    # Same inputs and seed: same split and bytes (modulo the creation time).
    again = preprocess(
        universes,
        tmp_path / "again",
        settings=cfg,
        seed=7,
        config_hash="abc123",
        universes_per_job=2,
    )
    assert again["splits"] == manifest["splits"]
    for split in ("train", "val", "test"):
        with (
            h5py.File(out / f"{split}.h5") as a,
            h5py.File(tmp_path / "again" / f"{split}.h5") as b,
        ):
            np.testing.assert_array_equal(a["x"][...], b["x"][...])


def test_float32_without_log1p_and_one_sample_per_universe(universes, tmp_path) -> None:
    cfg = settings(sample_size=16, slab_depth=8, dtype="float32", log1p=False)
    manifest = preprocess(
        universes, tmp_path / "s", settings=cfg, seed=0, config_hash="h", universes_per_job=2
    )
    _check_shards(tmp_path / "s", universes, cfg)
    assert manifest["counts"] == {"train": 3, "val": 1, "test": 1}


@pytest.mark.parametrize("standardize", [True, False])
def test_standardize_switch_reaches_the_datasets(universes, tmp_path, standardize) -> None:
    """preprocess.standardize is recorded with the shards; open_split obeys it (MLPerf: off)."""
    from cosmocub.config import load_config
    from cosmocub.data.dataset import open_split

    cfg = settings(standardize=standardize)
    manifest = preprocess(
        universes, tmp_path / "s", settings=cfg, seed=0, config_hash="h", universes_per_job=2
    )
    stats = json.loads((tmp_path / "s" / "stats.json").read_text())
    assert stats["standardize"] is standardize and manifest["standardize"] is standardize
    model = dataclasses.replace(load_config(None).model, input_size=8, num_conv_blocks=2)
    ds = open_split(tmp_path / "s", "train", model)
    xs = np.stack([ds[i][0].numpy() for i in range(len(ds))])  # (N, C, S, S, S)
    channel_mean = xs.mean(axis=(0, 2, 3, 4))
    if standardize:
        np.testing.assert_allclose(channel_mean, 0.0, atol=2e-3)
    else:  # log1p of Poisson(1) counts as stored: mean E[log(1 + k)] ≈ 0.56 per channel
        np.testing.assert_allclose(channel_mean, stats["mean"], rtol=1e-3)
        assert channel_mean.min() > 0.5
        with h5py.File(tmp_path / "s" / "train.h5") as f:
            np.testing.assert_array_equal(xs[0], f["x"][0].astype(np.float32))


def test_same_file_names_in_different_folders(tmp_path: Path, make_universe) -> None:
    paths = []
    for i in range(5):
        (tmp_path / f"run{i}").mkdir()
        paths.append(make_universe(f"run{i}/univ.hdf5", size=16, seed=20 + i))
    cfg = settings()
    preprocess(paths, tmp_path / "s", settings=cfg, seed=2, config_hash="h", universes_per_job=2)
    _check_shards(tmp_path / "s", paths, cfg)


def test_zero_ratio_writes_an_empty_valid_split(universes, tmp_path) -> None:
    cfg = settings(splits=SplitRatios(train=3, val=2, test=0))
    manifest = preprocess(
        universes, tmp_path / "s", settings=cfg, seed=1, config_hash="h", universes_per_job=2
    )
    assert manifest["counts"] == {"train": 24, "val": 16, "test": 0}
    with h5py.File(tmp_path / "s" / "test.h5") as f:
        assert f["x"].shape == (0, 4, 8, 8, 8) and f["x"].chunks == (1, 4, 4, 8, 8)
        assert f["y"].shape == (0, 4) and json.loads(f.attrs["source_files"]) == []
    _check_shards(tmp_path / "s", universes, cfg)


def test_other_input_layouts_read_the_same(tmp_path: Path, make_universe) -> None:
    # Edge chunks: 48 = 32 + 16, so the raw chunk reader meets partial chunks; plus a
    # contiguous universe (memory-mapped) and a gzip one (h5py fallback).
    base = make_universe("chunked.hdf5", size=48, seed=11)
    counts, meta = read_universe(base)
    for name, kwargs in (("contiguous.hdf5", {}), ("gzip.hdf5", {"compression": "gzip"})):
        with h5py.File(tmp_path / name, "w") as f:
            f.create_dataset("full", data=counts, **kwargs)
            f["unitPar"], f["physPar"] = meta.unit_par, phys_from_unit(meta.unit_par)
            f["namePar"] = np.array([n.encode() for n in meta.name_par])
            f["redshifts"] = meta.redshifts
    kinds = {
        p.name: type(open_source(p)).__name__
        for p in (base, tmp_path / "contiguous.hdf5", tmp_path / "gzip.hdf5")
    }
    assert kinds == {
        "chunked.hdf5": "RawChunkSource",
        "contiguous.hdf5": "ContiguousSource",
        "gzip.hdf5": "H5Source",
    }
    for name in kinds:
        # Sources pickle (for Dask cluster workers) and read the same after the round trip.
        source = pickle.loads(pickle.dumps(open_source(tmp_path / name)))
        key = (slice(16, 32), slice(0, 48), slice(5, 48), slice(0, 4))
        np.testing.assert_array_equal(source[key], counts[16:32, :, 5:48])


def test_raw_reader_fills_unwritten_chunks(tmp_path: Path) -> None:
    path = tmp_path / "partial.hdf5"
    data = np.arange(32 * 32 * 32 * 4, dtype=np.int16).reshape(32, 32, 32, 4)
    with h5py.File(path, "w") as f:
        full = f.create_dataset("full", shape=data.shape, dtype="<i2", chunks=(16, 16, 16, 4))
        full[:16] = data[:16]  # the chunks of d >= 16 are never allocated: they read as 0
    source = open_source(path)
    assert type(source).__name__ == "RawChunkSource"
    got = source[(slice(8, 24), slice(0, 32), slice(3, 20), slice(0, 4))]
    expect = data[8:24, :, 3:20].copy()
    expect[8:] = 0
    np.testing.assert_array_equal(got, expect)


def test_chunk_writer_after_pickling_writes_the_right_chunks(tmp_path: Path) -> None:
    path = tmp_path / "shard.h5"
    with h5py.File(path, "w") as f:
        create_preallocated(f, "x", shape=(6, 2, 4, 4, 4), dtype="float16", chunks=(1, 2, 2, 4, 4))
        f["after"] = np.arange(10)  # metadata allocated after the chunks must survive
    writer = pickle.loads(pickle.dumps(ChunkWriter(path, chunk_bytes=2 * 2 * 4 * 4 * 2)))
    chunk_offsets.cache_clear()  # as in a fresh cluster worker: rebuild the table from the file
    rng = np.random.default_rng(0)
    expect = rng.normal(size=(6, 2, 4, 4, 4)).astype(np.float16)
    # Blocks arrive chunk-ordered: (n, slab_index, C, slab, S, S).
    ordered = expect.reshape(6, 2, 2, 2, 4, 4).transpose(0, 2, 1, 3, 4, 5)
    writer[slice(2, 6), slice(None)] = ordered[2:6]
    writer[slice(0, 2), slice(None)] = ordered[0:2]
    with h5py.File(path) as f:
        np.testing.assert_array_equal(f["x"][...], expect)
        np.testing.assert_array_equal(f["after"][...], np.arange(10))


def test_the_chunk_table_without_a_chunk_iterator_is_the_iterators(tmp_path: Path) -> None:
    """HDF5 before 1.12.3 has no chunk iterator: the lookups by coordinate must give the same
    offset for every (sample, slab), not merely the same set of offsets."""
    path = tmp_path / "shard.h5"
    with h5py.File(path, "w") as f:
        create_preallocated(f, "x", shape=(5, 2, 8, 4, 4), dtype="float16", chunks=(1, 2, 2, 4, 4))
    with h5py.File(path) as f:
        x = f["x"]
        by_iter, by_coord = {}, {}
        x.id.chunk_iter(lambda i: by_iter.__setitem__(i.chunk_offset, i.byte_offset))
        offsets_by_coord(x, lambda i: by_coord.__setitem__(i.chunk_offset, i.byte_offset))
    assert len(by_iter) == 5 * 4
    assert by_coord == by_iter
    assert len(set(by_coord.values())) == 20  # distinct chunks, not one offset twenty times


@pytest.mark.parametrize(
    ("layout", "reason"),
    [
        ({"compression": "gzip"}, "it has filters"),
        ({"shuffle": True}, "it has filters"),
        ({"fletcher32": True}, "it has filters"),
        ({"dtype": ">f2"}, "its type >f2 is not a little-endian number"),
        ({"chunks": None}, "it is contiguous, not chunked"),
        ({"chunks": (2, 2, 2, 4, 4)}, r"chunks \(2, 2, 2, 4, 4\) are not \(1, C, slab, S, S\)"),
        ({"dtype": "<f4"}, "a chunk holds 256 bytes, not 128"),
    ],
)
def test_chunk_writer_refuses_layouts_it_would_corrupt(tmp_path: Path, layout, reason) -> None:
    path = tmp_path / "shard.h5"
    options = {"dtype": "<f2", "chunks": (1, 2, 2, 4, 4), **layout}
    with h5py.File(path, "w") as f:
        if options["chunks"] is None:
            f.create_dataset("x", shape=(6, 2, 4, 4, 4), dtype=options["dtype"])
        else:
            f.create_dataset("x", shape=(6, 2, 4, 4, 4), **options)
    with pytest.raises(
        ChunkFormatError,
        match=rf"shard.h5: cannot write 'x' by chunk offsets: "
        rf".*{reason}",
    ):
        ChunkWriter(path, chunk_bytes=2 * 2 * 4 * 4 * 2)


def test_chunk_writer_refuses_a_block_of_another_type(tmp_path: Path) -> None:
    path = tmp_path / "shard.h5"
    with h5py.File(path, "w") as f:
        create_preallocated(f, "x", shape=(2, 2, 4, 4, 4), dtype="float16", chunks=(1, 2, 2, 4, 4))
    writer = ChunkWriter(path, chunk_bytes=2 * 2 * 4 * 4 * 2)
    block = np.zeros((2, 2, 2, 2, 4, 4), dtype=">f2")
    with pytest.raises(ChunkFormatError, match=r"block of >f2 \(step 1\) for 'x' of <f2"):
        writer[slice(0, 2), slice(None)] = block


@pytest.mark.parametrize("train_crops", ["fixed", "random"])
def test_a_corrupt_write_is_caught_and_leaves_no_shards(
    universes, tmp_path, monkeypatch, train_crops
) -> None:
    """The read-back check: a writer bug (here swapped bytes) fails the run before the rename;
    also where train.h5 holds whole universes (the check reads its crops out of them)."""
    original = ChunkWriter.__setitem__

    def corrupting(self, key, block):
        # train.h5's writes only: each group checks its own rows, split by split, and the
        # first it meets may be any split's.
        original(self, key, block.byteswap() if self.path.endswith("train.h5") else block)

    monkeypatch.setattr(ChunkWriter, "__setitem__", corrupting)
    with pytest.raises(
        PreprocessError,
        match=r"train\.h5: sample \d+ read back through HDF5 differs from .*"
        r"univ_\d\.hdf5 at origin \(0, 0, 0\): the shard writer wrote a corrupt",
    ):
        preprocess(
            universes,
            tmp_path / "s",
            settings=settings(train_crops=train_crops),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    assert not (tmp_path / "s").exists()


def test_input_errors(universes: list[Path], tmp_path: Path, make_universe) -> None:
    out = tmp_path / "out"
    with pytest.raises(PreprocessError, match=r"no universe files given"):
        preprocess([], out, settings=settings(), seed=0, config_hash="h", universes_per_job=2)
    with pytest.raises(UniverseFormatError, match=r"missing.hdf5: no such universe file"):
        preprocess(
            [*universes, tmp_path / "missing.hdf5"],
            out,
            settings=settings(),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    bad = tmp_path / "bad.hdf5"
    with h5py.File(bad, "w") as f:
        f["full"] = np.zeros((16, 16, 16, 4), np.float32)
    with pytest.raises(UniverseFormatError, match=r"bad.hdf5: missing dataset 'unitPar'"):
        preprocess(
            [*universes, bad],
            out,
            settings=settings(),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    small = make_universe("small.hdf5", size=8)
    with pytest.raises(
        PreprocessError, match=r"small.hdf5: universe size 8 differs from 16 of .*univ_0.hdf5"
    ):
        preprocess(
            [*universes, small],
            out,
            settings=settings(),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    with pytest.raises(
        PreprocessError, match=r"univ_0.hdf5: preprocess.sample_size 12 does not divide .* 16"
    ):
        preprocess(
            universes,
            out,
            settings=settings(sample_size=12, slab_depth=4),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    with pytest.raises(PreprocessError, match=r"univ_1.hdf5: given twice"):
        preprocess(
            [*universes, universes[1]],
            out,
            settings=settings(),
            seed=0,
            config_hash="h",
            universes_per_job=2,
        )
    with pytest.raises(PreprocessError, match=r"2 universes cannot fill splits"):
        preprocess(
            universes[:2], out, settings=settings(), seed=0, config_hash="h", universes_per_job=2
        )
    assert not out.exists()


def test_failed_run_keeps_the_old_folder(universes, tmp_path, monkeypatch) -> None:
    out = tmp_path / "shards"
    first = preprocess(
        universes, out, settings=settings(), seed=0, config_hash="old", universes_per_job=2
    )

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(crop, "_to_values", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        preprocess(
            universes, out, settings=settings(), seed=1, config_hash="new", universes_per_job=2
        )
    assert json.loads((out / "manifest.json").read_text()) == first
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    with pytest.raises(RuntimeError):
        preprocess(
            universes,
            tmp_path / "fresh",
            settings=settings(),
            seed=1,
            config_hash="n",
            universes_per_job=2,
        )
    assert not (tmp_path / "fresh").exists()


def test_progress_lines_when_not_a_tty(universes, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setattr(dask_compute, "PROGRESS_EVERY_S", 0.0)
    preprocess(
        universes, tmp_path / "s", settings=settings(), seed=0, config_hash="h", universes_per_job=2
    )
    err = capsys.readouterr().err
    assert "% of" in err and "tasks" in err
    assert "preprocess: 40 samples from 5 universes" in err


class _PicklingClient:
    """Stands in for dask.distributed.Client: ships the graph through cloudpickle (as a real
    cluster does) and computes it from a fresh per-process cache, in this process."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None

    def compute(self, collections: list) -> list:
        import cloudpickle

        shipped = cloudpickle.loads(cloudpickle.dumps(collections))
        chunk_offsets.cache_clear()
        return [_Done(c.compute(scheduler="sync")) for c in shipped]

    def gather(self, futures: list) -> list:
        return [f.result() for f in futures]


@dataclasses.dataclass
class _Done:
    value: object

    def result(self) -> object:
        return self.value


def test_cluster_path_with_a_pickling_client(universes, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(dask_compute, "_distributed_client", lambda address: _PicklingClient())
    cfg = settings(dask_scheduler="tcp://scheduler:8786")
    # 5 universes in groups of 2: the last group's graph has a single store.
    preprocess(
        universes, tmp_path / "s", settings=cfg, seed=4, config_hash="h", universes_per_job=2
    )
    _check_shards(tmp_path / "s", universes, cfg)


def test_cluster_address_without_distributed(universes, tmp_path, monkeypatch) -> None:
    # The tests install distributed; a None entry makes importing it fail as if it were absent.
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.setitem(sys.modules, "dask.distributed", None)
    cfg = dataclasses.replace(settings(), dask_scheduler="tcp://127.0.0.1:8786")
    with pytest.raises(
        PreprocessError, match=r"'tcp://127.0.0.1:8786' but dask.distributed is not"
    ):
        preprocess(
            universes, tmp_path / "s", settings=cfg, seed=0, config_hash="h", universes_per_job=2
        )
    assert not (tmp_path / "s").exists()
