"""How faithful the emulated links are: per rate and message size, the time a TCP message takes
after an idle gap (sender's first byte to receiver's last) against the wire's size*8/rate.

Each rate gets its own 2-node network (`cosmocub.netemu.emulated_nodes`); every size is sent
`--repeats` times (sizes interleaved) by `cosmocub.netemu.linkprobe.time_messages`, the probe the
link test uses. Prints `uptime` before and after (the load the figures were taken at) and one
markdown row per rate and size: the median time, the ideal, their ratio (goal: within +-15 %) and
the range of the ratio over the repetitions. Needs root (network namespaces); prints one line and
exits otherwise.

    python benchmarks/bench_links.py --rates 10 100 1000 --repeats 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

from cosmocub.netemu import EmulationUnavailableError, emulated_nodes
from cosmocub.netemu.linkprobe import ideal_seconds, time_messages
from cosmocub.netemu.namespaces import check_privileges

KIB = 1024
SIZES = [16 * KIB, 64 * KIB, 256 * KIB, 1024 * KIB, 4096 * KIB]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="bytes")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gap-s", type=float, default=0.25)
    args = parser.parse_args()
    try:
        check_privileges()
    except EmulationUnavailableError as err:
        print(f"bench_links skipped: {err}")
        sys.exit(0)
    print(f"before: {uptime()}")
    print(f"{args.repeats} repetitions per size, each after {args.gap_s * 1e3:.0f} ms idle\n")
    print("| Mbit/s | size | median ms | ideal ms | ratio | ratio range |")
    print("|---|---|---|---|---|---|")
    for rate in args.rates:
        with emulated_nodes(nodes=2, rate_mbit=rate, prefix="ccubl-") as net:
            crossings = time_messages(net, sizes=args.sizes, repeats=args.repeats, gap_s=args.gap_s)
        for size in args.sizes:
            ratios = sorted(c.ratio for c in crossings if c.size_bytes == size)
            median_s = statistics.median(c.seconds for c in crossings if c.size_bytes == size)
            ideal_s = ideal_seconds(size, rate)
            print(
                f"| {rate:g} | {size // KIB} KiB | {median_s * 1e3:.2f} | {ideal_s * 1e3:.2f} "
                f"| {median_s / ideal_s:.3f} | {ratios[0]:.3f}-{ratios[-1]:.3f} |",
                flush=True,
            )
    print(f"\nafter: {uptime()}")


if __name__ == "__main__":
    main()
