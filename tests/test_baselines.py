"""The baselines: ridge fits on field statistics are fitted on the training split only, and a
field whose statistics carry the parameter is fitted well."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from baseline_shards import write_shards

from cosmocub.evaluation.baselines import baseline_predictions, fit_ridge, usable_columns


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    return write_shards(tmp_path_factory.mktemp("shards"), {"train": 12, "val": 2, "test": 4})


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


def test_field_level_metrics_compare_on_the_split_they_are_given(shards):
    """With split="val" the baselines predict the validation crops (the CNN's predictions are
    those crops' too): each estimator's MAE is its own on that split, per crop and per universe."""
    from cosmocub.evaluation.headline import field_level_metrics

    with h5py.File(shards / "val.h5", "r") as f:
        y, where = f["y"][:].astype(np.float64), f["universe_index"][:]
    val = {"mean": y + 0.25, "true": y, "universe_index": where}  # a CNN off by 0.25 everywhere
    names = ("Omega_m", "sigma_8", "N_spec", "H_0")
    metrics, _ = field_level_metrics(
        shards_dir=shards, names=names, test=val, val=None, split="val"
    )
    expected = baseline_predictions(shards, "val")
    crop = metrics["comparison"]["per_crop"]
    assert metrics["comparison"]["num_crops"] == len(y) == 4
    for j, name in enumerate(names):
        assert crop[name]["cnn"] == pytest.approx(0.25)
        assert crop[name]["one_point"] == pytest.approx(
            np.abs(expected["one_point"][:, j] - y[:, j]).mean()
        )
