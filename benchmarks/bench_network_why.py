"""Why Lion Cub's time-to-target speedup over Lion falls short of its per-step ratio on a slow
link: the network study's own points (`network_study` settings: model, lr, batch, epochs × steps)
re-run on emulated nodes, three tables.

(a) the Lion Cub exchange split into its phases per step (metrics.jsonl time_phase_*_s:
    quantize, encode, the all-to-all's wait, vote, the all-gather) beside Lion's, per link rate;
(b) convergence per optimizer step: validation loss after each epoch for Lion and Lion Cub at the
    same training seeds, unshaped (the link does not change the math), so the gap between the
    two optimizers can be set beside the spread between seeds of one;
(c) bytes on the wire that the optimizer's counters do not hold (wire − counted per step), with
    the model's batch norm on and off.

Needs root (network namespaces) and the study's shards (`snakemake --until preprocess
network_study`, or --shards); prints one line and exits otherwise.

    python benchmarks/bench_network_why.py --bandwidths 0 10 --seeds 0 1
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cosmocub.config import load_config
from cosmocub.netemu import EmulationUnavailableError
from cosmocub.netemu.namespaces import check_privileges
from cosmocub.netemu.runner import run_training_on_nodes
from cosmocub.studies.engine import find_point, point_values, shards_dir
from cosmocub.studies.network import point_name

PHASES = ("quantize", "encode", "alltoall", "vote", "allgather")


def run_point(
    cfg, variant: str, mbit: float, *, seed: int, batch_norm: bool | None, root: Path, shards: Path
) -> dict[str, Any]:
    """One training of the study's point `variant` at `mbit` with the given seed (and batch norm
    on/off over the study's model); the last epoch's metrics and every epoch's val loss."""
    values = point_values(cfg, "network", find_point(cfg, "network", point_name(variant, mbit)))
    values["seed"] = seed
    if batch_norm is not None:
        values["model"]["batch_norm"] = batch_norm
    values["tracking"]["enabled"] = False
    name = f"{variant}-{mbit:g}-s{seed}-bn{values['model']['batch_norm']:d}"
    config_path = root / f"{name}.yaml"
    config_path.write_text(yaml.safe_dump(values))
    result = run_training_on_nodes(
        config_path=config_path,
        shards_dir=shards,
        out_dir=root / name,
        nodes=cfg.network_study.nodes,
        ranks_per_node=cfg.network_study.ranks_per_node,
        bandwidth_mbit=mbit,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {result.returncode}); see {result.logs[0]}")
    epochs = result.metrics
    later = epochs[1:] or epochs  # per-step means after the first epoch, as the study
    row = {
        "variant": variant,
        "mbit": mbit,
        "seed": seed,
        "batch_norm": values["model"]["batch_norm"],
        "steps_per_epoch": epochs[0]["step"],
        "val_loss": [e["val_loss"] for e in epochs],
    }
    keys = [k for k in later[-1] if k.startswith("time_") or k.endswith("_per_step")]
    for key in keys:
        row[key] = statistics.fmean(e.get(key, 0.0) for e in later)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{1000 * seconds:.1f}"


def phase_table(rows: list[dict[str, Any]]) -> None:
    print("\n(a) exchange per step, ms (means over epochs 2..); phases as the optimizer timed them")
    print(
        "| variant | Mbit/s | step | compute | exchange | "
        + " | ".join(PHASES)
        + " | phases' sum | counted B/step |"
    )
    print("|---|---|---|---|---|" + "---|" * len(PHASES) + "---|---|")
    for r in rows:
        phases = [r.get(f"time_phase_{p}_s") for p in PHASES]
        step = r["time_compute_s"] + r["time_exchange_s"] + r["time_momentum_sync_s"]
        total = sum(p for p in phases if p is not None) if any(phases) else None
        print(
            f"| {r['variant']} | {r['mbit']:g} | {ms(step)} | {ms(r['time_compute_s'])} "
            f"| {ms(r['time_exchange_s'])} | " + " | ".join(ms(p) for p in phases)
            + f" | {ms(total)} | {r['comm_bytes_per_step']:,.0f} |"
        )  # fmt: skip


