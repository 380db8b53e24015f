"""The baselines: ridge fits on field statistics are fitted on the training split only, and a
field whose statistics carry the parameter is fitted well."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from baseline_shards import write_shards

from cosmocub.evaluation.baselines import (
    RIDGE_ALPHAS,
    baseline_predictions,
    fit_ridge,
    usable_columns,
)


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


def _write_planted_features(folder, rows: dict[str, int], seed: int = 6) -> dict[str, np.ndarray]:
    """train/val/test targets and a features.h5 by hand: parameter 0 sits in the one-point
    statistics, 1 in P(k), 2 in the bispectrum, 3 nowhere; the bispectrum block is wide noise,
    so a fit on every feature together overfits the training rows."""
    from cosmocub.data.features import FEATURES_FILE

    rng = np.random.default_rng(seed)
    targets = {}
    with h5py.File(folder / FEATURES_FILE, "w") as features:
        for split, n in rows.items():
            y = rng.uniform(-1, 1, size=(n, 4))
            one_point, pk, bispectrum = (rng.normal(size=(n, m)) for m in (3, 3, 40))
            one_point[:, 0] += 5 * y[:, 0]
            pk[:, 0] += 5 * y[:, 1]
            bispectrum[:, 0] += 5 * y[:, 2]
            group = features.create_group(split)
            group["one_point"], group["pk"], group["bispectrum"] = one_point, pk, bispectrum
            with h5py.File(folder / f"{split}.h5", "w") as shard:
                shard["y"] = y
            targets[split] = y
    return targets


def test_metrics_record_and_report_the_classical_fit_chosen_on_validation(tmp_path):
    from cosmocub.evaluation.headline import field_level_metrics
    from cosmocub.evaluation.report import format_comparison

    y = _write_planted_features(tmp_path, {"train": 60, "val": 60, "test": 20})["test"]
    test = {"mean": y + 0.1, "true": y, "universe_index": np.arange(len(y))}
    names = ("Omega_m", "sigma_8", "N_spec", "H_0")
    metrics, _ = field_level_metrics(shards_dir=tmp_path, names=names, test=test, val=None)
    chosen = metrics["comparison"]["classical_choice"]
    assert [chosen[n]["feature_set"] for n in names[:3]] == ["one_point", "pk", "combined"]
    assert chosen["N_spec"]["features"] == ("pk", "one_point", "bispectrum")
    assert chosen["Omega_m"]["penalty"] in RIDGE_ALPHAS
    page = "\n".join(format_comparison(metrics))
    classical = metrics["comparison"]["per_universe"]["sigma_8"]["classical"]
    assert f"| {classical:.4f} (P(k)) |" in page
    assert " (P(k) + one-point + bispectrum) |" in page and " (one-point) |" in page


def test_features_file_without_log_pk_still_fits_and_says_so(tmp_path, caplog):
    """A features.h5 written before log_pk existed: the baselines fit what it has and warn."""
    import logging

    from cosmocub.data.features import FEATURES_FILE, write_features
    from cosmocub.evaluation.baselines import feature_sets, fit_baselines

    rng = np.random.default_rng(4)
    for split, n in {"train": 12, "val": 6, "test": 4}.items():
        with h5py.File(tmp_path / f"{split}.h5", "w") as f:
            f["x"] = np.log1p(rng.poisson(2.0, size=(n, 1, 8, 8, 8))).astype(np.float32)
            f["y"] = rng.uniform(-1, 1, size=(n, 4)).astype(np.float32)
            f.attrs["log1p"] = True
    write_features(tmp_path, tmp_path / FEATURES_FILE, num_workers=1)
    with caplog.at_level(logging.WARNING):
        fit_baselines(tmp_path, "test")
    assert feature_sets(["pk", "log_pk", "one_point"])["combined"] == ("pk", "log_pk", "one_point")
    assert not [r for r in caplog.records if "no log_pk" in r.getMessage()]
    with h5py.File(tmp_path / FEATURES_FILE, "a") as f:
        for split in ("train", "val", "test"):
            del f[split]["log_pk"]
    with caplog.at_level(logging.WARNING):
        preds, choice = fit_baselines(tmp_path, "test")
    assert all("log_pk" not in c.features for c in choice)
    assert preds["classical"].shape == (4, 4) and np.isfinite(preds["classical"]).all()
    assert any(
        "no log_pk" in r.getMessage() and "cosmocub features" in r.getMessage()
        for r in caplog.records
    )
