"""The constants against_mlperf.py's table learned from the published logs, and the strict
leave-one-out: each refitted (or re-read) without the judged row and the run it calibrates
from, for every row; what cannot be refitted (a choice, a measurement made elsewhere) listed
with where it came from."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cosmocub.perfmodel.cost_model.cluster_presets import (
    CLUSTERS,
    EOS_DRIVES_GBYTE_S,
    TMPFS_READ_FACTOR,
    ClusterPreset,
)
from cosmocub.perfmodel.cost_model.software import NVIDIA_V3, SoftwareProfile
from cosmocub.perfmodel.cost_model.stragglers import ScalePair, Stragglers, fit_cv
from cosmocub.perfmodel.uses.run_calibration import GPU_STRAGGLERS
from cosmocub.perfmodel.uses.time_to_train import MLPERF_COSMOFLOW

if TYPE_CHECKING:
    from mlperf_rows import Row

# The reader threads a PyTorch rank's samples pass through, tried in the refit: 1 (one DALI
# prefetch thread, as the profiles say) to the configs' dali_threads 4 (the presets' default).
READER_THREADS = (1, 2, 3, 4)


@dataclass(frozen=True)
class Constants:
    """What the table learned from the logs: the GPU ranks' spread, the node drives' read rate
    (None: the later evaluations of a node whose staged share outgrows its memory are priced
    from its page cache, as the first), the PyTorch profiles' reader threads."""

    cv: float
    drive_gbyte_s: float | None
    reader_threads: int

    def stragglers(self) -> Stragglers:
        return Stragglers(cv=self.cv, source="against_mlperf.py's constants")

    def cluster(self, preset: str) -> ClusterPreset:
        cluster = CLUSTERS[preset]
        if cluster.drive_gbyte_s_per_node is None:
            return cluster
        return dataclasses.replace(cluster, drive_gbyte_s_per_node=self.drive_gbyte_s)

    def software(self, software: SoftwareProfile | None) -> SoftwareProfile | None:
        if software is None or software.reader_threads is None:
            return software
        return dataclasses.replace(software, reader_threads=self.reader_threads)


# As the package has them (run_calibration.GPU_STRAGGLERS, cluster_presets.EOS_DRIVES_GBYTE_S,
# software.NVIDIA_V3.reader_threads): the table as it was before the strict one.
TODAY = Constants(
    cv=GPU_STRAGGLERS.cv,
    drive_gbyte_s=EOS_DRIVES_GBYTE_S,
    reader_threads=NVIDIA_V3.reader_threads or 4,
)


def drive_rate(row: Row) -> float:
    """A node's read rate from its drives, read from a row whose every evaluation reads them
    (Eos's 4-node weak instances: O_DIRECT, cluster_presets.EOS_DRIVES_SOURCE): the node's
    share of the validation split's bytes over the median evaluation."""
    run = row.runs[0]
    node_bytes = run.eval_samples / run.nodes * MLPERF_COSMOFLOW.sample_bytes
    return node_bytes / row.published()["eval"] / 1e9


def drive_rows(rows: Sequence[Row], beyond_memory: Callable[[Row], bool]) -> list[Row]:
    """The rows the drives' rate is read from: Eos's, beyond its nodes' memory (its v3.0 4-node
    configs read O_DIRECT: use_direct_io, dali_tfr_gzip.py)."""
    return [r for r in rows if r.preset == "eos" and beyond_memory(r)]


def reader_fit(rows: Sequence[Row], eval_ratio: Callable[[Row, int], float]) -> int | None:
    """The reader threads whose uncalibrated evaluations best fit `rows`' published ones (least
    squares of the log ratio); None where no row is left to fit on."""
    if not rows:
        return None

    def loss(threads: int) -> float:
        return sum(math.log(eval_ratio(r, threads)) ** 2 for r in rows)

    return min(READER_THREADS, key=loss)


@dataclass(frozen=True)
class Strict:
    """One row's refitted constants and what each was refitted on."""

    constants: Constants
    pairs: list[str]
    drive_rows: list[str]
    reader_rows: list[str]