def convergence_table(rows: list[dict[str, Any]]) -> None:
    print("\n(b) validation loss after each epoch (same seeds, unshaped); step = epoch × steps")
    n = max(len(r["val_loss"]) for r in rows)
    steps = rows[0]["steps_per_epoch"]
    print("| variant | seed | " + " | ".join(str(steps * (i + 1)) for i in range(n)) + " | mean |")
    print("|---|---|" + "---|" * n + "---|")
    for r in rows:
        losses = r["val_loss"]
        print(
            f"| {r['variant']} | {r['seed']} | " + " | ".join(f"{x:.3f}" for x in losses)
            + f" | {statistics.fmean(losses):.3f} |"
        )  # fmt: skip
    variants = sorted({r["variant"] for r in rows})
    seeds = sorted({r["seed"] for r in rows})
    by = {(r["variant"], r["seed"]): r["val_loss"] for r in rows}
    if len(variants) == 2 and all((v, s) in by for v in variants for s in seeds):
        a, b = variants
        gaps = [y - x for s in seeds for x, y in zip(by[a, s], by[b, s], strict=False)]
        print(f"{b} − {a}, per evaluation over seeds: mean {statistics.fmean(gaps):+.3f}")
        if len(seeds) > 1:
            for v in variants:
                spread = [
                    by[v, s1][i] - by[v, s0][i]
                    for s0, s1 in itertools.pairwise(seeds)
                    for i in range(n)
                ]
                sd = statistics.pstdev(spread)
                print(f"{v}: seed-to-seed difference per evaluation, std {sd:.3f}")


def wire_table(rows: list[dict[str, Any]]) -> None:
    print("\n(c) bytes per step on the wire beyond the optimizer's counters (mean over nodes)")
    print("| variant | Mbit/s | batch norm | counted B/step | wire B/step | wire − counted |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        wire = r.get("wire_bytes_per_step")
        extra = "" if wire is None else f"{wire - r['comm_bytes_per_step']:,.0f}"
        print(
            f"| {r['variant']} | {r['mbit']:g} | {'on' if r['batch_norm'] else 'off'} "
            f"| {r['comm_bytes_per_step']:,.0f} | {'' if wire is None else f'{wire:,.0f}'} "
            f"| {extra} |"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/config.yaml")
    parser.add_argument("--shards", default=None, help="shard folder (default: the study's)")
    parser.add_argument("--reference", default="lion")
    parser.add_argument("--variant", default="lion_cub_1bit")
    parser.add_argument("--bandwidths", type=float, nargs="+", default=[0, 10])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    args = parser.parse_args()
    cfg = load_config(args.config)
    study = cfg.network_study
    for v in (args.reference, args.variant):
        if v not in study.variants:
            print(f"network_study.variants has no {v!r} ({sorted(study.variants)})")
            return 2
    missing = [m for m in args.bandwidths if m not in study.bandwidths_mbit]
    if missing:
        print(f"network_study.bandwidths_mbit {list(study.bandwidths_mbit)} lacks {missing}")
        return 2
    try:
        check_privileges()
    except EmulationUnavailableError as err:
        print(f"emulated points skipped: {err}")
        return 0
    point = find_point(cfg, "network", point_name(args.reference, args.bandwidths[0]))
    shards = Path(args.shards or shards_dir(cfg, point_values(cfg, "network", point)))
    if not (shards / "train.h5").is_file():
        print(f"no shards at {shards}: run `snakemake --until preprocess network_study` first")
        return 2
    variants = (args.reference, args.variant)
    seed0 = args.seeds[0]
    with tempfile.TemporaryDirectory(prefix="bench_network_why_") as tmp:
        root = Path(tmp)

        def run(variant, mbit, seed=seed0, batch_norm=None):
            return run_point(
                cfg, variant, mbit, seed=seed, batch_norm=batch_norm, root=root, shards=shards
            )

        base = {(v, m): run(v, m) for m in args.bandwidths for v in variants}
        unshaped = min(args.bandwidths)
        other_seeds = {(v, s): run(v, unshaped, s) for s in args.seeds[1:] for v in variants}
        bn_on = base[args.reference, unshaped]["batch_norm"]
        flipped = [run(v, unshaped, batch_norm=not bn_on) for v in variants]
    print(
        f"{study.nodes} emulated nodes × {study.ranks_per_node} rank, the network study's points "
        f"({study.epochs} epochs × {study.max_steps_per_epoch} steps, batch "
        f"{study.local_batch_size}/rank); shards {shards}"
    )
    phase_table(list(base.values()))
    curves = [base[v, unshaped] for v in variants] + list(other_seeds.values())
    convergence_table(sorted(curves, key=lambda r: (r["variant"], r["seed"])))
    wire_table(list(base.values()) + flipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
