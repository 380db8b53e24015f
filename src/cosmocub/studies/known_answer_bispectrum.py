"""Case (c) of the known-answer study beside the band bispectrum's own f_nl fit, with and
without the three axis-Nyquist modes: on seeds 0 and 1 the CNN matched the fit without them
and fell short only of what those three modes carry (docs/known_answer.md, case (c)); this
measures it on every seed of the study.

Per point: ridges (the baselines' own, evaluation.baselines.ridge_predictions) of f_nl on the
band bispectrum of the phase channels, fitted on the training universes, their per-universe
absolute errors on the test universes in the order of the evaluation's predictions.npz. The
bispectrum with the modes is the shards' features.h5 set (what the best classical fit reads);
without them it is recomputed from the shards' counts (~10 s for 1,400 universes of 32³).
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from cosmocub.data.features import (
    FEATURES_FILE,
    axis_nyquist_modes,
    bispectrum_statistics,
    bispectrum_triples,
    read_features,
)
from cosmocub.data.known_answer_fields import CASES, PARAMETERS

# The fits this module adds, as baselines of the study's f_nl rows (`<name>_mae`, `cnn_over_`).
WITH_NYQUIST = "bispectrum"
WITHOUT_NYQUIST = "bispectrum_no_nyquist"
FITS = (WITH_NYQUIST, WITHOUT_NYQUIST)
PARAMETER = "f_nl"
CHANNELS = tuple(c for c, case in enumerate(CASES) if case == "phase")


def _log1p_counts_shard(shard: Path) -> tuple[h5py.File, h5py.Dataset]:
    f = h5py.File(shard, "r")
    if not f.attrs.get("log1p", False) or f.attrs.get("crops") == "random":
        f.close()
        raise ValueError(
            f"{shard}: the bispectrum without the axis-Nyquist modes reads the stored samples' "
            "log1p counts, a sample a row (preprocess.log1p true, fixed crops)"
        )
    return f, f["x"]


def bispectrum_without_nyquist(shard: Path) -> np.ndarray:
    """(N, phase channels × triples): the band bispectrum of each row's phase channels with no
    band taking the axis-Nyquist modes, from the shard's log1p counts (whole boxes)."""
    f, x = _log1p_counts_shard(shard)
    with f:
        left_out = axis_nyquist_modes(x.shape[-1])
        rows = []
        for i in range(x.shape[0]):
            sample = np.asarray(x[i], dtype=np.float64)
            rows.append(
                np.concatenate(
                    [
                        bispectrum_statistics(np.rint(np.expm1(sample[c])), modes_left_out=left_out)
                        for c in CHANNELS
                    ]
                )
            )
    width = len(CHANNELS) * len(bispectrum_triples())
    return np.stack(rows) if rows else np.zeros((0, width))


def _phase_columns(bispectrum: np.ndarray, path: Path) -> np.ndarray:
    per_channel = len(bispectrum_triples())
    if bispectrum.shape[1] != len(CASES) * per_channel:
        raise ValueError(
            f"{path}: bispectrum has {bispectrum.shape[1]} columns, not {per_channel} triples "
            f"for each of the {len(CASES)} known-answer channels"
        )
    return np.hstack([bispectrum[:, c * per_channel : (c + 1) * per_channel] for c in CHANNELS])


def _per_universe(errors: np.ndarray, universe_index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    universes, inverse = np.unique(universe_index, return_inverse=True)
    sums = np.bincount(inverse, weights=errors, minlength=len(universes))
    return universes, sums / np.bincount(inverse, minlength=len(universes))


def bispectrum_fit_errors(shards: Path) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """(test universes, {fit: per-universe |error| in unitPar}) of the f_nl ridges on the phase
    channels' band bispectrum with (WITH_NYQUIST) and without (WITHOUT_NYQUIST) the
    axis-Nyquist modes, fitted on the training split; universes sorted as predictions.npz's."""
    from cosmocub.evaluation.baselines import ridge_predictions

    shards = Path(shards)
    slot = PARAMETERS.index(PARAMETER)
    data = {}
    for split in ("train", "test"):
        features = read_features(shards / FEATURES_FILE, split)
        if "bispectrum" not in features:
            raise ValueError(
                f"{shards / FEATURES_FILE}: no bispectrum (preprocess.bispectrum: true, as "
                "config/known_answer.yaml has it)"
            )
        with h5py.File(shards / f"{split}.h5", "r") as f:
            y = f["y"][:, slot].astype(np.float64)
            where = f["universe_index"][:] if "universe_index" in f else np.arange(len(y))
        with_modes = _phase_columns(features["bispectrum"], shards / FEATURES_FILE)
        without = bispectrum_without_nyquist(shards / f"{split}.h5")
        data[split] = ({WITH_NYQUIST: with_modes, WITHOUT_NYQUIST: without}, y, where)
    (x_train, y_train, _), (x_test, y_test, where) = data["train"], data["test"]
    errors = {}
    for fit in FITS:
        predicted = ridge_predictions(x_train[fit], y_train[:, None], x_test[fit]).ravel()
        universes, errors[fit] = _per_universe(np.abs(predicted - y_test), where)
    return universes, errors
