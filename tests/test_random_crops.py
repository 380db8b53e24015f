"""Random periodic crops (preprocess.train_crops random): whole training universes in train.h5,
a crop at any origin (wrapped) and symmetry per sample per epoch, under a split each rank's block
of it; val, test, stats and features as the fixed crops give them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from cosmocub.config import ConfigError, PreprocessConfig, SplitRatios, load_config
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.data import crop
from cosmocub.data.augment import CUBE_SYMMETRIES, cube_symmetry
from cosmocub.data.dataset import ShardDataset, UniverseCropDataset, open_shard, read_stats
from cosmocub.data.periodic import read_periodic, wrapped_pieces
from cosmocub.data.preprocess import preprocess
from cosmocub.data.universe import read_universe, read_universe_meta, write_universe
from cosmocub.io import sha256_file
from cosmocub.parallel.halo import spatial_coords
from cosmocub.train.loaders import ResumableSampler
from cosmocub.train.main import train

SIZE, CROP, SLAB = 16, 8, 4
SETTINGS = PreprocessConfig(
    sample_size=CROP,
    log1p=True,
    standardize=True,
    dtype="float16",
    splits=SplitRatios(train=0.6, val=0.2, test=0.2),
    slab_depth=SLAB,
    dask_scheduler=None,
    num_workers=2,
)


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same five universes preprocessed with fixed and with random training crops."""
    folder = tmp_path_factory.mktemp("random_crops")
    paths = []
    for i in range(5):
        rng = np.random.default_rng(i)
        unit_par = rng.uniform(-1, 1, size=4).astype(np.float32)
        paths.append(folder / f"univ_{i}.hdf5")
        write_universe(
            paths[-1],
            rng.poisson(1.0, size=(SIZE, SIZE, SIZE, 4)).astype(np.int16),
            unit_par=unit_par,
            phys_par=phys_from_unit(unit_par),
            redshifts=np.array([0.0, 0.5, 1.5, 3.0], np.float32),
        )
    out = {}
    for mode in ("fixed", "random"):
        out[mode] = folder / mode
        preprocess(
            paths,
            out[mode],
            settings=dataclasses.replace(SETTINGS, train_crops=mode),
            seed=7,
            config_hash="abc",
            universes_per_job=2,
        )
    return out


def _dataset(folder: Path, split: str = "train", **kwargs) -> ShardDataset:
    mean, std = read_stats(folder)
    return open_shard(folder / f"{split}.h5", mean=mean, std=std, **kwargs)


def _universe_values(folder: Path, universe: int) -> np.ndarray:
    """Training universe `universe` (C, N, N, N) standardised, from its source file by hand."""
    with h5py.File(folder / "train.h5") as f:
        source = json.loads(f.attrs["source_files"])[universe]
    counts, _ = read_universe(source)
    stored = np.log1p(counts.astype(np.float32)).astype(np.float16).astype(np.float32)
    mean, std = (np.asarray(v, np.float32).reshape(-1, 1, 1, 1) for v in read_stats(folder))
    return (stored.transpose(3, 0, 1, 2) - mean) * (1.0 / std)


def _hand_cut(values: np.ndarray, origin: tuple[int, int, int], symmetry: int) -> torch.Tensor:
    """The periodic crop at `origin` cut by np.roll, then turned."""
    rolled = np.roll(values, shift=[-o for o in origin], axis=(1, 2, 3))
    crop = torch.from_numpy(np.ascontiguousarray(rolled[:, :CROP, :CROP, :CROP]))
    return cube_symmetry(crop, symmetry)


def test_wrapped_pieces_cover_the_run_once() -> None:
    assert wrapped_pieces(3, 4, 16) == [(slice(3, 7), slice(0, 4))]
    assert wrapped_pieces(13, 8, 16) == [(slice(13, 16), slice(0, 3)), (slice(0, 5), slice(3, 8))]
    assert wrapped_pieces(-2, 16, 16) == [
        (slice(14, 16), slice(0, 2)),
        (slice(0, 14), slice(2, 16)),
    ]
    with pytest.raises(ValueError, match="a periodic run of 17 does not fit a side of 16"):
        wrapped_pieces(0, 17, 16)
    universe = np.arange(2 * 5**3).reshape(1, 2, 5, 5, 5)
    got = read_periodic(universe, 0, (4, 3, 0), (slice(1, 3), slice(None), slice(0, 1)), 4)
    expected = np.roll(universe[0], (-4, -3, 0), axis=(1, 2, 3))[:, 1:3, :4, 0:1]
    np.testing.assert_array_equal(got, expected)


