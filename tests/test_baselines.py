"""The baselines: ridge fits on field statistics are fitted on the training split only, and a
field whose statistics carry the parameter is fitted well."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

from cosmocub.baselines import baseline_predictions, fit_ridge, usable_columns
from cosmocub.data.features import FEATURES_FILE, write_features

SIZE = 8


def _write_split(path, rng, n_universes, crops=2):
    """Crops whose Poisson rate grows with the first parameter (so the fits have signal)."""
    y_u = rng.uniform(-1, 1, size=(n_universes, 4)).astype(np.float32)
    y = np.repeat(y_u, crops, axis=0)
    rate = 3.0 + 2.0 * y[:, 0]
    x = rng.poisson(rate[:, None, None, None, None], size=(len(y), 2, SIZE, SIZE, SIZE))
    with h5py.File(path, "w") as f:
        f["x"] = np.log1p(x).astype(np.float16)
        f["y"] = y
        f["universe_index"] = np.repeat(np.arange(n_universes), crops).astype(np.int32)
        f.attrs["log1p"] = True


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shards")
    rng = np.random.default_rng(0)
    for split, n in (("train", 12), ("val", 2), ("test", 4)):
        _write_split(folder / f"{split}.h5", rng, n)
    write_features(folder, folder / FEATURES_FILE, num_workers=1)
    return folder


def _set_labels(path, value):
    with h5py.File(path, "r+") as f:
        f["y"][...] = value


def test_baselines_never_see_the_test_labels(shards):
    before = baseline_predictions(shards, "test")
    with h5py.File(shards / "test.h5", "r") as f:
        y_test = f["y"][:]
    _set_labels(shards / "test.h5", 1e3)  # poisoned: a fit that read them would move
    try:
        after = baseline_predictions(shards, "test")
    finally:
        _set_labels(shards / "test.h5", y_test)
    for name in ("mean", "one_point", "pk"):
        np.testing.assert_array_equal(after[name], before[name])
    # The same poison in the training split does move them: the check above can fail.
    with h5py.File(shards / "train.h5", "r") as f:
        y_train = f["y"][:]
    _set_labels(shards / "train.h5", y_train + 0.5)
    try:
        moved = baseline_predictions(shards, "test")
    finally:
        _set_labels(shards / "train.h5", y_train)
    for name in ("mean", "one_point", "pk"):
        assert np.abs(moved[name] - before[name]).max() > 0.1


def test_one_point_fit_finds_the_parameter_in_the_density(shards):
    preds = baseline_predictions(shards, "test")
    with h5py.File(shards / "test.h5", "r") as f:
        y = f["y"][:]
    mae_fit = np.abs(preds["one_point"][:, 0] - y[:, 0]).mean()
    mae_mean = np.abs(preds["mean"][:, 0] - y[:, 0]).mean()
    assert mae_fit < 0.3 * mae_mean  # the mean count says Omega_m here


def test_usable_columns_and_fit_errors():
    features = np.array([[1.0, np.nan, 2.0], [2.0, 1.0, -np.inf]])
    np.testing.assert_array_equal(usable_columns(features), [True, False, False])
    with pytest.raises(ValueError, match="2 feature rows and 3 targets"):
        fit_ridge(np.zeros((2, 1)), np.zeros((3, 4)))
