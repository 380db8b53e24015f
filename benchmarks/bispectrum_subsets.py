"""Where in the bispectrum a parameter sits: ridges on subsets of the band triples of
`data.features.bispectrum_statistics`, fitted on a shard folder's training split, test MAE per
universe on one parameter (docs/known_answer.md, "Case (c): more steps, more filters").

    python benchmarks/bispectrum_subsets.py --shards results-known-answer/shards \\
        --parameter 3 --channels 2 3

The known-answer study's phase case (f_nl, unitPar slot 3, channels 2 and 3) asks it: a network
that reads one scale at a time (a block's moments are its filtered field's, an integral of the
bispectrum over one band) can reach what the equilateral triples hold; what the cross-scale
triples hold it has to combine across blocks. Reads features.h5 (`preprocess.bispectrum`); each
row is a RidgeCV on the standardised features, as the baselines fit them. Seconds.

`--nyquist` adds rows computed from the shards' log1p counts (whole periodic boxes; ~10 s for
1,400 of 32³): the same band bispectrum with and without the three real-valued modes at |k| = π
on the axes of an even grid, and the cubic statistic of those three modes alone,
Σ_a A_a⟨(−1)^(x_a)·δ_rest²⟩ (A_a the mode's amplitude, δ_rest the field without them).

`--regenerate N` builds N pairs of phase-case fields anew (data.known_answer_fields.phase_case,
f uniform in its range, 3/4 to fit and 1/4 to test; ~1 min for 800 at 32³), once as the
universes are built and once with the reference spectrum zero at |k| = π as well as above it,
and prints the band bispectrum's f_nl fit with and without the axis-Nyquist modes for each:
whether what those modes carry is a property of the construction or of the coupling.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import h5py
import numpy as np

from cosmocub.data.features import (
    FEATURES_FILE,
    bispectrum_statistics,
    bispectrum_triples,
    k_magnitude,
    read_features,
)
from cosmocub.evaluation.baselines import ridge_predictions


def subsets(triples: list[tuple[int, int, int]]) -> list[tuple[str, list[int]]]:
    """(name, indices into `triples`) of the rows printed."""
    bands = max(max(t) for t in triples) + 1

    def where(test) -> list[int]:
        return [i for i, t in enumerate(triples) if test(*t)]

    rows = [
        ("all triples", where(lambda a, b, c: True)),
        ("equilateral (i = j = l)", where(lambda a, b, c: a == b == c)),
        ("squeezed (i < j = l)", where(lambda a, b, c: a < b == c)),
        ("the others", where(lambda a, b, c: not (a == b == c or a < b == c))),
        ("all three bands differ", where(lambda a, b, c: a < b < c)),
    ]
    rows += [(f"band {k} in the triple", where(lambda *t, k=k: k in t)) for k in range(bands)]
    rows += [(f"band {k} not in it", where(lambda *t, k=k: k not in t)) for k in range(bands)]
    return rows


WITH = "band bispectrum, recomputed"
WITHOUT = "band bispectrum without the 3 axis-Nyquist modes"
CUBIC = "the 3 axis-Nyquist modes' cubic statistic"


class NyquistSplit:
    """Per (n, n, n) count field: the band bispectrum feature with and without the axis-Nyquist
    modes, and the cubic statistic of those modes alone."""

    def __init__(self, n: int) -> None:
        self.nyquist = np.isclose(k_magnitude(n), np.pi)  # (n/2, 0, 0) and its two turns
        x = (-1.0) ** np.arange(n)
        self.checkers = [x[:, None, None], x[None, :, None], x[None, None, :]]

    def __call__(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        delta = counts / counts.mean() - 1.0
        amplitudes = [float(np.mean(delta * c)) for c in self.checkers]
        rest = delta - sum(a * c for a, c in zip(amplitudes, self.checkers, strict=True))
        cubic = sum(
            a * np.mean(c * rest * rest) for a, c in zip(amplitudes, self.checkers, strict=True)
        )
        return {
            WITH: bispectrum_statistics(counts),
            WITHOUT: bispectrum_statistics(counts, modes_left_out=self.nyquist),
            CUBIC: np.array([cubic]),
        }


def regenerated_rows(count: int, size: int = 32) -> None:
    from cosmocub.data import known_answer_fields as fields

    design = fields.DESIGN
    split = NyquistSplit(size)
    rng = np.random.default_rng(0)
    f_nl = rng.uniform(-1.0, 1.0, count)  # unitPar
    fit = (3 * count) // 4
    print(f"| construction ({count} pairs, {size}³) | with the axis-Nyquist modes | without |")
    print("|---|---|---|")
    built = fields.power_law
    for name, zero_at_nyquist in (("as built", False), ("no power at |k| = π", True)):

        def power_law(n, slope, *, pivot_k=1.0, zero=zero_at_nyquist):
            out = built(n, slope, pivot_k=pivot_k)
            if zero:
                out[k_magnitude(n) >= np.pi * (1 - 1e-9)] = 0.0
            return out

        fields.power_law = power_law
        try:
            rows = []
            for i, u in enumerate(f_nl):
                f = design.f_nl[0] + design.f_nl[1] * u
                per_field = []
                for j in range(2):
                    y = fields.phase_case(
                        np.random.default_rng([i, j]), size, f_nl=f, iterations=design.iterations
                    )
                    per_field.append(split(np.rint(design.mean_count * (1 + design.scale * y))))
                rows.append(per_field)
        finally:
            fields.power_law = built
        maes = []
        for key in (WITH, WITHOUT):
            x = np.stack([np.concatenate([p[key] for p in r]) for r in rows])
            predicted = ridge_predictions(x[:fit], f_nl[:fit, None], x[fit:])
            maes.append(float(np.abs(predicted.ravel() - f_nl[fit:]).mean()))
        print(f"| {name} | {maes[0]:.3f} | {maes[1]:.3f} |")


def nyquist_rows(shards: Path, split: str, channels: list[int]) -> dict[str, np.ndarray]:
    with h5py.File(shards / f"{split}.h5", "r") as f:
        x = f["x"]
        if not f.attrs.get("log1p", False):
            raise SystemExit(f"{shards / split}.h5: --nyquist reads log1p counts (log1p false)")
        split_stats = NyquistSplit(x.shape[-1])
        rows = []
        for i in range(x.shape[0]):
            sample = x[i].astype(np.float64)
            per_channel = [split_stats(np.rint(np.expm1(sample[c]))) for c in channels]
            keys = per_channel[0]
            rows.append({key: np.concatenate([p[key] for p in per_channel]) for key in keys})
    return {key: np.stack([r[key] for r in rows]) for key in rows[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=Path, required=True)
    parser.add_argument("--parameter", type=int, default=3, help="unitPar slot (default 3)")
    parser.add_argument("--channels", type=int, nargs="+", default=[2, 3])
    parser.add_argument("--nyquist", action="store_true", help="the rows from the shards (~1 min)")
    parser.add_argument("--regenerate", type=int, default=0, metavar="N", help="N field pairs")
    args = parser.parse_args()
    triples = bispectrum_triples()
    data = {}
    for split in ("train", "test"):
        features = read_features(args.shards / FEATURES_FILE, split)
        if "bispectrum" not in features:
            raise SystemExit(
                f"{args.shards / FEATURES_FILE}: split {split} has no bispectrum (preprocess with "
                "preprocess.bispectrum: true)"
            )
        with h5py.File(args.shards / f"{split}.h5", "r") as f:
            y = f["y"][:, args.parameter].astype(np.float64)
        data[split] = (features["bispectrum"], y)
    (b_train, y_train), (b_test, y_test) = data["train"], data["test"]
    per_channel = len(triples)
    channels = b_train.shape[1] // per_channel
    if b_train.shape[1] != channels * per_channel or max(args.channels) >= channels:
        raise SystemExit(
            f"{args.shards / FEATURES_FILE}: bispectrum has {b_train.shape[1]} columns, not "
            f"{per_channel} triples for each of channels {args.channels}"
        )
    print(f"shards {args.shards}: {len(y_train)} train, {len(y_test)} test; parameter "
          f"{args.parameter}, channels {args.channels}; mean predictor "
          f"{np.abs(y_test - y_train.mean()).mean():.3f}; load "
          f"{' '.join(f'{v:.2f}' for v in os.getloadavg())}")  # fmt: skip
    print("| triples | count | test MAE |")
    print("|---|---|---|")
    for name, idx in subsets(triples):
        cols = [c * per_channel + i for c in args.channels for i in idx]
        predicted = ridge_predictions(b_train[:, cols], y_train[:, None], b_test[:, cols])
        mae = float(np.abs(predicted.ravel() - y_test).mean())
        print(f"| {name} | {len(idx)} | {mae:.3f} |")
    if args.regenerate:
        regenerated_rows(args.regenerate)
    if not args.nyquist:
        return
    extra = {split: nyquist_rows(args.shards, split, args.channels) for split in data}
    extra_rows = [(name, extra["train"][name], extra["test"][name]) for name in extra["train"]]
    extra_rows.append((
        f"{WITHOUT}, + {CUBIC}",
        np.hstack([extra["train"][WITHOUT], extra["train"][CUBIC]]),
        np.hstack([extra["test"][WITHOUT], extra["test"][CUBIC]]),
    ))  # fmt: skip
    for name, x_train, x_test in extra_rows:
        predicted = ridge_predictions(x_train, y_train[:, None], x_test)
        mae = float(np.abs(predicted.ravel() - y_test).mean())
        print(f"| {name} | {x_train.shape[1] // len(args.channels)} | {mae:.3f} |")


if __name__ == "__main__":
    main()
