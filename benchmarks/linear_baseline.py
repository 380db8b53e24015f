"""A linear fit on per-channel summary statistics of each sample: the bar a CNN should clear.

Fits least squares from (mean, std, non-empty fraction) per channel of the training shard to
unitPar, and prints test MAE per parameter beside the predict-the-training-mean baseline and,
if given, a trained run's evaluation (runs/<run>/eval/metrics.json).

python benchmarks/linear_baseline.py results/shards --eval results/runs/default/eval/metrics.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
import numpy as np

NAMES = ("Omega_m", "sigma_8", "N_spec", "H_0")


def summary_features(path: Path, *, block: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3·C) features and (N, 4) targets; the shard is read a block of samples at a time."""
    feats = []
    with h5py.File(path, "r") as f:
        x, y = f["x"], f["y"][:]
        for start in range(0, x.shape[0], block):
            xb = x[start : start + block].astype(np.float32)  # (B, C, S, S, S)
            axes = (2, 3, 4)
            feats.append(np.concatenate([xb.mean(axes), xb.std(axes), (xb > 0).mean(axes)], axis=1))
    return np.concatenate(feats), y


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shards", type=Path)
    parser.add_argument("--eval", type=Path, help="a run's eval/metrics.json to compare")
    args = parser.parse_args()

    f_train, y_train = summary_features(args.shards / "train.h5")
    f_test, y_test = summary_features(args.shards / "test.h5")
    design = np.c_[f_train, np.ones(len(f_train))]
    weights, *_ = np.linalg.lstsq(design, y_train, rcond=None)
    pred = np.c_[f_test, np.ones(len(f_test))] @ weights
    linear_mae = np.abs(pred - y_test).mean(axis=0)
    baseline_mae = np.abs(y_train.mean(axis=0) - y_test).mean(axis=0)
    cnn = json.loads(args.eval.read_text())["per_parameter"] if args.eval else None

    print(
        f"train {len(y_train)} samples, test {len(y_test)} samples, {f_train.shape[1]} features\n"
    )
    header = "| parameter | baseline MAE | linear MAE | linear/baseline |"
    rule = "|---|---|---|---|"
    if cnn:
        header += " CNN MAE | CNN/baseline |"
        rule += "---|---|"
    print(header)
    print(rule)
    for j, name in enumerate(NAMES):
        row = (
            f"| {name} | {baseline_mae[j]:.3f} | {linear_mae[j]:.3f} | "
            f"{linear_mae[j] / baseline_mae[j]:.2f} |"
        )
        if cnn:
            row += f" {cnn[name]['mae']:.3f} | {cnn[name]['mae'] / baseline_mae[j]:.2f} |"
        print(row)


if __name__ == "__main__":
    main()