def strict_constants(
    judged: Sequence[Row],
    pairs: Sequence[ScalePair],
    drives: Sequence[Row],
    pytorch_rows: Sequence[Row],
    eval_ratio: Callable[[Row, int], float],
) -> Strict:
    """The constants refitted without the rows in `judged` (a row and its partner): cv on the
    scale pairs that hold neither (0 where none is left: no spread known), the drives' rate
    from the drive rows left (None where none is), the reader threads on the PyTorch rows left
    (the presets' 4 where none is)."""
    out = {r.label for r in judged}
    apart = [p for p in pairs if not out & set(p.runs)]
    cv = fit_cv(apart) if apart else 0.0
    left = [r for r in drives if r.label not in out]
    rate = statistics.median(drive_rate(r) for r in left) if left else None
    fit_on = [r for r in pytorch_rows if r.label not in out]
    threads = reader_fit(fit_on, eval_ratio) or 4
    return Strict(
        constants=Constants(cv=cv, drive_gbyte_s=rate, reader_threads=threads),
        pairs=[p.name for p in apart],
        drive_rows=[r.label for r in left],
        reader_rows=[r.label for r in fit_on],
    )


def provenance(
    pairs: Sequence[ScalePair],
    drives: Sequence[Row],
    stricts: dict[str, Strict],
    alone: dict[str, Strict],
) -> list[str]:
    """The constants the table rests on, one line each: from which logs and rows, or from where
    else, and how the strict tables treat it (`stricts`: the calibrated table's, without a row
    and its partner; `alone`: the uncalibrated table's, without the row)."""

    def spread(values: list[float], fmt: str) -> str:
        if not values:
            return "-"
        low, high = min(values), max(values)
        return fmt.format(low) if low == high else f"{fmt.format(low)}-{fmt.format(high)}"

    cvs = [s.constants.cv for s in stricts.values()]
    rates = [s.constants.drive_gbyte_s for s in stricts.values()]
    known = [r for r in rates if r is not None]
    threads = sorted({s.constants.reader_threads for s in stricts.values()})
    other = {label: s.constants.reader_threads for label, s in alone.items()}
    other = {label: n for label, n in other.items() if n != TODAY.reader_threads}
    unpriced = [label for label, s in stricts.items() if s.constants.drive_gbyte_s is None]
    cluster = CLUSTERS["perlmutter"]
    return [
        "From the MLPerf logs (refitted in the strict table without the row and its partner):",
        f"  cv {TODAY.cv:g}: fitted on the {len(pairs)} scale pairs "
        f"({', '.join(p.name for p in pairs) or 'none here'}); strict {spread(cvs, '{:.3f}')}",
        f"  drive rate {EOS_DRIVES_GBYTE_S:.3g} GB/s a node: read from the evaluations of "
        f"{', '.join(r.label for r in drives) or 'no row here'}; strict "
        f"{spread(known, '{:.3g}')} GB/s"
        + (f", none left for {', '.join(unpriced)} (later evaluations from the page cache)"),
        f"  reader threads {TODAY.reader_threads} (PyTorch profiles): inferred from DGX A100's "
        "and HoreKa's evaluations (2.2-2.5 ms a step) with DALI's reader code; strict: refitted "
        f"over {READER_THREADS} on the other PyTorch rows' uncalibrated evaluations: "
        f"{', '.join(map(str, threads)) or '-'} (calibrated); uncalibrated, without the row "
        "alone: " + (", ".join(f"{n} for {label}" for label, n in other.items()) or "the same"),
        "From elsewhere, not refitted (each set after its row's error was seen):",
        f"  tmpfs read factor {TMPFS_READ_FACTOR:g} ({cluster.name}): measured on this machine "
        "(benchmarks/bench_staging_read.py), not read from a log: a measurement, not a fit",
        f"  HoreKa's {CLUSTERS['horeka'].nics_per_node} NICs: KIT's hardware page (the systems "
        "file's '4xHDR' read as the link's width)",
        "Choices, not fits (cannot be refitted; each made after the rows' errors were seen):",
        "  the partner rule: same system at another scale, else the same framework, then the "
        "same accelerator model (HoreKa <-> Perlmutter), then system, then GPU count",
        "  calibrating evaluation from the first one where a node's staged share outgrows its "
        "memory (DGX A100 and Eos weak)",
        "From the partner's run (the calibration itself): layer_scale, eval_scale",
    ]
