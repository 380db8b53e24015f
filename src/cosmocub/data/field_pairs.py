"""(input field, target field) pairs from the shards, whose channels are the four redshifts.

The same shards, reads and augmentation as CosmoFlow (`ShardDataset`: standardised log1p values,
only this rank's block under a spatial split, one cube symmetry applied to all channels alike),
then the channels are split into the U-Net's input and its target.
"""

from __future__ import annotations

import os

import torch
from torch.utils.data import Dataset

from cosmocub.config import Config
from cosmocub.cosmology.parameters import NUM_CHANNELS
from cosmocub.data.dataset import (
    ShardDataset,
    open_shard,
    read_stats,
    shard_path,
    stats_say_standardize,
)


class FieldPairs(Dataset):
    """Sample i (or (i, symmetry), or (i, symmetry, crop origin) of whole universes) →
    (x (C_in, d, h, w), y (1, d, h, w)) float32."""

    def __init__(self, shard: ShardDataset, *, inputs: list[int], target: int) -> None:
        if shard.channels != NUM_CHANNELS:
            raise ValueError(
                f"{shard.path}: {shard.channels} channels, expected the {NUM_CHANNELS} redshifts"
            )
        self.shard, self.path = shard, shard.path
        self.inputs, self.target = inputs, target
        self.random_origins = shard.random_origins  # random crops of whole universes, or None

    def __len__(self) -> int:
        return len(self.shard)

    def __getitem__(self, index: int | tuple) -> tuple[torch.Tensor, torch.Tensor]:
        x_cdhw, _unit_par = self.shard[index]  # index: i, (i, symmetry) or (i, symmetry, origin)
        return x_cdhw[self.inputs], x_cdhw[self.target : self.target + 1]


def open_field_split(
    shards_dir: str | os.PathLike,
    split: str,
    cfg: Config,
    *,
    block: tuple[slice, slice, slice] | None = None,
) -> FieldPairs:
    """The `split` shard as field pairs of `cfg.task`, standardised as `open_split` does."""
    mean, std = read_stats(shards_dir)
    standardize = stats_say_standardize(shards_dir)
    shard = open_shard(
        shard_path(shards_dir, split),
        mean=mean if standardize else None,
        std=std if standardize else None,
        block=block,
        sample_size=cfg.model.input_size,
    )
    inputs, target = cfg.task.channel_indices()
    return FieldPairs(shard, inputs=inputs, target=target)
