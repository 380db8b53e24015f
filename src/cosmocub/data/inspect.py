"""Describe one input file: a cosmoUniverse HDF5 universe or an MLPerf CosmoFlow TFRecord sample.

`cosmocub inspect PATH [--json]` prints shape, parameters and per-channel count statistics; big
universes are read in depth slabs so a 512³×4 file (1 GiB) never sits in memory at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from cosmocub.cosmology.parameters import NAME_PAR, REDSHIFTS, phys_from_unit
from cosmocub.data.tfrecord import read_tfrecord
from cosmocub.data.universe import channel_histogram, histogram_moments, read_universe_meta

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_GZIP_MAGIC = b"\x1f\x8b"
_SLAB_BYTES = 64 << 20  # read universes in depth slabs of about this many bytes


def inspect_path(path: str | os.PathLike) -> dict[str, Any]:
    """Return a JSON-ready description of `path` (format detected from the file's first bytes)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    with open(path, "rb") as f:
        head = f.read(8)
    if head == _HDF5_SIGNATURE or h5py.is_hdf5(path):
        return _inspect_universe(path)
    if head[:2] == _GZIP_MAGIC:
        return _inspect_tfrecord(path)
    raise ValueError(
        f"{path}: neither a cosmoUniverse HDF5 file nor a GZIP MLPerf TFRecord "
        f"(first bytes {head[:8]!r})"
    )


def _inspect_universe(path: Path) -> dict[str, Any]:
    meta = read_universe_meta(path)
    slab = max(1, _SLAB_BYTES // (meta.size * meta.size * meta.num_channels * 2))
    hist = np.zeros((meta.num_channels, 2**16), dtype=np.int64)
    with h5py.File(path, "r") as f:
        full = f["full"]
        for d0 in range(0, meta.size, slab):
            hist += channel_histogram(full[d0 : d0 + slab])
    return {
        "format": "cosmoUniverse-hdf5",
        "path": str(path),
        "shape": list(meta.shape),
        "dtype": "int16",
        "namePar": list(meta.name_par),
        "unitPar": _floats(meta.unit_par),
        "physPar": _floats(meta.phys_par),
        "channels": _channel_rows(hist, meta.redshifts),
        "attrs": meta.attrs,
    }


def _inspect_tfrecord(path: Path) -> dict[str, Any]:
    x, y, num_records = read_tfrecord(path)  # every record read and CRC-checked
    return {
        "format": "mlperf-tfrecord",
        "path": str(path),
        "records": num_records,
        "shape": list(x.shape),
        "dtype": "int16",
        "namePar": list(NAME_PAR),
        "unitPar": _floats(y),
        "physPar": _floats(phys_from_unit(y)),  # derived: the file holds only unitPar
        "channels": _channel_rows(
            channel_histogram(x), np.array(REDSHIFTS)
        ),  # MLPerf: generator's order
        "attrs": {},
    }


def _channel_rows(hist: np.ndarray, redshifts: np.ndarray) -> list[dict[str, float]]:
    moments = histogram_moments(hist)
    return [
        {
            "channel": c,
            "redshift": float(redshifts[c]),
            "mean": float(moments["mean"][c]),
            "std": float(moments["std"][c]),
            "max": int(moments["max"][c]),
            "empty_fraction": float(moments["empty_fraction"][c]),
        }
        for c in range(hist.shape[0])
    ]


def _floats(values: np.ndarray) -> list[float]:
    # Round-trip float32 through its shortest decimal form so JSON shows 0.3, not 0.30000001192.
    return [float(np.format_float_positional(np.float32(v))) for v in values]


def format_report(report: dict[str, Any]) -> str:
    """A readable table of `inspect_path`'s result."""
    lines = [
        f"path    {report['path']}",
        f"format  {report['format']}",
        f"shape   {tuple(report['shape'])} {report['dtype']}",
        *(
            [f"records {report['records']} (all CRC-checked; the first shown)"]
            if "records" in report
            else []
        ),
        "",
        f"{'param':<10}{'unitPar':>10}{'physPar':>10}",
    ]
    for name, unit, phys in zip(
        report["namePar"], report["unitPar"], report["physPar"], strict=True
    ):
        lines.append(f"{name:<10}{unit:>10.4f}{phys:>10.4f}")
    lines += ["", f"{'channel':<9}{'z':>5}{'mean':>10}{'std':>10}{'max':>8}{'empty':>8}"]
    for row in report["channels"]:
        lines.append(
            f"{row['channel']:<9}{row['redshift']:>5.1f}{row['mean']:>10.4f}{row['std']:>10.4f}"
            f"{row['max']:>8d}{row['empty_fraction']:>8.1%}"
        )
    if report.get("attrs"):
        lines += ["", "attributes"] + [f"  {k}: {v}" for k, v in sorted(report["attrs"].items())]
    return "\n".join(lines)


def report_text(path: str | os.PathLike, *, as_json: bool = False) -> str:
    """`cosmocub inspect`'s output: the report of `path` as indented JSON or as text."""
    report = inspect_path(path)
    return json.dumps(report, indent=2) if as_json else format_report(report)
