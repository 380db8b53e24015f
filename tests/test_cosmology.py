"""Synthetic universes: parameters, growth, the initial power spectrum, LPT, PM and the counts."""

from __future__ import annotations

import dataclasses
from itertools import pairwise

import numpy as np
import pytest
from colossus.cosmology.cosmology import Cosmology

from cosmocub.config import ConfigError, SimulateConfig
from cosmocub.cosmology.background import FlatLCDM
from cosmocub.cosmology.fourier import TimedFFT
from cosmocub.cosmology.lpt import linear_density_k, lpt_displacements, white_noise
from cosmocub.cosmology.pm import ParticleMeshForce, ngp_counts, step_scale_factors
from cosmocub.cosmology.pm_kernels import (
    cic_deposit,
    cic_interpolate,
    gradient_4point,
    sort_by_voxel,
)
from cosmocub.cosmology.power import (
    linear_power_spectrum,
    measure_power_spectrum,
    overdensity,
)
from cosmocub.data.simulate import (
    SNAPSHOT_REDSHIFTS,
    draw_unit_par,
    simulate_universe,
)

PM = SimulateConfig(pm_steps=10, initial_redshift=9.0, lpt_order=2, force_mesh_factor=2)
LPT_ONLY = SimulateConfig(pm_steps=0, initial_redshift=9.0, lpt_order=2, force_mesh_factor=2)
BASE = np.array([0.3, 0.8, 0.96, 70.0])


@pytest.fixture(scope="module")
def universe_32():
    return simulate_universe(size=32, seed=7, settings=PM)


# --- parameters -----------------------------------------------------------------------------


def test_unit_par_in_range_and_phys_par_mapping(universe_32):
    u, p = universe_32.unit_par, universe_32.phys_par
    assert u.dtype == np.float32 and p.dtype == np.float32
    assert np.all(u >= -1.0) and np.all(u < 1.0)
    np.testing.assert_allclose(p, BASE * (1.0 + 0.1 * u.astype(np.float64)), rtol=1e-6)
    # The draw is the public generator's: 4 uniforms in [-1, 1) from PCG64(seed), nothing else.
    expected = np.random.Generator(np.random.PCG64(7)).uniform(-1.0, 1.0, 4).astype(np.float32)
    np.testing.assert_array_equal(u, expected)
    draws = np.stack([draw_unit_par(np.random.Generator(np.random.PCG64(s))) for s in range(300)])
    assert draws.min() >= -1.0 and draws.max() < 1.0
    assert draws.min() < -0.95 and draws.max() > 0.95  # spans the range, not a narrower one


def test_box_size_scales_with_h0(universe_32):
    assert universe_32.box_size_mpc_h == pytest.approx(32 * universe_32.phys_par[3] / 70.0)


# --- background -----------------------------------------------------------------------------


@pytest.mark.parametrize("omega_m", [0.27, 0.3, 0.33])
def test_growth_matches_colossus_and_growth_ode(omega_m):
    bg = FlatLCDM(omega_m=omega_m)
    cosmo = Cosmology(
        name=f"test-{omega_m}",
        flat=True,
        Om0=omega_m,
        Ob0=0.045,
        H0=70.0,
        sigma8=0.8,
        ns=0.96,
        relspecies=False,
        persistence="",
    )
    a = np.array([0.1, 0.25, 0.4, 2.0 / 3.0, 1.0])
    np.testing.assert_allclose(bg.growth(a), cosmo.growthFactor(1.0 / a - 1.0), rtol=2e-4)
    # f(a=1) ≈ Ω_m^0.55 (Linder 2005, good to ~0.5 % in ΛCDM)
    assert bg.growth_rate(1.0) == pytest.approx(omega_m**0.55, rel=0.01)
    # g_p = a³E·D' obeys dg_p/da = 1.5·Ω_m·D / (a²E): what the kick factor relies on.
    h = 1e-5
    for ai in (0.1, 0.3, 0.7):
        dgp = (bg.momentum_growth(ai + h) - bg.momentum_growth(ai - h)) / (2 * h)
        rhs = 1.5 * omega_m * bg.growth(ai) / (ai**2 * bg.efunc(ai))
        assert dgp == pytest.approx(rhs, rel=1e-6)


