"""The gradient sync's byte accounting follows the group it really reduces over."""

import pytest
import torch

from cosmocub.parallel.parallel_dims import LaunchEnv, ParallelDims
from cosmocub.train.grad_sync import DDPAllReduce, LocalGradients, SpatialAverage


def _dims(data: int, spatial: int) -> ParallelDims:
    env = LaunchEnv(
        launcher="torchrun",
        rank=0,
        world_size=data * spatial,
        local_rank=0,
        local_world_size=data * spatial,
        master_addr="127.0.0.1",
        master_port=0,
    )
    return ParallelDims(
        data=data, spatial=spatial, env=env, device=torch.device("cpu"), backend="gloo"
    )


@pytest.mark.parametrize(
    ("data", "spatial", "ranks"),
    [(4, 1, 4), (2, 2, 4), (1, 4, 4), (3, 1, 3)],
)
def test_ddp_counts_a_ring_over_every_rank_it_reduces_over(data, spatial, ranks):
    # Spatial > 1: DDP runs over the whole mesh, so P is data × spatial, not the data axis alone.
    payload = 1_000_000
    expected = 2 * (ranks - 1) / ranks * payload
    assert DDPAllReduce(_dims(data, spatial)).bytes_sent_per_step(payload) == pytest.approx(
        expected
    )


def test_spatial_average_counts_its_ring_over_the_spatial_group_only():
    payload = 1_000_000
    assert SpatialAverage(_dims(4, 2)).bytes_sent_per_step(payload) == pytest.approx(payload)
    assert SpatialAverage(_dims(1, 4)).bytes_sent_per_step(payload) == pytest.approx(1.5 * payload)
    assert LocalGradients().bytes_sent_per_step(payload) == 0.0


def test_spatial_average_leaves_the_replicated_head_out():
    # The head after the gather is whole on every spatial rank, with the same gradient: it is
    # neither reduced nor counted. The conv stack is.
    from cosmocub.config import load_config
    from cosmocub.models.cosmoflow import CosmoFlow
    from cosmocub.parallel.layers import GatherFlatten

    model = CosmoFlow(load_config(None).model)
    head = sum(4 * p.numel() for p in model.head.parameters())
    total = sum(4 * p.numel() for p in model.parameters())
    sync = SpatialAverage(_dims(2, 4))
    sync.wrap(model)
    assert sync.replicated_bytes == 0  # not split: nothing is replicated
    model.flatten = GatherFlatten(plan=None, group_rank=0)  # as parallelize_cosmoflow leaves it
    sync.wrap(model)
    assert sync.replicated_bytes == head > 0
    assert sync.bytes_sent_per_step(total) == pytest.approx(1.5 * (total - head))


@pytest.mark.parametrize("timing", ["blocking", "overlapped"])
def test_ddp_exchange_is_timed_either_way_with_the_same_gradients(timing):
    """One gloo rank: DDP still runs its all-reduce (averaging over a group of one), so the
    hook's marks are real; gradients are those of the plain model either way. Two buckets from
    the second step on (the last layer's 1.4 MB fill DDP's 1 MiB first one): overlapped, the
    step waits only from the second bucket's launch, less than the all-reduce ran."""
    import datetime

    from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims

    dims = build_parallel_dims(backend="gloo", environ={}, timeout_s=7)
    try:
        data_group = dims.group("data")
        assert data_group._get_backend(torch.device("cpu")).options._timeout == (
            datetime.timedelta(seconds=7)
        )  # the configured timeout reaches the mesh's groups, not torch's 30 min
        torch.manual_seed(0)

        def model() -> torch.nn.Module:
            return torch.nn.Sequential(
                torch.nn.Linear(6, 600), torch.nn.Tanh(), torch.nn.Linear(600, 600)
            )

        plain, copy = model(), model()
        copy.load_state_dict(plain.state_dict())
        sync = DDPAllReduce(dims, timing=timing)
        wrapped = sync.wrap(copy)
        x = torch.randn(4, 6)
        for step in range(2):  # the second with the buckets DDP rebuilt after the first
            plain.zero_grad()
            copy.zero_grad()
            plain(x).square().sum().backward()
            wrapped(x).square().sum().backward()
            if timing == "overlapped":
                # DDP's first backward runs one bucket; it then rebuilds them in gradient order.
                assert len(sync.launched) == len(sync.completed) == 1 + step
            sync.after_backward(copy)
            for a, b in zip(plain.parameters(), copy.parameters(), strict=True):
                assert torch.equal(a.grad, b.grad), step
        assert sync.launched == sync.completed == []  # every mark taken into the spans
        if timing == "blocking":
            assert 0 < sync.exchange_s == sync.exchange_busy_s
        else:
            assert 0 < sync.exchange_s < sync.exchange_busy_s
    finally:
        close_parallel_dims(dims)


