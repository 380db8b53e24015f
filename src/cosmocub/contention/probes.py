"""Probes of the machine a process runs on, read from the kernel's own counters: every thread's
time on a core and waiting for one (schedstat), and the busy and stolen ticks of the cores it may
run on (/proc/stat), for the training meter and the performance model's calibration alike.
"""

from __future__ import annotations

import math
import os
from collections.abc import Collection
from pathlib import Path

TASKS = Path("/proc/self/task")
PROC_STAT = Path("/proc/stat")


def parse_schedstat(text: str) -> tuple[int, int]:
    """A schedstat line "<ns on cpu> <ns waiting on a runqueue> <timeslices>" → the first two."""
    ran, waited, *_ = text.split()
    return int(ran), int(waited)


def read_sched_ns(tasks: Path = TASKS) -> dict[int, tuple[int, int]] | None:
    """Every thread's (ran, waited) nanoseconds; None when the kernel keeps no schedstat."""
    out = {}
    try:
        for task in tasks.iterdir():
            try:
                out[int(task.name)] = parse_schedstat((task / "schedstat").read_text())
            except FileNotFoundError:
                continue  # the thread ended while we looked
    except OSError:
        return None
    return out or None


def parse_proc_stat(text: str, cpus: Collection[int]) -> tuple[int, int]:
    """(busy, stolen) ticks of `cpus` from /proc/stat's "cpuN user nice system idle iowait irq
    softirq steal ..." lines: busy is user + nice + system + irq + softirq (guest time is inside
    user); a CPU the file lacks is an error."""
    busy = stolen = 0
    seen = set()
    for line in text.splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        cpu = int(name[3:])
        if cpu not in cpus:
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
        busy, stolen = busy + user + nice + system + irq + softirq, stolen + steal
        seen.add(cpu)
    if missing := sorted(set(cpus) - seen):
        raise ValueError(f"/proc/stat: no line for cpu {missing}")
    return busy, stolen


def read_core_ticks(path: Path = PROC_STAT) -> tuple[int, int] | None:
    """(busy, stolen) ticks of the cores this process may run on; None where there is no
    /proc/stat (or no affinity to read)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    try:
        return parse_proc_stat(path.read_text(), os.sched_getaffinity(0))
    except (OSError, ValueError):
        return None


def steal_share(busy: int, stolen: int) -> float:
    """Share of the time the cores had work that the hypervisor gave to others (0: none)."""
    total = busy + stolen
    return stolen / total if total > 0 else 0.0


# Fewer busy + stolen ticks than this between two readings read no steal share: /proc/stat counts
# in ticks of 1/USER_HZ (10 ms here), so over a short window a tick or two is already the 10 %
# threshold (seen: 0.16 and then 0.10 over two 0.2 s epochs of a test point whose ready share was
# 0.90-0.98; the next readings were 0.0). 100 ticks is a core-second: one tick is then 1 %.
STEAL_MIN_TICKS = 100


def steal_between(start: tuple[int, int] | None, end: tuple[int, int] | None) -> float:
    """steal_share between two read_core_ticks readings; NaN where either has none or the cores
    had fewer than STEAL_MIN_TICKS ticks of work between them (too short to read a share)."""
    if start is None or end is None:
        return math.nan
    busy, stolen = (b - a for a, b in zip(start, end, strict=True))
    if busy + stolen < STEAL_MIN_TICKS:
        return math.nan
    return steal_share(busy, stolen)
