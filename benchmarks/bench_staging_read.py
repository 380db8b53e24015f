"""One core's copy of one CosmoFlow sample (4 x 128^3 int16, 16.8 MB) out of a staging area:
a tmpfs (/dev/shm, where HPE+LBNL stage on Perlmutter) against a disk file system's page cache
(where NVIDIA stage on DGX nodes and HelmholtzAI on HoreKa). The MLPerf PyTorch submissions'
evaluation reads one such sample a step and the DALI reader maps the staged file
(`dont_use_mmap=False`), so the ratio of the two is the ratio of their evaluation steps where
the read is what paces them (perfmodel.cost_model.cluster_presets.TMPFS_READ_FACTOR).

    python benchmarks/bench_staging_read.py [--tmpfs /dev/shm] [--disk /tmp] [--reps 200]

Prints the median time a sample each way, their 10th-90th percentiles and the ratios, with the
load before and after (the figure is one core's; a busy machine lengthens both sides).
"""

from __future__ import annotations

import argparse
import mmap
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

SAMPLE_BYTES = 4 * 128**3 * 2


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _mmap_copy(path: Path, out: np.ndarray) -> float:
    fd = os.open(path, os.O_RDONLY)
    try:
        t = time.perf_counter()
        with mmap.mmap(fd, SAMPLE_BYTES, prot=mmap.PROT_READ) as m:
            out[:] = np.frombuffer(m, np.uint8)
        return time.perf_counter() - t
    finally:
        os.close(fd)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tmpfs", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--disk", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--reps", type=int, default=200)
    args = parser.parse_args()
    print(f"load before: {_load()}")
    rng = np.random.default_rng(0)
    out = np.empty(SAMPLE_BYTES, np.uint8)
    times: dict[tuple[str, str], list[float]] = {}
    with (
        tempfile.TemporaryDirectory(dir=args.tmpfs) as tdir,
        tempfile.TemporaryDirectory(dir=args.disk) as ddir,
    ):
        stores = {"tmpfs": Path(tdir), "page cache": Path(ddir)}
        for store in stores.values():
            for i in range(args.files):
                (store / f"s{i}").write_bytes(rng.integers(0, 255, SAMPLE_BYTES, np.uint8))
        for store in stores.values():  # into the page cache before timing
            for i in range(args.files):
                _mmap_copy(store / f"s{i}", out)
        for rep in range(args.reps):  # interleaved, so drift in load falls on both sides
            for name, store in stores.items():
                path = store / f"s{rep % args.files}"
                times.setdefault((name, "mmap"), []).append(_mmap_copy(path, out))
    medians = {}
    for (name, how), ts in sorted(times.items()):
        deciles = statistics.quantiles(ts, n=10)
        medians[name, how] = statistics.median(ts)
        print(
            f"{name:10s} {how}: {1e3 * medians[name, how]:.2f} ms a sample (10th-90th "
            f"{1e3 * deciles[0]:.2f}-{1e3 * deciles[-1]:.2f}), "
            f"{SAMPLE_BYTES / medians[name, how] / 1e9:.1f} GB/s"
        )
    ratio = medians["tmpfs", "mmap"] / medians["page cache", "mmap"]
    print(f"tmpfs / page cache: {ratio:.2f}x")
    print(f"load after: {_load()}; kernel {os.uname().release}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
