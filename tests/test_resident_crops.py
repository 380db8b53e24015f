"""Crops cut where the step runs (data/resident_crops.py, train/resident_loader.py): the same
values, bit for bit, as the worker path's reads for the same draws; whole and split, random and
fixed crops; no host read or copy per batch once the shard is resident; resume skips exactly."""

from __future__ import annotations

import itertools
import threading

import pytest
import torch
from test_random_crops import CROP, ORIGINS, SIZE, _dataset, shards  # noqa: F401  (fixture)
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import DataLoader

from cosmocub.data.augment import CUBE_SYMMETRIES, symmetries_for_split
from cosmocub.data.dataset import FirstUniverses, ShardDataset
from cosmocub.data.resident_crops import gather_crops, load_resident, resident_bytes
from cosmocub.train import resident_loader
from cosmocub.train.loaders import ResumableSampler
from cosmocub.train.resident_loader import ResidentLoader, _one_ahead

CPU = torch.device("cpu")
HALF = CROP // 2
SPLITS = {  # this rank's block of every turned crop under a [2, 1, 1] and a [2, 2, 2] split
    "whole": None,
    "depth half": (slice(HALF, CROP), slice(None), slice(None)),
    "octant": (slice(0, HALF), slice(HALF, CROP), slice(HALF, CROP)),
}


def _reads(dataset, draws: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    """The worker path: one dataset read per draw, stacked."""
    items = [dataset[d] for d in draws]
    return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])


def _same(got: tuple[torch.Tensor, ...], expected: tuple[torch.Tensor, ...]) -> bool:
    return all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def _gather(
    dataset, draws: list[tuple], *, standardized: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    resident = load_resident(dataset, CPU, standardized=standardized)
    rows = torch.tensor([d[0] for d in draws])
    symmetries = torch.tensor([d[1] for d in draws])
    origins = torch.tensor([d[2] for d in draws]) if len(draws[0]) == 3 else None
    return gather_crops(resident, rows, symmetries, origins)


@pytest.mark.parametrize("standardized", [False, True])
@pytest.mark.parametrize("split", SPLITS)
def test_random_crops_gathered_equal_the_datasets_reads(shards, split, standardized) -> None:  # noqa: F811
    dataset = _dataset(shards["random"], block=SPLITS[split])
    # Every symmetry at every origin (inside, on the edge, wrapping along 1, 2 and 3 axes), over
    # rows of all three training universes.
    draws = [
        (row, symmetry, origin)
        for (row, origin), symmetry in itertools.product(
            zip((0, 9, 17, 23, 5), ORIGINS, strict=True), range(len(CUBE_SYMMETRIES))
        )
    ]
    # Held as stored (a GPU: standardised per batch) or standardised at load (a CPU).
    x, y = _gather(dataset, draws, standardized=standardized)
    expected_x, expected_y = _reads(dataset, draws)
    assert x.dtype == torch.float32 and x.shape == expected_x.shape
    assert torch.equal(x, expected_x) and torch.equal(y, expected_y)
    # No origin drawn: each row's fixed crop, as the dataset reads (row, symmetry).
    fixed = [(row, symmetry) for row in (3, 20) for symmetry in (0, 7, 41)]
    assert _same(_gather(dataset, fixed, standardized=standardized), _reads(dataset, fixed))


@pytest.mark.parametrize("split", ["whole", "octant"])
def test_fixed_crops_and_first_universes_gathered_equal_the_reads(shards, split) -> None:  # noqa: F811
    crops = _dataset(shards["fixed"], block=SPLITS[split])
    assert type(crops) is ShardDataset
    draws = [(row, symmetry) for row in range(0, 24, 5) for symmetry in range(0, 48, 5)]
    assert _same(_gather(crops, draws), _reads(crops, draws))
    # The first 2 universes of either layout: indices of the subset, rows of the shard.
    for mode in ("fixed", "random"):
        first = FirstUniverses(_dataset(shards[mode], block=SPLITS[split]), 2)
        draws = [(k, (7 * k) % 48, ORIGINS[k % 5]) for k in range(len(first))]
        if mode == "fixed":
            draws = [d[:2] for d in draws]
        got, expected = _gather(first, draws), _reads(first, draws)
        assert _same(got, expected), mode
        assert load_resident(first, CPU).values_undhwc.shape[0] == (
            len(first) if mode == "fixed" else 2
        )
    assert resident_bytes(_dataset(shards["random"])) == 3 * 4 * SIZE**3 * 2  # fp16 universes
    assert resident_bytes(_dataset(shards["random"]), standardized=True) == 3 * 4 * SIZE**3 * 4


def _sampler(dataset, **kwargs) -> ResumableSampler:
    return ResumableSampler(
        dataset, num_replicas=2, rank=1, seed=11, batch_size=3, max_batches=3, **kwargs
    )


def _epochs(loader, sampler: ResumableSampler, positions: list[tuple[int, int]]) -> list:
    batches = []
    for epoch, skip in positions:
        sampler.set_position(epoch, skip)
        batches.extend(loader)
    return batches


@pytest.mark.parametrize(
    ("mode", "split"), [("random", "whole"), ("random", "depth half"), ("fixed", "whole")]
)
def test_resident_loader_gives_the_worker_loaders_batches_and_resumes(shards, mode, split):  # noqa: F811
    dataset = _dataset(shards[mode], block=SPLITS[split])
    split_dhw = (2, 1, 1) if split == "depth half" else (1, 1, 1)
    options = {
        "symmetries": symmetries_for_split(split_dhw),
        "random_origins": dataset.random_origins,
    }
    worker_sampler, resident_sampler = _sampler(dataset, **options), _sampler(dataset, **options)
    workers = DataLoader(dataset, batch_size=3, sampler=worker_sampler, drop_last=True)
    resident = ResidentLoader(
        load_resident(dataset, CPU, standardized=True),
        resident_sampler,
        batch_size=3,
        device=CPU,
        memory_format=torch.channels_last_3d,
    )
    reads = 0
    original = type(dataset).__getitem__

    def counted(self, index):
        nonlocal reads
        reads += 1
        return original(self, index)

    # Two epochs whole, then epoch 1 resumed after its first batch: exactly its other batches.
    positions = [(0, 0), (1, 0), (1, 1)]
    expected = _epochs(workers, worker_sampler, positions)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(dataset), "__getitem__", counted)
        got = _epochs(resident, resident_sampler, positions)
    assert len(got) == len(expected) == 3 + 3 + 2 and reads == 0
    for (x, y), (ex, ey) in zip(got, expected, strict=True):
        assert x.is_contiguous(memory_format=torch.channels_last_3d)
        assert torch.equal(x, ex) and torch.equal(y, ey)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(got[6:], got[4:6], strict=True))
    assert not torch.equal(got[0][0], got[3][0])  # epochs differ
    # Cut on the device, no copy a batch (a CPU "device": none at all).
    assert resident.counters.batches == 8 and resident.counters.host_to_device_copies == 0
    assert len(resident) == 2  # after set_position(1, 1): two batches of three left
    # The pinned path's prefetching thread (on a CPU: no stream, no copy) cuts the same batches.
    resident.placement = "pinned"
    prefetched = _epochs(resident, resident_sampler, positions)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(prefetched, expected, strict=True))


