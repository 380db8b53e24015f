"""When Lion Cub averages its rank-local momenta over the data group, and which: pure functions.

Schedules (steps counted from 1, after the step's momentum update):
  never; every K steps; exponential: T_0 = 0, T_{j+1} = T_j + 2^(j/k), sync at ⌊T_j⌋ for j ≥ 1
  (k = 1: steps 1, 3, 7, 15, …; larger k syncs more often early on; always sparser later).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Sequence

import torch

SCHEDULES = ("never", "every", "exponential")


def exponential_sync_steps(k: float, up_to: int) -> list[int]:
    """The distinct steps ⌊T_j⌋ ≤ up_to of the exponential schedule, ascending."""
    if k <= 0:
        raise ValueError(f"exponential schedule: k must be > 0, got {k}")
    steps: list[int] = []
    t, j = 0.0, 0
    while True:
        t += 2.0 ** (j / k)
        j += 1
        s = int(t)
        if s > up_to:
            return steps
        if not steps or s != steps[-1]:
            steps.append(s)


def is_sync_step(step: int, *, schedule: str, every: int, k: float) -> bool:
    """Whether momenta are averaged after optimizer step `step` (≥ 1)."""
    if schedule == "never":
        return False
    if schedule == "every":
        return step % every == 0
    if schedule == "exponential":
        found = exponential_sync_steps(k, step)
        return bool(found) and found[-1] == step
    raise ValueError(f"unknown momentum_sync schedule {schedule!r} ({', '.join(SCHEDULES)})")


def matches(name: str, patterns: Sequence[str]) -> bool:
    """Whether a parameter name matches any shell-style pattern; no patterns = every parameter."""
    return not patterns or any(fnmatch.fnmatchcase(name, p) for p in patterns)


def average_momenta(
    momenta: Sequence[torch.Tensor], all_reduce_sum: Callable[[torch.Tensor], None], size: int
) -> int:
    """Replace each tensor by its mean over the group, in one flat all-reduce; returns the fp32
    payload bytes. `all_reduce_sum` sums a tensor in place over the group (any callable works,
    which is how this is tested without processes)."""
    if not momenta:
        return 0
    flat = torch.cat([m.reshape(-1) for m in momenta])
    all_reduce_sum(flat)
    flat.div_(size)
    offset = 0
    for m in momenta:
        m.copy_(flat[offset : offset + m.numel()].view_as(m))
        offset += m.numel()
    return flat.numel() * flat.element_size()
