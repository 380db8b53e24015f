"""Data loading for training: a resumable distributed sampler and the train/val loaders.

The sampler is DistributedSampler (seeded, epoch-set) over the "data" mesh axis plus a batch offset,
so a run resumed in the middle of an epoch skips exactly the batches it had consumed. Ranks of one
spatial group get the same indices and the same augmentation (symmetry and, for whole universes,
crop origin), and each reads its own block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler, Subset

from cosmocub.data.augment import draw_crop_origins, draw_symmetries
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.train.resident_loader import ResidentLoader, build_resident_loader


class ResumableSampler(Sampler[int]):
    """This data rank's indices for one epoch, in batches of `batch_size`, from batch `skip` on."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        num_replicas: int,
        rank: int,
        seed: int,
        batch_size: int,
        symmetries: Sequence[int] | None = None,
        random_origins: int | None = None,
        max_batches: int | None = None,
    ) -> None:
        # drop_last: every rank sees the same number of samples, so DDP steps stay in lockstep.
        self.inner = DistributedSampler(
            dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=True
        )
        self.batch_size = batch_size
        # A cap on batches per epoch (train.max_steps_per_epoch): short epochs, frequent
        # validation; each epoch's batches are a fresh shuffle's first ones.
        self.max_batches = max_batches
        self.epoch, self.skip_batches = 0, 0
        # Augmentation: yield (index, symmetry) drawn from these symmetry indices (None: plain),
        # and, for whole universes (random_origins: their side), (index, symmetry, crop origin).
        self.symmetries, self.seed, self.rank = symmetries, seed, rank
        self.random_origins = random_origins

    @property
    def batches_per_epoch(self) -> int:
        full = len(self.inner) // self.batch_size
        return full if self.max_batches is None else min(full, self.max_batches)

    def set_position(self, epoch: int, skip_batches: int = 0) -> None:
        self.epoch, self.skip_batches = epoch, skip_batches
        self.inner.set_epoch(epoch)

    def __iter__(self) -> Iterator[int | tuple]:
        indices = list(self.inner)[: self.batches_per_epoch * self.batch_size]
        if self.symmetries is None and self.random_origins is None:
            return iter(indices[self.skip_batches * self.batch_size :])
        return self._augmented(indices)

    def _augmented(self, indices: list[int]) -> Iterator[tuple]:
        # Every draw comes from the step's own generator, so batch b of epoch e gets the same
        # symmetries and crops whether the run got there uninterrupted or resumed at batch b.
        for batch in range(self.skip_batches, self.batches_per_epoch):
            step = self.epoch * self.batches_per_epoch + batch
            generator = augment_generator(self.seed, self.rank, step)
            batch_indices = indices[batch * self.batch_size : (batch + 1) * self.batch_size]
            chosen = (
                [0] * self.batch_size
                if self.symmetries is None
                else draw_symmetries(self.batch_size, generator, self.symmetries)
            )
            if self.random_origins is None:
                yield from zip(batch_indices, chosen, strict=True)
                continue
            # After the symmetries: they stay the ones the same run draws on fixed crops.
            origins = draw_crop_origins(self.batch_size, generator, self.random_origins)
            yield from zip(batch_indices, chosen, origins, strict=True)

    def __len__(self) -> int:
        return max(0, self.batches_per_epoch - self.skip_batches) * self.batch_size


def build_train_loader(
    dataset: Dataset,
    dims: ParallelDims,
    *,
    batch_size: int,
    seed: int,
    num_workers: int,
    symmetries: Sequence[int] | None = None,
    random_origins: int | None = None,
    max_batches: int | None = None,
    placement: str = "loader",
    memory_format: torch.memory_format = torch.contiguous_format,
) -> DataLoader | ResidentLoader:
    """The training batches: read by DataLoader workers (placement "loader"), or cut from the
    shard held on the device or in pinned memory ("device", "pinned": resident_loader.py); both
    from the same sampler's draws, so the same batches."""
    sampler = ResumableSampler(
        dataset,
        num_replicas=dims.data,
        rank=dims.axis_rank("data"),
        seed=seed,
        batch_size=batch_size,
        symmetries=symmetries,
        random_origins=random_origins,
        max_batches=max_batches,
    )
    if placement != "loader":
        return build_resident_loader(
            dataset,
            sampler,
            placement=placement,
            batch_size=batch_size,
            device=dims.device,
            memory_format=memory_format,
        )
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        num_workers=num_workers,
        pin_memory=dims.device.type == "cuda",
        persistent_workers=num_workers > 0,
        # Its own generator: iterating must not draw from the global torch RNG, or a resumed
        # run's dropout masks would differ from an uninterrupted run's.
        generator=torch.Generator().manual_seed(seed),
    )


def build_eval_loader(
    dataset: Dataset, dims: ParallelDims, *, batch_size: int, num_workers: int
) -> DataLoader:
    """Each data rank takes every data-size-th sample, none repeated (sums are reduced later)."""
    data_rank = dims.axis_rank("data")
    subset = Subset(dataset, range(data_rank, len(dataset), dims.data))
    return DataLoader(
        subset,
        batch_size=batch_size,
        shuffle=False,
        num_workers=num_workers,
        pin_memory=dims.device.type == "cuda",
        persistent_workers=num_workers > 0,  # validation runs every epoch: keep its workers
        # Without a generator of its own every new iterator draws a worker seed from the global
        # torch RNG, so dropout masks would depend on how often the iterator is remade: every
        # epoch without workers, once with persistent workers, again after a resume.
        generator=torch.Generator().manual_seed(0),
    )


def augment_generator(seed: int, data_rank: int, step: int) -> torch.Generator:
    # Seeded by (seed, data rank, step): the same symmetries after a resume, different ones per
    # data rank, and the same for all ranks that share a sample (a spatial group).
    return torch.Generator().manual_seed((seed * 1_000_003 + data_rank) * 1_000_003 + step)
