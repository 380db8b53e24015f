"""What the workflow's rules take from the package (cosmocub.workflow_support): the one module
they import, and the requests it makes of the config, with the numbers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from cosmocub.config import ConfigError, load_config
from cosmocub.data.naming import seeds_of_group, simulate_group_of, universe_group_names
from cosmocub.studies.launch_plan import LaunchPlan, PointLaunch
from cosmocub.workflow_support import (
    calibration_threads,
    job_config_path,
    preprocess_groups,
    study_point_cores,
    study_point_job,
    tracking_env,
    unet_job,
    universe_group_seeds,
)

REPO = Path(__file__).resolve().parents[1]


def test_the_rules_import_one_module_of_the_package() -> None:
    files = [REPO / "Snakefile", *sorted((REPO / "workflow" / "rules").glob("*.smk"))]
    imported = {
        (f.name, m)
        for f in files
        for m in re.findall(r"^\s*(?:from|import) (cosmocub[\w.]*)", f.read_text(), re.M)
    }
    assert {m for _, m in imported} == {"cosmocub.workflow_support"}, imported


def plan(runner: str, *, nodes: int, ranks_per_node: int) -> LaunchPlan:
    return LaunchPlan(
        study="s",
        name="p",
        runner=runner,
        labels={},
        launch=PointLaunch(),
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        rate_mbit=0.0,
    )


def test_a_study_points_request_and_cores() -> None:
    cfg = load_config(None, {"cluster": {"train": {"gpus_per_rank": 1, "cpus_per_rank": 4}}})
    # 3 real nodes of 2 ranks: 3 nodes asked for, 2 ranks, 8 cores and 2 GPUs on each.
    job = study_point_job(cfg, plan("local", nodes=3, ranks_per_node=2))
    assert (job.nodes, job.world_size, job.threads, job.cpus_total) == (3, 6, 8, 24)
    assert (job.mem_mb, job.gres) == (2 * 8000, "gpu:2")
    # 3 emulated nodes of 2 ranks share one machine: one node of 6 ranks.
    emulated = plan("emulated", nodes=3, ranks_per_node=2)
    job = study_point_job(cfg, emulated)
    assert (job.nodes, job.world_size, job.threads, job.gres) == (1, 6, 24, "gpu:6")
    # Locally an emulated point claims every core; on a cluster, its node's ranks' cores.
    assert study_point_cores(emulated, cpus_per_rank=3, machine_cores=16) == 16
    assert study_point_cores(emulated, cpus_per_rank=3, machine_cores=None) == 6
    assert (
        study_point_cores(
            plan("local", nodes=1, ranks_per_node=2), cpus_per_rank=3, machine_cores=16
        )
        == 6
    )


def test_the_unet_universes_and_study_rates_requests() -> None:
    cfg = load_config(
        REPO / "config" / "test.yaml",
        {"cluster": {"train": {"cpus_per_rank": 2, "mem_mb_per_rank": 1000}}},
    )
    job = unet_job(cfg)  # the U-Net's 2 ranks on one node
    assert (job.nodes, job.world_size, job.threads, job.mem_mb) == (1, 2, 4, 2000)
    # 6 universes, 100 a simulate job: one group of every seed; 4 a job: groups 0 and 1.
    assert universe_group_names(cfg) == ["seed1-0"]
    assert universe_group_seeds(cfg, "1", "0") == list(range(1_000_000, 1_000_006))
    four = load_config(
        REPO / "config" / "test.yaml", {"cluster": {"simulate": {"universes_per_job": 4}}}
    )
    assert universe_group_names(four) == ["seed1-0", "seed1-1"]
    assert universe_group_names(four, master_seed=7) == ["seed7-0", "seed7-1"]
    assert universe_group_seeds(four, 1, 1) == [1_000_004, 1_000_005]
    # Any top-level seed's universes (a study point's own seed), only the first universes.count.
    assert simulate_group_of(four, 7_000_005) == (7, 1)
    assert seeds_of_group(four, 1, master_seed=7) == [7_000_004, 7_000_005]
    with pytest.raises(ConfigError, match=r"synth_7000006.hdf5 is not one of .* universes.count 6"):
        simulate_group_of(four, 7_000_006)
    assert preprocess_groups(cfg, ["a"] * 230) == range(3)  # 100 universes a job
    env = tracking_env("train")({"run": "r1", "seed": "3"})
    assert env == "COSMOCUB_RULE=train COSMOCUB_WILDCARDS='run=r1,seed=3'"


def test_a_job_config_holds_its_sections_alone_under_their_hash(tmp_path) -> None:
    cfg = load_config(REPO / "config" / "test.yaml", {"results": str(tmp_path)})
    path = job_config_path(cfg, ["model", "universes.source"])
    held = yaml.safe_load(Path(path).read_text())
    # The sections listed, the top-level ones they lie in, and where the job records.
    assert held["held"] == ["model", "universes.source"]
    assert sorted(held) == ["held", "model", "results", "tracking", "universes"]
    job = load_config(path)
    assert (job.model, job.universes.source) == (cfg.model, "synthetic")
    said = r"key 'universes.count': read by this stage, but its config holds only model, "
    with pytest.raises(ConfigError, match=said + r"universes.source \(and results, tracking\)"):
        _ = job.universes.count
    with pytest.raises(ConfigError, match=r"key 'train'"):
        _ = job.global_batch  # a property reads through the guard too
    # Another training setting: the same file name (its hash is of its sections alone).
    other = load_config(
        REPO / "config" / "test.yaml", {"results": str(tmp_path), "train": {"epochs": 9}}
    )
    assert job_config_path(other, ["model", "universes.source"]) == path
    # Keys held beside the sections (a group's seeds param names their effect): the same name,
    # so that a rule given them reruns nothing; the same sections asked without them: refused.
    named = job_config_path(cfg, ["seed"], named_by_params=["universes.count"])
    assert load_config(named).universes.count == 6
    with pytest.raises(ValueError, match=r"named_by_params \(\) and \('universes.count',\)"):
        job_config_path(cfg, ["seed"])


def test_the_calibration_holds_the_configs_cores_or_a_local_runs() -> None:
    cfg = load_config(None)
    assert calibration_threads(cfg, machine_cores=16) == 16  # a local run's --cores
    with pytest.raises(ValueError, match=r"key 'cluster.calibrate.threads': required on a cluster"):
        calibration_threads(cfg, machine_cores=None)
    given = load_config(None, {"cluster": {"calibrate": {"threads": 64}}})
    assert calibration_threads(given, machine_cores=None) == 64
    assert calibration_threads(given, machine_cores=2) == 64
