"""The MLPerf HPC TFRecord folders as a source (universes.source mlperf), timed:

1. records checked a second by one worker (read, sha256, gunzip, both CRCs, decode and check
   x and y: data.mlperf.validate_group's work per record), on real files if given;
2. a folder of N small records (random counts, 8 crops a universe, 80 % train) through the
   workflow's commands one after another in this process: mlperf-group for every group, the
   plan, every preprocess group (crop, read back, features), the gather.

    python benchmarks/bench_mlperf.py --records ../shared/data/cosmoflow-real-samples
    python benchmarks/bench_mlperf.py --files 10000 --size 16
    python benchmarks/bench_mlperf.py --smoke

Full-size figures follow from these: records of 128³ are 512× the voxels of 16³ ones.
"""

from __future__ import annotations

import argparse
import gzip
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from cosmocub.cli import main as cosmocub
from cosmocub.data.mlperf import file_payloads
from cosmocub.data.tfrecord import decode_sample, encode_example, frame_record

# The workflow's preprocessing commands in order: the tests' fixture (tests/shard_fixtures.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from shard_fixtures import preprocess_stages


def check_rate(files: list[Path], repeat: int) -> tuple[int, float, int]:
    """(records, seconds, decoded bytes) of checking `files` `repeat` times, as a group job does."""
    import hashlib

    records = nbytes = 0
    t0 = time.perf_counter()
    for _ in range(repeat):
        for path in files:
            raw = path.read_bytes()
            hashlib.sha256(raw).hexdigest()
            for k, payload in enumerate(file_payloads(path, raw)):
                x, _ = decode_sample(path, k, payload)
                records += 1
                nbytes += x.nbytes
    return records, time.perf_counter() - t0, nbytes


def make_folder(root: Path, files: int, size: int) -> Path:
    rng = np.random.default_rng(0)
    for folder in ("train", "validation"):
        (root / folder).mkdir(parents=True)
    for i in range(files):
        universe, crop = divmod(i, 8)
        folder = "train" if universe % 5 else "validation"  # 80 % of the universes train
        x = rng.poisson(1.0, (size, size, size, 4)).astype(np.int16)
        y = rng.uniform(-1, 1, 4).astype(np.float32)
        name = root / folder / f"univ_ics_2019-03_a{10_000_000 + universe}_{crop:03d}.tfrecord"
        name.write_bytes(gzip.compress(frame_record(encode_example(x, y)), 6, mtime=0))
    return root


def run_folder(root: Path, work: Path, size: int, threads: int) -> list[tuple[str, float, int]]:
    work.mkdir(parents=True)
    config = work / "config.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "results": str(work / "results"),
                "tracking": {"enabled": False},
                "universes": {"source": "mlperf", "mlperf_dir": str(root)},
                "preprocess": {
                    "sample_size": size,
                    "slab_depth": min(size, 8),
                    "num_workers": threads,
                },
                "model": {"input_size": size, "num_conv_blocks": 2},
            }
        )
    )
    from cosmocub.config import load_config
    from cosmocub.data.mlperf import file_groups

    groups = len(file_groups(load_config(config)))
    common = ["--config", str(config)]
    universes = work / "universes"
    rows = []
    t0 = time.perf_counter()
    for g in range(groups):
        assert cosmocub(["mlperf-group", "--group", str(g), "--out", str(universes), *common]) == 0
    rows.append(("mlperf-group (check)", time.perf_counter() - t0, groups))
    t0 = time.perf_counter()
    for stage, jobs in preprocess_stages(config, universes, work, groups, threads=threads):
        label = stage + (" (crop, read back, features)" if stage == "preprocess-group" else "")
        rows.append((label, time.perf_counter() - t0, jobs))
        t0 = time.perf_counter()
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--records", type=Path, help="a folder of real .tfrecord files to check")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", type=int, default=10_000, help="files of the made folder")
    p.add_argument("--size", type=int, default=16, help="side of each made record")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--smoke", action="store_true")
    args = p.parse_args()
    if args.smoke:
        args.files, args.size, args.repeat, args.threads = 40, 8, 1, 1
    print(f"load {os.getloadavg()[0]:.2f} before")
    with tempfile.TemporaryDirectory(prefix="bench-mlperf-") as tmp:
        root = Path(tmp)
        made = make_folder(root / "mlperf", args.files, args.size)
        real = sorted(args.records.glob("*.tfrecord")) if args.records else []
        files = real or sorted(made.rglob("*.tfrecord"))[:50]
        records, seconds, nbytes = check_rate(files, args.repeat)
        side = round((nbytes / records / 8) ** (1 / 3))
        print(
            f"checked {records} records of {side}³ ({'real' if real else 'made'}): "
            f"{records / seconds:.1f} records/s a worker, {nbytes / seconds / 1e6:.0f} MB/s "
            f"decoded"
        )
        rows = run_folder(made, root / "work", args.size, args.threads)
    total = sum(s for _, s, _ in rows)
    print(f"\n{args.files:,} files of {args.size}³, {args.threads} threads")
    print(f"{'step':<48} {'jobs':>5} {'seconds':>8} {'files/s':>8}")
    for name, seconds, jobs in rows:
        print(f"{name:<48} {jobs:>5} {seconds:>8.1f} {args.files / seconds:>8.0f}")
    print(f"{'all':<48} {'':>5} {total:>8.1f} {args.files / total:>8.0f}")
    print(f"load {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