def test_step_scale_factors_hit_every_snapshot():
    snaps = [1.0 / (1.0 + z) for z in SNAPSHOT_REDSHIFTS]
    steps = step_scale_factors(0.1, snaps, 10)
    assert len(steps) == 11 and steps[0] == 0.1 and steps[-1] == 1.0
    assert np.all(np.diff(steps) > 0)
    for a in snaps:
        assert np.min(np.abs(steps - a)) < 1e-12
    # 4 intervals of lengths 0.15, 0.15, 0.267, 0.333: steps shared in proportion (1.67, 1.67,
    # 2.96, 3.70), each interval within one step of its share
    edges = [0.1, *sorted(snaps)]
    counts = np.array(
        [np.sum((steps > lo + 1e-12) & (steps <= hi + 1e-12)) for lo, hi in pairwise(edges)]
    )
    share = 10 * np.diff(edges) / 0.9
    assert counts.sum() == 10 and np.all(np.abs(counts - share) < 1.0), counts
    assert len(step_scale_factors(0.1, snaps, 4)) == 5
    with pytest.raises(ValueError, match="3 steps cannot end on 4 snapshots"):
        step_scale_factors(0.1, snaps, 3)


@pytest.mark.parametrize(
    ("steps", "z_init", "match"),
    [
        (len(SNAPSHOT_REDSHIFTS) - 1, 9.0, "simulate.pm_steps': 3"),
        (10, max(SNAPSHOT_REDSHIFTS), "simulate.initial_redshift': 3.0"),
    ],
)
def test_bad_settings_are_config_errors(steps, z_init, match):
    # SimulateConfig checks against hard-coded snapshots: this keeps them in step with the
    # simulation's SNAPSHOT_REDSHIFTS.
    with pytest.raises(ConfigError, match=match):
        SimulateConfig(pm_steps=steps, initial_redshift=z_init, lpt_order=2, force_mesh_factor=1)
    ok = SimulateConfig(
        pm_steps=len(SNAPSHOT_REDSHIFTS), initial_redshift=3.01, lpt_order=1, force_mesh_factor=1
    )
    assert simulate_universe(size=8, seed=0, settings=ok).counts_dhwc.sum() == 4 * 8**3
    with pytest.raises(ConfigError, match="--size 4 is below the minimum 8"):
        simulate_universe(size=4, seed=0, settings=ok)


# --- power spectrum -------------------------------------------------------------------------


def test_measure_power_spectrum_plane_wave():
    n, box, amp, m = 32, 100.0, 0.3, 3
    x = np.arange(n) / n
    field = amp * np.cos(2 * np.pi * m * x)[None, None, :] * np.ones((n, n, 1))
    k, p, n_modes = measure_power_spectrum(field, box)
    # all power in the bin at |k| = m·k_f: Σ P·n_modes / V = variance = amp²/2 (Parseval)
    hit = np.argmax(p)
    k_f = 2 * np.pi / box
    assert abs(k[hit] - m * k_f) < 0.5 * k_f  # k is the bin's mean |k| over its modes
    assert p[hit] * n_modes[hit] / box**3 == pytest.approx(amp**2 / 2, rel=1e-6)
    assert np.sum(p * n_modes) / box**3 == pytest.approx(amp**2 / 2, rel=1e-6)
    # mode counts: the first bin, 0.5–1.5 k_f, holds the 6 modes (±1, 0, 0) and the 12 (±1, ±1, 0)
    assert n_modes[0] == 18


def _mode_averaged(power, n, box, k_bins):
    """Mean of P(|k|) over the modes of each estimator bin (independent of the estimator code)."""
    k_f = 2 * np.pi / box
    f = np.fft.fftfreq(n, 1.0 / n)
    kk = k_f * np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + f[None, None, :] ** 2)
    shell = np.rint(kk / k_f).astype(int)
    # the generator zeroes Nyquist planes: leave them out of the expectation as well
    nyq = np.abs(f) == n // 2
    keep = ~(nyq[:, None, None] | nyq[None, :, None] | nyq[None, None, :])
    out = []
    for kb in k_bins:
        sel = keep & (shell == round(kb / k_f))
        out.append(power(kk[sel]).mean())
    return np.array(out)


