"""Case (c) of the known-answer study beside the band bispectrum's own f_nl fit, with and
without the three axis-Nyquist modes: on seeds 0 and 1 the CNN matched the fit without them
and fell short only of what those three modes carry (docs/explanation/known_answer.md, case (c));
this
measures it on every seed of the study.

Per point: ridges (the baselines' own, evaluation.baselines.ridge_predictions) of f_nl on the
band bispectrum of the phase channels, fitted on the training universes, their per-universe
absolute errors on the test universes in the order of the evaluation's predictions.npz. The
bispectrum with the modes is the shards' features.h5 set (what the best classical fit reads);
without them it is recomputed from the shards' counts (~10 s for 1,400 universes of 32³).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cosmocub.data.features import (
    FEATURES_FILE,
    axis_nyquist_modes,
    bispectrum_statistics,
    bispectrum_triples,
    read_features,
)
from cosmocub.data.known_answer_fields import CASES, PARAMETERS
from cosmocub.studies.known_answer_shards import (
    counts,
    open_log1p_counts,
    per_universe,
    split_labels,
)

# The fits this module adds, as baselines of the study's f_nl rows (`<name>_mae`, `cnn_over_`).
WITH_NYQUIST = "bispectrum"
WITHOUT_NYQUIST = "bispectrum_no_nyquist"
FITS = (WITH_NYQUIST, WITHOUT_NYQUIST)
PARAMETER = "f_nl"
CHANNELS = tuple(c for c, case in enumerate(CASES) if case == "phase")


def bispectrum_without_nyquist(shard: Path) -> np.ndarray:
    """(N, phase channels × triples): the band bispectrum of each row's phase channels with no
    band taking the axis-Nyquist modes, from the shard's log1p counts (whole boxes)."""
    f, x = open_log1p_counts(shard, "the bispectrum without the axis-Nyquist modes")
    with f:
        left_out = axis_nyquist_modes(x.shape[-1])
        rows = []
        for i in range(x.shape[0]):
            sample = counts(x[i])
            rows.append(
                np.concatenate(
                    [bispectrum_statistics(sample[c], modes_left_out=left_out) for c in CHANNELS]
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
        labels, where = split_labels(shards / f"{split}.h5")
        y = labels[:, slot]
        with_modes = _phase_columns(features["bispectrum"], shards / FEATURES_FILE)
        without = bispectrum_without_nyquist(shards / f"{split}.h5")
        data[split] = ({WITH_NYQUIST: with_modes, WITHOUT_NYQUIST: without}, y, where)
    (x_train, y_train, _), (x_test, y_test, where) = data["train"], data["test"]
    errors = {}
    for fit in FITS:
        predicted = ridge_predictions(x_train[fit], y_train[:, None], x_test[fit]).ravel()
        universes, errors[fit] = per_universe(np.abs(predicted - y_test), where)
    return universes, errors
