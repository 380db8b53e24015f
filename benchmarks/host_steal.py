"""Is this machine quiet enough to time on? The load average sees only this machine's processes;
on a virtual machine the host's other guests also take its cores away (steal), which slows every
step while the load average and the ready share stay as on a quiet machine. This keeps every core
busy for a few seconds (one spinning process per core: steal accrues only while a core has work)
and prints, per core and in all, the share of the busy time the hypervisor gave to others, from
/proc/stat (cosmocub.contention.probes, the same reading the studies' `steal_share` takes), with the
load before and after. Run it right before a measurement; the studies mark a point contended
above `studies.contended_steal_share` (0.1).

    python benchmarks/host_steal.py --seconds 5
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time
from pathlib import Path

from cosmocub.contention.probes import PROC_STAT, parse_proc_stat, steal_share


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _ticks(cpus: list[int]) -> dict[int, tuple[int, int]]:
    text = Path(PROC_STAT).read_text()
    return {cpu: parse_proc_stat(text, {cpu}) for cpu in cpus}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each core spins")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}; cores {cpus}")
    start = _ticks(cpus)
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=_spin, args=(args.seconds,)) for _ in cpus]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    end = _ticks(cpus)
    print(f"{'core':>6} {'busy ticks':>11} {'stolen':>8} {'steal share':>12}")
    total_busy = total_stolen = 0
    for cpu in cpus:
        busy, stolen = (b - a for a, b in zip(start[cpu], end[cpu], strict=True))
        total_busy, total_stolen = total_busy + busy, total_stolen + stolen
        print(f"{cpu:>6} {busy:>11} {stolen:>8} {steal_share(busy, stolen):>12.3f}")
    share = steal_share(total_busy, total_stolen)
    print(f"{'all':>6} {total_busy:>11} {total_stolen:>8} {share:>12.3f}")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