def test_val_test_stats_and_features_are_the_fixed_modes_bytes(shards) -> None:
    for name in ("val.h5", "test.h5", "stats.json", "features.h5"):
        assert sha256_file(shards["random"] / name) == sha256_file(shards["fixed"] / name), name
    manifest = json.loads((shards["random"] / "manifest.json").read_text())
    fixed = json.loads((shards["fixed"] / "manifest.json").read_text())
    assert manifest["train_crops"] == "random" and fixed["train_crops"] == "fixed"
    assert manifest["sample_size"] == CROP and manifest["counts"] == fixed["counts"]
    with (
        h5py.File(shards["random"] / "train.h5") as f,
        h5py.File(shards["fixed"] / "train.h5") as g,
    ):
        # 3 universes whole, in depth-slab chunks; the rows are the fixed crops' rows.
        assert f["x"].shape == (3, 4, SIZE, SIZE, SIZE)
        assert f["x"].chunks == (1, 4, SLAB, SIZE, SIZE)
        assert f.attrs["crops"] == "random" and f.attrs["universe_size"] == SIZE
        assert f.attrs["sample_size"] == CROP and "crops" not in g.attrs
        for name in ("y", "universe_index", "crop_origin"):
            np.testing.assert_array_equal(f[name][:], g[name][:])
        sources = json.loads(f.attrs["source_files"])
        for u, source in enumerate(sources):
            counts, _ = read_universe(source)
            expected = np.log1p(counts.astype(np.float32)).astype(np.float16).transpose(3, 0, 1, 2)
            np.testing.assert_array_equal(f["x"][u], expected)


