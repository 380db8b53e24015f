"""Preprocessing at cluster scale: the same shards from plan → per-group jobs → gather, and from
a Dask distributed cluster (a LocalCluster over TCP on 127.0.0.1), as from one local job; the
same bytes from `cosmocub preprocess` by hand as from the workflow's three commands."""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import socket
import time
from pathlib import Path
from unittest import mock

import h5py
import numpy as np
import pytest
import yaml
from test_preprocess import settings  # the same tiny preprocess settings

from cosmocub.data.h5chunks import ChunkWriter
from cosmocub.data.preprocess import preprocess
from cosmocub.data.shard_jobs import crop_group, gather_shards, plan_shards
from cosmocub.data.splits import PreprocessError, check_universes
from cosmocub.io import sha256_file

SPLITS = ("train", "val", "test")


@pytest.fixture
def universes(make_universe) -> list[Path]:
    return sorted(make_universe(f"univ_{i}.hdf5", size=16, seed=i) for i in range(7))


def assert_same_shards(a: Path, b: Path) -> None:
    """Every dataset and attribute equal, stats equal, manifests equal but for their date and
    the record of which hosts wrote the shards (a Dask cluster's only)."""
    for split in SPLITS:
        with h5py.File(a / f"{split}.h5") as fa, h5py.File(b / f"{split}.h5") as fb:
            assert set(fa) == set(fb)
            for name in fa:
                np.testing.assert_array_equal(fa[name][...], fb[name][...], err_msg=name)
            assert dict(fa.attrs) == dict(fb.attrs)
    assert json.loads((a / "stats.json").read_text()) == json.loads((b / "stats.json").read_text())
    with h5py.File(a / "features.h5") as fa, h5py.File(b / "features.h5") as fb:
        for split in SPLITS:
            for name in ("pk", "one_point"):
                np.testing.assert_array_equal(fa[split][name][...], fb[split][name][...])
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (a, b))
    for m in (ma, mb):
        m.pop("created"), m.pop("written_by", None)
    assert ma == mb


