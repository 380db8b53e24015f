"""How close a fit learned from P(k) comes to case (a)'s floor, against the number of training
universes: the known-answer study's Gaussian channel (amplitude and slope), 32³, stored and read
back as the study's counts.

The floor is the Bayes estimate from P(k) under the field's exact likelihood
(cosmocub.studies.known_answer_likelihood): nothing is fitted. The learned fits read the
evaluation's P(k) features of the channel (10 log bins, data.features.counts_power_spectrum):
the evaluation's ridge (evaluation.baselines.ridge_predictions) and a small MLP (two hidden
layers of 64, scikit-learn, early stopping on a tenth of the training rows), both clipped to the
prior [-1, 1). The known-answer study trains on 1,000 universes; the CNN reads the same P(k)
(model.pooled.spectrum_bins), so a learned fit's gap to the floor at that size is the gap the
study's CNN can be expected to show on case (a).

    python benchmarks/known_answer_floor.py [--train 1000 4000 16000] [--test 1000] [--seed 7]

Prints, per training size, each fit's test MAE (unitPar) and its ratio to the floor, with the
load before and after.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

from cosmocub.data import known_answer_fields as ka
from cosmocub.data.features import counts_power_spectrum
from cosmocub.evaluation.baselines import ridge_predictions
from cosmocub.studies import known_answer_likelihood as floor

SIZE = 32


def universes(rng: np.random.Generator, count: int, size: int) -> tuple[np.ndarray, ...]:
    """(log10 P(k) features (count, 10), unitPar of amplitude and slope (count, 2), the count
    overdensity (count, size, size, size)) of `count` Gaussian-case fields as stored."""
    unit = rng.uniform(-1.0, 1.0, size=(count, 2))
    physical = ka.DESIGN.physical(np.hstack([unit, np.zeros((count, 2))]))[:, :2]
    fields = [ka.gaussian_case(rng, size, amplitude=a, slope=s) for a, s in physical]
    counts = ka.stored_counts(np.stack(fields))
    features = np.stack([np.log10(counts_power_spectrum(c)[1]) for c in counts])
    return features, unit, floor.overdensity(counts)


def mlp_predictions(x_train: np.ndarray, y_train: np.ndarray, x: np.ndarray, seed: int):
    from sklearn.neural_network import MLPRegressor
    from sklearn.preprocessing import StandardScaler

    scale = StandardScaler().fit(x_train)
    model = MLPRegressor(
        hidden_layer_sizes=(64, 64),
        alpha=1e-2,
        max_iter=2000,
        early_stopping=True,
        random_state=seed,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a small training set stops on the iteration limit
        model.fit(scale.transform(x_train), y_train)
    return model.predict(scale.transform(x))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--train", type=int, nargs="+", default=[1000, 4000, 16000])
    parser.add_argument("--test", type=int, default=1000)
    parser.add_argument("--size", type=int, default=SIZE)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    start = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    x_test, y_test, delta = universes(rng, args.test, args.size)
    floor_mae = np.abs(floor.posterior_medians(delta) - y_test).mean(0)
    x_all, y_all, _ = universes(rng, max(args.train), args.size)
    print(f"{args.test} test universes of {args.size}³; MAE in unitPar (amplitude, slope)")
    print(f"{'fit':<22}{'training':>9}{'amplitude':>11}{'÷ floor':>9}{'slope':>9}{'÷ floor':>9}")
    print(f"{'floor (no fitting)':<22}{'-':>9}{floor_mae[0]:>11.3f}{1:>9.2f}{floor_mae[1]:>9.3f}")
    for count in args.train:
        x, y = x_all[:count], y_all[:count]
        fits = {
            "ridge (evaluation's)": ridge_predictions(x, y, x_test),
            "MLP 64-64": mlp_predictions(x, y, x_test, args.seed),
        }
        for name, predicted in fits.items():
            mae = np.abs(np.clip(predicted, -1.0, 1.0) - y_test).mean(0)
            ratio = mae / floor_mae
            print(
                f"{name:<22}{count:>9}{mae[0]:>11.3f}{ratio[0]:>9.2f}{mae[1]:>9.3f}{ratio[1]:>9.2f}"
            )
    print(f"{time.perf_counter() - start:.1f} s")
    print(f"load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
