"""Process topology: read the launcher's environment (torchrun, Slurm srun, or none), start the
process group, and build the one DeviceMesh with named axes ("data", "spatial").

Everything else asks `ParallelDims` for groups and ranks; nothing else reads RANK or SLURM_*.
"""

from __future__ import annotations

import datetime
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as C10dBackend
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from cosmocub.launch.env import CPUS_PER_RANK_ENV
from cosmocub.parallel.node_layout import NodeLayout
from cosmocub.parallel.placement import RankPlace, gather_places, ranks_per_node

MESH_AXES = ("data", "spatial")


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """Who am I, as the launcher said: global and node-local rank and size, and the rendezvous."""

    launcher: str  # "torchrun", "slurm" or "single"
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    # Cores the launcher reserved for each rank (srun --cpus-per-task), if it said.
    cpus_per_rank: int | None = None


def _first_slurm_host(nodelist: str) -> str:
    # "node[03-05,9],gpu1" → "node03": only the first host is needed for the rendezvous.
    match = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist.strip())
    if not match:
        raise ValueError(f"SLURM_JOB_NODELIST {nodelist!r}: cannot read the first host")
    prefix, ranges = match.group(1), match.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _optional_int(environ: Mapping[str, str], name: str) -> int | None:
    return int(environ[name]) if environ.get(name) else None


def _slurm_local_size(environ: Mapping[str, str], world_size: int) -> int:
    if "SLURM_NTASKS_PER_NODE" in environ:
        return int(environ["SLURM_NTASKS_PER_NODE"].split("(")[0].split(",")[0])
    if "SLURM_TASKS_PER_NODE" in environ:  # e.g. "4(x2)" or "4,3"
        return int(environ["SLURM_TASKS_PER_NODE"].split("(")[0].split(",")[0])
    return world_size


def detect_launch_env(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """torchrun's RANK/WORLD_SIZE/LOCAL_RANK first, then srun's SLURM_PROCID/…, else one process."""
    env = os.environ if environ is None else environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return LaunchEnv(
            launcher="torchrun",
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env.get("LOCAL_RANK", 0)),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(env.get("MASTER_PORT", 29500)),
            # What the workflow granted each rank (cosmocub.launch.launcher); torchrun itself
            # says nothing.
            cpus_per_rank=_optional_int(env, CPUS_PER_RANK_ENV),
        )
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        world_size = int(env["SLURM_NTASKS"])
        # Rank 0 runs on the first node of the step (srun's block distribution), which is where
        # it serves the store. SLURM_LAUNCH_NODE_IPADDR is where srun was typed: after `salloc` on
        # a login node that is the login node, which serves nothing, so it is the last resort.
        if "MASTER_ADDR" in env:
            addr = env["MASTER_ADDR"]
        elif nodelist := env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST"):
            addr = _first_slurm_host(nodelist)
        elif "SLURM_LAUNCH_NODE_IPADDR" in env:
            addr = env["SLURM_LAUNCH_NODE_IPADDR"]
        else:
            addr = "127.0.0.1"
        # A port derived from the job id keeps two jobs sharing a node from colliding.
        port = int(env.get("MASTER_PORT", 20000 + int(env.get("SLURM_JOB_ID", 0)) % 20000))
        return LaunchEnv(
            launcher="slurm",
            rank=int(env["SLURM_PROCID"]),
            world_size=world_size,
            local_rank=int(env.get("SLURM_LOCALID", 0)),
            local_world_size=_slurm_local_size(env, world_size),
            master_addr=addr,
            master_port=port,
            cpus_per_rank=int(env["SLURM_CPUS_PER_TASK"]) if "SLURM_CPUS_PER_TASK" in env else None,
        )
    return LaunchEnv(
        launcher="single",
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=0,
    )


