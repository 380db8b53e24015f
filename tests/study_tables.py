"""A study's gather in a test: the package's own layout (studies.gather.gather_into), with a
tracker that logs nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.studies.gather import gather_into


class NoTracking:
    """A tracker that logs nothing but checks that what it is given to log exists."""

    run_id = None

    def log_artifact(self, path, artifact_path=None) -> None:
        assert Path(path).is_file()


def gather_study(cfg: Config, study: str, folder: Path, *, tracker: Any = None) -> list[dict]:
    """The points under `folder` gathered as `cosmocub study-gather` lays them out; the rows."""
    return gather_into(cfg, study, folder, tracker=NoTracking() if tracker is None else tracker)
