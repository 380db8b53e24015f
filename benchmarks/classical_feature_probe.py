"""How much each classical statistic tells of the parameters: ridges on sets of field statistics
of a shard folder, fitted on its training split, test MAE per parameter (docs/known_answer.md,
"The log-density P(k)").

    python benchmarks/classical_feature_probe.py --shards results-science-wholebox/shards

Reads `pk`, `log_pk` and `one_point` from the folder's features.h5 (`cosmocub features --shards
DIR` writes a missing `log_pk`) and computes from the shards one statistic that is not a feature
set: per |k| bin, the cross-spectrum of channel 0 with each other channel, as a correlation
coefficient and as a ratio to channel 0's power (the channels are one universe at four
redshifts from the same initial phases, so their ratio per mode is the growth between them).
Each row is a scikit-learn RidgeCV (penalty by leave-one-out on the training rows) on the
standardised features, as the baselines fit them. ~1 min for 2,200 universes of 64³ on 2 cores.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import h5py
import numpy as np

from cosmocub.cosmology.power import log_k_edges, rfft_bins
from cosmocub.data.features import FEATURES_FILE, NUM_K_BINS, k_magnitude, read_features
from cosmocub.evaluation.baselines import ridge_predictions

ROWS = (
    ("pk",),
    ("pk", "one_point"),
    ("log_pk",),
    ("log_pk", "one_point"),
    ("pk", "log_pk", "one_point"),
    ("pk", "one_point", "cross"),
    ("pk", "log_pk", "one_point", "cross"),
)


class CrossSpectra:
    """(C, n, n, n) log1p counts → per other channel and bin: corr(0, c) and P_0c / P_00."""

    def __init__(self, n: int, num_bins: int = NUM_K_BINS) -> None:
        edges = log_k_edges(n, float(n), num_bins)
        self.inside, self.which, self.weight = rfft_bins(k_magnitude(n), edges)
        self.num_bins = num_bins

    def _binned(self, values: np.ndarray) -> np.ndarray:
        return np.bincount(
            self.which, weights=self.weight * values.ravel()[self.inside], minlength=self.num_bins
        )

    def __call__(self, logs_cdhw: np.ndarray) -> np.ndarray:
        x = logs_cdhw.astype(np.float64)
        field_k = np.fft.rfftn(x - x.mean(axis=(1, 2, 3), keepdims=True), axes=(1, 2, 3))
        auto = [self._binned(np.abs(f) ** 2) for f in field_k]
        out = []
        for c in range(1, len(field_k)):
            cross = self._binned((field_k[0] * np.conj(field_k[c])).real)
            with np.errstate(invalid="ignore", divide="ignore"):
                out += [cross / np.sqrt(auto[0] * auto[c]), cross / auto[0]]
        return np.concatenate(out)


def load(shards: Path, split: str, cross: CrossSpectra) -> tuple[dict[str, np.ndarray], np.ndarray]:
    features = read_features(shards / FEATURES_FILE, split)
    if "log_pk" not in features:
        raise SystemExit(f"{shards / FEATURES_FILE}: no log_pk; run `cosmocub features --shards "
                         f"{shards}` first")  # fmt: skip
    with h5py.File(shards / f"{split}.h5", "r") as f:
        y = f["y"][:].astype(np.float64)
        if f["x"].shape[0] != len(y) or not f.attrs.get("log1p", False):
            raise SystemExit(
                f"{shards / split}.h5: x {f['x'].shape[0]} samples, y {len(y)} rows, log1p "
                f"{f.attrs.get('log1p')}: needs one log1p-count sample per row (whole boxes)"
            )
        features["cross"] = np.stack([cross(f["x"][i]) for i in range(len(y))])
    return features, y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=Path, required=True)
    args = parser.parse_args()
    with h5py.File(args.shards / "test.h5", "r") as f:
        n = f["x"].shape[-1]
    cross = CrossSpectra(n)
    data = {split: load(args.shards, split, cross) for split in ("train", "test")}
    (train, y_train), (test, y_test) = data["train"], data["test"]
    print(f"shards {args.shards}: {len(y_train)} train, {len(y_test)} test samples of {n}³; "
          f"load {' '.join(f'{v:.2f}' for v in os.getloadavg())}")  # fmt: skip
    print(f"| features | {' | '.join(f'MAE p{j}' for j in range(y_test.shape[1]))} |")
    print("|---|" + "---|" * y_test.shape[1])
    for names in ROWS:
        x_train = np.hstack([train[k] for k in names])
        x_test = np.hstack([test[k] for k in names])
        mae = np.abs(ridge_predictions(x_train, y_train, x_test) - y_test).mean(axis=0)
        print(f"| {' + '.join(names)} | {' | '.join(f'{v:.3f}' for v in mae)} |")


if __name__ == "__main__":
    main()
