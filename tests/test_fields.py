"""The U-Net's evaluation pieces: cross spectra, transfer and r(k), linear growth, counts."""

from __future__ import annotations

import numpy as np
import pytest

from cosmocub.cosmology.spectra import cross_spectra, transfer_and_correlation
from cosmocub.emulator.evaluate_emulator import field_metrics, growth_ratio, to_counts


def field(seed: int, n: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, n, n))


def test_cross_spectrum_is_the_binned_real_part_of_a_times_conj_b() -> None:
    a, b = field(0), field(1) + 0.5 * field(0)
    s = cross_spectra(a, b, 16.0)
    # Direct: Re(a_k b_k*) on the same shells, every mode of the full FFT counted once.
    fa, fb = np.fft.fftn(a), np.fft.fftn(b)
    k1 = np.fft.fftfreq(16, d=1.0 / 16) * (2 * np.pi / 16.0)
    kk = np.sqrt(k1[:, None, None] ** 2 + k1[None, :, None] ** 2 + k1[None, None, :] ** 2)
    shell = (kk > 0.5 * 2 * np.pi / 16) & (kk <= 1.5 * 2 * np.pi / 16)  # the first bin
    direct = np.mean((fa * np.conj(fb)).real[shell]) * 16.0**3 / 16.0**6
    assert s.p_ab[0] == pytest.approx(direct, rel=1e-10)
    assert s.n_modes[0] == shell.sum()


def test_transfer_and_r_of_scaled_and_independent_fields() -> None:
    a = field(2)
    s = cross_spectra(2.0 * a, a, 16.0)
    transfer, r = transfer_and_correlation(s.p_aa, s.p_bb, s.p_ab)
    np.testing.assert_allclose(transfer, 4.0, rtol=1e-12)
    np.testing.assert_allclose(r, 1.0, rtol=1e-12)
    _, r_neg = transfer_and_correlation(*_three(cross_spectra(-a, a, 16.0)))
    np.testing.assert_allclose(r_neg, -1.0, rtol=1e-12)
    # Independent fields: |r| small, shrinking with the modes per bin.
    _, r_ind = transfer_and_correlation(*_three(cross_spectra(field(3, 32), field(4, 32), 32.0)))
    assert np.all(np.abs(r_ind[3:]) < 0.2)


def _three(s):
    return s.p_aa, s.p_bb, s.p_ab


def test_growth_ratio() -> None:
    assert growth_ratio(1.0, 0.0, 3.0) == pytest.approx(4.0, rel=1e-12)  # EdS: D ∝ a
    # With Λ growth has slowed since z = 3: less than a's factor 4.
    assert 3.0 < growth_ratio(0.3, 0.0, 3.0) < 3.3


def test_counts_round_trip_and_goal_flags() -> None:
    counts = np.array([0.0, 1.0, 7.0])
    stored = (np.log1p(counts) - 0.5) / 0.25
    np.testing.assert_allclose(to_counts(stored, mean=0.5, std=0.25, log1p=True), counts)
    k = np.array([1.0, 2.0, 3.0])
    sums = {
        "tt": np.ones(3),
        "pp": np.array([1.05, 0.95, 0.2]),
        "pt": np.array([0.98, 0.92, 0.1]),
        "bb": np.array([1.3, 1.5, 2.0]),
        "bt": np.array([0.9, 0.5, 0.0]),
    }
    metrics = field_metrics(sums, k, k_nyquist=4.0)  # k_N/2 = 2: the first two bins count
    model, base = metrics["summary"]["model"], metrics["summary"]["baseline"]
    assert model["max_transfer_error_to_half_nyquist"] == pytest.approx(0.05)
    assert model["min_r_to_half_nyquist"] == pytest.approx(0.92 / np.sqrt(0.95))
    assert model["meets_goal"] and not base["meets_goal"]


def test_unet_run_config(tmp_path) -> None:
    from pathlib import Path

    from cosmocub.config import from_values, load_config
    from cosmocub.emulator.unet_run_config import unet_config_values

    repo = Path(__file__).resolve().parents[1]
    base = load_config(repo / "config" / "config.yaml")
    cfg = from_values(unet_config_values(base))
    assert (cfg.model.name, cfg.model.in_channels, cfg.train.run_name) == ("unet", 1, "unet")
    assert cfg.model.input_size == base.model.input_size  # the same shards
    assert base.model.name == "cosmoflow" and base.values["model"]["name"] == "cosmoflow"
    path = tmp_path / "c.yaml"
    path.write_text(
        "optimizer: {name: lion_cub, lion_cub: {quantizer: l1, bits: 4}}\n"
        "train: {ranks_per_node: 3}\n"
        "task: {input_redshifts: [3.0, 1.5]}\n"
        "unet: {parallel: {spatial: 2}, optimizer: {name: adamw, lr: 0.01},"
        " train: {ranks_per_node: 6}}\n"
    )
    cfg = from_values(unet_config_values(load_config(path)))
    assert cfg.optimizer.name == "adamw" and cfg.optimizer.lion_cub is None
    assert cfg.optimizer.lr == 0.01 and cfg.model.in_channels == 2
    assert (cfg.parallel.spatial, cfg.train.ranks_per_node) == (2, 6)  # 3 data ranks × 2


def test_unet_ranks_per_node_counts_every_rank(tmp_path) -> None:
    import pytest

    from cosmocub.config import ConfigError, load_config
    from cosmocub.emulator.unet_run_config import unet_world_size

    path = tmp_path / "c.yaml"
    path.write_text("unet: {parallel: {spatial: 2}, train: {ranks_per_node: 2}}\n")
    assert unet_world_size(load_config(path)) == 2  # as in train: 2 ranks, one sample
    path.write_text("unet: {parallel: {spatial: 2}, train: {ranks_per_node: 3}}\n")
    match = (
        r"c.yaml \+ unet: key 'unet.train.ranks_per_node': 3 ranks per node is not a multiple "
        r"of parallel.spatial 2 \(.*for 3 data ranks write 6\)$"
    )
    with pytest.raises(ConfigError, match=match):
        unet_world_size(load_config(path))
    # Inherited from train: the message names the key it came from.
    path.write_text("train: {ranks_per_node: 3}\nunet: {parallel: {spatial: 2}}\n")
    with pytest.raises(ConfigError, match=r"key 'train.ranks_per_node': 3 ranks per node"):
        unet_world_size(load_config(path))
