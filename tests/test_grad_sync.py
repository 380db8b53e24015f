"""The gradient sync's byte accounting follows the group it really reduces over."""

import pytest
import torch

from cosmocub.parallel.mesh import LaunchEnv, ParallelDims
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
def test_ddp_exchange_is_timed_when_blocking_with_the_same_gradients(timing):
    """One gloo rank: DDP still runs its all-reduce (averaging over a group of one), so the hook's
    wait is real; gradients are those of the plain model either way."""
    import datetime

    from cosmocub.parallel.mesh import build_parallel_dims, close_parallel_dims

    dims = build_parallel_dims(backend="gloo", environ={}, timeout_s=7)
    try:
        data_group = dims.group("data")
        assert data_group._get_backend(torch.device("cpu")).options._timeout == (
            datetime.timedelta(seconds=7)
        )  # the configured timeout reaches the mesh's groups, not torch's 30 min
        torch.manual_seed(0)
        plain = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        copy = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
        copy.load_state_dict(plain.state_dict())
        sync = DDPAllReduce(dims, timing=timing)
        wrapped = sync.wrap(copy)
        x = torch.randn(4, 6)
        plain(x).square().sum().backward()
        wrapped(x).square().sum().backward()
        for a, b in zip(plain.parameters(), copy.parameters(), strict=True):
            assert torch.equal(a.grad, b.grad)
        if timing == "blocking":
            assert sync.exchange_s > 0
        else:
            assert sync.exchange_s == 0
    finally:
        close_parallel_dims(dims)
