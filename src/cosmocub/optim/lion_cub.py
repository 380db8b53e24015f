"""Distributed Lion and Lion Cub: each data rank keeps its own momentum and the ranks agree on
sign(Σ quantized c) through a swappable collective; the class only does the bookkeeping.

Math: `quantize.py`, `vote.py`, `packing.py`, `momentum_sync.py`; what is sent, flat or two-level
(hierarchy "node"): a plan (`exchange_plan.py`), run by `exchange.py` over `collectives.py` and
`hierarchy.py`.
Gradients arrive reduced over the spatial group only (see train.grad_sync): no DDP all-reduce.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.optim import Optimizer

from cosmocub.optim.collectives import Collective, CommStats, Pending
from cosmocub.optim.exchange import BucketWire, Exchange, build_exchange
from cosmocub.optim.exchange_plan import ExchangePlan, bucket_elements, plan_exchange
from cosmocub.optim.exchange_plan import split_into_buckets as bucket_indices
from cosmocub.optim.lion import check_lion_hyperparameters, lion_apply, lion_interpolation
from cosmocub.optim.lion_cub_checkpoint import own_rows, own_state
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.optim.momentum_sync import matches
from cosmocub.optim.quantize import levels_shrunk
from cosmocub.optim.vote import tie_pattern
from cosmocub.optim.wire import WireSpec
from cosmocub.parallel.timing import Spans, clock_for

__all__ = ["LionCub", "LionCubSettings", "named_groups", "split_into_buckets"]
GROUP_OPTIONS = ("lr", "betas", "weight_decay")  # what a parameter group may set for itself


@dataclass
class _Bucket:
    """Parameters exchanged together; their momenta are views of one flat buffer."""

    params: list[torch.Tensor]
    group: dict[str, Any]  # the parameter group: its lr, betas, weight_decay (a schedule sets lr)
    momentum: torch.Tensor  # flat (n,)
    # Reused every step: c, then the update as floats. Fresh n-sized tensors per step cost
    # more than the arithmetic on a CPU (page faults of large allocations).
    scratch: torch.Tensor
    wire: BucketWire  # the exchange's buffers (tie pattern, q, the node slice)
    ready: int = 0  # parameters whose gradient is accumulated this step (overlap)
    pending: Pending | None = None
    views: list[torch.Tensor] = field(default_factory=list)


def split_into_buckets(
    params: Sequence[torch.Tensor], cap_elements: int
) -> list[list[torch.Tensor]]:
    """The parameters of each exchange bucket (optim.exchange_plan.split_into_buckets)."""
    kinds = [(p.dtype, p.device) for p in params]
    buckets = bucket_indices([p.numel() for p in params], cap_elements, kinds)
    return [[params[i] for i in bucket] for bucket in buckets]


def named_groups(params: Iterable[Any]) -> list[dict[str, Any]]:
    """Parameter groups of (name, parameter) from `model.parameters()`, `named_parameters()` or
    a list of dicts whose "params" is either; plain tensors are named "param_<i>" (i counts
    through all groups). ValueError for a group option LionCub cannot hold per group."""
    items = list(params)
    groups = items if items and isinstance(items[0], dict) else [{"params": items}]
    out, count = [], 0
    for k, group in enumerate(groups):
        if not isinstance(group, dict) or "params" not in group:
            raise ValueError(f"LionCub: parameter group {k} is not a dict with 'params'")
        if other := sorted(set(group) - {"params", *GROUP_OPTIONS}):
            raise ValueError(
                f"LionCub: parameter group {k} sets {', '.join(other)}: a group may set only "
                f"{', '.join(GROUP_OPTIONS)}; pass the others to LionCub, for all groups"
            )
        given = group["params"]
        named = []
        for x in [given] if isinstance(given, torch.Tensor) else given:
            named.append(x if isinstance(x, tuple) else (f"param_{count}", x))
            count += 1
        out.append({**group, "params": named})
    return out


class LionCub(Optimizer):
    """Lion whose update is voted over `group` (the data axis); `distributed_lion` is the 1-bit
    sign / all-gather / never-sync case of it.

    Every rank of `group` builds it on the same parameters and steps it together; each keeps
    its own momentum. `params`: `model.parameters()`, `named_parameters()` (momentum_sync
    patterns match the names) or parameter groups with their own lr, betas, weight_decay.
    `settings` (LionCubSettings; its defaults where None): Lion's hyperparameters, the wire,
    the buckets, the hierarchy and the momentum syncs. Gradients are this rank's own (no DDP,
    no gradient all-reduce); the parameters stay identical on every rank. `group` None is a
    group of one: Lion exactly.

    Topology: `data_ranks_per_node` G: `group`'s ranks run node by node, G on each (None: one
    a node), for the intra/inter-node byte split and hierarchy node (the data ranks of a node,
    not all its ranks: with a spatial group of S, G = ranks a node / S); `node_groups`: under
    hierarchy node, (the G ranks on mine, my rail: my local index on every node).

    `plan` is what the exchange sends (optim.exchange_plan: the performance model prices the
    same object); `comm_stats` counts the bytes this rank sent and the exchange's seconds;
    `levels_in_use` the levels the quantizer keeps (a warning at construction where fewer than
    `bits` asked). Checkpoints: `state_dict` is this data rank's own; each rank saves and loads
    its own.
    """

    communicates_gradients = True
    state_per_data_rank = True  # train.checkpoint: each data rank writes its state_dict apart

    def __init__(
        self,
        params: Iterable[Any],
        settings: LionCubSettings | None = None,
        *,
        group: dist.ProcessGroup | None,
        data_ranks_per_node: int | None = None,
        node_groups: tuple[dist.ProcessGroup, dist.ProcessGroup] | None = None,
    ) -> None:
        s = self.settings = settings if settings is not None else LionCubSettings()
        groups = named_groups(params)
        named = [(n, p) for g in groups for n, p in g["params"] if p.requires_grad]
        trained = [{**g, "params": [p for n, p in g["params"] if p.requires_grad]} for g in groups]
        super().__init__(trained, {"lr": s.lr, "betas": s.betas, "weight_decay": s.weight_decay})
        for g in self.param_groups:
            check_lion_hyperparameters("LionCub", lr=g["lr"], betas=g["betas"])
        self.comm_stats = CommStats()
        self.group = group
        self.group_size = 1 if group is None else dist.get_world_size(group)
        self.rank = 0 if group is None else dist.get_rank(group)
        self.sync_params = {id(p) for n, p in named if matches(n, s.sync_patterns)}
        self.step_count = 0
        cap = bucket_elements(s.bucket_mb)  # a bucket holds one group's parameters
        bucketed = [(b, g) for g in self.param_groups for b in split_into_buckets(g["params"], cap)]
        self.plan: ExchangePlan = plan_exchange(
            s,
            [[p.numel() for p in b] for b, _ in bucketed],
            data_ranks=self.group_size,
            data_per_node=data_ranks_per_node or 1,
            synced_elements=sum(p.numel() for _, p in named if id(p) in self.sync_params),
            value_bytes=named[0][1].element_size() if named else 4,
        )
        self.exchange: Exchange = build_exchange(
            self.plan, group, stats=self.comm_stats, node_groups=node_groups
        )
        # The voters: ranks, or nodes under hierarchy node.
        kind = "nodes" if self.plan.two_level else "data ranks"
        shrunk = levels_shrunk(
            s.quantizer, s.bits, self.spec.levels, f"{self.plan.voters} {kind}", s.wire_dtype
        )
        if shrunk:
            warnings.warn(f"LionCub: {shrunk}", stacklevel=2)
        self.buckets = [self._new_bucket(b, g) for b, g in bucketed]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        if self.plan.overlap:
            for _, p in named:
                p.register_post_accumulate_grad_hook(self._grad_ready)

    @property
    def levels_in_use(self) -> int:
        """s: the largest |q| a rank sends, as quantizer_levels allows at this group size."""
        return self.spec.levels

    @property
    def spec(self) -> WireSpec:
        """What goes on the wire (quantizer, levels, bits a value, the all-reduce's dtype)."""
        return self.plan.wire

    @property
    def collective(self) -> Collective:
        """The vote's collective: over `group`, or over the rail under two levels."""
        return self.exchange.collective

    @property
    def two_level(self) -> bool:
        return self.plan.two_level

    def _new_bucket(self, params: list[torch.Tensor], group: dict[str, Any]) -> _Bucket:
        n = sum(p.numel() for p in params)
        momentum = torch.zeros(n, dtype=params[0].dtype, device=params[0].device)
        even = tie_pattern(n, step=0, device=momentum.device)
        wire = self.exchange.new_wire([p.numel() for p in params], (even, -even), momentum)
        bucket = _Bucket(params, group, momentum, torch.zeros_like(momentum), wire)
        offset = 0
        for p in params:
            bucket.views.append(momentum[offset : offset + p.numel()].view_as(p))
            offset += p.numel()
        self._register_state(bucket)
        return bucket

    def _register_state(self, bucket: _Bucket) -> None:
        for p, view in zip(bucket.params, bucket.views, strict=True):
            self.state[p]["exp_avg"] = view

    # -- the exchange ---------------------------------------------------------------------------

    def _start(self, bucket: _Bucket, step: int) -> None:
        beta1 = bucket.group["betas"][0]
        started = time.perf_counter()
        c, offset = bucket.scratch, 0  # c = β1·m + (1−β1)·g, per tensor as Lion computes it
        for p, m in zip(bucket.params, bucket.views, strict=True):
            lion_interpolation(
                m, p.grad, beta1=beta1, out=c[offset : offset + p.numel()].view_as(p)
            )
            offset += p.numel()
        bucket.pending = self.exchange.start(c, bucket.wire, step, started)

    @torch.no_grad()
    def _grad_ready(self, p: torch.Tensor) -> None:
        # One backward per step (no gradient accumulation): a bucket starts when the last of its
        # parameters has its gradient, and `step` finishes it.
        bucket = self._bucket_of[id(p)]
        bucket.ready += 1
        if bucket.ready == len(bucket.params):
            self._start(bucket, self.step_count + 1)

    def _timed(self, fn: Callable[[], Any], spans: Spans) -> Any:
        """fn() timed into `spans` on the device's clock: on a GPU between two CUDA events, the
        collectives' waits having made the stream wait for them, read once an epoch."""
        device = self.buckets[0].momentum.device if self.buckets else torch.device("cpu")
        clock = clock_for(device)
        start = clock.mark()
        out = fn()
        spans.add(clock, start, clock.mark())
        return out

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        step = self.step_count + 1

        def exchange() -> list[torch.Tensor]:
            for bucket in self.buckets:
                if bucket.pending is None:  # not overlapped, or a parameter got no gradient
                    self._start(bucket, step)
            updates = []
            for bucket in self.buckets:
                assert bucket.pending is not None
                updates.append(self.exchange.finish(bucket.pending, bucket.wire))
                bucket.pending, bucket.ready = None, 0
            return updates

        updates = self._timed(exchange, self.comm_stats.exchange)
        for bucket, update in zip(self.buckets, updates, strict=True):
            g = bucket.group
            lr, wd, (_, beta2) = g["lr"], g["weight_decay"], g["betas"]
            update = bucket.scratch.copy_(update)  # c is spent: its buffer holds the update
            offset = 0
            for p, m in zip(bucket.params, bucket.views, strict=True):
                n = p.numel()
                if p.grad is not None:  # as Lion: a parameter without gradient is left alone
                    lion_apply(
                        p,
                        p.grad,
                        m,
                        update[offset : offset + n].view_as(p),
                        lr=lr,
                        weight_decay=wd,
                        beta2=beta2,
                    )
                offset += n
        self.step_count = step
        if self.group_size > 1 and self.plan.is_sync_step(step):
            self._timed(self._average_momenta, self.comm_stats.momentum_sync)
        return loss

    def _average_momenta(self) -> None:
        momenta = [
            m
            for b in self.buckets
            for p, m in zip(b.params, b.views, strict=True)
            if id(p) in self.sync_params
        ]
        self.exchange.average_momenta(momenta)

    # -- checkpoints: this data rank's momentum, and the schedule's position ---------------------

    def state_dict(self) -> dict[str, Any]:
        """This data rank's own momentum, no communication (optim.lion_cub_checkpoint.own_state):
        each data rank saves its own and loads it back; the parameters are the model's."""
        mine = {"data_group_size": self.group_size, "data_rank": self.rank}
        return own_state(super().state_dict(), step_count=self.step_count, **mine)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load this data rank's state_dict (or data rank 0's of every rank, as written before)."""
        rows = own_rows(state_dict, data_group_size=self.group_size, data_rank=self.rank)
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        for b in self.buckets:
            self._register_state(b)  # the base class replaced self.state
        params = [p for g in self.param_groups for p in g["params"]]
        with torch.no_grad():
            for i, row in rows.items():
                self.state[params[i]]["exp_avg"].copy_(row)
        self.step_count = int(state_dict["step_count"])
