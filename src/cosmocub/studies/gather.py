"""`cosmocub study-gather`: a study's table, plot and report section from its points' folders,
under the study's MLflow parent run.
"""

from __future__ import annotations

from pathlib import Path

from cosmocub.config import Config
from cosmocub.studies.engine import check_study, gather, study_points
from cosmocub.tracking.runs import job_run


def gather_study(cfg: Config, study: str, *, folder: Path) -> None:
    """points.tsv, <study>.png and summary.md in `folder` (one subfolder per point)."""
    check_study(cfg, study)  # a bad study name or block fails before MLflow is opened
    study_points(cfg, study)
    with job_run(cfg, stage=f"{study}_study", params={"study": study}) as tracker:
        gather(
            cfg,
            study,
            folder=folder,
            out_tsv=folder / "points.tsv",
            out_png=folder / f"{study}.png",
            out_summary=folder / "summary.md",
            tracker=tracker,
        )
