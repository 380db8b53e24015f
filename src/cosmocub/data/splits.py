"""Which universe goes to which split: a seeded train/val/test assignment by whole universes.

Also the checks every preprocessing run makes of its universes first, and the error it raises.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from cosmocub.data.universe import UniverseMeta, read_universe_meta

SPLITS: tuple[str, ...] = ("train", "val", "test")


class PreprocessError(ValueError):
    """Inputs or settings that preprocessing cannot use; one line naming files and numbers."""


def split_counts(num_universes: int, ratios: dict[str, float]) -> dict[str, int]:
    """Universes per split: normalised ratios, largest-remainder rounding (ties: train, val, test).

    A split with ratio 0 gets none (it is written empty); a split with ratio > 0 that would get
    none, or an empty train split, is an error.
    """
    total = sum(ratios[s] for s in SPLITS)
    described = " ".join(f"{s}={ratios[s]:g}" for s in SPLITS)
    if total <= 0:
        raise PreprocessError(f"preprocess.splits {described}: ratios must sum to > 0")
    # Rounding the quotas first keeps 0.7 * 10 = 6.999… from losing a universe to float error.
    quotas = {s: round(num_universes * ratios[s] / total, 9) for s in SPLITS}
    counts = {s: math.floor(quotas[s]) for s in SPLITS}
    left = num_universes - sum(counts.values())
    by_remainder = sorted(SPLITS, key=lambda s: -(quotas[s] - counts[s]))
    for s in by_remainder[:left]:
        counts[s] += 1
    for s in SPLITS:
        if (ratios[s] > 0 or s == "train") and counts[s] == 0:
            raise PreprocessError(
                f"{num_universes} universes cannot fill splits {described}: {s} would get 0"
            )
    return counts


def assign_splits(paths: list[Path], ratios: dict[str, float], seed: int) -> dict[str, list[Path]]:
    """Deterministic split: a seeded permutation of the sorted paths, cut by `split_counts`.

    Within a split, universes are listed in sorted order (so shard order does not depend on the
    permutation, only membership does).
    """
    ordered = sorted(paths, key=str)
    counts = split_counts(len(ordered), ratios)
    perm = np.random.default_rng(seed).permutation(len(ordered))
    out: dict[str, list[Path]] = {}
    start = 0
    for s in SPLITS:
        chosen = perm[start : start + counts[s]]
        out[s] = [ordered[i] for i in sorted(chosen)]
        start += counts[s]
    return out


def check_universes(paths: list[Path], sample_size: int) -> list[UniverseMeta]:
    """The universes' headers, read from their files, once each of them is known to be usable
    (`check_metas`)."""
    if not paths:
        raise PreprocessError("preprocess: no universe files given")
    return check_metas([read_universe_meta(p) for p in paths], sample_size)


def check_metas(metas: list[UniverseMeta], sample_size: int) -> list[UniverseMeta]:
    """`metas`, once each universe is known to be usable: given once, one size, a size that
    `sample_size` divides."""
    if not metas:
        raise PreprocessError("preprocess: no universes given")
    seen: dict[Path, Path] = {}
    for m in metas:
        key = Path(m.path).resolve()
        if key in seen:
            raise PreprocessError(
                f"{m.path}: given twice (also as {seen[key]}); samples would repeat"
            )
        seen[key] = Path(m.path)
    first = metas[0]
    for m in metas[1:]:
        if m.size != first.size:
            raise PreprocessError(
                f"{m.path}: universe size {m.size} differs from {first.size} of {first.path}; "
                f"all universes must share one size"
            )
    if first.size % sample_size:
        raise PreprocessError(
            f"{first.path}: preprocess.sample_size {sample_size} does not divide the universe "
            f"size {first.size}"
        )
    return metas
