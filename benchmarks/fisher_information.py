"""How much do the synthetic universes hold beyond P(k), and how much of it does the CNN take?
Fisher information of each summary at the centre of the prior, from the simulator's own
derivatives (issue 38, "A CNN that knows more than the classical statistics", part 4).

    python benchmarks/fisher_information.py --config config/science.yaml \\
        --run results-science/runs/science --shards results-science/shards

Simulates `--fiducial` universes at unitPar 0 (the covariance) and, for each of the four
parameters, `--pairs` pairs at unitPar ±step with the same seeds (the derivatives: the pairs'
cosmic variance cancels), with the config's simulate settings and size. Summaries per whole
universe: log P(k) of each channel (10 log bins), the log-density P(k) (of its log1p counts,
the same bins), the one-point statistics of its log1p counts, the bispectrum statistics
(data/features.py, the baselines' own), and the union the best classical fit reads (P(k),
log-density P(k), one-point) with and without the bispectrum; the same averaged over the
universe's fixed crops (what the evaluation's baselines see); and the trained CNN's means (its
fixed crops of side model.input_size, standardised with the shards' stats.json and combined by
inverse variance, as evaluation combines a test universe's crops; a whole-box model's one crop
is the box). Each summary's
1σ on unitPar comes out of evaluation/fisher.py twice, the standard estimate (biased low in σ by
derivative noise) and the compressed one (biased high): the truth lies between. Two views: Ω_m
and σ_8 with the other two known, and all four free with the uniform prior's variance added
(alone, the four are nearly degenerate in every summary here, and their marginal errors run far
past the prior's width). `--summaries FILE.npz` keeps the summaries, and reads them back
instead of simulating when the file exists.

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
from cosmocub.data.shard_file import cube_origins
from cosmocub.data.simulate import simulate_universe
from cosmocub.evaluation.fisher import (
    conditional_sigma,
    estimate_fisher,
    independent_columns,
    marginal_sigma,
)
from cosmocub.evaluation.uncertainty import combine_crops
from cosmocub.models.heads import split_output, variance
from cosmocub.models.model_factory import load_model_file

PARAMETERS = ("Omega_m", "sigma_8", "N_spec", "H_0")
UNIFORM_PRIOR_PRECISION = 3.0  # 1 / the variance of U[-1, 1)
FIDUCIAL_SEED, PAIR_SEED = 1_000_000, 2_000_000  # far from the workflow's seeds 0 … count − 1


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _simulate(job: tuple[int, np.ndarray, int, int, object]) -> tuple[np.ndarray, ...]:
    """(log P(k), log-density log P(k), one-point, bispectrum of the whole universe, the same
    averaged over its fixed crops of side `crop`, stored values (C, N, N, N) float16) of one
    universe."""
    seed, unit_par, size, crop, settings = job
    counts = simulate_universe(size=size, seed=seed, settings=settings, unit_par=unit_par)
    counts_cdhw = np.moveaxis(counts.counts_dhwc, -1, 0)
    sets = ("pk", "log_pk", "one_point", "bispectrum")
    features = sample_features(counts_cdhw, log1p=False, bispectrum=True)
    whole = tuple(features[name] for name in sets)
    per_crop = [
        sample_features(
            np.ascontiguousarray(counts_cdhw[:, d : d + crop, h : h + crop, w : w + crop]),
            log1p=False,
            bispectrum=True,
        )
        for d, h, w in cube_origins(size, crop)
    ]
    crops = tuple(np.mean([c[name] for c in per_crop], axis=0) for name in sets)
    stored = np.log1p(counts_cdhw.astype(np.float64)).astype(np.float16)  # as a shard holds it
    return (*whole, *crops, stored)


def simulate_all(cfg, *, fiducial: int, pairs: int, step: float, workers: int, crop: int) -> dict:
    """{"fiducial": [results], "plus": [[results] per parameter], "minus": …}."""
    size, settings = cfg.universes.size, cfg.simulate
    jobs: list[tuple] = [
        (FIDUCIAL_SEED + i, np.zeros(4, np.float32), size, crop, settings) for i in range(fiducial)
    ]
    for p in range(4):
        for sign in (1.0, -1.0):
            unit = np.zeros(4, np.float32)
            unit[p] = sign * step
            jobs += [(PAIR_SEED + j, unit.copy(), size, crop, settings) for j in range(pairs)]
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
    origins = cube_origins(stored[0].shape[-1], crop)
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
    pk, log_pk, one_point, bispectrum, crop_pk, _, crop_one_point, crop_bispectrum = (
        np.stack([r[i] for r in results]) for i in range(8)
    )
    cnn = cnn_means(model, [r[8] for r in results], stats, crop)
    # The best classical fit's features (evaluation.baselines: the counts' P(k), the log-density
    # P(k) and the one-point statistics), and with the bispectrum beside them.
    classical = np.hstack([pk, log_pk, one_point])
    return {
        "P(k)": pk,
        "one-point": one_point,
        "bispectrum": bispectrum,
        "P(k) + one-point": np.hstack([pk, one_point]),
        "P(k) + one-point + bispectrum": np.hstack([pk, one_point, bispectrum]),
        "crops: P(k)": crop_pk,
        "crops: P(k) + one-point + bispectrum": np.hstack(
            [crop_pk, crop_one_point, crop_bispectrum]
        ),
        "CNN (crops)": cnn,
        "CNN + P(k) + one-point + bispectrum": np.hstack([cnn, pk, one_point, bispectrum]),
        "log-density P(k)": log_pk,
        "best classical's: P(k) + log-density P(k) + one-point": classical,
        "best classical's + bispectrum": np.hstack([classical, bispectrum]),
        "CNN + best classical's + bispectrum": np.hstack([cnn, classical, bispectrum]),
    }


def fisher_rows(fiducial: dict, plus: list[dict], minus: list[dict], step: float) -> dict:
    """{summary: {"values", "standard", "compressed"}} Fisher matrices (4, 4) of each summary
    over a full-rank subset of its values (evaluation.fisher.independent_columns)."""
    rows = {}
    steps = np.full(len(PARAMETERS), step)
    for name, fid in fiducial.items():
        keep = independent_columns(fid)
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
            "standard": estimate.standard,
            "compressed": estimate.compressed,
        }
    return rows


def print_table(rows: dict, title: str, sigma, names: tuple[str, ...]) -> dict:
    """One table: per summary, `sigma(F)` from the standard and the compressed estimate, and
    each over P(k)'s; returns {summary: {"standard": [...], "compressed": [...]}}."""
    out = {
        name: {
            "standard": sigma(row["standard"]).tolist(),
            "compressed": sigma(row["compressed"]).tolist(),
        }
        for name, row in rows.items()
    }
    reference = out.get("P(k)")
    print(f"\n{title}\n")
    print(
        "| summary | values | "
        + " | ".join(f"σ {n}" for n in names)
        + " | "
        + " | ".join(f"÷ P(k) {n}" for n in names)
        + " |"
    )
    print("|---|---|" + "---|" * (2 * len(names)))
    for name, row in out.items():
        pairs = zip(row["standard"], row["compressed"], strict=True)
        cells = " | ".join(f"{a:.3f} – {b:.3f}" for a, b in pairs)
        ratios = (
            " | ".join(
                f"{a / ra:.2f} – {b / rb:.2f}"
                for a, b, ra, rb in zip(
                    row["standard"],
                    row["compressed"],
                    reference["standard"],
                    reference["compressed"],
                    strict=True,
                )
            )
            if reference
            else ""
        )
        print(f"| {name} | {rows[name]['values']} | {cells} | {ratios} |")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/science.yaml")
    parser.add_argument("--run", type=Path, help="the training run (model.pt)")
    parser.add_argument("--shards", type=Path, help="its shards (stats.json)")
    parser.add_argument("--fiducial", type=int, default=500)
    parser.add_argument("--pairs", type=int, default=100, help="± pairs per parameter")
    parser.add_argument("--step", type=float, default=0.1, help="± step in unitPar")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument(
        "--summaries",
        type=Path,
        help="an .npz of the summaries: written after simulating, or read instead of it",
    )
    args = parser.parse_args()
    before, start = load_avg(), time.perf_counter()
    cfg = load_config(args.config)
    if args.summaries is not None and args.summaries.is_file():  # an earlier run's summaries
        with np.load(args.summaries) as saved:
            fiducial, plus, minus = unpack(dict(saved))
        simulated = 0.0
    else:
        if args.run is None or args.shards is None:
            parser.error("--run and --shards are needed to simulate (or an existing --summaries)")
        model = load_model_file(args.run / "model.pt").eval()
        torch.set_num_threads(args.workers)
        sims = simulate_all(
            cfg,
            fiducial=args.fiducial,
            pairs=args.pairs,
            step=args.step,
            workers=args.workers,
            crop=model.config.input_size,
        )
        simulated = time.perf_counter() - start
        # Read as training read the shards: standardised with their stats unless they say not.
        mean, std = read_stats(args.shards)
        if not stats_say_standardize(args.shards):
            mean, std = [0.0] * len(mean), [1.0] * len(std)
        stats, crop = (mean, std), model.config.input_size
        fiducial = summaries(sims["fiducial"], model, stats, crop)
        plus = [summaries(r, model, stats, crop) for r in sims["plus"]]
        minus = [summaries(r, model, stats, crop) for r in sims["minus"]]
        if args.summaries is not None:
            np.savez(args.summaries, **pack(fiducial, plus, minus))
    rows = fisher_rows(fiducial, plus, minus, args.step)
    fiducials, pairs = len(fiducial["P(k)"]), len(plus[0]["P(k)"])
    print(
        f"\n{fiducials} fiducial universes at unitPar 0, {pairs} ± pairs a parameter at step "
        f"{args.step}, {cfg.universes.size}³. 1σ on unitPar (the prior is [-1, 1)), standard – "
        "compressed estimate: the truth lies between; ÷ P(k): each over P(k)'s own estimate."
    )
    tables = {
        "omega_m_sigma_8_others_known": print_table(
            rows,
            "Ω_m and σ_8, with n_s and H_0 known (the Fisher matrix's Ω_m–σ_8 block):",
            lambda f: conditional_sigma(f, [0, 1]),
            PARAMETERS[:2],
        ),
        "all_four_with_prior": print_table(
            rows,
            "All four free, with the uniform prior's variance 1/3 (precision 3) on each:",
            lambda f: marginal_sigma(f, UNIFORM_PRIOR_PRECISION),
            PARAMETERS,
        ),
    }
    total = time.perf_counter() - start
    print(f"\nsimulated in {simulated:.0f} s, {total:.0f} s in all; load {before} → {load_avg()}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": {k: str(v) for k, v in vars(args).items()}, "tables": tables}, indent=1
            )
        )


def pack(fiducial: dict, plus: list[dict], minus: list[dict]) -> dict[str, np.ndarray]:
    """The summaries as flat arrays for np.savez: fiducial/NAME, plus/NAME (P, m, F), …"""
    out = {f"fiducial/{k}": v for k, v in fiducial.items()}
    for side, sets in (("plus", plus), ("minus", minus)):
        out.update({f"{side}/{k}": np.stack([s[k] for s in sets]) for k in fiducial})
    return out


def unpack(saved: dict[str, np.ndarray]) -> tuple[dict, list[dict], list[dict]]:
    names = [k.split("/", 1)[1] for k in saved if k.startswith("fiducial/")]
    fiducial = {n: saved[f"fiducial/{n}"] for n in names}
    sides = [
        [{n: saved[f"{side}/{n}"][p] for n in names} for p in range(len(PARAMETERS))]
        for side in ("plus", "minus")
    ]
    return fiducial, sides[0], sides[1]


if __name__ == "__main__":
    main()
