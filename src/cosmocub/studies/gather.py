"""`cosmocub study-gather`: a study's table, plot and report section from its points' folders,
under the study's MLflow parent run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.studies.engine import check_study, gather, study_points
from cosmocub.tracking.runs import job_run


def gather_study(cfg: Config, study: str, *, folder: Path) -> None:
    """points.tsv, <study>.png and summary.md in `folder` (one subfolder per point)."""
    check_study(cfg, study)  # a bad study name or block fails before MLflow is opened
    study_points(cfg, study)
    with job_run(cfg, stage=f"{study}_study", params={"study": study}) as tracker:
        gather_into(cfg, study, folder, tracker=tracker)


def gather_into(cfg: Config, study: str, folder: Path, *, tracker: Any) -> list[dict[str, Any]]:
    """`gather` of the points under `folder` into folder/points.tsv, folder/<study>.png and
    folder/summary.md, the study rules' layout, logging through `tracker`; the table's rows."""
    return gather(
        cfg,
        study,
        folder=folder,
        out_tsv=folder / "points.tsv",
        out_png=folder / f"{study}.png",
        out_summary=folder / "summary.md",
        tracker=tracker,
    )
