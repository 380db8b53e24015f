"""How far an uncalibrated prediction has been from published runs: per stack family (GPU family
and framework), the range of published ÷ predicted that benchmarks/against_mlperf.py found over
the MLPerf HPC CosmoFlow runs (uncalibrated_spread.json, its source and date inside), which
`perf-model predict` prints beside an answer made with no calibration.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

SPREAD_FILE = Path(__file__).with_name("uncalibrated_spread.json")
NARROW = (
    "cosmocub perf-model calibrate --from-run RUN --out CAL.json, then --gpu-calibration "
    "CAL.json, narrows it (RUN: a result log or a run folder on this accelerator and software)"
)


@dataclass(frozen=True, kw_only=True)
class StackSpread:
    """One stack family's range of published ÷ uncalibrated prediction over its runs."""

    family: str  # e.g. "V100 tensorflow": the GPU family, then the framework
    step: tuple[float, float]
    training_epoch: tuple[float, float]
    rows: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Spread:
    stacks: tuple[StackSpread, ...]
    source: str
    date: str

    def of_gpu(self, accelerator: str) -> tuple[StackSpread, ...]:
        """The stacks run on `accelerator`'s GPU family (the first word of its name, as
        hardware_specs and the config's entries name them: 'V100 SXM2 16GB', 'v100 (...)')."""
        gpu = accelerator.split()[0].upper()
        return tuple(s for s in self.stacks if s.family.split()[0].upper() == gpu)


def read_spread(path: Path | None = None) -> Spread:
    """The spread file (default: the package's); a one-line ValueError naming the file and key
    where it is not one."""
    path = path or SPREAD_FILE
    try:
        data = json.loads(path.read_text())
        families = data["families"]
        stacks = tuple(
            StackSpread(
                family=name,
                step=_pair(f["step"]),
                training_epoch=_pair(f["training_epoch"]),
                rows=tuple(f["rows"]),
            )
            for name, f in families.items()
        )
        return Spread(stacks=stacks, source=str(data["source"]), date=str(data["date"]))
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not an uncalibrated spread file ({err!r})") from None


def _pair(values: list[float]) -> tuple[float, float]:
    low, high = (float(v) for v in values)
    if not 0 < low <= high:
        raise ValueError(f"range {values}: want 0 < low <= high")
    return low, high


def ranges(
    stacks: tuple[StackSpread, ...], step_s: float, training_epoch_s: float
) -> tuple[list[float], list[float]] | None:
    """([low, high] step seconds, [low, high] training epoch seconds): the prediction times the
    widest range of the stacks given; None where there is none."""
    if not stacks:
        return None
    step = (min(s.step[0] for s in stacks), max(s.step[1] for s in stacks))
    epoch = (min(s.training_epoch[0] for s in stacks), max(s.training_epoch[1] for s in stacks))
    return [step_s * step[0], step_s * step[1]], [
        training_epoch_s * epoch[0],
        training_epoch_s * epoch[1],
    ]


def spread_text(
    spread: Spread, accelerator: str, step_s: float, training_epoch_s: float, *, own_step: bool
) -> str:
    """The lines `predict` prints beside an uncalibrated answer on `accelerator`; `own_step`:
    the answer prices cosmocub's own step (software cosmocub_eager), which no published run
    measured."""
    stacks = spread.of_gpu(accelerator)
    found = ranges(stacks, step_s, training_epoch_s)
    if found is None:
        return (
            f"uncalibrated: no published run of a {accelerator.split()[0]} to say how far this "
            f"answer may be off ({spread.source}, {spread.date}); {NARROW}"
        )
    step, epoch = found
    each = "; ".join(
        f"{s.family} {s.step[0]:.2f}-{s.step[1]:.2f}x over {len(s.rows)} runs" for s in stacks
    )
    return (
        f"uncalibrated: published runs on this GPU family took (published / uncalibrated "
        f"prediction) {each} ({spread.source}, {spread.date}): this step may take "
        f"{1e3 * step[0]:.3g}-{1e3 * step[1]:.3g} "
        f"ms, the training epoch {epoch[0]:.3g}-{epoch[1]:.3g} s"
        + (" (other stacks' runs: no GPU run of cosmocub's own step backs its price)" * own_step)
        + f"\n{NARROW}"
    )
