"""The MLPerf HPC TFRecord folders as a source (universes.source mlperf): an exported synthetic set
read back gives the HDF5 path's shards bit for bit; several records a file and plain records;
bad input refused in one line with nothing written. (The three real samples through the whole
workflow: tests/workflow/test_workflow.py.)"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from shard_fixtures import preprocess_stages

from cosmocub.cli import main
from cosmocub.data.tfrecord import encode_example, frame_record, read_tfrecord
from cosmocub.io import sha256_file

SPLITS = ("train", "val", "test")


def write_config(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


def shards(config: Path, universes: Path, work: Path, groups: int) -> Path:
    """The workflow's commands: plan, every group, gather (the group manifests exist)."""
    for _ in preprocess_stages(config, universes, work, groups):
        pass
    return work / "shards"


def assert_same_data(a: Path, b: Path) -> None:
    """The samples (x) and labels (y) of every shard, every feature, bit for bit; the stats
    equal; the shards' attributes equal but for the files they name. (universe_index and
    crop_origin say where each sample sits in its source: a record here, a universe there.)"""
    for split in SPLITS:
        with h5py.File(a / f"{split}.h5") as fa, h5py.File(b / f"{split}.h5") as fb:
            for name in ("x", "y"):
                x, y = fa[name][()], fb[name][()]
                assert (x.dtype, x.shape) == (y.dtype, y.shape), (split, name)
                assert x.tobytes() == y.tobytes(), (split, name)
            attrs = {k: v for k, v in fa.attrs.items() if k != "source_files"}
            assert attrs == {k: v for k, v in fb.attrs.items() if k != "source_files"}
    with h5py.File(a / "features.h5") as fa, h5py.File(b / "features.h5") as fb:
        for split in SPLITS:
            for name in fa[split]:
                assert fa[split][name][()].tobytes() == fb[split][name][()].tobytes(), name
    assert json.loads((a / "stats.json").read_text()) == json.loads((b / "stats.json").read_text())