@pytest.mark.parametrize("per_job", [1, 3, 7])
def test_groups_then_gather_equal_one_job(universes, tmp_path, per_job) -> None:
    cfg = settings()
    preprocess(
        universes, tmp_path / "one", settings=cfg, seed=3, config_hash="h", universes_per_job=7
    )
    staging = tmp_path / "staging"
    plan = plan_shards(
        check_universes(universes, cfg.sample_size),
        staging,
        settings=cfg,
        seed=3,
        universes_per_job=per_job,
    )
    assert len(plan["groups"]) == -(-7 // per_job)
    # Groups run in any order (as cluster jobs do), and a group run twice writes the same.
    order = [*reversed(range(len(plan["groups"]))), 0]
    for g in order:
        crop_group(staging, g, tmp_path / "groups" / f"{g}.npz", settings=cfg)
    files = [tmp_path / "groups" / f"{g}.npz" for g in range(len(plan["groups"]))]
    gather_shards(staging, files, tmp_path / "many", settings=cfg, config_hash="h")
    assert_same_shards(tmp_path / "one", tmp_path / "many")
    # The stats are not trivially equal: 4 channels of log1p(Poisson(1)) values.
    stats = json.loads((tmp_path / "many" / "stats.json").read_text())
    assert all(0.4 < m < 0.7 for m in stats["mean"])


@pytest.mark.parametrize("train_crops", ["fixed", "random"])
def test_a_group_reads_each_shards_chunk_table_once(universes, tmp_path, train_crops) -> None:
    """A group shares one writer per shard among its universes: a writer per universe read the
    whole shard's table twice each (layout check and offsets), n² in the shard's size."""
    cfg = settings(train_crops=train_crops)
    staging = tmp_path / "staging"
    plan_shards(
        check_universes(universes, cfg.sample_size),
        staging,
        settings=cfg,
        seed=3,
        universes_per_job=7,
    )
    made = []
    real_init = ChunkWriter.__init__

    def counting(self, path, chunk_bytes):
        made.append(Path(path).name)
        real_init(self, path, chunk_bytes)

    with mock.patch.object(ChunkWriter, "__init__", counting):
        crop_group(staging, 0, tmp_path / "0.npz", settings=cfg)
    assert sorted(made) == ["test.h5", "train.h5", "val.h5"]


class _FrozenClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return cls(2026, 1, 2, 3, 4, 5, tzinfo=tz)


def test_by_hand_command_writes_the_workflows_bytes(make_universe, tmp_path, monkeypatch) -> None:
    """`cosmocub preprocess` by hand, and the command lines of the workflow's preprocess_plan →
    preprocess_group (each group) → preprocess rules (workflow/rules/data.smk), write the same
    bytes: shards, stats.json, manifest.json and features.h5."""
    from cosmocub.cli import main
    from cosmocub.config import load_config
    from cosmocub.data import shard_summary
    from cosmocub.launch.resources import num_preprocess_groups

    folder = tmp_path / "universes"
    folder.mkdir()
    paths = [make_universe(f"universes/univ_{i}.hdf5", size=16, seed=i) for i in range(5)]
    config = tmp_path / "config.yaml"
    values = {
        "results": str(tmp_path / "results"),
        "tracking": {"enabled": False},
        "seed": 3,
        "universes": {"source": "cosmoflow", "cosmoflow_dir": str(folder), "size": 16},
        "preprocess": {"sample_size": 8, "slab_depth": 4},
        "model": {"input_size": 8, "num_conv_blocks": 2},
        "cluster": {"preprocess": {"universes_per_job": 2}},  # 3 groups, by hand too
    }
    config.write_text(yaml.safe_dump(values))
    # manifest.json records when it was written, to the second: the clock is frozen so that a
    # second ticking over between the runs cannot tell them apart, and every byte is compared.
    # The shards name their universes (attribute source_files): the same files in both runs.
    monkeypatch.setattr(shard_summary, "datetime", _FrozenClock)
    common = ["--config", str(config)]

    # The workflow links the public universes a group at a time (link_group), with a manifest
    # each; a link group may not write into the public folder itself (its files would go).
    linked = tmp_path / "results" / "universes"
    for g in range(3):
        assert main(["link-group", "--group", str(g), "--out", str(linked), *common]) == 0
    assert main(["link-group", "--group", "0", "--out", str(folder), *common]) == 2
    assert all(p.is_file() and not p.is_symlink() for p in paths)
    by_hand = tmp_path / "by-hand"
    # The order given does not matter; the linked files are the workflow's sources.
    shuffled = [str(linked / paths[i].name) for i in (3, 0, 4, 1, 2)]
    assert main(["preprocess", *shuffled, "--out", str(by_hand), "--threads", "2", *common]) == 0

    staging, groups, workflow = tmp_path / "staging", tmp_path / "groups", tmp_path / "workflow"
    linked = tmp_path / "results" / "universes"
    plan = ["preprocess-plan", "--universes-dir", str(linked), "--staging", str(staging)]
    assert main([*plan, *common]) == 0
    num_groups = num_preprocess_groups(load_config(config), len(paths))  # as data.smk counts
    assert num_groups == 3
    for g in reversed(range(num_groups)):  # cluster jobs run in any order
        group = ["preprocess-group", "--staging", str(staging), "--group", str(g)]
        assert main([*group, "--out", str(groups / f"{g}.npz"), "--threads", "2", *common]) == 0
    gather = ["preprocess-gather", "--staging", str(staging), "--groups-dir", str(groups)]
    assert main([*gather, "--out", str(workflow), *common]) == 0

    names = ["features.h5", "manifest.json", "stats.json", "test.h5", "train.h5", "val.h5"]
    assert sorted(p.name for p in by_hand.iterdir()) == names
    assert sorted(p.name for p in workflow.iterdir()) == names
    for name in names:
        assert sha256_file(by_hand / name) == sha256_file(workflow / name), name
    manifest = json.loads((by_hand / "manifest.json").read_text())
    assert manifest["created"] == "2026-01-02T03:04:05+00:00"
    assert manifest["counts"] == {"train": 24, "val": 8, "test": 8}


def test_a_group_reads_its_raw_chunk_writes_back(universes, tmp_path, monkeypatch) -> None:
    """The groups write raw chunks: a writer bug (swapped bytes) fails the group that wrote
    them, when it reads its rows back through HDF5, and it leaves no group file."""
    from cosmocub.data.h5chunks import ChunkWriter

    original = ChunkWriter.__setitem__
    monkeypatch.setattr(
        ChunkWriter, "__setitem__", lambda self, key, block: original(self, key, block.byteswap())
    )
    cfg = settings()
    staging = tmp_path / "staging"
    plan = plan_shards(
        check_universes(universes, cfg.sample_size),
        staging,
        settings=cfg,
        seed=3,
        universes_per_job=7,
    )
    with pytest.raises(PreprocessError, match=r"sample 0 read back through HDF5 differs"):
        crop_group(staging, 0, tmp_path / "0.npz", settings=cfg)
    assert len(plan["groups"]) == 1 and not (tmp_path / "0.npz").exists()


def test_gather_refuses_a_missing_group(universes, tmp_path) -> None:
    cfg = settings()
    staging = tmp_path / "staging"
    plan_shards(
        check_universes(universes, cfg.sample_size),
        staging,
        settings=cfg,
        seed=3,
        universes_per_job=4,
    )
    crop_group(staging, 0, tmp_path / "0.npz", settings=cfg)
    with pytest.raises(PreprocessError, match=r"3 universe\(s\) were cropped by no group"):
        gather_shards(
            staging, [tmp_path / "0.npz"], tmp_path / "out", settings=cfg, config_hash="h"
        )
    assert not (tmp_path / "out").exists()
    with pytest.raises(PreprocessError, match="group 5 does not exist"):
        crop_group(staging, 5, tmp_path / "5.npz", settings=cfg)


@pytest.mark.slow
def test_dask_local_cluster_over_tcp_writes_the_same_shards(universes, tmp_path) -> None:
    import distributed  # a declared test dependency: missing must fail, not skip

    cfg = settings()
    preprocess(
        universes, tmp_path / "threads", settings=cfg, seed=5, config_hash="h", universes_per_job=7
    )
    # The nannies set their workers' environment (distributed.nanny.pre-spawn-environ:
    # OMP_NUM_THREADS=1 and others) in this process's os.environ and leave it there: every later
    # test in this pytest worker would inherit it (`nproc` then says 1, and the one-node Slurm is
    # written with one CPU). patch.dict puts os.environ back as it was.
    with (
        mock.patch.dict(os.environ),
        distributed.LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            protocol="tcp",
            dashboard_address=None,
        ) as cluster,
    ):
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        on_cluster = dataclasses.replace(cfg, dask_scheduler=cluster.scheduler_address)
        preprocess(
            universes,
            tmp_path / "cluster",
            settings=on_cluster,
            seed=5,
            config_hash="h",
            universes_per_job=7,
        )
        # The per-group path on the cluster too.
        staging = tmp_path / "staging"
        plan_shards(
            check_universes(universes, cfg.sample_size),
            staging,
            settings=on_cluster,
            seed=5,
            universes_per_job=4,
        )
        for g in range(2):
            crop_group(staging, g, tmp_path / f"{g}.npz", settings=on_cluster)
        gather_shards(
            staging,
            [tmp_path / "0.npz", tmp_path / "1.npz"],
            tmp_path / "cluster-groups",
            settings=on_cluster,
            config_hash="h",
        )
    assert_same_shards(tmp_path / "threads", tmp_path / "cluster")
    assert_same_shards(tmp_path / "threads", tmp_path / "cluster-groups")
    # The workers said where they wrote: every universe, all its blocks, by this host; threads
    # leave no record. Each 16³ universe is cropped in two blocks, its two 8-deep slabs of
    # samples (data/crop.py, open_universes).
    assert "written_by" not in json.loads((tmp_path / "threads" / "manifest.json").read_text())
    host = socket.gethostname()
    for folder in ("cluster", "cluster-groups"):
        manifest = json.loads((tmp_path / folder / "manifest.json").read_text())
        assert manifest["written_by"] == {str(p): {host: 2} for p in universes}


def test_a_dask_scheduler_that_does_not_answer(universes, tmp_path) -> None:
    import socket

    import distributed  # noqa: F401  (a declared test dependency: missing must fail)

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = settings(dask_scheduler=f"tcp://127.0.0.1:{port}")
    t0 = time.perf_counter()
    with pytest.raises(PreprocessError, match=r"no Dask scheduler answers at 'tcp://127.0.0.1:"):
        preprocess(
            universes, tmp_path / "s", settings=cfg, seed=0, config_hash="h", universes_per_job=7
        )
    assert time.perf_counter() - t0 < 30
    assert not (tmp_path / "s").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".s")] == []