def test_initial_field_follows_linear_power_on_large_scales():
    n, box = 64, 64.0
    power = linear_power_spectrum(omega_m=0.3, sigma_8=0.8, n_s=0.96, h0=70.0)
    fft = TimedFFT()
    noise = white_noise(np.random.Generator(np.random.PCG64(3)), n)
    delta = fft.irfftn(linear_density_k(noise, box_size=box, power=power, fft=fft), n)
    k, p, n_modes = measure_power_spectrum(delta, box)
    large = k < 0.5 * np.pi * n / box  # below half the Nyquist wavenumber
    expected = _mode_averaged(power, n, box, k[large])
    ratio = p[large] / expected
    # each bin averages n_modes/2 independent |δ_k|², exponentially distributed: σ = √(2/n_modes)
    sigma = np.sqrt(2.0 / n_modes[large])
    assert np.all(np.abs(ratio - 1.0) < 5.0 * sigma), (ratio, sigma)
    pooled = np.sum(p[large] * n_modes[large]) / np.sum(expected * n_modes[large])
    assert abs(pooled - 1.0) < 4.0 * np.sqrt(2.0 / n_modes[large].sum())
    # amplitude really is σ_8-normalised: doubling σ_8 quadruples the power
    power2 = linear_power_spectrum(omega_m=0.3, sigma_8=1.6, n_s=0.96, h0=70.0)
    np.testing.assert_allclose(power2(k) / power(k), 4.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("omega_m", "sigma_8", "n_s", "h0"), [(0.3, 0.8, 0.96, 70), (0.33, 0.72, 1.05, 63)]
)
def test_linear_power_is_normalised_to_sigma8(omega_m, sigma_8, n_s, h0):
    # σ²(R = 8 Mpc/h) = ∫ k² P(k) W²(kR) dk / 2π² with the top-hat window, from the returned P(k)
    power = linear_power_spectrum(omega_m=omega_m, sigma_8=sigma_8, n_s=n_s, h0=h0)
    k = np.logspace(-4, 2, 20000)
    x = 8.0 * k
    window = 3.0 * (np.sin(x) - x * np.cos(x)) / x**3
    sigma = np.sqrt(np.trapezoid(k**2 * power(k) * window**2, k) / (2 * np.pi**2))
    assert sigma == pytest.approx(sigma_8, rel=2e-3)
    assert power(np.array([0.0]))[0] == 0.0


# --- LPT ------------------------------------------------------------------------------------


def test_lpt_of_a_plane_wave_is_exact_zeldovich():
    # δ = A·cos(2π·m·x/n) (x along axis 2): Ψ_x = −A·sin(kx)/k, other axes 0, and Ψ2 = 0
    # because the 2LPT source vanishes for one-dimensional motion.
    n, amp, m = 16, 0.2, 2
    x = np.arange(n)
    delta = np.broadcast_to(amp * np.cos(2 * np.pi * m * x / n), (n, n, n)).astype(np.float32)
    fft = TimedFFT()
    psi1, psi2 = lpt_displacements(fft.rfftn(delta), order=2, fft=fft)
    k = 2 * np.pi * m / n
    np.testing.assert_allclose(psi1[2, 0, 0], -amp * np.sin(k * x) / k, atol=1e-6)
    assert np.abs(psi1[:2]).max() < 1e-6
    assert np.abs(psi2).max() < 1e-6
    _, none = lpt_displacements(fft.rfftn(delta), order=1, fft=fft)
    assert none is None


def test_second_order_source_sign():
    # Two crossed waves: the 2LPT source is φ_xx·φ_yy − φ_xy², nonzero; check Ψ2 against the
    # analytic answer for δ = A(cos kx + cos ky): φ = −A(cos kx + cos ky)/k²,
    # S = φ_xx·φ_yy = A²·cos kx·cos ky, φ2 = −S/(2k²), Ψ2_x = ∂xφ2 = A²·sin kx·cos ky/(2k).
    n, amp = 16, 0.1
    k = 2 * np.pi / n
    i = np.arange(n)
    delta = amp * (np.cos(k * i)[None, :, None] + np.cos(k * i)[None, None, :])
    delta = np.broadcast_to(delta, (n, n, n)).astype(np.float32)
    fft = TimedFFT()
    _, psi2 = lpt_displacements(fft.rfftn(delta), order=2, fft=fft)
    expected_x = amp**2 * np.sin(k * i)[None, :] * np.cos(k * i)[:, None] / (2 * k)  # (y, x)
    np.testing.assert_allclose(psi2[2, 0], expected_x, atol=1e-6)


