"""What the machine gave each rank during an epoch's steps: CPU time beside wall time, threads,
cores, time waiting for a core, time the hypervisor took, the load average and involuntary
switches, reduced over ranks.

cpu_share = CPU time (user + sys, every thread) / (wall × min(torch threads, cores granted)): how
much of the CPU its wall time allows a rank used. It also falls when a rank waits for its peers
(a slow link, a straggler), so it cannot tell a busy machine from a slow network.
ready_share = time its threads ran / (ran + waited runnable for a core) from the scheduler's own
per-thread counters (/proc/self/task/*/schedstat): a blocked wait counts in neither, so only
other processes on the same cores lower it.
steal_share = time the hypervisor ran other guests while this rank's cores had work / (that +
their busy time), from /proc/stat's per-CPU steal column over the cores the rank may run on: on a
virtual machine the host's other tenants take cores away unseen by the guest's scheduler, so
ready_share and the load average stay as on a quiet machine while the steps slow (seen here: 29 %
of the busy time stolen during a network point whose compute took 2.4x its quiet time, 1-3 % in
quiet spells). The studies mark a point contended on either share (`contended` in points.tsv,
filtered by cosmocub.contention.marks). Pure: the studies and the Snakefile
read these without torch (contention/meter.py measures); the readings of the
kernel's counters are cosmocub.contention.probes's.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cosmocub.contention.probes import read_core_ticks, read_sched_ns, steal_between

# One rank's numbers in the order all_gather sends them.
RANK_FIELDS = (
    "cpu_s",
    "wall_s",
    "cpu_share",
    "ready_share",
    "nivcsw",
    "steal_share",
    "load_1m_start",
    "load_1m_end",
    "torch_threads",
    "cores_granted",
)


@dataclass(frozen=True, kw_only=True)
class Sample:
    """One rank at one instant."""

    wall_s: float
    cpu_s: float  # user + sys of every thread of this process
    nivcsw: int
    load_1m: float
    # thread id -> (ns on a core, ns runnable waiting for one); None where the kernel has none.
    sched_ns: Mapping[int, tuple[int, int]] | None
    # (busy, stolen) clock ticks summed over the cores this rank may run on; None without them.
    core_ticks: tuple[int, int] | None = None


def take_sample() -> Sample:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return Sample(
        wall_s=time.perf_counter(),
        cpu_s=usage.ru_utime + usage.ru_stime,
        nivcsw=usage.ru_nivcsw,
        load_1m=os.getloadavg()[0],
        sched_ns=read_sched_ns(),
        core_ticks=read_core_ticks(),
    )


def cpu_share(cpu_s: float, wall_s: float, *, threads: int, cores: int) -> float:
    """CPU time over what the wall time allows: wall × min(threads, cores)."""
    allowed = wall_s * min(threads, cores)
    if allowed <= 0:
        raise ValueError(f"cpu share: wall {wall_s} s × min({threads} threads, {cores} cores)")
    return cpu_s / allowed


def ready_share(ran_s: float, waited_s: float) -> float:
    """Share of the runnable time its threads got a core (1: never waited for one)."""
    total = ran_s + waited_s
    return ran_s / total if total > 0 else 1.0


def sched_delta_s(start: Sample, end: Sample) -> tuple[float, float] | None:
    """(ran, waited) seconds between the samples, over the threads alive at the end (a thread
    started in between counts from zero; one that ended takes its counts with it)."""
    if start.sched_ns is None or end.sched_ns is None:
        return None
    ran = waited = 0
    for tid, (r, w) in end.sched_ns.items():
        r0, w0 = start.sched_ns.get(tid, (0, 0))
        ran, waited = ran + r - r0, waited + w - w0
    return ran / 1e9, waited / 1e9


def rank_conditions(start: Sample, end: Sample, *, threads: int, cores: int) -> dict[str, float]:
    """One rank's numbers between two samples (ready_share NaN without schedstat, steal_share
    without /proc/stat)."""
    wall, cpu = end.wall_s - start.wall_s, end.cpu_s - start.cpu_s
    sched = sched_delta_s(start, end)
    return {
        "cpu_s": cpu,
        "wall_s": wall,
        "cpu_share": cpu_share(cpu, wall, threads=threads, cores=cores),
        "ready_share": ready_share(*sched) if sched else math.nan,
        "nivcsw": float(end.nivcsw - start.nivcsw),
        "steal_share": steal_between(start.core_ticks, end.core_ticks),
        "load_1m_start": start.load_1m,
        "load_1m_end": end.load_1m,
        "torch_threads": float(threads),
        "cores_granted": float(cores),
    }


def reduce_over_ranks(ranks: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """The epoch's record: the worst-served rank's shares, the sum of switches, the mean CPU
    time, the longest wall, the highest load seen; ready_share and steal_share (the most stolen
    rank's) absent if a rank had none."""
    out = {
        "cpu_s": sum(r["cpu_s"] for r in ranks) / len(ranks),
        "wall_s": max(r["wall_s"] for r in ranks),
        "cpu_share": min(r["cpu_share"] for r in ranks),
        "nivcsw": sum(r["nivcsw"] for r in ranks),
        "load_1m_start": max(r["load_1m_start"] for r in ranks),
        "load_1m_end": max(r["load_1m_end"] for r in ranks),
        "torch_threads": max(r["torch_threads"] for r in ranks),
        "cores_granted": min(r["cores_granted"] for r in ranks),
    }
    ready = [r["ready_share"] for r in ranks]
    if all(math.isfinite(v) for v in ready):
        out["ready_share"] = min(ready)
    steal = [r.get("steal_share", math.nan) for r in ranks]
    if all(math.isfinite(v) for v in steal):
        out["steal_share"] = max(steal)
    return out
