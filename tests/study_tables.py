"""A study's gather in a test, laid out as the study rules lay it out: points.tsv, <study>.png and
summary.md in the folder that holds the points' own folders."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.studies.engine import gather


class NoTracking:
    """A tracker that logs nothing but checks that what it is given to log exists."""

    run_id = None

    def log_artifact(self, path, artifact_path=None) -> None:
        assert Path(path).is_file()


def gather_study(cfg: Config, study: str, folder: Path, *, tracker: Any = None) -> list[dict]:
    """`gather` of `study`'s points under `folder` into folder/points.tsv, folder/<study>.png and
    folder/summary.md; its rows."""
    return gather(
        cfg,
        study,
        folder=folder,
        out_tsv=folder / "points.tsv",
        out_png=folder / f"{study}.png",
        out_summary=folder / "summary.md",
        tracker=NoTracking() if tracker is None else tracker,
    )
