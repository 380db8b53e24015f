"""The allocator setting training and the calibration run with (cosmocub.host_memory): a step's
tensors of 32 MiB or more come from the heap and are reused, not mapped and faulted in again
every step."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# A step's 64 MiB activation (past glibc's 32 MiB mmap ceiling), allocated, written and freed,
# ten times: prints whether it lay in the heap and the minor page faults of each step.
STEPS = """
import json, resource, sys, torch
from cosmocub.host_memory import keep_freed_memory
torch.set_num_threads(1)  # as a rank of one thread (each of torch's threads has its own arena)
if sys.argv[1] == "keep":
    keep_freed_memory()
faults, in_heap = [], []
for _ in range(10):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.ones(16 * 2**20)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    heap = [l.split()[0].split("-") for l in open("/proc/self/maps") if "[heap]" in l]
    in_heap.append(any(int(a, 16) <= x.data_ptr() < int(b, 16) for a, b in heap))
    del x
print(json.dumps({"faults": faults, "in_heap": in_heap}))
"""
PAGES_64_MIB = 64 * 2**20 // 4096


def _steps(setting: str) -> dict[str, list]:
    out = subprocess.run(
        [sys.executable, "-c", STEPS, setting], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_kept_memory_is_reused_not_mapped_and_faulted_in_every_step() -> None:
    plain, kept = _steps("plain"), _steps("keep")
    # glibc's default: a mapping of its own every step, every page faulted in again.
    assert not any(plain["in_heap"])
    assert min(plain["faults"]) > 0.9 * PAGES_64_MIB
    # Kept: the heap, whose pages the next step reuses. Not every step is free of faults here
    # (0-13k a step over runs: the heap's first steps grow it, and this VM's kernel runs DAMON's
    # pageout, the likely cause of the rest), so the fewest is asked.
    assert all(kept["in_heap"])
    assert min(kept["faults"][1:]) < 0.05 * PAGES_64_MIB
