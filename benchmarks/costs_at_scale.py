"""What the rank-dependent costs of a run come to at scale, by formula from a config's model:
the Lion Cub checkpoint's momentum gather and the spatial gradient average, before and after
issue 16 (gather to the writer only; the replicated head left out of the spatial all-reduce).

    python benchmarks/costs_at_scale.py --config config/cosmoflow-mlperf.yaml --ranks 1024

Bytes are fp32 parameters; ring all-reduce sends 2(P−1)/P × payload per rank, all-gather and
gather move (P−1)/P of the gathered bytes (the α–β model of docs, DESIGN.md).
"""

from __future__ import annotations

import argparse

from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow


def gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/cosmoflow-mlperf.yaml")
    parser.add_argument("--ranks", type=int, default=1024)
    args = parser.parse_args()
    model = CosmoFlow(load_config(args.config).model)
    params = sum(p.numel() for p in model.parameters())
    head = sum(p.numel() for p in model.head.parameters())
    momentum = 4 * params  # one fp32 momentum per parameter, per data rank
    n = args.ranks
    print(
        f"{args.config}: {params:,} parameters, "
        f"of which the dense head {head:,} ({head / params:.1%})"
    )
    print(f"\nLion Cub checkpoint, {n} data ranks (spatial 1): momentum {mb(momentum)} per rank")
    rows = [("", "before (all-gather)", "after (gather to the writer)")]
    rows.append(("held by the writer (rank 0)", gb(n * momentum), gb(n * momentum)))
    rows.append(("held by every other rank", gb(n * momentum), mb(momentum)))
    rows.append(("held by all ranks together", gb(n * n * momentum), gb((2 * n - 1) * momentum)))
    rows.append(
        ("received by one rank", gb((n - 1) * momentum), f"{gb((n - 1) * momentum)} (rank 0 only)")
    )
    rows.append(("moved over the network", gb(n * (n - 1) * momentum), gb((n - 1) * momentum)))
    rows.append(
        ("read by each rank on resume", gb(n * momentum), f"{mb(momentum)} (memory-mapped row)")
    )
    print(table(rows))
    print(f"\nSpatial gradient average ahead of Lion Cub, per rank per step, {n} ranks")
    rows = [
        ("mesh (data x spatial)", "before (all parameters)", "after (conv stack only)", "saved")
    ]
    for spatial in (2, 4, 8, 16):
        ring = 2 * (spatial - 1) / spatial
        before, after = ring * 4 * params, ring * 4 * (params - head)
        rows.append(
            (f"{n // spatial} x {spatial}", mb(before), mb(after), f"{1 - after / before:.1%}")
        )
    print(table(rows))


if __name__ == "__main__":
    main()
