"""How real do synthetic universes look? Per-channel one-point statistics and power spectra of
generated universes beside the real 128³ CosmoFlow samples in ../shared/data/cosmoflow-real-samples.

Run: python benchmarks/realism.py --size 128 [--config F] [--seeds 0 1 2] [--random-params]
By default each synthetic universe takes the cosmology (unitPar) of one real sample, with its own
phases, so the tables compare like with like. Real samples are 128³ cuts of 512³ periodic boxes, so
their FFT sees edges (a little leakage at low k) and modes longer than 128 Mpc/h that ours lack.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from cosmocub.config import load_config
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.cosmology.power import measure_power_spectrum, overdensity
from cosmocub.data.simulate import SNAPSHOT_REDSHIFTS, box_size_mpc_h, simulate_universe
from cosmocub.data.tfrecord import read_tfrecord_sample

REAL_DIR = Path(__file__).resolve().parents[2] / "shared/data/cosmoflow-real-samples"
K_TABLE = (0.1, 0.2, 0.5, 1.0, 2.0)  # h/Mpc


def one_point(counts: np.ndarray) -> dict[str, float]:
    return {
        "mean": float(counts.mean()),
        "std": float(counts.std()),
        "max": float(counts.max()),
        "empty": float((counts == 0).mean()),
    }


def power_at(counts: np.ndarray, box: float, k_wanted: tuple[float, ...]) -> np.ndarray:
    k, p, _ = measure_power_spectrum(overdensity(counts), box)
    return np.exp(np.interp(np.log(k_wanted), np.log(k), np.log(p), left=np.nan, right=np.nan))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--config", default=None, help="YAML config (default: schema defaults)")
    parser.add_argument("--real-dir", type=Path, default=REAL_DIR)
    parser.add_argument(
        "--random-params",
        action="store_true",
        help="draw unitPar from each seed instead of copying the real samples' unitPar",
    )
    args = parser.parse_args()

    files = sorted(args.real_dir.glob("*.tfrecord"))
    if not files:
        raise SystemExit(f"realism: no *.tfrecord under {args.real_dir}")
    real = [read_tfrecord_sample(f) for f in files]  # (x (S,S,S,4) int16, unitPar (4,))
    settings = load_config(args.config).simulate

    synthetic = []
    for i, seed in enumerate(args.seeds):
        unit = None if args.random_params else real[i % len(real)][1]
        t0 = time.perf_counter()
        uni = simulate_universe(size=args.size, seed=seed, settings=settings, unit_par=unit)
        synthetic.append((uni.counts_dhwc, uni.box_size_mpc_h, time.perf_counter() - t0))

    print(
        f"synthetic: {len(synthetic)} × {args.size}³ (pm_steps {settings.pm_steps}, initial z "
        f"{settings.initial_redshift}, {settings.lpt_order}LPT, mesh {settings.force_mesh_factor}×N"
        f", {np.mean([s[2] for s in synthetic]):.1f} s each); real: {len(real)} × "
        f"{real[0][0].shape[0]}³ from {args.real_dir.name}\n"
    )
    print("### One-point statistics of the counts per voxel (mean ± spread over universes)\n")
    print("| z | source | mean | std | max | empty fraction |")
    print("|---|---|---|---|---|---|")
    for channel, z in enumerate(SNAPSHOT_REDSHIFTS):
        for name, cubes in (
            ("synthetic", [s[0][..., channel] for s in synthetic]),
            ("real", [r[0][..., channel] for r in real]),
        ):
            stats = [one_point(c) for c in cubes]
            cells = []
            for key, fmt in (("mean", ".3f"), ("std", ".2f"), ("max", ".0f"), ("empty", ".3f")):
                values = np.array([s[key] for s in stats])
                cells.append(f"{values.mean():{fmt}} ± {values.std():{fmt}}")
            print(f"| {z} | {name} | " + " | ".join(cells) + " |")

    print("\n### Power spectrum of δ = n/n̄ − 1, mean over universes [(Mpc/h)³]; ratio synth/real\n")
    print("| z | k [h/Mpc] | synthetic P | real P | ratio |")
    print("|---|---|---|---|---|")
    for channel, z in enumerate(SNAPSHOT_REDSHIFTS):
        p_syn = np.mean([power_at(s[0][..., channel], s[1], K_TABLE) for s in synthetic], axis=0)
        p_real = np.mean(
            [
                power_at(
                    x[..., channel],
                    box_size_mpc_h(x.shape[0], float(phys_from_unit(y)[3])),
                    K_TABLE,
                )
                for x, y in real
            ],
            axis=0,
        )
        for k, ps, pr in zip(K_TABLE, p_syn, p_real, strict=True):
            print(f"| {z} | {k} | {ps:.3g} | {pr:.3g} | {ps / pr:.2f} |")


if __name__ == "__main__":
    main()