@pytest.mark.parametrize(
    ("size", "sample_size"),
    # 128³ takes ~2 min here (its features' FFTs): on request (pytest -m long).
    [(64, 32), pytest.param(128, 128, marks=pytest.mark.long)],
)
def test_an_exported_set_read_back_gives_the_hdf5_paths_shards(tmp_path, size, sample_size):
    base = {
        "results": str(tmp_path / "results"),
        "seed": 1,
        "tracking": {"enabled": False},
        "universes": {"count": 4, "size": size},
        "simulate": {"pm_steps": 0},
        "preprocess": {
            "sample_size": sample_size,
            "slab_depth": 8,
            "splits": {"train": 0.5, "val": 0.25, "test": 0.25},
        },
        "model": {"input_size": sample_size},
        "cluster": {"preprocess": {"universes_per_job": 3, "files_per_job": 8}},
    }
    config = write_config(tmp_path / "synthetic.yaml", base)
    universes = tmp_path / "results" / "universes"
    assert (
        main(["simulate-group", "--group", "0", "--out", str(universes), "--config", str(config)])
        == 0
    )
    from_hdf5 = shards(config, universes, tmp_path / "hdf5", groups=2)

    exported = tmp_path / "mlperf"
    assert main(["export-mlperf", "--out", str(exported), "--config", str(config)]) == 0
    crops = (size // sample_size) ** 3
    counts = json.loads((from_hdf5 / "manifest.json").read_text())["universes"]
    for split, folder in (("train", "train"), ("val", "validation"), ("test", "test")):
        assert len(list((exported / folder).glob("*.tfrecord"))) == counts[split] * crops
    # A second export into the same place is refused; the first stays whole.
    assert main(["export-mlperf", "--out", str(exported), "--config", str(config)]) == 2

    read_back = write_config(
        tmp_path / "mlperf.yaml",
        {**base, "universes": {"source": "mlperf", "mlperf_dir": str(exported), "size": size}},
    )
    groups = -(-4 * crops // 8)
    for g in range(groups):
        assert (
            main(
                [
                    "mlperf-group",
                    "--group",
                    str(g),
                    "--out",
                    str(tmp_path / "validated"),
                    "--config",
                    str(read_back),
                ]
            )
            == 0
        )
    from_mlperf = shards(read_back, tmp_path / "validated", tmp_path / "read-back", groups)
    assert_same_data(from_hdf5, from_mlperf)
    manifest = json.loads((from_mlperf / "manifest.json").read_text())
    assert manifest["counts"] == {s: counts[s] * crops for s in SPLITS}
    assert manifest["source_universes"]["universes_in_two_splits"] == 0
    # The checksums the check jobs took (the crop jobs take them from the manifests, not again),
    # and those the simulate job took of the universes, are the files'.
    for m in (manifest, json.loads((from_hdf5 / "manifest.json").read_text())):
        assert all(src["sha256"] == sha256_file(src["path"]) for src in m["sources"])
    assert manifest["source_universes"]["universes"] == counts


def record(x: np.ndarray, y) -> bytes:
    return frame_record(encode_example(x, np.asarray(y, np.float32)))


def small_layout(root: Path, *, files: dict[str, bytes]) -> Path:
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return root


def counts(seed: int, side: int = 8) -> np.ndarray:
    return np.random.default_rng(seed).poisson(1.0, (side, side, side, 4)).astype(np.int16)


def test_several_records_a_file_and_plain_records(tmp_path):
    """A plain (uncompressed) file of two Examples is two samples; gzip files one each. The
    shards hold exactly the counts `read_tfrecord` reads, log1p'd, and each record's label."""
    x = {i: counts(i) for i in range(4)}
    y = {i: [0.1 * i, -0.2, 0.3, 0.0] for i in range(4)}
    layout = small_layout(
        tmp_path / "d",
        files={
            "train/univ_a1_000.tfrecord": record(x[0], y[0]) + record(x[1], y[1]),  # plain, two
            "train/univ_a2_000.tfrecord": gzip.compress(record(x[2], y[2]), mtime=0),
            "validation/univ_a3_000.tfrecord": gzip.compress(record(x[3], y[3]), mtime=0),
            "test/univ_a4_000.tfrecord": gzip.compress(record(x[0], y[0]), mtime=0),
        },
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "results": str(tmp_path / "results"),
            "tracking": {"enabled": False},
            "universes": {"source": "mlperf", "mlperf_dir": str(layout)},
            "preprocess": {"sample_size": 8, "slab_depth": 4},
            "model": {"input_size": 8, "num_conv_blocks": 2},
        },
    )
    assert (
        main(
            ["mlperf-group", "--group", "0", "--out", str(tmp_path / "u"), "--config", str(config)]
        )
        == 0
    )
    out = shards(config, tmp_path / "u", tmp_path / "w", groups=1)
    with h5py.File(out / "train.h5") as f:
        names = json.loads(f.attrs["source_files"])
        assert [Path(n).name for n in names] == [
            "univ_a1_000.tfrecord@0",
            "univ_a1_000.tfrecord@1",
            "univ_a2_000.tfrecord",
        ]
        for row, i in enumerate((0, 1, 2)):
            expected = np.log1p(x[i].astype(np.float32)).astype(np.float16).transpose(3, 0, 1, 2)
            assert f["x"][row].tobytes() == expected.tobytes()
            np.testing.assert_array_equal(f["y"][row], np.float32(y[i]))
    read, _, n = read_tfrecord(layout / "validation" / "univ_a3_000.tfrecord")
    with h5py.File(out / "val.h5") as f:
        assert (
            n == 1
            and f["x"][0].tobytes()
            == np.log1p(read.astype(np.float32)).astype(np.float16).transpose(3, 0, 1, 2).tobytes()
        )


def _corrupt(kind: str) -> bytes:
    good = record(counts(0), [0.1, 0.2, 0.3, 0.4])
    if kind == "truncated gzip":
        return gzip.compress(good, mtime=0)[:-40]
    if kind == "crc":
        bad = bytearray(good)
        bad[100] ^= 0xFF  # a byte of the payload: its CRC no longer matches
        return gzip.compress(bytes(bad), mtime=0)
    if kind == "x length":
        return gzip.compress(record(counts(0)[:7], [0.1, 0.2, 0.3, 0.4]), mtime=0)
    label = [float("nan"), 0, 0, 0] if kind == "nan label" else [1.5, 0, 0, 0]
    return gzip.compress(record(counts(0), label), mtime=0)


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("truncated gzip", "GZIP stream is corrupt or truncated"),
        ("crc", "record 0: CRC mismatch in the"),
        ("x length", "not a cube of 4 int16 channels"),
        ("nan label", "is not finite"),
        ("out of range label", "is outside [-1, 1]"),
    ],
)
def test_a_bad_record_is_one_line_and_nothing_is_written(tmp_path, capsys, kind, said):
    good = gzip.compress(record(counts(1), [0.0, 0.0, 0.0, 0.0]), mtime=0)
    layout = small_layout(
        tmp_path / "d",
        files={
            "train/univ_a1_000.tfrecord": good,
            "train/univ_a2_000.tfrecord": _corrupt(kind),
            "validation/univ_a3_000.tfrecord": good,
        },
    )
    config = write_config(
        tmp_path / "c.yaml",
        {
            "tracking": {"enabled": False},
            "universes": {"source": "mlperf", "mlperf_dir": str(layout)},
        },
    )
    out = tmp_path / "u"
    assert main(["mlperf-group", "--group", "0", "--out", str(out), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "univ_a2_000.tfrecord" in err, err
    assert not out.exists() or not list(out.rglob("*.json"))


@pytest.mark.parametrize(
    ("layout", "said"),
    [
        ({"train/univ_a1_000.tfrecord": b"x"}, "has no validation/ folder"),
        ({"train/univ_a1_000.tfrecord": b"x", "validation/notes.txt": b""}, "holds no .tfrecord"),
    ],
)
def test_a_missing_or_empty_split_folder_is_one_line(tmp_path, capsys, layout, said):
    root = small_layout(tmp_path / "d", files=layout)
    config = write_config(
        tmp_path / "c.yaml",
        {
            "tracking": {"enabled": False},
            "universes": {"source": "mlperf", "mlperf_dir": str(root)},
        },
    )
    out = tmp_path / "u"
    assert main(["mlperf-group", "--group", "0", "--out", str(out), "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and said in err and "universes.mlperf_dir" in err, err
    assert not out.exists()
