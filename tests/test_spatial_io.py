"""Spatial I/O: a rank reads only its block of each sample, and augmentation under a split gives
it the block of the same transformed sample that an unsplit rank would see."""

from __future__ import annotations

import io
import itertools
import math
from pathlib import Path

import h5py
import pytest
import torch
from shard_fixtures import make_random_shards

from cosmocub.config import ConfigError, load_config
from cosmocub.data.augment import (
    CUBE_SYMMETRIES,
    cube_symmetry,
    draw_symmetries,
    source_region,
    symmetries_for_split,
)
from cosmocub.data.dataset import ShardDataset, read_stats
from cosmocub.train.loaders import ResumableSampler

SIZE, CHANNELS, SLAB = 16, 4, 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_random_shards(
        tmp_path_factory.mktemp("shards"),
        counts={"train": 3},
        size=SIZE,
        channels=CHANNELS,
        slab_depth=SLAB,
    )


def blocks(split: tuple[int, int, int], size: int) -> list[tuple[slice, slice, slice]]:
    """Every rank's block, row-major over (sd, sh, sw)."""
    out = []
    for coords in itertools.product(*(range(n) for n in split)):
        out.append(
            tuple(
                slice(c * size // n, (c + 1) * size // n)
                for c, n in zip(coords, split, strict=True)
            )
        )
    return out


class CountingFile(io.FileIO):
    """A file that counts the bytes HDF5 reads through it."""

    bytes_read = 0

    def readinto(self, buffer) -> int:  # type: ignore[override]
        n = super().readinto(buffer)
        self.bytes_read += n or 0
        return n

    def read(self, size: int = -1) -> bytes:
        data = super().read(size)
        self.bytes_read += len(data)
        return data


class CountingShardDataset(ShardDataset):
    def _open(self) -> h5py.File:
        if self._file is None:
            self.raw = CountingFile(self.path, "r")
            self._file = h5py.File(self.raw, "r")
        return self._file


def bytes_for_one_sample(path: Path, index: int | tuple[int, int], **kwargs) -> int:
    ds = CountingShardDataset(path, mean=None, std=None, **kwargs)
    ds._open()["y"][0]  # open and read the small datasets' metadata first
    before = ds.raw.bytes_read
    ds[index]
    ds.close()
    return ds.raw.bytes_read - before


def test_a_rank_reads_only_its_block(shards: Path) -> None:
    path = shards / "train.h5"
    sample_bytes = CHANNELS * SIZE**3 * 2  # float16
    # Beyond the sample's data, HDF5 reads the same few KiB of chunk index for any selection.
    overhead = bytes_for_one_sample(path, 1) - sample_bytes
    assert 0 <= overhead < 8192
    for split in [(2, 1, 1), (4, 1, 1), (2, 2, 1)]:
        for block in blocks(split, SIZE):
            share = sample_bytes // split[0]  # chunks are whole (H, W) slabs of depth 4
            got = bytes_for_one_sample(path, 1, block=block)
            assert got == share + overhead, (split, block, got)
    # A depth flip is served by the mirrored slab: still one share.
    flip_d = CUBE_SYMMETRIES.index(((0, 1, 2), (True, False, False)))
    got = bytes_for_one_sample(path, (1, flip_d), block=blocks((2, 1, 1), SIZE)[0])
    assert got == sample_bytes // 2 + overhead
    # Why a depth split drops the D↔H swap: its source region is an H slab, which spans every
    # depth chunk, so the rank would read the whole sample.
    swap = CUBE_SYMMETRIES.index(((1, 0, 2), (False, False, False)))
    got = bytes_for_one_sample(path, (1, swap), block=blocks((2, 1, 1), SIZE)[0])
    assert got >= sample_bytes


@pytest.mark.parametrize("split", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (1, 2, 2), (2, 2, 2)])
def test_each_block_is_the_block_of_the_transformed_sample(
    shards: Path, split: tuple[int, int, int]
) -> None:
    mean, std = read_stats(shards)
    whole = ShardDataset(shards / "train.h5", mean=mean, std=std)
    parts = [
        ShardDataset(shards / "train.h5", mean=mean, std=std, block=b) for b in blocks(split, SIZE)
    ]
    for symmetry in range(len(CUBE_SYMMETRIES)):  # exact for every one; a split keeps some
        x_full, y_full = whole[(2, symmetry)]
        torch.testing.assert_close(x_full, cube_symmetry(whole[2][0], symmetry), rtol=0, atol=0)
        for part, block in zip(parts, blocks(split, SIZE), strict=True):
            x_part, y_part = part[(2, symmetry)]
            torch.testing.assert_close(x_part, x_full[(slice(None), *block)], rtol=0, atol=0)
            assert torch.equal(y_part, y_full)


