"""The compute calibration cached per machine: where it lives, and `load_or_calibrate`, which
measures once per machine and refuses a cache from another machine, torch or grid.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cosmocub.config import CalibrationConfig, Config
from cosmocub.io import read_json, write_json
from cosmocub.perfmodel.measure import calibration as grid
from cosmocub.perfmodel.measure.cpu_model import (
    FORMAT_VERSION,
    Calibration,
    calibrate,
    grid_settings,
    machine_key,
)

log = logging.getLogger(__name__)


def calibration_path(cfg: Config, given: str | os.PathLike | None) -> Path:
    """`given`, else perf_model.calibration.path, else {results}/perf_model/calibration.json."""
    if given is not None:
        return Path(given)
    if cfg.perf_model.calibration.path:
        return Path(cfg.perf_model.calibration.path)
    return Path(cfg.results) / "perf_model" / "calibration.json"


def read_calibration(path: Path, *, settings: CalibrationConfig, cores: int) -> Calibration:
    """The calibration at `path`, if it was measured on this machine (host, CPU, torch, cores,
    threads) and grid; else a ValueError naming the first difference."""
    d = read_json(path, not_found="compute calibration not found")
    if d.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: calibration format {d.get('format_version')}, this cosmocub reads "
            f"{FORMAT_VERSION}; rerun `cosmocub perf-model calibrate --out {path}`"
        )
    want = {
        "machine": machine_key(grid.grid_threads(settings, cores)),
        "grid": grid_settings(settings),
    }
    for section, expected in want.items():
        for key, value in expected.items():
            theirs = d[section].get(key)
            if theirs != value:
                raise ValueError(
                    f"{path}: calibrated with {section} {key} {theirs!r}, this run has "
                    f"{value!r}: not used; rerun `cosmocub perf-model calibrate --out {path}` "
                    "(or name another perf_model.calibration.path)"
                )
    return Calibration.from_dict(d)


def load_or_calibrate(path: Path, settings: CalibrationConfig, *, cores: int) -> Calibration:
    """The cached calibration at `path` (read_calibration's checks), or, where there is none,
    one measured now and written there."""
    if path.exists():
        return read_calibration(path, settings=settings, cores=cores)
    cal = calibrate(settings, cores=cores)
    write_json(path, cal.as_dict())
    log.info(
        "compute calibration: %d timings at threads %s in %.1f s (load %.2f -> %.2f), %s",
        len(cal.timings),
        list(cal.threads),
        cal.wall_s,
        *cal.load_1m,
        path,
    )
    return cal