# --- mass assignment ------------------------------------------------------------------------


def test_cic_conserves_mass_and_interpolates_linear_fields():
    rng = np.random.default_rng(0)
    m = 8
    pos = rng.uniform(-3, 11, size=(3, 500)).astype(np.float32)  # outside [0, m): wrapped
    density = np.full((m, m, m), np.nan, dtype=np.float32)  # the deposit overwrites it all
    cic_deposit(pos, 1.0, density)
    assert density.sum() == pytest.approx(500, rel=1e-6)
    # Each particle's 8 weights sum to 1: a constant field reads back as that constant.
    forces = np.empty((2, 500), dtype=np.float32)
    constant = np.stack([np.full((m, m, m), 3.0), np.full((m, m, m), -1.5)], axis=-1)
    cic_interpolate(constant.astype(np.float32), pos, 1.0, forces)
    np.testing.assert_allclose(forces, [[3.0] * 500, [-1.5] * 500], rtol=1e-6)
    # A field linear along axis 0 inside the box, read at points away from the wrap seam; at
    # scale 2 (two cells a voxel) the same field is read at twice the coordinate.
    inner = rng.uniform(0.5, 6.5, size=(3, 200)).astype(np.float32)
    field = np.broadcast_to(np.arange(m, dtype=np.float32)[:, None, None, None], (m, m, m, 1))
    out = np.empty((1, 200), dtype=np.float32)
    cic_interpolate(np.ascontiguousarray(field), inner, 1.0, out)
    np.testing.assert_allclose(out[0], inner[0], atol=1e-5)
    cic_interpolate(np.ascontiguousarray(field), inner / 2, 2.0, out)
    np.testing.assert_allclose(out[0], inner[0], atol=1e-5)


def test_cic_interpolation_is_the_deposits_adjoint():
    # Σ_p (W·F)_p = Σ_cells F·(Wᵀ·1): the same weights both ways, so a particle exerts no net
    # force on itself and momentum is conserved to rounding.
    rng = np.random.default_rng(1)
    m, num = 16, 3000
    pos = rng.uniform(0, 8, size=(3, num)).astype(np.float32)
    field = rng.standard_normal((m, m, m, 1)).astype(np.float32)
    density = np.empty((m, m, m), dtype=np.float32)
    cic_deposit(pos, 2.0, density)
    out = np.empty((1, num), dtype=np.float32)
    cic_interpolate(field, pos, 2.0, out)
    assert out.sum(dtype=np.float64) == pytest.approx(
        (field[..., 0] * density).sum(dtype=np.float64), rel=1e-5
    )


def test_four_point_gradient_of_a_wave_is_accurate_to_fourth_order():
    # f = sin(2π·k·x/m) along each axis in turn: the stencil's derivative is
    # (8 sin(θ) − sin(2θ)) / (6h)·cos(...) with θ = 2πk/m, exact to O(θ⁵) against k·cos(...)
    m, cells_per_unit = 32, 2.0
    x = np.arange(m)
    out = np.empty((m, m, m, 3), dtype=np.float32)
    for k_wave, tolerance in ((1, 1e-4), (4, 2e-2)):
        theta = 2 * np.pi * k_wave / m
        for axis in range(3):
            shape = [1, 1, 1]
            shape[axis] = m
            field = np.broadcast_to(np.sin(theta * x).reshape(shape), (m, m, m))
            gradient_4point(np.ascontiguousarray(field, dtype=np.float32), cells_per_unit, out)
            exact = cells_per_unit * theta * np.cos(theta * x).reshape(shape)
            stencil = cells_per_unit * (8 * np.sin(theta) - np.sin(2 * theta)) / 6
            np.testing.assert_allclose(
                out[..., axis],
                np.broadcast_to(stencil * np.cos(theta * x).reshape(shape), out.shape[:3]),
                atol=1e-5,
            )
            assert np.abs(out[..., axis] - exact).max() < tolerance * cells_per_unit * theta
            others = [a for a in range(3) if a != axis]
            assert np.abs(out[..., others]).max() < 1e-6


