"""Preprocess throughput (MB/s of input) beside a plain file copy of the same bytes, same disk.

Run: python benchmarks/bench_preprocess.py --size 256 --count 4 --dir /scratch/bench
Prints one table; the goal is preprocess >= half the copy's MB/s. Beside wall time it gives the
CPU seconds (all threads) and the MB/s the available cores would reach if the work were CPU-bound
and spread perfectly: a figure that a machine shared with other jobs does not distort. `--breakdown`
adds the CPU time of each per-block step on one 16.7 MB block.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from cosmocub.config import PreprocessConfig, SplitRatios
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.data.preprocess import preprocess
from cosmocub.data.universe import write_universe


def make_universes(folder: Path, *, size: int, count: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        counts = rng.poisson(1.0, size=(size, size, size, 4)).astype(np.int16)
        unit = rng.uniform(-1, 1, size=4).astype(np.float32)
        path = folder / f"univ_{i:03d}.hdf5"
        write_universe(
            path, counts, unit_par=unit, phys_par=phys_from_unit(unit), redshifts=[0, 0.5, 1.5, 3]
        )
        paths.append(path)
    return paths


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def time_copy(paths: list[Path], out: Path) -> tuple[float, float]:
    """(wall s, CPU s) of copying the files."""
    out.mkdir(parents=True, exist_ok=True)
    t0, c0 = time.perf_counter(), _cpu()
    for p in paths:
        shutil.copyfile(p, out / p.name)
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(out)
    return seconds, cpu


def time_preprocess(
    paths: list[Path], out: Path, settings: PreprocessConfig
) -> tuple[float, float]:
    """(wall s, CPU s of every thread) of preprocessing the files."""
    t0, c0 = time.perf_counter(), _cpu()
    preprocess(
        paths, out, settings=settings, seed=0, config_hash="bench", universes_per_job=len(paths)
    )
    seconds, cpu = time.perf_counter() - t0, _cpu() - c0
    shutil.rmtree(out)
    return seconds, cpu


def breakdown(size: int, sample_size: int, dtype: str) -> None:
    """CPU ms of each per-block step on one block as preprocess cuts a `size`³ universe."""
    from cosmocub.data.crop import BLOCK_BYTES, _to_values
    from cosmocub.data.universe import channel_histogram

    rng = np.random.default_rng(0)
    s = sample_size
    rows = max(1, min(size // s, BLOCK_BYTES // (s * s * size * 4 * 2)))  # as open_universes
    # Heavy-tailed counts like a synthetic universe's (mostly 0-3, a tail to thousands).
    block = np.minimum(rng.lognormal(-0.5, 1.3, (s, rows * s, size, 4)), 3000)
    block = block.astype(np.int16)
    values = _to_values(block, True, dtype)
    steps = {
        "log1p table lookup": lambda: _to_values(block, True, dtype),
        "train histogram": lambda: channel_histogram(block),
        "to chunk order (copy)": lambda: np.ascontiguousarray(values.transpose(1, 3, 0, 2)),
        "sha256 (side thread)": lambda: hashlib.sha256(memoryview(block)).digest(),
    }
    print(f"\nper-block CPU, one {block.nbytes / 1e6:.1f} MB block (thread CPU time, best of 7)")
    print(f"{'step':<26}{'ms':>8}")
    for name, step in steps.items():
        best = min(_thread_cpu(step) for _ in range(7))
        print(f"{name:<26}{best * 1e3:>8.1f}")


def _thread_cpu(step) -> float:
    t0 = time.thread_time()
    step()
    return time.thread_time() - t0


def drop_page_cache() -> None:
    """Flush dirty pages and drop the page cache, so the next run reads from the disk."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as err:
        raise SystemExit(
            f"--cold: cannot drop the page cache ({err}); run as root on Linux"
        ) from None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=128, help="universe voxels per side")
    parser.add_argument("--count", type=int, default=4, help="number of universes")
    parser.add_argument("--sample-size", type=int, default=32)
    parser.add_argument("--slab-depth", type=int, default=8)
    parser.add_argument("--dtype", choices=["float16", "float32"], default="float16")
    parser.add_argument("--workers", type=int, default=None, help="Dask threads (default: all)")
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--dir", type=Path, default=None, help="scratch folder on the disk to test")
    parser.add_argument("--breakdown", action="store_true", help="CPU time per step of one block")
    parser.add_argument(
        "--cold",
        action="store_true",
        help="drop the page cache before every timed run (Linux, root): read from the disk itself",
    )
    args = parser.parse_args()

    settings = PreprocessConfig(
        sample_size=args.sample_size,
        log1p=True,
        standardize=True,
        dtype=args.dtype,
        splits=SplitRatios(train=0.5, val=0.25, test=0.25),
        slab_depth=args.slab_depth,
        dask_scheduler=None,
        num_workers=args.workers,
    )
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench_preprocess_") as tmp:
        folder = Path(tmp)
        paths = make_universes(folder / "universes", size=args.size, count=args.count)
        megabytes = sum(p.stat().st_size for p in paths) / 1e6
        # Interleave the two so page-cache warmth and background load affect both alike.
        copy_runs, pre_runs = [], []
        for _ in range(args.repeat):
            if args.cold:
                drop_page_cache()
            copy_runs.append(time_copy(paths, folder / "copy"))
            if args.cold:
                drop_page_cache()
            pre_runs.append(time_preprocess(paths, folder / "shards", settings))
        cores = args.workers or len(os.sched_getaffinity(0))
        copy_s, copy_cpu = min(copy_runs)
        pre_s, pre_cpu = min(pre_runs)
        copy_rate, pre_rate = megabytes / copy_s, megabytes / pre_s
        cache = "dropped before each run" if args.cold else "warm"
        print(
            f"\n{args.count} universes of {args.size}^3 x 4 int16 ({megabytes:.0f} MB), "
            f"S={args.sample_size}, {args.dtype}, workers={args.workers or 'all'}, "
            f"best of {args.repeat}, page cache {cache}"
        )
        print(
            f"{'method':<22}{'seconds':>10}{'MB/s':>10}{'vs copy':>10}{'CPU s':>10}"
            f"{f'CPU-bound MB/s on {cores} cores':>32}"
        )
        print(
            f"{'shutil.copyfile':<22}{copy_s:>10.3f}{copy_rate:>10.0f}{1:>10.2f}{copy_cpu:>10.2f}"
            f"{'':>32}"
        )
        print(
            f"{'cosmocub preprocess':<22}{pre_s:>10.3f}{pre_rate:>10.0f}"
            f"{pre_rate / copy_rate:>10.2f}{pre_cpu:>10.2f}{cores * megabytes / pre_cpu:>32.0f}"
        )
    if args.breakdown:
        breakdown(args.size, args.sample_size, args.dtype)


if __name__ == "__main__":
    main()