@dataclass(kw_only=True)
class ParallelDims:
    """Mesh sizes (data × spatial = world), the device, and once built, the DeviceMesh."""

    data: int
    spatial: int
    env: LaunchEnv
    device: torch.device
    backend: str
    mesh: DeviceMesh | None = field(default=None, repr=False)
    owns_process_group: bool = False
    # Groups made for this run beyond the mesh's (e.g. batch norm's): destroyed on close.
    extra_groups: list[dist.ProcessGroup] = field(default_factory=list, repr=False)
    # Ranks on one node: the config's parallel.assumed_ranks_per_node (e.g. to treat one host's
    # ranks as several nodes), else where the ranks run (`placement`, gathered when the process
    # group starts), else the launcher's local world size.
    assumed_ranks_per_node: int | None = None
    placement: tuple[RankPlace, ...] | None = None
    _node_groups: NodeGroups | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.data < 1 or self.spatial < 1 or self.data * self.spatial != self.env.world_size:
            raise ValueError(
                f"mesh data={self.data} × spatial={self.spatial} = {self.data * self.spatial} "
                f"does not equal the world size {self.env.world_size} ({self.env.launcher})"
            )

    @property
    def world_size(self) -> int:
        return self.env.world_size

    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    def _axis(self, axis: str) -> DeviceMesh:
        if self.mesh is None:
            raise RuntimeError("ParallelDims: mesh not built (call build_parallel_dims)")
        return self.mesh[axis]

    def group(self, axis: str) -> dist.ProcessGroup:
        """The process group of mesh axis "data" or "spatial"."""
        return self._axis(axis).get_group()

    def axis_rank(self, axis: str) -> int:
        return self._axis(axis).get_local_rank()

    @property
    def world_group(self) -> dist.ProcessGroup:
        """The group of every rank of the mesh (data × spatial = world, checked at build)."""
        return dist.group.WORLD

    def barrier(self) -> None:
        """Wait until every rank of the mesh gets here (nothing to wait for on one rank)."""
        if self.world_size > 1:
            dist.barrier(group=self.world_group)

    def new_group(self, ranks: list[int]) -> dist.ProcessGroup:
        """A process group over `ranks` (a collective over the world), destroyed on close."""
        group = dist.new_group(ranks=ranks)
        self.extra_groups.append(group)
        return group

    @property
    def per_node(self) -> int:
        """G: the ranks on one node (consecutive global ranks)."""
        if self.assumed_ranks_per_node:
            return self.assumed_ranks_per_node
        if self.placement is not None:
            return ranks_per_node(self.placement)
        return self.env.local_world_size

    def node_layout(self) -> NodeLayout:
        """The data axis over the nodes (ValueError, naming the sizes, where it is uneven)."""
        return NodeLayout(data=self.data, spatial=self.spatial, ranks_per_node=self.per_node)

    def node_groups(self) -> NodeGroups:
        """My intra-node data group and my rail (inter-node data group), made once: the first
        call is a collective over the world (every rank makes every group, in one order)."""
        if self._node_groups is None:
            layout = self.node_layout()
            mine: dict[str, dist.ProcessGroup | None] = {"intra": None, "inter": None}
            if layout.two_level:
                mine["intra"] = self._make_groups(layout.intra_groups())
                mine["inter"] = self._make_groups(layout.inter_groups())
            self._node_groups = NodeGroups(layout=layout, **mine)
        return self._node_groups

    def _make_groups(self, rank_lists: list[list[int]]) -> dist.ProcessGroup | None:
        """Make every group of `rank_lists` (a collective over the world), return mine."""
        mine = None
        for ranks in rank_lists:
            group = self.new_group(ranks)
            if self.rank in ranks:
                mine = group
        return mine


@dataclass(frozen=True)
class NodeGroups:
    """The data axis's two levels for this rank: the data ranks on its node (`intra`) and those
    with its local index on every node (`inter`); both None where the layout has one level."""

    layout: NodeLayout
    intra: dist.ProcessGroup | None
    inter: dist.ProcessGroup | None