def test_universes_written_one_depth_slab_per_block_are_the_same(shards, tmp_path, monkeypatch):
    """Large universes are written in blocks of a few depth slabs (the writer's slab ranges)."""
    monkeypatch.setattr(crop, "BLOCK_BYTES", 1)  # one slab_depth-thick block per task
    with h5py.File(shards["random"] / "train.h5") as f:
        sources = [Path(p) for p in json.loads(f.attrs["source_files"])]
        expected = f["x"][...]
    others = sorted(p for p in sources[0].parent.glob("univ_*.hdf5") if p not in sources)
    preprocess(
        sources + others,
        tmp_path / "slabs",
        settings=dataclasses.replace(SETTINGS, train_crops="random"),
        seed=7,
        config_hash="abc",
        universes_per_job=5,
    )
    blocks = crop.open_universe_slabs([read_universe_meta(sources[0])], slab_depth=SLAB)
    assert blocks.data.chunks[1] == (SLAB,) * (SIZE // SLAB)
    with h5py.File(tmp_path / "slabs/train.h5") as f:
        np.testing.assert_array_equal(f["x"][...], expected)


def test_a_row_without_an_origin_is_its_fixed_crop(shards) -> None:
    whole, crops = _dataset(shards["random"]), _dataset(shards["fixed"])
    assert isinstance(whole, UniverseCropDataset) and type(crops) is ShardDataset
    assert len(whole) == len(crops) == 24 and whole.random_origins == SIZE
    assert crops.random_origins is None
    for i in (0, 9, 23):
        for index in (i, (i, 5)):
            (x, y), (x_fixed, y_fixed) = whole[index], crops[index]
            assert torch.equal(x, x_fixed) and torch.equal(y, y_fixed)
    with pytest.raises(ValueError, match=r"train\.h5: holds whole universes .*UniverseCropDataset"):
        ShardDataset(shards["random"] / "train.h5", mean=None, std=None)
    with pytest.raises(ValueError, match=r"train\.h5: holds crops, not whole universes"):
        UniverseCropDataset(shards["fixed"] / "train.h5", mean=None, std=None)


# Origins inside, on the edge, and wrapping past it along one, two and three axes.
ORIGINS = [(0, 0, 0), (4, 8, 2), (13, 2, 15), (9, 12, 11), (15, 15, 15)]


@pytest.mark.parametrize("symmetry", range(len(CUBE_SYMMETRIES)))
def test_random_crop_is_the_periodic_sub_volume_whole_and_split(shards, symmetry) -> None:
    whole = _dataset(shards["random"])
    # Each rank of a [2, 1, 1] split reads its block of the cropped, turned sample.
    halves = [
        _dataset(
            shards["random"],
            block=(slice(c * CROP // 2, (c + 1) * CROP // 2),) + (slice(None),) * 2,
        )
        for c, _, _ in (spatial_coords(rank, (2, 1, 1)) for rank in range(2))
    ]
    row = 17  # a row of the last training universe
    with h5py.File(shards["random"] / "train.h5") as f:
        universe = int(f["universe_index"][row])
    assert universe == 2
    values = _universe_values(shards["random"], universe)
    for origin in ORIGINS:
        expected = _hand_cut(values, origin, symmetry)
        x, y = whole[row, symmetry, origin]
        assert x.shape == (4, CROP, CROP, CROP)
        assert torch.equal(x, expected), origin
        assert torch.equal(y, whole[row][1])
        blocks = [half[row, symmetry, origin][0] for half in halves]
        assert [b.shape[1] for b in blocks] == [CROP // 2, CROP // 2]
        assert torch.equal(torch.cat(blocks, dim=1), expected), origin


def _epoch(sampler: ResumableSampler, epoch: int, skip: int = 0) -> list[tuple]:
    sampler.set_position(epoch, skip)
    return list(sampler)


def test_sampler_draws_crops_by_seed_epoch_and_position() -> None:
    rows = list(range(24))

    def sampler(seed: int = 3, rank: int = 0, symmetries=tuple(range(48))) -> ResumableSampler:
        return ResumableSampler(
            rows,
            num_replicas=2,
            rank=rank,
            seed=seed,
            batch_size=4,
            symmetries=symmetries,
            random_origins=SIZE,
        )

    first = _epoch(sampler(), 0)
    assert len(first) == 12 and all(len(item) == 3 for item in first)
    assert all(0 <= o < SIZE for _, _, origin in first for o in origin)
    assert _epoch(sampler(), 0) == first  # same seed, same epoch: the same crops
    second = _epoch(sampler(), 1)
    assert [o for *_, o in second] != [o for *_, o in first]  # another epoch: other crops
    # Every (row, symmetry, origin) of two epochs differs from every other: no crop repeats.
    assert len({(i, s, o) for i, s, o in first + second}) == 24
    assert _epoch(sampler(), 1, skip=2) == second[8:]  # a resumed run: the same crops
    assert _epoch(sampler(seed=4), 0) != first and _epoch(sampler(rank=1), 0) != first
    # The symmetries are those the same sampler draws over fixed crops.
    plain = ResumableSampler(
        rows, num_replicas=2, rank=0, seed=3, batch_size=4, symmetries=range(48)
    )
    assert [(i, s) for i, s, _ in first] == _epoch(plain, 0)
    # Without augmentation, only the origins are drawn.
    assert {s for _, s, _ in _epoch(sampler(symmetries=None), 0)} == {0}


def test_train_crops_key_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"key 'preprocess\.train_crops': 'sometimes'"):
        dataclasses.replace(SETTINGS, train_crops="sometimes")
    assert load_config(None).preprocess.train_crops == "fixed"


def _train_cfg(**train_keys):
    return load_config(
        None,
        overrides={
            "preprocess": {"sample_size": CROP, "train_crops": "random", "slab_depth": SLAB},
            "model": {
                "input_size": CROP,
                "base_filters": 4,
                "num_conv_blocks": 2,
                "dense_sizes": [16],
                "batch_norm": False,
            },
            "train": {
                "epochs": 2,
                "local_batch_size": 4,
                "checkpoint_every_steps": 4,
                "threads_per_rank": 1,
                "num_data_workers": 0,
                **train_keys,
            },
            "tracking": {"enabled": False},
        },
    )


def test_short_training_on_random_crops(shards, tmp_path: Path, monkeypatch) -> None:
    read: list = []
    original = UniverseCropDataset.__getitem__

    def recording(self, index):
        read.append(index)
        return original(self, index)

    monkeypatch.setattr(UniverseCropDataset, "__getitem__", recording)
    run = tmp_path / "run"
    # The worker path, whose reads are recorded (the resident path cuts the same crops:
    # tests/test_resident_crops.py).
    cfg = _train_cfg(data_placement="loader")
    summary = train(cfg, shards_dir=shards["random"], run_dir=run)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    # An epoch is one crop per fixed-crop row: 24 rows / batch 4 = 6 steps, as with fixed crops.
    assert [r["step"] for r in records] == [6, 12] and summary["steps"] == 12
    assert all(np.isfinite(r["train_loss"]) and np.isfinite(r["val_loss"]) for r in records)
    # Every training sample was a drawn crop: (row, symmetry, origin), no two alike.
    assert len(read) == 48 and all(len(index) == 3 for index in read)
    assert len(set(read)) == 48


class Killed(Exception):
    pass


def test_a_resumed_run_trains_on_the_same_crops(shards, tmp_path: Path) -> None:
    """Killed in epoch 1 two steps after its checkpoint at step 8, resumed: the same weights."""
    cfg = _train_cfg(deterministic=True)

    def kill(step: int, model) -> None:
        if step == 10:
            raise Killed(step)

    train(cfg, shards_dir=shards["random"], run_dir=tmp_path / "whole")
    with pytest.raises(Killed):
        train(cfg, shards_dir=shards["random"], run_dir=tmp_path / "broken", on_step_end=kill)
    resumed = train(cfg, shards_dir=shards["random"], run_dir=tmp_path / "broken")
    assert resumed["resumed_from"].endswith("step_00000008.pt")
    whole = torch.load(tmp_path / "whole/model.pt", weights_only=True)["state_dict"]
    again = torch.load(tmp_path / "broken/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(whole[name], again[name]) for name in whole)