def test_sort_by_voxel_orders_particles_and_keeps_pairs():
    rng = np.random.default_rng(2)
    n = 6
    pos = rng.uniform(-1, n + 1, size=(3, 400)).astype(np.float32)
    mom = (pos * 10 + 1).astype(np.float32)  # a momentum each particle can be recognised by
    before = {tuple(p) for p in np.concatenate([pos, mom]).T.tolist()}
    sort_by_voxel(pos, mom, n)
    voxel = np.ravel_multi_index(tuple(np.floor(pos).astype(int) % n), (n, n, n))
    assert np.all(np.diff(voxel) >= 0)
    assert {tuple(p) for p in np.concatenate([pos, mom]).T.tolist()} == before


def test_ngp_counts_wrap_periodically():
    pos = np.array([[0.2, 0.2, 0.2], [3.9, 0.0, 0.0], [-0.1, 0.0, 0.0], [4.0, 0.5, 0.5]])
    c = ngp_counts(pos.T.astype(np.float32), 4)
    assert c.sum() == 4
    assert c[0, 0, 0] == 2  # 0.2 and 4.0 (= 0 after wrapping)
    assert c[3, 0, 0] == 2  # 3.9 and -0.1


# --- whole universes ------------------------------------------------------------------------


def test_mean_count_is_exactly_one_per_channel(universe_32):
    c = universe_32.counts_dhwc
    assert c.shape == (32, 32, 32, 4) and c.dtype == np.int16
    assert c.min() >= 0
    np.testing.assert_array_equal(c.reshape(-1, 4).sum(axis=0, dtype=np.int64), [32**3] * 4)
    np.testing.assert_array_equal(universe_32.redshifts, SNAPSHOT_REDSHIFTS)
    t = universe_32.timings
    assert 0 < t["fft"] < t["total"] and t["pm"] < t["total"]


def test_same_seed_same_universe_other_seed_other_universe(universe_32):
    again = simulate_universe(size=32, seed=7, settings=PM)
    np.testing.assert_array_equal(again.counts_dhwc, universe_32.counts_dhwc)
    np.testing.assert_array_equal(again.unit_par, universe_32.unit_par)
    other = simulate_universe(size=32, seed=8, settings=PM)
    assert not np.array_equal(other.unit_par, universe_32.unit_par)
    assert np.mean(other.counts_dhwc != universe_32.counts_dhwc) > 0.3


def test_clustering_grows_toward_low_redshift(universe_32):
    std = universe_32.counts_dhwc.reshape(-1, 4).std(axis=0)  # channels z = 0, 0.5, 1.5, 3
    assert std[0] > std[1] > std[2] > std[3], std
    # z = 3 is nearly linear, z = 0 strongly non-linear (real 128³ samples: ~1.5 and 6–7.4)
    assert std[0] > 2.5 * std[3]


def test_higher_sigma8_gives_higher_variance():
    # 64³: at 32³ the z = 0 std is dominated by a handful of haloes and too noisy to compare.
    low = simulate_universe(size=64, seed=5, settings=PM, unit_par=np.array([0, -1, 0, 0]))
    high = simulate_universe(size=64, seed=5, settings=PM, unit_par=np.array([0, 0.99, 0, 0]))
    assert high.phys_par[1] == pytest.approx(0.8 * 1.099)
    s_low = low.counts_dhwc.reshape(-1, 4).std(axis=0)
    s_high = high.counts_dhwc.reshape(-1, 4).std(axis=0)
    assert np.all(s_high > 1.1 * s_low), (s_low, s_high)
    # same phases: the two put their structures in the same places (4³-voxel blocks, z = 3, to
    # average out the shot noise of one particle per voxel)
    blocks = [
        u.counts_dhwc[..., 3].reshape(16, 4, 16, 4, 16, 4).sum(axis=(1, 3, 5)) for u in (low, high)
    ]
    assert np.corrcoef(blocks[0].ravel(), blocks[1].ravel())[0, 1] > 0.9