def test_which_symmetries_a_split_keeps() -> None:
    assert symmetries_for_split((1, 1, 1)) == tuple(range(48))
    assert symmetries_for_split((4, 4, 4)) == tuple(range(48))
    kept = symmetries_for_split((2, 1, 1))
    # All 8 flips of the identity order and of the H↔W swap: D stays D.
    assert len(kept) == 16
    assert {CUBE_SYMMETRIES[i][0] for i in kept} == {(0, 1, 2), (0, 2, 1)}
    assert {CUBE_SYMMETRIES[i][0] for i in symmetries_for_split((2, 2, 1))} == {
        (0, 1, 2),
        (1, 0, 2),
    }
    assert len(symmetries_for_split((4, 2, 1))) == 8  # flips only
    # Every kept symmetry's source region of a block is another rank's block.
    for split in [(2, 1, 1), (2, 2, 1), (2, 2, 2), (4, 2, 1)]:
        all_blocks = blocks(split, SIZE)
        for i in symmetries_for_split(split):
            for block in all_blocks:
                assert source_region(i, block, SIZE) in all_blocks


def test_sampler_draws_the_same_symmetries_as_before_at_no_split() -> None:
    """At no split, the sampler draws exactly what the batch-wise augmentation drew (a resumed
    or S = 1 run keeps its random stream), and the same indices for every spatial partner."""
    data = list(range(12))
    sampler = ResumableSampler(
        data, num_replicas=2, rank=1, seed=5, batch_size=3, symmetries=tuple(range(48))
    )
    sampler.set_position(epoch=1, skip_batches=1)
    plain = ResumableSampler(data, num_replicas=2, rank=1, seed=5, batch_size=3)
    plain.set_position(epoch=1, skip_batches=1)
    pairs = list(sampler)
    assert [i for i, _ in pairs] == list(plain) and len(pairs) == 3
    step = 1 * 2 + 1  # epoch 1 of 2 batches, batch 1
    seed = (5 * 1_000_003 + 1) * 1_000_003 + step
    expected = torch.randint(48, (3,), generator=torch.Generator().manual_seed(seed)).tolist()
    assert [s for _, s in pairs] == expected
    kept = symmetries_for_split((2, 1, 1))
    split_sampler = ResumableSampler(
        data, num_replicas=2, rank=1, seed=5, batch_size=3, symmetries=kept
    )
    split_sampler.set_position(epoch=1, skip_batches=1)
    drawn = [s for _, s in split_sampler]
    assert set(drawn) <= set(kept)
    assert drawn == draw_symmetries(3, torch.Generator().manual_seed(seed), kept)


def test_parallel_config_errors_name_the_numbers() -> None:
    # 3 blocks on 32³: 4 ranks along depth leave blocks of 2 planes before the last pooling (4
    # blocks would leave 1, and are refused).
    three_blocks = {"model": {"num_conv_blocks": 3}}
    cfg = load_config(None, overrides={"parallel": {"spatial": 4}, **three_blocks})
    assert cfg.parallel.split_dhw == (4, 1, 1)
    cfg = load_config(None, overrides={"parallel": {"spatial": 4, "split": [2, 2, 1]}})
    assert cfg.parallel.split_dhw == (2, 2, 1) and math.prod(cfg.parallel.split_dhw) == 4
    with pytest.raises(
        ConfigError, match=r"key 'parallel.split': \[2, 2, 2\] multiplies to 8, not parallel"
    ):
        load_config(None, overrides={"parallel": {"spatial": 4, "split": [2, 2, 2]}})
    match = (
        r"^<defaults>: key 'parallel.spatial': model.name cosmoflow cannot run on this split: "
        r"conv_blocks.block0.conv: depth extent 32 does not divide into 3 blocks \(split "
        r"\[3, 1, 1\], input 32\)$"
    )
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides={"parallel": {"spatial": 3}})
    # Every block is checked at load, not only the input: 32 → 16 → 8 → 4 in 8 along depth
    # leaves 1 plane before block 2's pooling.
    with pytest.raises(ConfigError, match=r"key 'parallel.split': .*block2.pool: odd local depth"):
        load_config(None, overrides={"parallel": {"spatial": 8, "split": [8, 1, 1]}})


def test_world_size_not_divisible_by_spatial() -> None:
    from cosmocub.parallel.parallel_dims import build_parallel_dims

    env = {"RANK": "0", "WORLD_SIZE": "3", "LOCAL_RANK": "0", "MASTER_PORT": "1"}
    with pytest.raises(
        ValueError, match=r"'parallel.spatial': 2 does not divide the world size 3 \(torchrun\)"
    ):
        build_parallel_dims(backend="gloo", spatial=2, environ=env)
