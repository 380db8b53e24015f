"""How much do the synthetic universes hold beyond P(k), and how much of it does the CNN take?
Fisher information of each summary at the centre of the prior, from the simulator's own
derivatives (issue 38, "A CNN that knows more than the classical statistics", part 4).

    python benchmarks/fisher_information.py --config config/science.yaml \\
        --run results-science/runs/science --shards results-science/shards

Simulates `--fiducial` universes at unitPar 0 (the covariance) and, for each of the four
parameters, `--pairs` pairs at unitPar ±step with the same seeds (the derivatives: the pairs'
cosmic variance cancels), with the config's simulate settings and size. Summaries per whole
universe: log P(k) of each channel (10 log bins), the one-point statistics of its log1p counts,
the bispectrum statistics (data/features.py, the baselines' own), and the trained CNN's means
(its 8 fixed crops of side model.input_size, standardised with the shards' stats.json and
combined by inverse variance, as evaluation combines a test universe's crops). Each summary's
marginal 1σ on unitPar comes out of evaluation/fisher.py twice, the standard estimate (biased
low in σ by derivative noise) and the compressed one (biased high): the truth lies between.

A Fisher σ is what an unbiased estimator could reach at best from that summary near the
centre; the ratios between summaries say how much each adds. Summaries are lower bounds on what
the field holds: no number here bounds the field's own information from above.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import torch

from cosmocub.config import load_config
from cosmocub.data.dataset import read_stats, stats_say_standardize
from cosmocub.data.features import sample_features
from cosmocub.data.simulate import simulate_universe
from cosmocub.evaluation.fisher import estimate_fisher
from cosmocub.evaluation.uncertainty import combine_crops
from cosmocub.models.heads import split_output, variance
from cosmocub.models.model_factory import load_model_file

PARAMETERS = ("Omega_m", "sigma_8", "N_spec", "H_0")
FIDUCIAL_SEED, PAIR_SEED = 1_000_000, 2_000_000  # far from the workflow's seeds 0 … count − 1


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _simulate(job: tuple[int, np.ndarray, int, object]) -> tuple[np.ndarray, ...]:
    """(log P(k), one-point, bispectrum, stored values (C, N, N, N) float16) of one universe."""
    seed, unit_par, size, settings = job
    counts = simulate_universe(size=size, seed=seed, settings=settings, unit_par=unit_par)
    counts_cdhw = np.moveaxis(counts.counts_dhwc, -1, 0)
    pk, one_point, bispectrum = sample_features(counts_cdhw, log1p=False, bispectrum=True)
    stored = np.log1p(counts_cdhw.astype(np.float64)).astype(np.float16)  # as a shard holds it
    return pk, one_point, bispectrum, stored


def simulate_all(cfg, *, fiducial: int, pairs: int, step: float, workers: int) -> dict:
    """{"fiducial": [results], "plus": [[results] per parameter], "minus": …}."""
    size, settings = cfg.universes.size, cfg.simulate
    jobs: list[tuple] = [
        (FIDUCIAL_SEED + i, np.zeros(4, np.float32), size, settings) for i in range(fiducial)
    ]
    for p in range(4):
        for sign in (1.0, -1.0):
            unit = np.zeros(4, np.float32)
            unit[p] = sign * step
            jobs += [(PAIR_SEED + j, unit.copy(), size, settings) for j in range(pairs)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_simulate, jobs, chunksize=8))
    out = {"fiducial": results[:fiducial], "plus": [], "minus": []}
    rest = results[fiducial:]
    for p in range(4):
        block = rest[2 * p * pairs : 2 * (p + 1) * pairs]
        out["plus"].append(block[:pairs])
        out["minus"].append(block[pairs:])
    return out


def cnn_means(
    model: torch.nn.Module, stored: list[np.ndarray], stats: tuple, crop: int
) -> np.ndarray:
    """(U, 4) the CNN's unitPar means per universe: its fixed crops (the non-overlapping cubes
    of side `crop`, as preprocess cuts validation and test), combined by inverse variance."""
    mean = torch.tensor(stats[0], dtype=torch.float32).view(-1, 1, 1, 1)
    inv_std = 1.0 / torch.tensor(stats[1], dtype=torch.float32).view(-1, 1, 1, 1)
    size = stored[0].shape[-1]
    starts = range(0, size - crop + 1, crop)
    origins = [(d, h, w) for d in starts for h in starts for w in starts]
    means, variances = [], []
    with torch.no_grad():
        for values in stored:
            x = torch.from_numpy(values).float()
            crops = torch.stack(
                [x[:, d : d + crop, h : h + crop, w : w + crop] for d, h, w in origins]
            )
            out = model((crops - mean) * inv_std)
            if model.config.gaussian:
                m, log_var = split_output(out, model.config)
                means.append(m.double().numpy())
                variances.append(variance(log_var.double()).numpy())
            else:
                means.append(out.double().numpy())
                variances.append(np.ones_like(means[-1]))
    index = np.repeat(np.arange(len(stored)), len(origins))
    combined, _ = combine_crops(np.concatenate(means), np.concatenate(variances), index)
    return combined


def summaries(results: list, model, stats, crop: int) -> dict[str, np.ndarray]:
    """{summary name: (n, F)} for one set of universes."""
    pk, one_point, bispectrum = (np.stack([r[i] for r in results]) for i in range(3))
    cnn = cnn_means(model, [r[3] for r in results], stats, crop)
    return {
        "P(k)": pk,
        "one-point": one_point,
        "bispectrum": bispectrum,
        "P(k) + one-point": np.hstack([pk, one_point]),
        "P(k) + one-point + bispectrum": np.hstack([pk, one_point, bispectrum]),
        "CNN": cnn,
        "CNN + P(k) + one-point + bispectrum": np.hstack([cnn, pk, one_point, bispectrum]),
    }


def usable(fiducial: np.ndarray) -> np.ndarray:
    """Columns that are finite and vary over the fiducial universes (empty k bins are NaN)."""
    finite = np.all(np.isfinite(fiducial), axis=0)
    return finite & (np.nanstd(np.where(finite, fiducial, 0.0), axis=0) > 0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/science.yaml")
    parser.add_argument("--run", type=Path, required=True, help="the training run (model.pt)")
    parser.add_argument("--shards", type=Path, required=True, help="its shards (stats.json)")
    parser.add_argument("--fiducial", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=100, help="± pairs per parameter")
    parser.add_argument("--step", type=float, default=0.1, help="± step in unitPar")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    before, start = load_avg(), time.perf_counter()
    cfg = load_config(args.config)
    model = load_model_file(args.run / "model.pt").eval()
    torch.set_num_threads(args.workers)
    sims = simulate_all(
        cfg, fiducial=args.fiducial, pairs=args.pairs, step=args.step, workers=args.workers
    )
    simulated = time.perf_counter() - start
    # Read the way training read the shards: standardised with their stats unless they say not.
    mean, std = read_stats(args.shards)
    if not stats_say_standardize(args.shards):
        mean, std = [0.0] * len(mean), [1.0] * len(std)
    stats, crop = (mean, std), model.config.input_size
    fiducial = summaries(sims["fiducial"], model, stats, crop)
    plus = [summaries(r, model, stats, crop) for r in sims["plus"]]
    minus = [summaries(r, model, stats, crop) for r in sims["minus"]]
    steps = np.full(4, args.step)

    rows = {}
    for name, fid in fiducial.items():
        keep = usable(fid)
        try:
            estimate = estimate_fisher(
                fid[:, keep],
                np.stack([p[name][:, keep] for p in plus]),
                np.stack([m[name][:, keep] for m in minus]),
                steps,
            )
        except ValueError as err:  # too few fiducial universes for this many values
            print(f"# {name}: {err}")
            continue
        rows[name] = {
            "values": int(keep.sum()),
            "sigma_standard": estimate.sigma_standard.tolist(),
            "sigma_compressed": estimate.sigma_compressed.tolist(),
        }
    reference = np.array(rows["P(k)"]["sigma_standard"]) if "P(k)" in rows else np.ones(4)
    print(
        f"\n{args.fiducial} fiducial universes, {args.pairs} ± pairs a parameter at step "
        f"{args.step} (unitPar), {cfg.universes.size}³; marginal 1σ on unitPar, standard – "
        "compressed estimate (the truth between); ÷ P(k): standard over P(k)'s standard\n"
    )
    print(
        "| summary | values | "
        + " | ".join(PARAMETERS)
        + " | "
        + " | ".join(f"÷ P(k) {p}" for p in PARAMETERS)
        + " |"
    )
    print("|---|---|" + "---|" * (2 * len(PARAMETERS)))
    for name, row in rows.items():
        sig = " | ".join(
            f"{a:.4f} – {b:.4f}"
            for a, b in zip(row["sigma_standard"], row["sigma_compressed"], strict=True)
        )
        ratio = " | ".join(
            f"{a / r:.2f}" for a, r in zip(row["sigma_standard"], reference, strict=True)
        )
        print(f"| {name} | {row['values']} | {sig} | {ratio} |")
    total = time.perf_counter() - start
    print(f"\nsimulated in {simulated:.0f} s, {total:.0f} s in all; load {before} → {load_avg()}")
    if args.json:
        args.json.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