def _fundamental_growth(uni, seed):
    """Per channel: Σ Re(δ_k·δ_lin,k*) / Σ |δ_lin,k|² over the 6 fundamental modes, δ_lin scaled by
    D(z) and regenerated from the seed (same phases, so no cosmic variance)."""
    n = uni.counts_dhwc.shape[0]
    omega_m, sigma_8, n_s, h0 = (float(v) for v in uni.phys_par)
    power = linear_power_spectrum(omega_m=omega_m, sigma_8=sigma_8, n_s=n_s, h0=h0)
    rng = np.random.Generator(np.random.PCG64(seed))
    draw_unit_par(rng)
    fft = TimedFFT()
    lin_k = linear_density_k(white_noise(rng, n), box_size=uni.box_size_mpc_h, power=power, fft=fft)
    bg = FlatLCDM(omega_m=omega_m)
    f = np.fft.fftfreq(n, 1.0 / n)
    shell = np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + np.arange(n // 2 + 1) ** 2)
    fundamental = (shell > 0) & (shell < 1.5)
    ratios = []
    for channel, z in enumerate(SNAPSHOT_REDSHIFTS):
        got_k = np.fft.rfftn(overdensity(uni.counts_dhwc[..., channel]))[fundamental]
        want_k = bg.growth(1.0 / (1.0 + z)) * lin_k[fundamental]
        ratios.append(np.sum((got_k * np.conj(want_k)).real) / np.sum(np.abs(want_k) ** 2))
    return np.array(ratios)


def test_pm_reproduces_linear_growth_on_the_largest_scales():
    # Checks the force normalisation and the kick/drift factors together: the fundamental modes of
    # the counts must grow as D(z)·δ_lin. Non-linear mode coupling damps the cross-correlation with
    # the initial field (the propagator, ~exp(−k²σ_v²/2)): ~3 % at z = 3, ~17 % at z = 0 in a
    # 32 Mpc/h box; a force off by 10 % would move z = 3 by ~10 %.
    seed = 11
    uni = simulate_universe(size=32, seed=seed, settings=PM, unit_par=np.zeros(4))
    ratios = _fundamental_growth(uni, seed)  # channels z = 0, 0.5, 1.5, 3
    assert ratios[3] == pytest.approx(1.0, abs=0.05), ratios
    assert ratios[2] == pytest.approx(1.0, abs=0.08), ratios
    assert np.all(ratios > 0.75) and np.all(ratios < 1.02), ratios
    assert np.all(np.diff(ratios) > 0), ratios  # damping grows with time
    # time-step convergence: four times as many steps changes the large scales by < 1 %
    fine = SimulateConfig(pm_steps=40, initial_redshift=9.0, lpt_order=2, force_mesh_factor=2)
    fine_uni = simulate_universe(size=32, seed=seed, settings=fine, unit_par=np.zeros(4))
    np.testing.assert_allclose(_fundamental_growth(fine_uni, seed), ratios, atol=0.01)


def test_finite_difference_and_spectral_forces_give_the_same_universe(universe_32):
    # The default force (4-point stencil) against the exact spectral gradient, same seed: the
    # fields differ voxel by voxel (chaos), their statistics must not. Measured at 128³ with
    # benchmarks/realism.py (removed; last at a39a33b, docs/explanation/benchmarks.md): std within
    # 1 % at
    # every redshift, P(k) within 3 %.
    other = simulate_universe(
        size=32, seed=7, settings=dataclasses.replace(PM, force_gradient="spectral")
    )
    a = universe_32.counts_dhwc.astype(np.float64)
    b = other.counts_dhwc.astype(np.float64)
    assert np.any(a != b)  # not the same code path
    np.testing.assert_allclose(a.std(axis=(0, 1, 2)), b.std(axis=(0, 1, 2)), rtol=0.03)
    box = universe_32.box_size_mpc_h
    for channel in range(4):
        k, p_fd, _ = measure_power_spectrum(overdensity(a[..., channel]), box)
        _, p_sp, _ = measure_power_spectrum(overdensity(b[..., channel]), box)
        large = k < 0.5 * np.pi * 32 / box
        np.testing.assert_allclose(p_fd[large], p_sp[large], rtol=0.05)
    with pytest.raises(ValueError, match="gradient 'upwind'"):
        ParticleMeshForce(n=8, mesh_factor=1, omega_m=0.3, fft=TimedFFT(), gradient="upwind")


def test_simulated_power_follows_linear_theory_on_large_scales(universe_32):
    # The counts' P(k) (shot noise off) over D(z)²·P_lin of the universe's own linear field (same
    # phases, so no cosmic variance), in the two largest-scale bins (k ≈ 0.25, 0.44 h/Mpc in a
    # ~32 Mpc/h box). Measured: 0.83–1.00 (z = 0 lowest: non-linear damping of the largest
    # modes' phases does not enter an auto-spectrum, but mode coupling and the 10 coarse steps
    # do). A force 20 % too strong puts them at up to 1.3, one 20 % too weak down to 0.6.
    uni, n = universe_32, 32
    box = uni.box_size_mpc_h
    omega_m, sigma_8, n_s, h0 = (float(v) for v in uni.phys_par)
    power = linear_power_spectrum(omega_m=omega_m, sigma_8=sigma_8, n_s=n_s, h0=h0)
    rng = np.random.Generator(np.random.PCG64(7))
    draw_unit_par(rng)
    fft = TimedFFT()
    linear = fft.irfftn(
        linear_density_k(white_noise(rng, n), box_size=box, power=power, fft=fft), n
    )
    _, p_linear, _ = measure_power_spectrum(linear, box)
    background = FlatLCDM(omega_m=omega_m)
    ratios = []
    for channel, z in enumerate(SNAPSHOT_REDSHIFTS):
        _, p, _ = measure_power_spectrum(overdensity(uni.counts_dhwc[..., channel]), box)
        growth = background.growth(1.0 / (1.0 + z))
        ratios.append((p[:2] - box**3 / n**3) / (growth**2 * p_linear[:2]))
    ratios = np.array(ratios)  # (channel z = 0, 0.5, 1.5, 3; bin)
    assert np.all((ratios > 0.75) & (ratios < 1.15)), ratios
    assert ratios[3, 0] == pytest.approx(1.0, abs=0.05), ratios  # the fundamental at z = 3


def test_lpt_only_mode_deposits_every_particle():
    uni = simulate_universe(size=16, seed=2, settings=LPT_ONLY)
    np.testing.assert_array_equal(uni.counts_dhwc.reshape(-1, 4).sum(axis=0), [16**3] * 4)
    assert uni.counts_dhwc[..., 0].std() > uni.counts_dhwc[..., 3].std()


def test_second_order_lpt_is_closer_to_the_pm_run_than_zeldovich():
    # The sign and size of the 2LPT term, end to end: at z = 3 the 2LPT-only counts must sit
    # nearer a PM run started early (z = 19) than Zel'dovich's do. Seen: RMS 1.5 against 2.1
    # (2³-voxel blocks, seeds 3–5).
    n, seed = 32, 3
    fine = SimulateConfig(pm_steps=20, initial_redshift=19.0, lpt_order=2, force_mesh_factor=2)
    pm = simulate_universe(size=n, seed=seed, settings=fine, unit_par=np.zeros(4))

    def blocks(counts):
        return counts.reshape(16, 2, 16, 2, 16, 2).sum(axis=(1, 3, 5)).astype(np.float64)

    rms = {}
    for order in (1, 2):
        lpt = SimulateConfig(
            pm_steps=0, initial_redshift=19.0, lpt_order=order, force_mesh_factor=2
        )
        uni = simulate_universe(size=n, seed=seed, settings=lpt, unit_par=np.zeros(4))
        diff = blocks(uni.counts_dhwc[..., 3]) - blocks(pm.counts_dhwc[..., 3])
        rms[order] = float(np.sqrt(np.mean(diff**2)))
    assert rms[2] < 0.8 * rms[1], rms


@pytest.mark.realdata
def test_one_point_statistics_resemble_the_real_samples(real_samples):
    # The realism target: z = 0 std at least half the real samples' (Zel'dovich alone gives a
    # third), and the fraction of empty voxels, which tracks how far matter has collapsed, close
    # at every redshift. Seen at 64³ (seed 0): std 6.8/4.5/2.5/1.4 against real
    # 6.6/5.2/2.9/1.5; empty fractions within 0.02.
    from cosmocub.data.tfrecord import read_tfrecord_sample

    real = [read_tfrecord_sample(path) for path in real_samples]
    real_x = np.stack([x.reshape(-1, 4) for x, _ in real])  # (samples, voxels, 4)
    uni = simulate_universe(size=64, seed=0, settings=PM, unit_par=real[0][1])
    synth = uni.counts_dhwc.reshape(-1, 4)
    real_std = real_x.std(axis=1).mean(axis=0)
    assert synth[:, 0].std() > 0.5 * real_std[0], (synth.std(axis=0), real_std)
    np.testing.assert_allclose(synth.std(axis=0), real_std, rtol=0.35)
    np.testing.assert_allclose(
        (synth == 0).mean(axis=0), (real_x == 0).mean(axis=(0, 1)), atol=0.05
    )
