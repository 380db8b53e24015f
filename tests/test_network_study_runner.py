"""The network study's runner choice: `emulated` points ask a scheduler for one node and make
their own nodes there; `local` points ask for the study's nodes and start their ranks there with
`cosmocub launch`, on the cluster's links at the one rate the config says they have."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmocub.config import ConfigError, load_config
from cosmocub.launch import launcher
from cosmocub.studies.engine import plan, point_config
from cosmocub.studies.runners import run_local
from cosmocub.workflow_support import study_point_cores, study_point_job

REPO = Path(__file__).resolve().parents[1]
TEST_CONFIG = REPO / "config" / "test.yaml"  # network_study: 2 nodes × 1 rank, 10 Mbit/s


def _network_points(**study):
    overrides = {
        "network_study": {"ranks_per_node": 2, **study},
        "cluster": {"train": {"cpus_per_rank": 3, "mem_mb_per_rank": 1000}},
    }
    cfg = load_config(TEST_CONFIG, overrides)
    return cfg, {p.point.name: p for p in plan(cfg, "network")}


def test_a_local_point_asks_for_its_nodes_and_an_emulated_one_for_one() -> None:
    cfg, points = _network_points(runner="local")
    launch = points["lion_10mbit"].launch
    assert (launch.runner, launch.nodes, launch.ranks_per_node) == ("local", 2, 2)
    job = study_point_job(cfg, launch)
    # 2 nodes of 2 ranks, 3 cores and 1000 MB a rank on each node.
    assert (job.nodes, job.ranks_per_node, job.world_size) == (2, 2, 4)
    assert (job.threads, job.cpus_total, job.mem_mb) == (6, 12, 2000)
    assert study_point_cores(launch, cpus_per_rank=3, machine_cores=None) == 6
    # The point's training names the world the launch makes.
    assert point_config(cfg, "network", points["lion_10mbit"].point).cluster.train.nodes == 2

    cfg, points = _network_points()  # the default runner: as before
    launch = points["lion_10mbit"].launch
    assert (launch.runner, launch.nodes, launch.ranks_per_node) == ("emulated", 2, 2)
    job = study_point_job(cfg, launch)
    assert (job.nodes, job.ranks_per_node, job.world_size, job.threads) == (1, 4, 4, 12)


def test_runner_local_takes_one_rate_the_clusters() -> None:
    with pytest.raises(ConfigError, match=r"rates_mbit': \[0, 100\] with runner local"):
        _network_points(runner="local", rates_mbit=[0, 100])
    with pytest.raises(ConfigError, match="runner"):
        _network_points(runner="flux")


def test_a_local_point_records_its_rate_as_not_set_by_the_runner(monkeypatch, tmp_path) -> None:
    _, points = _network_points(runner="local")
    launch = points["lion_10mbit"].launch
    started = []
    monkeypatch.setattr(launcher, "run_launch", lambda layout, args: started.append(layout) or 0)
    args = {"config_path": tmp_path, "shards_dir": tmp_path, "out_dir": tmp_path}
    # Outside a scheduler's allocation two nodes cannot start: one line naming the key.
    for name in ("SLURM_JOB_ID", "FLUX_JOB_ID", "LSB_JOBID"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"set network_study\.runner: emulated") as err:
        run_local(launch, cpus_per_rank=1, max_restarts=0, **args)
    assert "\n" not in str(err.value) and started == []
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    rc, record = run_local(launch, cpus_per_rank=1, max_restarts=0, **args)
    assert rc == 0 and [(s.nodes, s.ranks_per_node) for s in started] == [(2, 2)]
    assert record == {
        "nodes": 2,
        "ranks_per_node": 2,
        "rate_mbit": 10.0,
        "rate_set_by_runner": False,
    }
