"""LionCub's checkpoint over 4 gloo ranks through the trainer's CheckpointManager: no rank
allocates more than its own momentum (one row) plus a bounded buffer, saving or resuming, and the
resumed run goes on bit for bit. The same spawn checks the levels warning and parameters().
At one process: each data rank's file is pruned with its checkpoint and read on resume."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.optim import LionCub, LionCubSettings
from cosmocub.train.checkpoint import CheckpointManager

PROGRAM = r'''
import sys, warnings
from pathlib import Path
import torch, torch.distributed as dist
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from cosmocub.optim import LionCub, LionCubSettings
from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
from cosmocub.train.checkpoint import CheckpointManager

class NewStorageBytes(TorchDispatchMode):
    """Bytes of every tensor storage an aten op returns that none of its inputs had, each
    counted once: what this rank allocates (a gather's receive buffer, a copy, a file's tensors
    as torch.load maps them), not the views it takes of what it already holds."""
    def __init__(self):
        super().__init__()
        self.bytes, self.seen = 0, set()
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        ins = {t.untyped_storage().data_ptr()
               for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                key = (storage.data_ptr(), storage.nbytes())
                if key[0] not in ins and key not in self.seen:
                    self.seen.add(key)
                    self.bytes += key[1]
        return out

folder = Path(sys.argv[1])
dims = build_parallel_dims(backend="gloo")
rank, D, data = dims.rank, dims.data, dims.group("data")

def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.Tanh(), nn.Linear(1024, 512))
    settings = LionCubSettings(lr=1e-3, quantizer="l1", bits=4, momentum_sync="every",
                               sync_every=4)
    opt = LionCub(model.parameters(), settings, group=data)
    manager = CheckpointManager(folder, config_hash="0" * 12, stateful={"optimizer": opt},
                                dims=dims)
    return model, opt, manager

def train(model, opt, steps):
    for step in steps:
        gen = torch.Generator().manual_seed(100 * rank + step)
        x = torch.randn(8, 512, generator=gen)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), x.flip(1)).backward()
        opt.step()

model, opt, manager = build()
row = sum(p.numel() * p.element_size() for p in model.parameters())  # one rank's momentum
train(model, opt, range(6))  # step 6: two local steps after the sync at 4, momenta differ
with NewStorageBytes() as saved:
    manager.save(6)
if rank == 0:
    torch.save(model.state_dict(), folder / "model.pt")
dist.barrier()
train(model, opt, range(6, 10))  # the run that goes on

resumed_model, resumed_opt, resumed_manager = build()
resumed_model.load_state_dict(torch.load(folder / "model.pt", weights_only=True))
with NewStorageBytes() as loaded:
    resumed_manager.restore_latest()
train(resumed_model, resumed_opt, range(6, 10))
for a, b in zip(model.parameters(), resumed_model.parameters()):
    assert torch.equal(a, b), "the resumed run departs"
for a, b in zip(opt.buckets, resumed_opt.buckets):
    assert torch.equal(a.momentum, b.momentum), "the resumed momenta depart"
# parameters(), trained over the group on each rank's own batches: the same on every rank.
mine = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
everyone = [torch.empty_like(mine) for _ in range(D)]
dist.all_gather(everyone, mine, group=data)
assert all(torch.equal(everyone[0], x) for x in everyone)
assert not torch.equal(mine, torch.cat([p.reshape(-1) for p in build()[0].parameters()]))

# Another data rank's file (a restart that picked the wrong one) is refused, not loaded.
other = (rank + 1) % D
state = torch.load(folder / f"step_00000006.data_rank_{other:05d}.pt", weights_only=True)
try:
    resumed_opt.load_state_dict(state["optimizer"])
except ValueError as err:
    assert f"state of data rank {other} loaded on data rank {rank} of {D}" in str(err), err
else:
    raise AssertionError("another data rank's momentum was loaded")

# The counter sees what the gather that state_dict used to make allocates on rank 0: D rows.
flat = torch.cat([b.momentum for b in opt.buckets])
with NewStorageBytes() as gathered:
    rows = flat.new_empty(D, flat.numel()) if rank == 0 else None
    dist.gather(flat, list(rows.unbind(0)) if rank == 0 else None, group=data, group_dst=0)
if rank == 0:
    assert gathered.bytes >= D * row, (gathered.bytes, D * row)
    files = sorted(p.name for p in folder.iterdir())
    assert files == ["model.pt", "step_00000006.data_rank_00000.pt",
                     "step_00000006.data_rank_00001.pt", "step_00000006.data_rank_00002.pt",
                     "step_00000006.data_rank_00003.pt", "step_00000006.pt"], files
    main = (folder / "step_00000006.pt").stat().st_size
    assert main < row / 4, main  # the checkpoint itself holds no momentum

# Levels: an 8-bit l1 quantizer over an int8 all-reduce of D ranks keeps floor(127/D).
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    shrunk = LionCub(model.parameters(),
                     LionCubSettings(quantizer="l1", bits=8, collective="allreduce"), group=data)
assert shrunk.levels_in_use == 127 // D == 31
(warning,) = [str(w.message) for w in caught]
assert f"asks for 127 levels, keeps 31: an int8 all-reduce over {D} data ranks" in warning

print(f"rank {rank}: row {row} saved {saved.bytes} loaded {loaded.bytes} "
      f"gathered {gathered.bytes}", flush=True)
close_parallel_dims(dims)
'''


def test_each_data_rank_file_goes_with_its_checkpoint(tmp_path: Path) -> None:
    """One process: step_<n>.data_rank_00000.pt beside step_<n>.pt, pruned with it (and an
    orphan of a save that died before its checkpoint), and the one a resume reads."""
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    opt = LionCub(model.parameters(), LionCubSettings(lr=0.01), group=None)
    folder = tmp_path / "0123456789ab"
    manager = CheckpointManager(folder, config_hash="0" * 12, stateful={"optimizer": opt}, keep=2)
    (folder / "step_00000009.data_rank_00000.pt").parent.mkdir(parents=True)
    (folder / "step_00000009.data_rank_00000.pt").write_bytes(b"")  # no step_00000009.pt
    for step in range(1, 5):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        manager.save(step)
    assert sorted(p.name for p in folder.iterdir()) == [
        "step_00000003.data_rank_00000.pt",
        "step_00000003.pt",
        "step_00000004.data_rank_00000.pt",
        "step_00000004.pt",
    ]
    assert "optimizer" not in torch.load(folder / "step_00000004.pt", weights_only=True)
    fresh = LionCub(nn.Linear(4, 3).parameters(), LionCubSettings(lr=0.01), group=None)
    CheckpointManager(folder, config_hash="0" * 12, stateful={"optimizer": fresh}).restore_latest()
    assert fresh.step_count == 4
    assert torch.equal(fresh.buckets[0].momentum, opt.buckets[0].momentum)
    # A newer config's folder beside it: the old one, data rank files and all, is deleted.
    newer = CheckpointManager(tmp_path / "ba9876543210", config_hash="1" * 12, stateful={})
    newer.save(1)
    assert newer.prune_other_folders(0) == [folder] and not folder.exists()


LINE = re.compile(r"rank (\d): row (\d+) saved (\d+) loaded (\d+) gathered (\d+)")
BUFFER = 256 * 1024  # RNG states and pickled objects that every checkpoint gathers


@pytest.mark.slow
def test_no_rank_holds_more_than_its_own_momentum_and_resume_is_exact(tmp_path: Path) -> None:
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    argv = torchrun_argv(4, str(program), str(tmp_path / "checkpoints"))
    proc = multirank.run_ranks(argv, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = {int(m[1]): tuple(map(int, m.groups()[1:])) for m in LINE.finditer(proc.stdout)}
    assert sorted(found) == [0, 1, 2, 3], proc.stdout
    for rank, (row, saved, loaded, gathered) in found.items():
        assert row == 4 * (512 * 1024 + 1024 + 1024 * 512 + 512)  # 4.2 MB of fp32 momentum
        # Saving: views of the momentum, nothing allocated; resuming: this rank's file only.
        assert saved <= BUFFER, (rank, saved)
        assert loaded <= row + BUFFER, (rank, loaded)
        if rank == 0:  # what the gather onto rank 0 allocated: the bound would have caught it
            assert gathered >= 4 * row > row + BUFFER
