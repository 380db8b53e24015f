"""ShardDataset: standardisation, depth slabs, size checks, missing files, worker safety."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from shard_fixtures import make_random_shards
from torch.utils.data import DataLoader

from cosmocub.config import ModelConfig, load_config
from cosmocub.data.dataset import ShardDataset, open_split, read_stats, shard_path


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    return make_random_shards(
        tmp_path / "shards", counts={"train": 6, "val": 3}, size=8, slab_depth=4
    )


def test_sample_is_standardised_float32(shards: Path) -> None:
    mean, std = read_stats(shards)
    ds = ShardDataset(shards / "train.h5", mean=mean, std=std)
    assert len(ds) == 6
    x, y = ds[2]
    assert x.dtype == torch.float32 and x.shape == (4, 8, 8, 8)
    assert y.dtype == torch.float32 and y.shape == (4,)
    with h5py.File(shards / "train.h5") as f:
        raw = f["x"][2].astype(np.float32)
        y_raw = f["y"][2]
    expected = (raw - np.array(mean, np.float32)[:, None, None, None]) / np.array(std, np.float32)[
        :, None, None, None
    ]
    np.testing.assert_allclose(x.numpy(), expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y.numpy(), y_raw)
    # Over all training samples the standardised channels have mean ≈ 0 and std ≈ 1 (the stats
    # were computed from the float32 values; the shard stores float16, hence the tolerance).
    xs = torch.stack([ds[i][0] for i in range(len(ds))])
    assert xs.mean(dim=(0, 2, 3, 4)).abs().max().item() < 2e-3
    assert (xs.std(dim=(0, 2, 3, 4)) - 1).abs().max().item() < 2e-3


def test_without_stats_returns_stored_values(shards: Path) -> None:
    ds = ShardDataset(shards / "val.h5", mean=None, std=None)
    with h5py.File(shards / "val.h5") as f:
        np.testing.assert_array_equal(ds[1][0].numpy(), f["x"][1].astype(np.float32))


def test_depth_slab_reads_only_that_slab(shards: Path) -> None:
    mean, std = read_stats(shards)
    full = ShardDataset(shards / "train.h5", mean=mean, std=std)
    slab = ShardDataset(shards / "train.h5", mean=mean, std=std, depth_slab=(4, 8))
    x_slab, y_slab = slab[3]
    assert x_slab.shape == (4, 4, 8, 8)
    torch.testing.assert_close(x_slab, full[3][0][:, 4:8], rtol=0, atol=0)
    torch.testing.assert_close(y_slab, full[3][1], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"train\.h5: depth_slab \(6, 10\) outside \[0, 8\]"):
        ShardDataset(shards / "train.h5", mean=None, std=None, depth_slab=(6, 10))


def test_shard_model_size_mismatch_names_file_and_sizes(shards: Path) -> None:
    model = load_config(None).model  # input_size 32
    with pytest.raises(
        ValueError,
        match=r"train\.h5: dataset 'x' holds 8³ samples but "
        r"model\.input_size is 32",
    ):
        open_split(shards, "train", model)


def test_channel_mismatch(shards: Path) -> None:
    with pytest.raises(ValueError, match=r"has 4 channels but model\.in_channels is 1"):
        ShardDataset(shards / "train.h5", mean=None, std=None, in_channels=1)
    with pytest.raises(ValueError, match=r"stats have 2 means and 2 stds for 4 channels"):
        ShardDataset(shards / "train.h5", mean=[0, 0], std=[1, 1])


def test_missing_shard_and_stats(tmp_path: Path, shards: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"test\.h5: shard not found"):
        shard_path(shards, "test")
    with pytest.raises(ValueError, match="split 'dev': must be one of train, val, test"):
        shard_path(shards, "dev")
    with pytest.raises(FileNotFoundError, match=r"stats\.json: shard statistics not found"):
        read_stats(tmp_path)
    (tmp_path / "stats.json").write_text(json.dumps({"mean": [0.0], "std": [0.0]}))
    with pytest.raises(ValueError, match=r"stats\.json: 'std' must be > 0, got \[0\.0\]"):
        read_stats(tmp_path)


def test_not_a_shard(tmp_path: Path) -> None:
    with h5py.File(tmp_path / "odd.h5", "w") as f:
        f["x"] = np.zeros((2, 4, 8, 8, 8), np.float32)
    with pytest.raises(ValueError, match=r"odd\.h5: dataset 'y' missing"):
        ShardDataset(tmp_path / "odd.h5", mean=None, std=None)


def test_pickles_without_handle_and_works_in_a_worker(shards: Path) -> None:
    mean, std = read_stats(shards)
    ds = ShardDataset(shards / "train.h5", mean=mean, std=std)
    first = ds[0][0]  # opens the file in this process
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._file is None
    torch.testing.assert_close(clone[0][0], first, rtol=0, atol=0)
    loader = DataLoader(ds, batch_size=3, num_workers=1)
    xs = torch.cat([x for x, _ in loader])
    assert xs.shape == (6, 4, 8, 8, 8)
    torch.testing.assert_close(xs[0], first, rtol=0, atol=0)


@pytest.mark.realdata
def test_real_mlperf_sample_through_shard_and_reference_model(
    tmp_path: Path, real_samples: list[Path], mlperf_model_cfg: ModelConfig
) -> None:
    from cosmocub.data.tfrecord import read_tfrecord_sample
    from cosmocub.models.cosmoflow import CosmoFlow

    counts_dhwc, y = read_tfrecord_sample(real_samples[0])
    x_cdhw = np.log1p(counts_dhwc.astype(np.float32)).transpose(3, 0, 1, 2)  # channels first
    path = tmp_path / "train.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("x", data=x_cdhw[None].astype(np.float16), chunks=(1, 4, 16, 128, 128))
        f.create_dataset("y", data=y[None])
    mean = x_cdhw.mean(axis=(1, 2, 3)).tolist()
    std = x_cdhw.std(axis=(1, 2, 3)).tolist()
    cfg = mlperf_model_cfg
    ds = ShardDataset(path, mean=mean, std=std, sample_size=cfg.input_size, in_channels=4)
    x, target = ds[0]
    assert x.shape == (4, 128, 128, 128)
    # Standardised with its own statistics: mean 0, std 1 per channel (float16 storage aside).
    assert x.mean(dim=(1, 2, 3)).abs().max().item() < 1e-2
    assert (x.std(dim=(1, 2, 3)) - 1).abs().max().item() < 1e-2
    np.testing.assert_array_equal(target.numpy(), y)
    torch.manual_seed(0)
    with torch.no_grad():
        out = CosmoFlow(cfg).eval()(x[None])
    assert out.shape == (1, 4) and torch.isfinite(out).all()