def test_ddp_broadcasts_buffers_only_where_a_norm_is_not_synced():
    """Synced norms' running statistics come from the mesh-wide batch, equal on every rank, so
    DDP's broadcast of them before each forward is left out; a plain norm keeps it."""
    from cosmocub.parallel.layers import SyncBatchNorm3d
    from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
    from cosmocub.train.grad_sync import has_unsynced_buffers

    dims = build_parallel_dims(backend="gloo", environ={}, timeout_s=7)
    try:

        def model(synced: bool) -> torch.nn.Module:
            norm = torch.nn.BatchNorm3d(2)
            if synced:
                norm = SyncBatchNorm3d(norm, dims.world_group)
            return torch.nn.Sequential(torch.nn.Conv3d(1, 2, 3), norm)

        assert not has_unsynced_buffers(torch.nn.Linear(2, 2))
        for synced in (True, False):
            assert has_unsynced_buffers(model(synced)) is not synced
            wrapped = DDPAllReduce(dims, timing="overlapped").wrap(model(synced))
            assert wrapped.forward_sync_buffers is not synced
            wrapped(torch.randn(2, 1, 4, 4, 4)).sum().backward()  # trains either way
    finally:
        close_parallel_dims(dims)


def test_ddp_timing_must_be_known():
    with pytest.raises(ValueError, match=r"train\.ddp_exchange_timing: 'sometimes'"):
        DDPAllReduce(_dims(2, 1), timing="sometimes")


class _FakeEvents:
    """A device clock in a test: marks are event ids that a test completes by hand, each at a
    time it chooses (what torch.cuda.Event's query and elapsed_time report on a GPU)."""

    def __init__(self) -> None:
        self.at: dict[int, float] = {}  # completed marks → their device time
        self.issued = 0
        self.waits = 0  # seconds() on a mark not done yet: a synchronize on a GPU

    def mark(self) -> int:
        self.issued += 1
        return self.issued

    def done(self, mark: int) -> bool:
        return mark in self.at

    def seconds(self, start: int, end: int) -> float:
        if end not in self.at:
            self.waits += 1
            # The device catches up: the mark is done when the one queued before it was.
            self.at[end] = self.at.get(end - 1, 0.0)
        return self.at[end] - self.at[start]


def test_spans_read_device_marks_once_when_asked_and_never_wait_before():
    from cosmocub.parallel import timing
    from cosmocub.parallel.timing import HOST_CLOCK, EventClock, Spans, clock_for

    assert clock_for(torch.device("cpu")) is HOST_CLOCK
    assert isinstance(clock_for(torch.device("cuda", 0)), EventClock)  # no GPU needed to build
    clock, spans = _FakeEvents(), Spans()
    for i in range(timing.MAX_PENDING + 10):
        start, end = clock.mark(), clock.mark()
        spans.add(clock, start, end)
        if i < 3:  # the oldest spans finish: 1 s, 2 s, 3 s of device time
            clock.at[start], clock.at[end] = 10.0 * i, 10.0 * i + i + 1
    # Past MAX_PENDING only the finished ones at the front were read, without waiting.
    assert clock.waits == 0 and spans.pending == timing.MAX_PENDING + 7
    for j, mark in enumerate(range(7, clock.issued + 1)):
        clock.at[mark] = 100.0 + (j // 2) * 0.5 + (j % 2) * 0.25  # the rest: 0.25 s each
    assert spans.seconds == pytest.approx(1 + 2 + 3 + 0.25 * (timing.MAX_PENDING + 7))
    assert spans.pending == 0 and clock.waits == 0
    # A span ends at the latest of its end marks (buckets completing in any order); a span
    # read before its end is done waits for it (synchronize), and only then.
    a, b, c = clock.mark(), clock.mark(), clock.mark()
    clock.at[a], clock.at[c] = 200.0, 200.5
    spans.reset()
    spans.add(clock, a, b, c)
    assert spans.seconds == pytest.approx(0.5) and clock.waits == 1
    # The host clock: perf_counter readings, done at once.
    spans.reset()
    spans.add(HOST_CLOCK, 1.0, 1.5, 1.25)
    assert spans.seconds == 0.5
    # Buckets in flight: each launch to its completion, overlaps once, gaps and an end before
    # its start not at all.
    spans.reset()
    spans.add_intervals(HOST_CLOCK, [(10.0, 11.0), (10.5, 12.0), (13.0, 14.0), (15.0, 14.5)])
    assert spans.seconds == pytest.approx(3.0)


def test_inter_node_share_is_one_crossing_a_node_of_a_ring() -> None:
    # 8 ranks, 2 a node (the config's override): a ring over all crosses each node once, 1/2 of
    # each rank's bytes on average; a spatial group of 2 lies on one node, one of 4 spans two.
    def dims(data: int, spatial: int) -> ParallelDims:
        d = _dims(data, spatial)
        d.assumed_ranks_per_node = 2
        return d

    assert DDPAllReduce(dims(8, 1)).inter_node_fraction == 0.5
    assert SpatialAverage(dims(4, 2)).inter_node_fraction == 0.0
    assert SpatialAverage(dims(2, 4)).inter_node_fraction == 0.5
    assert DDPAllReduce(_dims(4, 1)).inter_node_fraction == 0.0  # one node of 4
    assert LocalGradients().inter_node_fraction == 0.0
    with pytest.raises(ValueError, match="ranks per node 3 does not divide the world of 8"):
        ParallelDims(**{**vars(dims(8, 1)), "assumed_ranks_per_node": 3}).node_layout()
