"""One synthetic N-body universe: parameters drawn as in the public CosmoFlow set, 2LPT initial
conditions, a particle-mesh run to z = 0, and particle counts per voxel at z = 0, 0.5, 1.5, 3.

`simulate_universe` is pure (arrays in memory, for tests and benchmarks); `run_simulate` is what
`cosmocub simulate` calls and writes the cosmoUniverse HDF5 layout atomically.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tqdm import tqdm

from cosmocub import __version__
from cosmocub.config import ConfigError, SimulateConfig
from cosmocub.cosmology.background import FlatLCDM
from cosmocub.cosmology.fourier import TimedFFT
from cosmocub.cosmology.lpt import (
    linear_density_k,
    lpt_displacements,
    second_order_growth,
    white_noise,
)
from cosmocub.cosmology.parameters import REDSHIFTS, phys_from_unit
from cosmocub.cosmology.pm import ParticleMeshForce, evolve_kdk, ngp_counts, step_scale_factors
from cosmocub.cosmology.power import OMEGA_B, linear_power_spectrum
from cosmocub.data.universe import channel_histogram, histogram_moments, write_universe

log = logging.getLogger(__name__)

# The snapshots are the channels of `full`, in its order.
SNAPSHOT_REDSHIFTS = REDSHIFTS
MIN_SIZE = 8
# Reference H0 of the public voxel size: box side = N·(H0/70) Mpc/h, i.e. 1 Mpc/h·(H0/70) voxels.
VOXEL_H0 = 70.0


@dataclass(frozen=True, kw_only=True)
class SimulatedUniverse:
    counts_dhwc: np.ndarray = field(repr=False)  # (N, N, N, 4) int16, channels z = 0, .5, 1.5, 3
    unit_par: np.ndarray  # (4,) float32 in [-1, 1): Omega_m, sigma_8, N_spec, H_0
    phys_par: np.ndarray  # (4,) float32, base·(1 + 0.1·u)
    redshifts: np.ndarray  # (4,) float32, the channels' redshifts
    box_size_mpc_h: float
    timings: dict[str, float]  # seconds: total, initial_conditions, pm, fft (part of both), ...


def box_size_mpc_h(size: int, h0: float) -> float:
    """Side of an N-voxel universe: the public voxel (512·H0/70 Mpc/h over 512) times N."""
    return size * h0 / VOXEL_H0


def draw_unit_par(rng: np.random.Generator) -> np.ndarray:
    """4 floats u ~ U[-1, 1) as float32 (kept below 1 after rounding to single precision)."""
    unit = rng.uniform(-1.0, 1.0, size=4).astype(np.float32)
    return np.minimum(unit, np.nextafter(np.float32(1.0), np.float32(0.0)))


def check_settings(*, size: int, settings: SimulateConfig) -> None:
    """Raise ConfigError (a ValueError) for a size the simulation cannot honour; the settings
    themselves are checked when SimulateConfig is built (with the config file in the message)."""
    if size < MIN_SIZE:
        raise ConfigError(f"simulate: --size {size} is below the minimum {MIN_SIZE}")
    # Internal invariant: SimulateConfig.__post_init__ hard-codes the snapshots it checks against.
    assert settings.pm_steps == 0 or (
        settings.pm_steps >= len(SNAPSHOT_REDSHIFTS)
        and settings.initial_redshift > max(SNAPSHOT_REDSHIFTS)
    )


def simulate_universe(
    *,
    size: int,
    seed: int,
    settings: SimulateConfig,
    unit_par: np.ndarray | None = None,
    progress: bool | None = None,
) -> SimulatedUniverse:
    """Simulate one universe of size³ voxels (and particles), deterministic in `seed`.

    unit_par: use these parameters instead of the seed's draw (the white noise, hence the phases,
    still come from the seed, so two calls differ only in cosmology). progress: show a tqdm bar
    (default: only when stderr is a terminal).
    """
    check_settings(size=size, settings=settings)
    start = time.perf_counter()
    rng = np.random.Generator(np.random.PCG64(seed))
    drawn = draw_unit_par(rng)  # always drawn first, so the noise below is the same either way
    if unit_par is None:
        unit_par = drawn
    unit_par = np.asarray(unit_par, dtype=np.float32)
    if unit_par.shape != (4,) or np.any(unit_par < -1.0) or np.any(unit_par >= 1.0):
        raise ValueError(
            f"simulate_universe: unit_par {unit_par.tolist()} must be 4 floats in [-1, 1)"
        )
    phys_par = phys_from_unit(unit_par)
    omega_m, sigma_8, n_s, h0 = (float(v) for v in phys_par)
    box = box_size_mpc_h(size, h0)
    background = FlatLCDM(omega_m=omega_m)
    fft = TimedFFT()
    timings: dict[str, float] = {}

    # Initial conditions: δ_k with the linear P(k) at z = 0, then Ψ1, Ψ2 in voxels.
    power = linear_power_spectrum(omega_m=omega_m, sigma_8=sigma_8, n_s=n_s, h0=h0)
    delta_k = linear_density_k(white_noise(rng, size), box_size=box, power=power, fft=fft)
    psi1, psi2 = lpt_displacements(delta_k, order=settings.lpt_order, fft=fft)
    del delta_k
    psi1 = psi1.reshape(3, -1)  # (3, P), particle order = voxel order (D, H, W)
    psi2 = None if psi2 is None else psi2.reshape(3, -1)
    lattice = _lattice(size)
    timings["initial_conditions"] = time.perf_counter() - start

    snapshots_a = [1.0 / (1.0 + z) for z in SNAPSHOT_REDSHIFTS]
    counts = np.empty((size, size, size, len(SNAPSHOT_REDSHIFTS)), dtype=np.int16)
    recorded: set[int] = set()
    pm_start = time.perf_counter()

    def record(a: float, positions: np.ndarray) -> None:
        for channel, a_snap in enumerate(snapshots_a):
            if np.isclose(a, a_snap, rtol=0.0, atol=1e-9):
                counts[..., channel] = _to_int16(ngp_counts(positions, size), seed=seed)
                recorded.add(channel)

    if settings.pm_steps == 0:
        for a in snapshots_a:
            d1 = float(background.growth(a))
            record(a, _lpt_positions(lattice, psi1, psi2, d1))
    else:
        a_initial = 1.0 / (1.0 + settings.initial_redshift)
        d1 = float(background.growth(a_initial))
        positions = _lpt_positions(lattice, psi1, psi2, d1)
        # p = a³E·dx/da = g_p·(Ψ1 + (dD2/dD1)·Ψ2), dD2/dD1 = −6/7·D1.
        momenta = psi1 * np.float32(background.momentum_growth(a_initial))
        if psi2 is not None:
            momenta += psi2 * np.float32(background.momentum_growth(a_initial) * (-6.0 / 7.0) * d1)
        del psi1, psi2
        force = ParticleMeshForce(
            n=size,
            mesh_factor=settings.force_mesh_factor,
            omega_m=omega_m,
            fft=fft,
            gradient=settings.force_gradient,
        )
        steps_a = step_scale_factors(a_initial, snapshots_a, settings.pm_steps)
        show = sys.stderr.isatty() if progress is None else progress
        with tqdm(
            total=settings.pm_steps, desc=f"PM {size}³", disable=not show, leave=False
        ) as bar:
            evolve_kdk(
                positions,
                momenta,
                steps_a=steps_a,
                box_voxels=size,
                background=background,
                force=force,
                on_step=record,
                progress=bar.update,
            )
    assert len(recorded) == len(SNAPSHOT_REDSHIFTS), f"snapshots recorded: {sorted(recorded)}"
    timings["pm"] = time.perf_counter() - pm_start
    timings["fft"] = fft.seconds
    timings["fft_calls"] = float(fft.calls)
    timings["total"] = time.perf_counter() - start
    return SimulatedUniverse(
        counts_dhwc=counts,
        unit_par=unit_par,
        phys_par=phys_par,
        redshifts=np.asarray(SNAPSHOT_REDSHIFTS, dtype=np.float32),
        box_size_mpc_h=box,
        timings=timings,
    )


def universe_metrics(universe: SimulatedUniverse) -> dict[str, float]:
    """The realised universe at a glance, per snapshot (channel): std, max and empty fraction of
    the counts (exact, from their histogram), and the wall and FFT times; for MLflow, so that
    universes can be compared in its UI."""
    moments = histogram_moments(channel_histogram(universe.counts_dhwc))
    metrics: dict[str, float] = {}
    for c, z in enumerate(universe.redshifts):
        for name in ("std", "max", "empty_fraction"):
            metrics[f"{name}_z{float(z):g}"] = float(moments[name][c])
    metrics["wall_time_s"] = universe.timings["total"]
    metrics["fft_time_s"] = universe.timings["fft"]
    return metrics


def run_simulate(
    out: str | os.PathLike, *, size: int, seed: int, settings: SimulateConfig
) -> dict[str, float]:
    """Simulate one universe and write it to `out` in the cosmoUniverse HDF5 layout (atomically);
    returns `universe_metrics`."""
    universe = simulate_universe(size=size, seed=seed, settings=settings)
    attrs: dict[str, Any] = {
        "cosmocub_seed": seed,
        "box_size_mpc_h": universe.box_size_mpc_h,
        "generator": f"cosmocub {__version__}: {settings.lpt_order}LPT + PM",
        "pm_steps": settings.pm_steps,
        "initial_redshift": settings.initial_redshift,
        "lpt_order": settings.lpt_order,
        "force_mesh_factor": settings.force_mesh_factor,
        "force_gradient": settings.force_gradient,
        "omega_b": OMEGA_B,
        "transfer_function": "eisenstein98 (colossus)",
    }
    write_universe(
        out,
        universe.counts_dhwc,
        unit_par=universe.unit_par,
        phys_par=universe.phys_par,
        redshifts=universe.redshifts,
        attrs=attrs,
    )
    t = universe.timings
    log.info(
        "simulated %s: %d³, seed %d, %.1f s (%.1f s in FFTs), z=0 std %.2f",
        out,
        size,
        seed,
        t["total"],
        t["fft"],
        float(universe.counts_dhwc[..., 0].std()),
    )
    return universe_metrics(universe)


def _lattice(size: int) -> np.ndarray:
    """Unperturbed particle positions, one per voxel centre: (3, size³) float32 in voxels."""
    centres = np.arange(size, dtype=np.float32) + np.float32(0.5)
    grid = np.meshgrid(centres, centres, centres, indexing="ij")
    return np.stack([g.ravel() for g in grid])


def _lpt_positions(
    lattice: np.ndarray, psi1: np.ndarray, psi2: np.ndarray | None, growth: float
) -> np.ndarray:
    positions = lattice + np.float32(growth) * psi1
    if psi2 is not None:
        positions += np.float32(second_order_growth(growth)) * psi2
    return positions


def _to_int16(counts: np.ndarray, *, seed: int) -> np.ndarray:
    limit = np.iinfo(np.int16).max
    peak = int(counts.max())
    if peak > limit:
        raise ValueError(
            f"simulate: seed {seed}: {peak} particles in one voxel exceed int16 ({limit})"
        )
    return counts.astype(np.int16)
