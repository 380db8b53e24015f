"""Data × spatial against data alone, per optimizer: per-epoch losses and their largest relative
difference, with a control that changes nothing but the fp32 summation order (issue 15's table).

  A  data 2 × spatial 1 (2 ranks)
  B  data 2 × spatial 2 (4 ranks, each sample split along D)
  C  A again with the convolutions in contiguous (NCDHW) memory instead of channels_last_3d (what
     an unsplit CPU run uses, `models/memory_layout.memory_format`): the same math in another
     fp32 order.
If B departs from A as far as C does, the departure is fp32 rounding that the optimizer's
discrete steps amplify, not something the hybrid mesh computes differently
(docs/lion_cub_hybrid.md). "Same weights through" is the last step after which two runs'
parameters were still equal bit for bit (a digest of every parameter after every step).
Deterministic, batch norm on, no augmentation, random shards of --size³ samples; every run of
a mesh trains in one torchrun spawn (gloo, CPU).

    python benchmarks/bench_hybrid_lion_cub.py                 # 3 epochs, 16³, 8 steps an epoch
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cosmocub.io import read_jsonl
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv

LION_CUB_L1 = {"quantizer": "l1", "bits": 4, "collective": "allreduce"}
ROWS: dict[str, dict[str, Any]] = {
    "adamw": {"name": "adamw", "lr": 0.0003},
    "lion (DDP)": {"name": "lion", "lr": 0.0001},
    "lion_cub sign, alltoall": {
        "name": "lion_cub",
        "lr": 0.0001,
        "lion_cub": {"quantizer": "sign", "collective": "alltoall"},
    },
    "lion_cub l1 4-bit, allreduce": {"name": "lion_cub", "lr": 0.0001, "lion_cub": LION_CUB_L1},
    "lion_cub l1 4-bit, allreduce, sync every 5": {
        "name": "lion_cub",
        "lr": 0.0001,
        "lion_cub": {**LION_CUB_L1, "momentum_sync": {"schedule": "every", "every_steps": 5}},
    },
}
MESHES = {"A": (2, 1), "B": (4, 2), "C": (2, 1)}  # name: (ranks, spatial)


def _rank_main(args: argparse.Namespace) -> None:
    import torch

    from cosmocub.models import memory_layout
    from cosmocub.parallel.parallel_dims import build_parallel_dims
    from cosmocub.train.testing import train_runs

    if args.contiguous:
        memory_layout.memory_format = lambda device, spatial=1: torch.contiguous_format
    dims = build_parallel_dims()
    digests: dict[str, list[str]] = {}  # run: parameter digest after every step

    def begin(run: dict) -> None:
        digests[run["name"]] = []

    def digest(step: int, model: torch.nn.Module) -> None:
        h = hashlib.sha1()
        for p in model.parameters():
            h.update(p.detach().cpu().numpy().tobytes())
        digests[next(reversed(digests))].append(h.hexdigest())

    summaries = train_runs(args.rank_manifest, before_run=begin, on_step_end=digest)
    for name, summary in summaries.items():
        summary["param_digests"] = digests[name]
    if dims.is_main:
        Path(args.rank_out).write_text(json.dumps(summaries))
    torch.distributed.destroy_process_group()


def _config(args: argparse.Namespace, optimizer: dict, spatial: int) -> dict[str, Any]:
    return {
        "seed": 0,
        "preprocess": {"sample_size": args.size},
        "model": {
            "input_size": args.size,
            "base_filters": args.filters,
            "num_conv_blocks": args.blocks,
            "dense_sizes": [128, 64],
            "batch_norm": True,
            "dropout": 0.0,
        },
        "parallel": {"spatial": spatial},
        "optimizer": {**optimizer, "base_batch_size": 4, "warmup_epochs": 0},
        "train": {
            "epochs": args.epochs,
            "local_batch_size": 2,
            "augment": False,
            "deterministic": True,
            "threads_per_rank": 1,
            "checkpoint_every_steps": 10_000,
            "log_every_steps": 10_000,
        },
        "tracking": {"enabled": False},
    }


def _spawn(args: argparse.Namespace, work: Path, mesh: str, shards: Path) -> dict[str, Any]:
    ranks, spatial = MESHES[mesh]
    runs = []
    for i, (label, optimizer) in enumerate(ROWS.items()):
        config = work / mesh / f"row{i}.yaml"
        config.parent.mkdir(parents=True, exist_ok=True)
        config.write_text(yaml.safe_dump(_config(args, optimizer, spatial)))
        runs.append({"name": label, "config": str(config), "run_dir": str(config.with_suffix(""))})
    manifest = work / f"{mesh}.json"
    manifest.write_text(json.dumps({"shards": str(shards), "runs": runs}))
    out = work / f"{mesh}-summaries.json"
    argv = torchrun_argv(
        ranks, __file__, "--rank-manifest", str(manifest), "--rank-out", str(out),
        *(["--contiguous"] if mesh == "C" else []),
    )  # fmt: skip
    try:
        proc = multirank.run_ranks(argv, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"mesh {mesh}: no result within {args.timeout} s")
    if proc.returncode != 0:
        sys.exit(f"mesh {mesh} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    summaries = json.loads(out.read_text())
    return {
        label: (Path(run["run_dir"]), summaries[label])
        for label, run in zip(ROWS, runs, strict=True)
    }


def _losses(run: Path) -> list[dict[str, float]]:
    return read_jsonl(run / "metrics.jsonl")


def same_through(a: list[str], b: list[str]) -> str:
    """The last step after which both runs' parameters were equal bit for bit."""
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        if x != y:
            return str(step)  # steps count from 1: `step` is the last equal one
    return f"{len(a)} (all)"


