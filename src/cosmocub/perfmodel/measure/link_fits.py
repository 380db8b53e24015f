"""The α–β fitted on each link a collective can cross, and its lookup: link names (`loopback`,
`emulated_<R>mbit`, `emulated_unshaped`), fit.tsv, and which fit an intra- or inter-node group uses.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cosmocub.io import atomic_path, read_tsv
from cosmocub.perfmodel.alpha_beta import KINDS, AlphaBeta
from cosmocub.perfmodel.measure.alpha_beta_fit import Fit, Sample, fit_per_kind

LOOPBACK = "loopback"  # ranks of one node (gloo over lo, also inside an emulated node)
UNSHAPED = "emulated_unshaped"  # the emulated network at rate 0: veth and bridge, no tbf
FIT_COLUMNS = (
    "link",
    "kind",
    "alpha_s",
    "beta_s_per_byte",
    "bandwidth_gbit",
    "call_latency_s",
    "samples",
    "median_rel_error",
    "worst_rel_error",
)
_EMULATED = re.compile(r"emulated_(\d+(?:\.\d+)?)mbit")


def emulated_link(rate_mbit: float) -> str:
    """The name of the emulated link at `rate_mbit` (0: unshaped)."""
    if rate_mbit < 0:
        raise ValueError(f"emulated link: rate_mbit must be >= 0, got {rate_mbit}")
    return UNSHAPED if rate_mbit == 0 else f"emulated_{rate_mbit:g}mbit"


def emulated_rate(link: str) -> float | None:
    """The rate of an emulated link's name (0 for unshaped); None for any other link."""
    if link == UNSHAPED:
        return 0.0
    match = _EMULATED.fullmatch(link)
    return float(match.group(1)) if match else None


def fit_per_link(samples_by_link: Mapping[str, Sequence[Sample]]) -> dict[str, dict[str, Fit]]:
    """α–β per (link, kind): each link's samples fitted apart, as each runs its own wire."""
    return {link: fit_per_kind(samples) for link, samples in sorted(samples_by_link.items())}


@dataclass(frozen=True, kw_only=True)
class LinkFits:
    """The fits of `perf-model fit` per link and kind; `source` (the file) names them in errors."""

    fits: Mapping[str, Mapping[str, Fit]]
    source: str

    def costs(self, link: str) -> dict[str, AlphaBeta]:
        """Every kind's α–β on `link`; a ValueError naming the link when it was not measured, or
        lacks a kind the model uses."""
        if link not in self.fits:
            raise ValueError(
                f"{self.source}: no alpha-beta fit for link {link!r} (measured: "
                f"{', '.join(sorted(self.fits)) or 'none'}); `cosmocub perf-model bench` measures "
                "loopback and, as root, the emulated links at the studies' rates"
            )
        if missing := [k for k in KINDS if k not in self.fits[link]]:
            raise ValueError(f"{self.source}: link {link!r} has no fit of {missing}")
        return {kind: fit.costs for kind, fit in self.fits[link].items()}

    def inter_node(self, rate_mbit: float) -> tuple[str, dict[str, AlphaBeta], str | None]:
        """(link, its α–β, note) for a group across emulated nodes at `rate_mbit`: that
        rate's fit, or where it was not measured the nearest measured rate's (by rate ratio;
        unshaped is the fastest) and a note saying so; a ValueError naming the link when no
        emulated link was measured at all."""
        wanted = emulated_link(rate_mbit)
        if wanted in self.fits:
            return wanted, self.costs(wanted), None
        measured = {link: rate for link in self.fits if (rate := emulated_rate(link)) is not None}
        if not measured:
            self.costs(wanted)  # raises, naming it
        used = min(measured, key=lambda link: _rate_distance(measured[link], rate_mbit))
        note = (
            f"link {wanted!r} was not measured: using the fit of {used!r}, the nearest measured "
            f"rate (measured: {', '.join(sorted(measured))})"
        )
        return used, self.costs(used), note


def _rate_distance(measured_mbit: float, wanted_mbit: float) -> tuple[bool, float]:
    """How far apart two rates are, by ratio; unshaped (0) is infinitely fast, so the fastest
    shaped rate is the nearest to it, and it is the nearest to a shaped rate only when no other
    shaped rate was measured."""
    m, w = (math.inf if r == 0 else r for r in (measured_mbit, wanted_mbit))
    if m == w:
        return False, 0.0
    if math.inf in (m, w):
        return True, -min(m, w)  # the faster the shaped one, the nearer
    return False, abs(math.log(m / w))


def write_fits(fits: Mapping[str, Mapping[str, Fit]], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")
        writer.writerow(FIT_COLUMNS)
        for link, by_kind in fits.items():
            for kind, r in by_kind.items():
                c = r.costs
                writer.writerow(
                    [
                        link,
                        kind,
                        f"{c.alpha_s:.6g}",
                        f"{c.beta_s_per_byte:.6g}",
                        f"{c.bandwidth_gbit:.4g}",
                        f"{r.call_latency_s:.6g}",
                        r.samples,
                        f"{r.median_rel_error:.3g}",
                        f"{r.worst_rel_error:.3g}",
                    ]
                )


def read_fits(path: Path) -> LinkFits:
    rows = read_tsv(path, not_found="alpha-beta fit not found (cosmocub perf-model fit)")
    if not rows:
        raise ValueError(f"{path}: no fits")
    if missing := [c for c in FIT_COLUMNS if c not in rows[0]]:
        raise ValueError(f"{path}: columns {missing} missing (need {', '.join(FIT_COLUMNS)})")
    fits: dict[str, dict[str, Fit]] = {}
    for r in rows:
        fits.setdefault(r["link"], {})[r["kind"]] = Fit(
            costs=AlphaBeta(
                alpha_s=float(r["alpha_s"]), beta_s_per_byte=float(r["beta_s_per_byte"])
            ),
            samples=int(r["samples"]),
            median_rel_error=float(r["median_rel_error"]),
            worst_rel_error=float(r["worst_rel_error"]),
            call_latency_s=float(r["call_latency_s"]),
        )
    return LinkFits(fits=fits, source=str(path))
