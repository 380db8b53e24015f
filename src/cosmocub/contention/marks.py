"""Whether a study point was measured on a busy machine: its conditions over the measured epochs
(contention/conditions.py records them per epoch), the `contended` mark, and what is
left out.

A point is contended when its worst-served rank's ready_share (the share of the time its threads
were ready to run that they ran) is below `studies.contended_ready_share` (times the share its
own ranks leave each other where they share cores: `own_share`), or when the hypervisor
took more than `studies.contended_steal_share` of its most stolen rank's cores' busy time
(steal_share: other guests on the host, which no share inside this machine sees); the study-point
runner runs it once more, and a point contended twice is left out of efficiencies, fits and model
errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cosmocub.config import StudiesConfig

CONTENDED_COLUMN = "contended"


def is_marked(row: Mapping[str, object]) -> bool:
    """A points.tsv row (as gathered, or read back as strings) marked contended."""
    return row.get(CONTENDED_COLUMN) in (True, "True")


def kept(rows: Sequence[Mapping[str, object]]) -> list:
    """The rows not marked contended (the same objects, in order): the filter every reader of
    those tables applies (the studies' efficiencies and fits, the performance model's
    validation)."""
    return [r for r in rows if not is_marked(r)]


# The points.tsv columns beside a point's timings (blank for points measured before they were
# recorded, or skipped).
CONDITION_COLUMNS = (
    "cpu_share",
    "ready_share",
    "steal_share",
    "load_1m",
    "nivcsw_per_step",
    "contended",
    "runs",
    "first_ready_share",
)


def measured_epochs(epochs: Sequence[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any]]]:
    """(steps, record) of the epochs after the first (start-up costs) that recorded conditions,
    or of the first alone when no later one did."""
    steps = [b["step"] - a for a, b in zip([0] + [e["step"] for e in epochs], epochs, strict=False)]
    picked = [(steps[i], epochs[i]) for i in range(1, len(epochs)) if "cpu_share" in epochs[i]]
    if not picked and epochs and "cpu_share" in epochs[0]:
        picked = [(steps[0], epochs[0])]
    return picked


def point_conditions(epochs: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Step-weighted shares, the highest 1-minute load seen and involuntary switches per step
    (summed over ranks) of the measured epochs; {} when the run recorded none."""
    picked = [(s, e) for s, e in measured_epochs(epochs) if s > 0]
    if not picked:
        return {}
    steps = sum(s for s, _ in picked)
    out = {
        "cpu_share": sum(s * e["cpu_share"] for s, e in picked) / steps,
        "load_1m": max(max(e["load_1m_start"], e["load_1m_end"]) for _, e in picked),
        "nivcsw_per_step": sum(e["nivcsw"] for _, e in picked) / steps,
    }
    for share in ("ready_share", "steal_share"):
        if all(share in e for _, e in picked):
            out[share] = sum(s * e[share] for s, e in picked) / steps
    return out


def own_share(cores_per_rank: float | None, threads_per_rank: float | None) -> float:
    """The ready share a point's own ranks leave each other: 1 on cores of their own, else the
    cores each rank had over its threads (4 one-thread ranks on 2 cores: 0.5), since ranks
    that share cores wait for each other's threads as they would for another process's. 1
    where the runner did not say (a local point: its ranks on cores of their own)."""
    if not cores_per_rank or not threads_per_rank:
        return 1.0
    return min(1.0, cores_per_rank / threads_per_rank)


def is_contended(
    conditions: Mapping[str, Any], limits: StudiesConfig, *, expected_ready: float = 1.0
) -> bool:
    """Below limits.contended_ready_share × expected_ready (`own_share`: what the point's own
    ranks leave each other) in ready_share, or above limits.contended_steal_share in
    steal_share. A run without the kernel's per-thread scheduler counters (no
    /proc/self/task/*/schedstat) has no ready_share and is not judged on it (`conditions_note`
    says so); one without /proc/stat's steal not on that."""
    return bool(why_contended(conditions, limits, expected_ready=expected_ready))


def why_contended(
    conditions: Mapping[str, Any], limits: StudiesConfig, *, expected_ready: float = 1.0
) -> str:
    """The shares that make `conditions` contended, for a one-line message ("": not
    contended)."""
    ready, steal = conditions.get("ready_share"), conditions.get("steal_share")
    parts = []
    ready_limit = limits.contended_ready_share * expected_ready
    if ready is not None and ready < ready_limit:
        parts.append(f"ready share {ready:.2f} < {ready_limit:.3g}")
    if steal is not None and steal > limits.contended_steal_share:
        parts.append(f"steal share {steal:.2f} > {limits.contended_steal_share:g}")
    return ", ".join(parts)


def condition_row(epochs: Sequence[Mapping[str, Any]], record: Mapping[str, Any]) -> dict:
    """The point's CONDITION_COLUMNS: the final run's conditions, the mark the runner gave it
    (point.json `contended`) and how many runs it took, with the first run's ready_share."""
    runs = record.get("runs") or []
    return {
        **point_conditions(epochs),
        "contended": record.get("contended"),
        "runs": len(runs) or None,
        "first_ready_share": runs[0].get("ready_share") if len(runs) > 1 else None,
    }


def conditions_note(rows: Sequence[Mapping[str, Any]], limits: StudiesConfig) -> str:
    """The report's sentence on the points left out (empty when every measured point is kept)."""
    measured = [r for r in rows if r.get("contended") is not None]
    out = [r["point"] for r in measured if is_marked(r)]
    unjudged = [
        r["point"] for r in rows if r.get("cpu_share") is not None and not r.get("ready_share")
    ]
    parts = []
    if out:
        parts.append(
            f"{len(out)} of {len(measured)} points left out of efficiencies, fits and model "
            f"errors as contended on the first run and on its rerun (their ranks ran < "
            f"{limits.contended_ready_share:g} of the time they were ready to: other processes "
            f"held their cores; or the hypervisor took > {limits.contended_steal_share:g} of "
            f"their cores' busy time for other guests): {', '.join(out)}."
        )
    if unjudged:
        parts.append(
            f"{len(unjudged)} points had no scheduler counters (schedstat) and were not "
            f"judged: {', '.join(unjudged)}."
        )
    return " ".join(parts)
