"""Seconds per synthetic universe (2LPT + PM) at a few sizes, and the share of it spent in FFTs.

Run: python benchmarks/bench_simulate.py --sizes 64 128 --repeats 2 [--config config/config.yaml]
Prints one markdown table. Single-threaded FFTs (as in the workflow: one simulation per core).
"""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from cosmocub.config import load_config
from cosmocub.data.simulate import simulate_universe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--repeats", type=int, default=2, help="universes per size (seeds 0..)")
    parser.add_argument("--config", default=None, help="YAML config (default: schema defaults)")
    parser.add_argument("--pm-steps", type=int, default=None, help="override simulate.pm_steps")
    parser.add_argument("--mesh", type=int, default=None, help="override force_mesh_factor")
    args = parser.parse_args()

    settings = load_config(args.config).simulate
    if args.pm_steps is not None:
        settings = dataclasses.replace(settings, pm_steps=args.pm_steps)
    if args.mesh is not None:
        settings = dataclasses.replace(settings, force_mesh_factor=args.mesh)

    # Warm up imports, colossus and FFT plans so the first row is not charged for them.
    simulate_universe(size=16, seed=0, settings=settings, progress=False)

    print(
        f"pm_steps {settings.pm_steps}, initial z {settings.initial_redshift}, "
        f"{settings.lpt_order}LPT, force mesh {settings.force_mesh_factor}×N\n"
    )
    print("| N | universes | s / universe | initial conditions s | PM s | FFT s | FFT share |")
    print("|---|---|---|---|---|---|---|")
    for size in args.sizes:
        rows = [
            simulate_universe(size=size, seed=seed, settings=settings, progress=False).timings
            for seed in range(args.repeats)
        ]
        mean = {key: float(np.mean([r[key] for r in rows])) for key in rows[0]}
        print(
            f"| {size} | {args.repeats} | {mean['total']:.2f} | {mean['initial_conditions']:.2f} "
            f"| {mean['pm']:.2f} | {mean['fft']:.2f} | {mean['fft'] / mean['total']:.0%} |"
        )


if __name__ == "__main__":
    main()
