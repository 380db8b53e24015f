"""The pooled branch (model.pooled) against the plain head, briefly, on validation only: small
synthetic universes, one recipe and seed trained with and without the branch (why_cnn_vs_pk.py's
variants base, pooled, pooled_last_hidden), validation MAE per parameter per crop and per
universe beside the ridge baselines, with the load average before and after.

So few universes on a shared machine decide nothing: this checks that the branch trains and
shows the size of the differences; the universes study chooses on validation.

    python benchmarks/bench_pooled_head.py --out /tmp/pooled --universes 40 --epochs 20
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import why_cnn_vs_pk

from cosmocub.config import load_config
from cosmocub.data.simulate import run_simulate


def bench_config(args: argparse.Namespace) -> dict:
    """A small recipe: crops of `--crop`³ from `--size`³ universes, no test split (not used)."""
    return {
        "results": str(args.out / "results"),
        "seed": args.seed,
        "universes": {"source": "synthetic", "count": args.universes, "size": args.size},
        "preprocess": {
            "sample_size": args.crop,
            "slab_depth": 4,
            "splits": {"train": 0.6, "val": 0.4, "test": 0.0},
        },
        "model": {
            "input_size": args.crop,
            "base_filters": 8,
            "num_conv_blocks": 3,
            "dense_sizes": [64],
            "batch_norm": True,
            "dropout": 0.0,
        },
        "optimizer": {
            "name": "adamw",
            "lr": 0.001,
            "base_batch_size": 8,
            "warmup_epochs": 1,
            "decay_epochs": [max(2, args.epochs * 3 // 4)],
            "decay_factors": [0.25],
        },
        "train": {"epochs": args.epochs, "local_batch_size": 8, "augment": True},
        "evaluate": {"symmetries": 8},
        "tracking": {"enabled": False},
    }


def make_shards(args: argparse.Namespace, config_path: Path) -> Path:
    """Simulate the universes (seeds seed·1000 + i) and crop them, unless already there."""
    shards = args.out / "shards"
    if (shards / "val.h5").is_file():
        print(f"reusing {shards}", flush=True)
        return shards
    cfg = load_config(config_path)
    folder = args.out / "universes"
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    paths = []
    for i in range(args.universes):
        path = folder / f"universe_{i:04d}.hdf5"
        if not path.is_file():
            run_simulate(path, size=args.size, seed=args.seed * 1000 + i, settings=cfg.simulate)
        paths.append(str(path))
    print(f"{args.universes} universes in {time.perf_counter() - start:.0f} s", flush=True)
    cmd = ["cosmocub", "preprocess", "--config", str(config_path), "--out", str(shards), *paths]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return shards


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f} ({os.cpu_count()} cores, shared)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--universes", type=int, default=40)
    parser.add_argument("--size", type=int, default=32, help="voxels per universe side")
    parser.add_argument("--crop", type=int, default=16, help="voxels per crop side")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    config_path = args.out / "config.yaml"
    config_path.write_text(yaml.safe_dump(bench_config(args), sort_keys=False))
    shards = make_shards(args, config_path)
    print(f"before: {load_average()}", flush=True)
    start = time.perf_counter()
    variants = ["base", "pooled", "pooled_last_hidden"]
    runs = ["--config", str(config_path), "--shards", str(shards), "--out", str(args.out / "runs")]
    code = why_cnn_vs_pk.main([*runs, "--variants", *variants])
    print(f"after {time.perf_counter() - start:.0f} s: {load_average()}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