def _pick_device(env: LaunchEnv) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def _store(env: LaunchEnv) -> dist.Store:
    """The rendezvous store, under a prefix unique to this torchrun restart attempt.

    torchrun keeps one agent store across restarts; without the prefix a restarted rank can read
    the address a dead rank published in the previous attempt and fail to connect (seen with
    gloo: "connectFullMesh failed … Connection refused").
    """
    if env.launcher == "single":
        return dist.HashStore()
    url = "env://" if env.launcher == "torchrun" else f"tcp://{env.master_addr}:{env.master_port}"
    store, _, _ = next(dist.rendezvous(url, rank=env.rank, world_size=env.world_size))
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"cosmocub/attempt_{attempt}/", store)


def build_parallel_dims(
    *,
    backend: str = "auto",
    spatial: int = 1,
    environ: Mapping[str, str] | None = None,
    timeout_s: float = 1800.0,
    assumed_ranks_per_node: int | None = None,
) -> ParallelDims:
    """Start the process group (gloo on CPU, nccl on CUDA, unless `backend` says) and the mesh.

    A single process without a launcher still gets a world of one (an in-memory store), so the
    training code has no `if distributed:` branches. Reuses a process group that already exists.
    """
    env = detect_launch_env(environ)
    if spatial < 1 or env.world_size % spatial:
        raise ValueError(
            f"key 'parallel.spatial': {spatial} does not divide the world size "
            f"{env.world_size} ({env.launcher}): the data axis would be "
            f"{env.world_size}/{spatial}"
        )
    device = _pick_device(env)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("key 'train.backend': nccl needs CUDA devices, none is available")
    dims = ParallelDims(
        data=env.world_size // spatial,
        spatial=spatial,
        env=env,
        device=device,
        backend=backend,
        assumed_ranks_per_node=assumed_ranks_per_node,
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        # A collective that waits longer fails the rank (the launcher restarts it), not hangs.
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend, store=_store(env), rank=env.rank, world_size=env.world_size, timeout=timeout
        )
        dims.owns_process_group = True
    elif dist.get_world_size() != env.world_size:
        raise ValueError(
            f"existing process group has {dist.get_world_size()} ranks, the launcher says "
            f"{env.world_size}"
        )
    dims.placement = gather_places(
        rank=env.rank, local_rank=env.local_rank, world_size=env.world_size
    )
    # The mesh's groups default to torch's 30 min, whatever the world's timeout: pass it on.
    timeout = datetime.timedelta(seconds=timeout_s)
    options = {axis: _group_options(backend, timeout) for axis in MESH_AXES}
    dims.mesh = init_device_mesh(
        device.type,
        (dims.data, dims.spatial),
        mesh_dim_names=MESH_AXES,
        backend_override=options,
    )
    return dims


def _group_options(backend: str, timeout: datetime.timedelta) -> C10dBackend.Options:
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return options
    return C10dBackend.Options(backend, timeout=timeout)


def close_parallel_dims(dims: ParallelDims) -> None:
    """Destroy the process group if `build_parallel_dims` started it; else only the groups it
    and the run made (the mesh's axes, `new_group`'s), which would otherwise live as long as the
    caller's default group: each holds connections to its peers (gloo sockets, NCCL
    communicators with their device buffers), one more set per run in the same process."""
    if not dist.is_initialized():
        return
    if dims.owns_process_group:
        dist.destroy_process_group()  # every group with it
        dims.owns_process_group = False
    else:
        groups = list(dims.extra_groups)
        if dims.mesh is not None:
            groups += [dims.group(axis) for axis in MESH_AXES]
        for group in groups:
            if group is not dist.group.WORLD and group is not dist.GroupMember.WORLD:
                dist.destroy_process_group(group)
    dims.extra_groups.clear()
    dims.mesh = None
    dims._node_groups = None
