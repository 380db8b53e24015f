"""Training checkpoints: atomic files per save in run_dir/checkpoints/<hash>, the last few kept.

A checkpoint holds everything a resumed run needs to continue bit for bit: model, optimizer,
schedule, every rank's RNG states, the sampler position, and the hash of the resume-relevant config.
Under a mesh of more than one rank, what is a rank's own (its RNG states, LionCub's momentum) goes
to a file per data rank, written by its spatial rank 0: no rank ever holds another data rank's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from cosmocub.config import Config, config_hash
from cosmocub.io import atomic_path, sigterm_deferred
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.train.rng_state import capture_rng_state, restore_rng_state

CHECKPOINT_FORMAT = "cosmocub.checkpoint/1"
_NAME = re.compile(r"^step_(\d{8})\.pt$")
# Beside it, each data rank's own state (LionCub's momentum: D × the model in all), written by
# the data rank's spatial rank 0 (its spatial ranks hold the same); no rank holds another's.
_SPATIAL_RNG = "rng_per_spatial_rank"
_STEP_FILE = re.compile(r"^step_(\d{8})(\.data_rank_\d{5})?\.pt$")  # either
# Beside the checkpoints of a folder: the resume-relevant values its hash was computed from, so a
# run that starts afresh can say which keys changed.
IDENTITY_FILE = "resume.json"
_FOLDER_NAME = re.compile(r"^[0-9a-f]{12}$")  # config_hash

log = logging.getLogger(__name__)

# Keys that change how a run is operated, not what it computes: a resumed run may change them.
_OPERATIONAL_TRAIN_KEYS = {
    "run_name",
    "epochs",
    "num_data_workers",
    "checkpoint_every_steps",
    "keep_old_checkpoint_folders",
    "max_restarts",
    "log_every_steps",
    "threads_per_rank",
    "backend",
}
_OPERATIONAL_PREPROCESS_KEYS = {
    "dask_scheduler",
    "dask_slurm_workers",
    "dask_slurm_wait_s",
    "num_workers",
}


class CheckpointMismatchError(ValueError):
    """A checkpoint was written by a run with another resume-relevant config."""


def resume_hash(cfg: Config, *, data_identity: str = "") -> str:
    """Hash of seed + model + parallel + optimizer + train + preprocess (without the operational
    keys) and of the training data (`data_identity`, see `shard_identity`): what a resumed run
    must share.
    """
    return config_hash(resume_values(cfg, data_identity=data_identity))


def resume_values(cfg: Config, *, data_identity: str = "") -> dict[str, Any]:
    """The values `resume_hash` hashes (JSON types)."""
    c = cfg
    return json.loads(
        json.dumps(
            {
                "seed": c.seed,
                "model": {
                    **{k: v for k, v in dataclasses.asdict(c.model).items() if k != "pooled"},
                    # Off, the pooled branch leaves the model as it was before the key existed:
                    # so it leaves the identity too, and older checkpoints still resume.
                    **({"pooled": c.model.pooled.identity()} if c.model.pooled.enabled else {}),
                },
                "parallel": dataclasses.asdict(c.parallel),
                "optimizer": dataclasses.asdict(c.optimizer),
                "train": {
                    k: v
                    for k, v in dataclasses.asdict(c.train).items()
                    if k not in _OPERATIONAL_TRAIN_KEYS
                },
                "preprocess": {
                    k: v
                    for k, v in dataclasses.asdict(c.preprocess).items()
                    if k not in _OPERATIONAL_PREPROCESS_KEYS
                },
                "data": data_identity,
                # Only a U-Net reads the task: CosmoFlow runs keep their identity without it.
                **({"task": dataclasses.asdict(c.task)} if c.model.name == "unet" else {}),
            }
        )
    )


def shard_identity(shards_dir: Path, *, num_train: int, num_val: int) -> str:
    """Which data a run trains on: the exact training statistics and the split sizes.

    stats.json holds exact per-channel moments of every training value, so new universes,
    another split or another transform change it; reading it costs nothing.
    """
    stats = json.loads((Path(shards_dir) / "stats.json").read_text())
    return config_hash({"stats": stats, "train": num_train, "val": num_val})


@dataclasses.dataclass(frozen=True)
class FreshStart:
    """Why a run starts at step 0 although the run folder holds checkpoints of another config."""

    folder: Path  # this run's new checkpoint folder
    previous: Path  # the newest other checkpoint folder
    changed: tuple[str, ...] | None  # "key: old → new" per changed key; None = not recorded

    def describe(self) -> str:
        what = (
            "; ".join(self.changed)
            if self.changed
            else "its config was not recorded (written before resume.json)"
        )
        return (
            f"training starts at step 0 in {self.folder}: the newest checkpoints, in "
            f"{self.previous}, were written with other settings: {what}"
        )


def diff_values(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    """'key: old → new' for every flattened key whose value differs (the data as one key)."""
    from cosmocub.config import flatten

    a, b = flatten(old), flatten(new)
    changed = []
    for key in sorted(a.keys() | b.keys()):
        if a.get(key) != b.get(key):
            if key == "data":
                changed.append("data: other training shards (stats or split sizes)")
            else:
                changed.append(f"{key}: {json.dumps(a.get(key))} → {json.dumps(b.get(key))}")
    return tuple(changed)


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any], /) -> Any: ...


class CheckpointManager:
    """Saves and restores every stateful piece of a run as `step_<8 digits>.pt` in one folder.

    `stateful` maps names to objects with state_dict/load_state_dict (model, optimizer, schedule,
    train state); `invariants` are values a resumed run must share (e.g. the data-parallel size).
    Rank 0 of `dims` writes it, and a piece with `state_per_data_rank` (LionCub) has each data
    rank write its own state beside it; every rank reads. Without `dims`, one process.
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        config_hash: str,
        stateful: dict[str, Stateful],
        invariants: dict[str, Any] | None = None,
        identity: dict[str, Any] | None = None,
        keep: int = 2,
        dims: ParallelDims | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError(f"CheckpointManager: keep must be >= 1, got {keep}")
        self.folder = Path(folder)
        self.config_hash, self.keep, self.dims = config_hash, keep, dims
        self.is_main = dims is None or dims.is_main
        # Rank-0 decisions and RNG gathers are collectives over the whole mesh.
        self.collective = dims is not None and dims.world_size > 1
        self.stateful, self.invariants = stateful, dict(invariants or {})
        # The values config_hash was computed from (see resume_values), written beside the
        # checkpoints so that a later run with other values can say what changed.
        self.identity = identity
        # Set by restore_latest when this run starts afresh beside another config's checkpoints.
        self.fresh_start: FreshStart | None = None

    def path_for(self, step: int) -> Path:
        return self.folder / f"step_{step:08d}.pt"

    def list(self) -> list[Path]:
        if not self.folder.is_dir():
            return []
        return sorted(p for p in self.folder.iterdir() if _NAME.match(p.name))

    def latest(self) -> Path | None:
        found = self.list()
        return found[-1] if found else None

    def save(self, step: int) -> Path | None:
        """Every rank's own state to its data rank's file, then rank 0 writes the checkpoint
        naming them (a collective: all ranks call this)."""
        states = {name: obj.state_dict() for name, obj in self.stateful.items()}
        # A state_dict that is its data rank's own (LionCub's): a file per data rank.
        mine = [n for n, o in self.stateful.items() if getattr(o, "state_per_data_rank", False)]
        own = {n: states.pop(n) for n in mine}
        rng = capture_rng_state()
        rng_in_main = {} if self.collective else {"rng_per_rank": [rng]}
        if self.collective:  # the RNG states of a data rank's spatial ranks, in its file
            own[_SPATIAL_RNG] = self._gather_spatial(rng)
        if own:  # each data rank's file is whole before rank 0 writes the checkpoint naming it
            data_rank, writes = self._own_writer()
            if writes:
                with sigterm_deferred(), atomic_path(self.own_path_for(step, data_rank)) as tmp:
                    torch.save(own, tmp)
            if self.dims is not None:
                self.dims.barrier()
        if not self.is_main:
            return None
        payload = {
            "format": CHECKPOINT_FORMAT,
            "config_hash": self.config_hash,
            "step": step,
            **rng_in_main,
            "invariants": self.invariants,
            "per_data_rank": sorted(own),
            **states,
        }
        path = self.path_for(step)
        # A cancel (SIGTERM) during the write waits for the rename: the folder then holds whole
        # checkpoints and no temporary.
        with sigterm_deferred():
            with atomic_path(path) as tmp:
                torch.save(payload, tmp)
            identity_path = self.folder / IDENTITY_FILE
            if self.identity is not None and not identity_path.exists():
                with atomic_path(identity_path) as tmp:
                    tmp.write_text(json.dumps(self.identity, indent=1) + "\n")
        for old in self.list()[: -self.keep]:
            old.unlink(missing_ok=True)
        kept = {_NAME.match(p.name)[1] for p in self.list()}  # type: ignore[index]
        for f in self.folder.iterdir():  # of pruned checkpoints, or of a save that died
            if (m := _STEP_FILE.match(f.name)) and m[2] and m[1] not in kept:
                f.unlink(missing_ok=True)
        return path

    def own_path_for(self, step: int, data_rank: int) -> Path:
        return self.folder / f"step_{step:08d}.data_rank_{data_rank:05d}.pt"

    def _gather_spatial(self, rng: dict[str, Any]) -> list[Any] | None:
        """This data rank's spatial ranks' RNG states on its spatial rank 0 (None elsewhere)."""
        assert self.dims is not None
        if self.dims.spatial == 1:
            return [rng]
        group = self.dims.group("spatial")
        first = dist.get_global_rank(group, 0)
        out: list[Any] | None = [None] * self.dims.spatial if self.dims.rank == first else None
        dist.gather_object(rng, out, dst=first, group=group)
        return out

    def _axis_rank(self, axis: str) -> int:
        """This rank's place along mesh `axis` (0 without a mesh of more than one rank)."""
        if self.dims is None or self.dims.world_size == 1:
            return 0
        return self.dims.axis_rank(axis)

    def _own_writer(self) -> tuple[int, bool]:
        """This rank's data rank, and whether it writes its file (spatial rank 0 does)."""
        return self._axis_rank("data"), self._axis_rank("spatial") == 0

    def load(self, path: str | Path) -> dict[str, Any]:
        """Read a checkpoint on CPU; a foreign config raises CheckpointMismatchError."""
        path = Path(path)
        # Memory-mapped: a rank pages in what it copies out (its own row of a distributed
        # optimizer's per-data-rank momenta), not the whole file.
        payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
            raise ValueError(f"{path}: not a cosmocub checkpoint (expected {CHECKPOINT_FORMAT})")
        if payload["config_hash"] != self.config_hash:
            raise CheckpointMismatchError(
                f"{path}: checkpoint written with config hash {payload['config_hash']}, this run "
                f"has {self.config_hash} (model/optimizer/train/preprocess/seed differ: use "
                "another run folder or delete the checkpoints)"
            )
        for key, value in self.invariants.items():
            if payload["invariants"].get(key) != value:
                raise CheckpointMismatchError(
                    f"{path}: checkpoint written with {key}={payload['invariants'].get(key)}, "
                    f"this run has {key}={value}"
                )
        return payload

    def restore_latest(self, rank: int | None = None, world_size: int | None = None) -> Path | None:
        """Load the newest checkpoint into every stateful piece and this rank's RNGs, if any.

        Rank 0 alone decides which checkpoint that is, or with none, `fresh_start` (which other
        config's checkpoints this run does not resume from, and why), and tells every rank (a
        collective over `dims` when it has more than one rank): ranks that listed the folder
        themselves could pick different steps while rank 0 writes, or read folders that rank 0
        is pruning. `rank` and `world_size` (whose RNG state to restore) default to `dims`'s,
        or 0 and 1 without it.
        """
        if rank is None:
            rank = self.dims.rank if self.dims is not None else 0
        if world_size is None:
            world_size = self.dims.world_size if self.dims is not None else 1
        decision = [self._decide() if rank == 0 or not self.collective else None]
        if self.collective:
            assert self.dims is not None
            dist.broadcast_object_list(decision, src=0, group=self.dims.world_group)
        path, self.fresh_start = decision[0]
        if path is None:
            return None
        payload = self.load(path)
        if payload.get("per_data_rank"):  # a rank pages in its own data rank's file only
            own_path = self.own_path_for(payload["step"], self._own_writer()[0])
            payload.update(torch.load(own_path, map_location="cpu", weights_only=True, mmap=True))
        for name, obj in self.stateful.items():
            obj.load_state_dict(payload[name])
        if _SPATIAL_RNG in payload:  # a mesh's checkpoint: my spatial group's states
            per_rank, rank = payload[_SPATIAL_RNG], self._axis_rank("spatial")
            world_size = len(per_rank) if self.dims is None else self.dims.spatial
        else:
            per_rank = payload["rng_per_rank"]
        if len(per_rank) != world_size and rank == 0:
            # The data-parallel size is an invariant, so this is a change of the other axes:
            # the model state is the same, but the random streams cannot be split anew.
            log.warning(
                "%s: saved by %d ranks, resumed by %d: %s",
                path,
                len(per_rank),
                world_size,
                f"ranks {len(per_rank)}..{world_size - 1} take rank 0's RNG state"
                if world_size > len(per_rank)
                else f"the RNG states of ranks {world_size}..{len(per_rank) - 1} are dropped",
            )
        restore_rng_state(per_rank[rank] if rank < len(per_rank) else per_rank[0])
        return path

    def _decide(self) -> tuple[Path | None, FreshStart | None]:
        path = self.latest()
        return (path, None) if path is not None else (None, self._fresh_start())

    def other_folders(self) -> list[Path]:
        """Checkpoint folders of other configs beside this one, newest checkpoint first."""
        root = self.folder.parent
        if not root.is_dir():
            return []
        found = []
        for d in root.iterdir():
            if d == self.folder or not d.is_dir() or not _FOLDER_NAME.match(d.name):
                continue
            steps = [p for p in d.iterdir() if _NAME.match(p.name)]
            if steps:
                found.append((max(p.stat().st_mtime for p in steps), d))
        return [d for _, d in sorted(found, reverse=True)]

    def _fresh_start(self) -> FreshStart | None:
        others = self.other_folders()
        if not others:
            return None
        previous = others[0]
        identity_path = previous / IDENTITY_FILE
        changed = None
        if identity_path.is_file() and self.identity is not None:
            changed = diff_values(json.loads(identity_path.read_text()), self.identity)
        return FreshStart(folder=self.folder, previous=previous, changed=changed)

    def prune_other_folders(self, keep: int | None) -> list[Path]:
        """Rank 0: delete the checkpoint folders of other configs beyond the `keep` newest
        (None = keep all); only folders that hold nothing but checkpoints. Returns the deleted.

        Every rank calls it after its restore: a barrier, so no rank still reads what goes."""
        if keep is None:
            return []
        if self.dims is not None:
            self.dims.barrier()
        if not self.is_main:
            return []
        deleted = []
        for folder in self.other_folders()[keep:]:
            names = [p.name for p in folder.iterdir()]
            if all(_STEP_FILE.match(n) or n == IDENTITY_FILE or n.endswith(".tmp") for n in names):
                shutil.rmtree(folder)
                deleted.append(folder)
                log.info(
                    "deleted old checkpoint folder %s (train.keep_old_checkpoint_folders)", folder
                )
        return deleted