def max_rel(a: list[dict], b: list[dict]) -> float:
    keys = ("train_loss", "val_loss")
    return max(abs(y[k] - x[k]) / abs(x[k]) for x, y in zip(a, b, strict=True) for k in keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size", type=int, default=16, help="sample voxels per side")
    parser.add_argument("--filters", type=int, default=16, help="base filters of the model")
    parser.add_argument("--blocks", type=int, default=3, help="conv blocks of the model")
    parser.add_argument("--train-samples", type=int, default=32, help="8 steps an epoch")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--rank-manifest", help=argparse.SUPPRESS)
    parser.add_argument("--rank-out", help=argparse.SUPPRESS)
    parser.add_argument("--contiguous", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_manifest:
        _rank_main(args)
        return
    from cosmocub.train.testing import make_random_shards

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        counts = {"train": args.train_samples, "val": 8}
        shards = make_random_shards(work / "shards", counts=counts, size=args.size)
        runs = {mesh: _spawn(args, work, mesh, shards) for mesh in MESHES}
        losses = {m: {row: _losses(r) for row, (r, _) in rs.items()} for m, rs in runs.items()}
    digests = {m: {row: s["param_digests"] for row, (_, s) in rs.items()} for m, rs in runs.items()}
    print(
        f"\n{args.epochs} epochs, {args.size}³ samples, {args.train_samples} training samples, "
        f"global batch 4, filters {args.filters}, {args.blocks} blocks, batch norm, deterministic"
    )
    print(
        "\n| optimizer | B vs A | C vs A (order only) | B vs C | same weights through: "
        "B, A | C, A | B, C |"
    )
    print("|---|---|---|---|---|---|---|")
    for row in ROWS:
        a, b, c = (losses[m][row] for m in "ABC")
        da, db, dc = (digests[m][row] for m in "ABC")
        print(
            f"| {row} | {max_rel(a, b):.1e} | {max_rel(a, c):.1e} | {max_rel(c, b):.1e} | "
            f"{same_through(db, da)} | {same_through(dc, da)} | {same_through(db, dc)} |"
        )
    print("\nval_loss per epoch (A / B / C)")
    for row in ROWS:
        values = zip(*(losses[m][row] for m in "ABC"), strict=True)
        print(
            f"  {row}: " + "; ".join(" / ".join(f"{r['val_loss']:.5f}" for r in e) for e in values)
        )
    final_b = losses["B"][next(iter(ROWS))][-1]
    print(
        f"\nB per rank and step: halo {final_b['halo_bytes_per_step']:.0f} B in "
        f"{final_b['time_halo_s'] * 1e3:.2f} ms; gradient/update exchange "
        f"{final_b['comm_bytes_per_step']:.0f} B"
    )


if __name__ == "__main__":
    main()
