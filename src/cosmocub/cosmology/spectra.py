"""Auto and cross power spectra of two fields on the same k bins, and the two numbers field
emulators are judged by: the transfer P_pred/P_true and the cross-correlation coefficient
r(k) = P_pt / sqrt(P_pp · P_tt).

Built on `power.measure_power_spectrum` (one estimator for the whole package): the cross spectrum
comes from the polarisation identity P_ab = (P_{a+b} − P_{a−b}) / 4, exact mode by mode, so it
needs no binning code of its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosmocub.cosmology.power import measure_power_spectrum


@dataclass(frozen=True)
class CrossSpectra:
    """Per k bin: mean |k| [h/Mpc], P_aa, P_bb, P_ab [(Mpc/h)³] and the number of modes."""

    k: np.ndarray
    p_aa: np.ndarray
    p_bb: np.ndarray
    p_ab: np.ndarray
    n_modes: np.ndarray


def cross_spectra(field_a: np.ndarray, field_b: np.ndarray, box_size: float) -> CrossSpectra:
    """P_aa, P_bb and P_ab of two periodic cubic fields of the same shape (box side in Mpc/h)."""
    a = np.asarray(field_a, dtype=np.float64)
    b = np.asarray(field_b, dtype=np.float64)
    if a.shape != b.shape:
        raise ValueError(f"cross_spectra: field shapes {a.shape} and {b.shape} differ")
    k, p_aa, n_modes = measure_power_spectrum(a, box_size)
    _, p_bb, _ = measure_power_spectrum(b, box_size)
    _, p_sum, _ = measure_power_spectrum(a + b, box_size)
    _, p_diff, _ = measure_power_spectrum(a - b, box_size)
    return CrossSpectra(k=k, p_aa=p_aa, p_bb=p_bb, p_ab=(p_sum - p_diff) / 4.0, n_modes=n_modes)


def transfer_and_correlation(
    p_pred: np.ndarray, p_true: np.ndarray, p_cross: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(P_pred / P_true, P_cross / sqrt(P_pred · P_true)) per bin (NaN where a power is 0)."""
    p_pred, p_true = np.asarray(p_pred, float), np.asarray(p_true, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        transfer = np.where(p_true > 0, p_pred / p_true, np.nan)
        r = np.where((p_pred > 0) & (p_true > 0), p_cross / np.sqrt(p_pred * p_true), np.nan)
    return transfer, r
