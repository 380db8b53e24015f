"""Lion vs Lion Cub (1-bit all-to-all) vs AdamW on emulated nodes at a few link rates.

Each point is one training run (`cosmocub.netemu.runner.run_training_on_nodes`) of a small
CosmoFlow on random 16³ shards; the table holds the last epoch's per-step means: the step
(compute + exchange + momentum sync), the exchange and its share of the step, the optimizer's
counted bytes and the interface's tx bytes per step (`wire_bytes_per_step`) and their ratio.
Needs root (network namespaces); prints one line and exits otherwise.

    python benchmarks/bench_network.py --nodes 2 --bandwidths 0 100 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import yaml

from cosmocub.netemu import EmulationUnavailableError
from cosmocub.netemu.namespaces import check_privileges
from cosmocub.netemu.runner import run_training_on_nodes
from cosmocub.train.testing import make_random_shards

VARIANTS = {
    "adamw": {"name": "adamw", "lr": 0.001},
    "lion": {"name": "lion", "lr": 0.0001},
    "lion_cub_1bit": {
        "name": "lion_cub",
        "lr": 0.0001,
        "lion_cub": {"quantizer": "sign", "collective": "alltoall"},
    },
}


def config(variant: str, *, size: int, filters: int, epochs: int) -> dict:
    return {
        "preprocess": {"sample_size": size},
        "model": {
            "input_size": size,
            "base_filters": filters,
            "num_conv_blocks": 2,
            "dense_sizes": [64],
            "batch_norm": False,
            "dropout": 0.0,
        },
        "optimizer": {
            **VARIANTS[variant],
            "base_batch_size": 4,
            "warmup_epochs": 0,
            "decay_epochs": [],
            "decay_factors": [],
        },
        "train": {
            "epochs": epochs,
            "local_batch_size": 2,
            "augment": False,
            "checkpoint_every_steps": 1000,
            "log_every_steps": 1000,
            "threads_per_rank": 1,
        },
        "tracking": {"enabled": False},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[0, 100, 10])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--size", type=int, default=16)
    parser.add_argument("--filters", type=int, default=8)
    parser.add_argument("--samples", type=int, default=32, help="training samples")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    try:
        check_privileges()
    except EmulationUnavailableError as err:
        print(f"emulated points skipped: {err}")
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_network_") as tmp:
        root = Path(tmp)
        shards = make_random_shards(
            root / "shards", counts={"train": args.samples, "val": 4}, size=args.size
        )
        rows = []
        for variant in args.variants:
            cfg = root / f"{variant}.yaml"
            values = config(variant, size=args.size, filters=args.filters, epochs=args.epochs)
            cfg.write_text(yaml.safe_dump(values))
            for mbit in args.bandwidths:
                result = run_training_on_nodes(
                    config_path=cfg,
                    shards_dir=shards,
                    out_dir=root / f"{variant}-{mbit:g}",
                    nodes=args.nodes,
                    ranks_per_node=1,
                    bandwidth_mbit=mbit,
                )
                if result.returncode != 0:
                    print(f"{variant} at {mbit:g} Mbit/s failed (exit {result.returncode}); "
                          f"see {result.logs[0]}", file=sys.stderr)  # fmt: skip
                    return 1
                last = result.metrics[-1]
                step = last["time_compute_s"] + last["time_exchange_s"]
                step += last["time_momentum_sync_s"]
                rows.append(
                    {
                        "variant": variant,
                        "mbit": mbit,
                        "cores_per_rank": result.cores_per_rank,
                        "step_s": step,
                        "exchange_s": last["time_exchange_s"],
                        "share": last["time_exchange_s"] / step,
                        "counted": last["comm_bytes_per_step"],
                        "wire": last["wire_bytes_per_step"],
                    }
                )
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print(
        f"{args.nodes} emulated nodes × 1 rank, {args.size}³ samples, batch 2 per rank, "
        f"last of {args.epochs} epochs; link 0 = unshaped"
    )
    print(
        "| variant | Mbit/s | cores/rank | step_s | exchange_s | exchange share "
        "| counted B/step | wire B/step | wire/counted |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['variant']} | {r['mbit']:g} | {r['cores_per_rank']:g} | {r['step_s']:.4f} "
            f"| {r['exchange_s']:.4f} | {100 * r['share']:.0f} % | {r['counted']:,.0f} "
            f"| {r['wire']:,.0f} | {r['wire'] / r['counted']:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