class _HostData(TorchDispatchMode):
    """Counts the ops that bring host data into a batch: a tensor made from Python or numpy
    values (aten.lift_fresh) or a copy that changes device (aten._to_copy with a device)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        moves = func is torch.ops.aten._to_copy.default and kwargs.get("device") is not None
        self.count += func is torch.ops.aten.lift_fresh.default or moves
        return func(*args, **kwargs)


def test_after_its_first_batch_an_epoch_brings_nothing_from_the_host(
    shards,  # noqa: F811
    monkeypatch,
) -> None:
    """The epoch's draws cross once, with its first batch; the others are cut from tensors
    already on the device (on a GPU: no copy and no sync to wait for). The cut runs on this
    thread here, where the dispatch mode (thread-local) sees it."""
    monkeypatch.setattr(resident_loader, "_one_ahead", lambda make, starts: map(make, starts))
    dataset = _dataset(shards["random"])
    sampler = _sampler(dataset, symmetries=tuple(range(48)), random_origins=SIZE)
    loader = ResidentLoader(load_resident(dataset, CPU), sampler, batch_size=3, device=CPU)
    sampler.set_position(2)
    with _HostData() as first:
        batches = iter(loader)
        next(batches)
    with _HostData() as rest:
        assert len(list(batches)) == 2
    assert first.count > 0 and rest.count == 0


def test_the_next_batch_is_cut_while_the_caller_holds_this_one() -> None:
    """On a CPU the resident path cuts batch b + 1 on a helper thread while the step runs
    batch b: in order, one ahead, and an error is raised where its batch is taken."""
    made: list[int] = []
    started_next = threading.Event()

    def make(start: int) -> int:
        made.append(start)
        if start == 4:
            started_next.set()
        if start == 6:
            raise ValueError("bad batch at 6")
        return start

    batches = _one_ahead(make, range(0, 8, 2))
    assert next(batches) == 0
    assert next(batches) == 2
    assert started_next.wait(10)  # batch 4 was begun while the caller held batch 2
    assert next(batches) == 4 and made[:3] == [0, 2, 4]
    with pytest.raises(ValueError, match="bad batch at 6"):
        next(batches)
    assert list(_one_ahead(make, range(0))) == []
