"""Field statistics: the binned P(k) estimator on a Gaussian field of known spectrum, the
one-point statistics on hand-checkable fields, and the per-shard features file."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from scipy.ndimage import gaussian_filter

from cosmocub.cosmology.power import binned_power_spectrum, log_k_edges
from cosmocub.data.features import (
    FEATURES_FILE,
    NUM_K_BINS,
    ONE_POINT_NAMES,
    one_point_statistics,
    read_features,
    sample_features,
    write_features,
)


def _gaussian_field(n: int, box: float, power, rng: np.random.Generator) -> np.ndarray:
    """A Gaussian random field with spectrum `power(k)`: white noise coloured in Fourier space."""
    white_k = np.fft.rfftn(rng.standard_normal((n, n, n)))  # <|w_k|²> = n³
    k_fund = 2 * np.pi / box
    k1 = np.fft.fftfreq(n, d=1.0 / n) * k_fund
    kz = np.fft.rfftfreq(n, d=1.0 / n) * k_fund
    k = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + kz[None, None, :] ** 2)
    k[0, 0, 0] = 1.0
    # P = V·|DFT|²/n⁶ ⇒ |DFT|² = P·n⁶/V; the white noise carries n³ already.
    amplitude = np.sqrt(power(k) * n**3 / box**3)
    amplitude[0, 0, 0] = 0.0
    return np.fft.irfftn(white_k * amplitude, s=(n, n, n), axes=(0, 1, 2))


def test_power_spectrum_of_a_gaussian_field_within_cosmic_variance():
    n, box = 32, 100.0

    def power(k):
        return 50.0 * k**-1.0

    field = _gaussian_field(n, box, power, np.random.default_rng(3))
    k, p, n_modes = binned_power_spectrum(field, box, log_k_edges(n, box, 10))
    assert np.all(n_modes > 0)
    assert k[0] == pytest.approx(2 * np.pi / box)  # the first bin holds only the fundamental
    assert k[-1] < np.pi * n / box  # nothing beyond Nyquist
    # A bin's estimate scatters by P·sqrt(2 / n_modes) (n_modes counts k and −k, one mode).
    z = (p - power(k)) / (power(k) * np.sqrt(2.0 / n_modes))
    assert np.all(np.abs(z) < 4), z
    assert np.mean(z**2) < 3, z
    # A wrong normalisation (factor 2) would be far outside: the test can fail.
    z_wrong = (2 * p - power(k)) / (power(k) * np.sqrt(2.0 / n_modes))
    assert np.max(np.abs(z_wrong)) > 10


def test_power_spectrum_shot_noise_and_window():
    rng = np.random.default_rng(0)
    field = rng.standard_normal((16, 16, 16))
    edges = log_k_edges(16, 16.0, 4)
    _, raw, _ = binned_power_spectrum(field, 16.0, edges)
    _, less, _ = binned_power_spectrum(field, 16.0, edges, shot_noise=0.25)
    np.testing.assert_allclose(less, raw - 0.25)
    _, ngp, _ = binned_power_spectrum(field, 16.0, edges, window="ngp")
    assert np.all(ngp > raw)  # dividing by W² < 1 raises every bin
    with pytest.raises(ValueError, match="window 'tsc'"):
        binned_power_spectrum(field, 16.0, edges, window="tsc")


def test_one_point_statistics_of_known_values():
    values = np.array([0.0, 0.0, 1.0, 3.0])
    stats = dict(zip(ONE_POINT_NAMES, one_point_statistics(values), strict=True))
    assert stats["mean"] == pytest.approx(1.0)
    assert stats["std"] == pytest.approx(np.sqrt(1.5))
    assert stats["empty"] == pytest.approx(0.5)
    assert stats["q0.5"] == pytest.approx(0.5)
    assert stats["skewness"] > 0  # the long tail is to the right


def test_one_point_moments_are_scipys():
    """The moments are written out in numpy; scipy.stats's biased skewness and Fisher kurtosis
    are the reference, on a skewed field where both are far from 0."""
    import scipy.stats

    values = np.log1p(np.random.default_rng(2).poisson(0.7, size=(16, 16, 16)))
    stats = dict(zip(ONE_POINT_NAMES, one_point_statistics(values), strict=True))
    assert stats["skewness"] == pytest.approx(scipy.stats.skew(values.ravel()), rel=1e-12)
    assert stats["kurtosis"] == pytest.approx(scipy.stats.kurtosis(values.ravel()), rel=1e-12)
    assert stats["std"] == pytest.approx(values.std(), rel=1e-12)
    assert abs(stats["skewness"]) > 0.3 and abs(stats["kurtosis"]) > 0.3


def test_sample_features_same_from_counts_and_log1p():
    counts = np.random.default_rng(1).poisson(3.0, size=(2, 8, 8, 8)).astype(np.float64)
    a = sample_features(counts, log1p=False)
    b = sample_features(np.log1p(counts), log1p=True)
    assert list(a) == ["pk", "log_pk", "one_point"]
    for name in a:
        np.testing.assert_allclose(a[name], b[name], rtol=1e-9, equal_nan=True)
    assert a["one_point"].shape == (2 * len(ONE_POINT_NAMES),)
    assert a["log_pk"].shape == a["pk"].shape


def test_write_features_per_split(tmp_path):
    rng = np.random.default_rng(2)
    sizes = {"train": 5, "val": 0, "test": 3}
    for split, n in sizes.items():
        with h5py.File(tmp_path / f"{split}.h5", "w") as f:
            f["x"] = np.log1p(rng.poisson(2.0, size=(n, 2, 8, 8, 8))).astype(np.float16)
            f.attrs["log1p"] = True
    write_features(tmp_path, tmp_path / FEATURES_FILE, num_workers=1)
    for split, n in sizes.items():
        feats = read_features(tmp_path / FEATURES_FILE, split)
        assert feats["one_point"].shape == (n, 2 * len(ONE_POINT_NAMES))
        assert feats["pk"].shape[0] == n
    # Each row is the features of its own sample, in shard order.
    with h5py.File(tmp_path / "test.h5", "r") as f:
        expected = sample_features(f["x"][2], log1p=True)
    stored = read_features(tmp_path / FEATURES_FILE, "test")
    assert set(stored) == {"pk", "log_pk", "one_point"}
    for name, values in expected.items():
        np.testing.assert_allclose(stored[name][2], values)
    with pytest.raises(FileNotFoundError, match="cosmocub features --shards"):
        read_features(tmp_path / "missing.h5", "train")


def test_log_pk_is_the_log_fields_spectrum():
    """On counts exp(h)·n̄ of a Gaussian h the log-density P(k) is h's own, which the counts'
    P(k) is not (a lognormal's spectrum is log(1 + C) transformed, far from C at σ_h = 1)."""
    n = 16
    rng = np.random.default_rng(5)
    h = gaussian_filter(rng.normal(size=(n, n, n)), 1.5, mode="wrap")
    h /= h.std()
    counts = np.round(1e4 * np.exp(h))
    edges = log_k_edges(n, float(n), NUM_K_BINS)
    expected = binned_power_spectrum(h - h.mean(), float(n), edges)[1]
    features = sample_features(counts[None], log1p=False)
    finite = np.isfinite(expected) & (expected > 1e-3 * np.nanmax(expected))
    np.testing.assert_allclose(10 ** features["log_pk"][finite], expected[finite], rtol=2e-3)
    counts_pk = 10 ** features["pk"][finite]
    assert np.max(np.abs(np.log(counts_pk / expected[finite]))) > 0.3
