"""Every executor profile parses and plans the workflow (`snakemake -n --profile …`), and the
training job's and a study point's request, derived from the config, reach each scheduler's
submit command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import snakemake_env

REPO = Path(__file__).resolve().parents[2]
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
# 2 nodes × 4 ranks of 8 cores and 1 GPU, 6000 MB each, 90 minutes.
BIG = {
    "train": {"ranks_per_node": 4},
    "cluster": {
        "train": {
            "nodes": 2,
            "gpus_per_rank": 1,
            "cpus_per_rank": 8,
            "mem_mb_per_rank": 6000,
            "runtime": 90,
        }
    },
}
# The network study's points on 2 nodes × 2 ranks, each rank as BIG's.
STUDY = {**BIG, "network_study": {"nodes": 2, "ranks_per_node": 2}}


def dry_run(
    profile: str, tmp_path: Path, *, config: dict = BIG, targets: tuple[str, ...] = ()
) -> dict[str, dict[str, str]]:
    """Rule → its resources as the dry run prints them."""
    (tmp_path / "big.yaml").write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        [
            str(SNAKEMAKE),
            *targets,  # before --configfile, which takes every word after it
            "-n",
            "-s",
            str(REPO / "Snakefile"),
            "--profile",
            str(REPO / "profiles" / profile),
            "--configfile",
            str(REPO / "config" / "test.yaml"),
            str(tmp_path / "big.yaml"),
        ],
        cwd=tmp_path,
        env=snakemake_env(),
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    found = {}
    for rule, resources in re.findall(r"rule (\w+):\n(?:.*\n)*?\s+resources: (.*)", out):
        found.setdefault(rule, dict(kv.split("=", 1) for kv in resources.split(", ")))
    return found


def submit_command(profile: str, resources: dict[str, str], rule: str) -> str:
    config = yaml.safe_load((REPO / "profiles" / profile / "config.yaml").read_text())
    job = SimpleNamespace(resources=SimpleNamespace(**resources), rule=rule)
    return config["cluster-generic-submit-cmd"].format(**vars(job))


@pytest.mark.slow
def test_flux_profile_maps_the_training_request(tmp_path) -> None:
    import snakemake_executor_plugin_cluster_generic  # noqa: F401  (a declared test dependency)

    jobs = dry_run("flux", tmp_path)
    cmd = submit_command("flux", jobs["train"], "train")
    for part in (
        "--nodes=2",
        "--ntasks=8",
        "--cores-per-task=8",
        "--gpus-per-task=1",
        "--time-limit=90m",
    ):
        assert part in cmd, cmd
    small = submit_command("flux", jobs["universe_group"], "universe_group")
    assert "--nodes=1 --ntasks=1 --cores-per-task=1 --gpus-per-task=0" in small


@pytest.mark.slow
def test_lsf_profile_maps_the_training_request(tmp_path) -> None:
    import snakemake_executor_plugin_cluster_generic  # noqa: F401  (a declared test dependency)

    jobs = dry_run("lsf", tmp_path)
    cmd = submit_command("lsf", jobs["train"], "train")
    # 2 hosts × 32 cores; LSF's memory unit is the site's (LSF_UNIT_FOR_LIMITS), MB here.
    for part in ("-n 64", "span[ptile=32]", "rusage[mem=24000]", "-W 90"):
        assert part in cmd, cmd
    assert "-n 1 " in submit_command("lsf", jobs["universe_group"], "universe_group")


@pytest.mark.slow
def test_slurm_profile_maps_the_training_request(tmp_path) -> None:
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command

    jobs = dry_run("slurm", tmp_path)
    train = jobs["train"]
    assert (train["nodes"], train["tasks"], train["cpus_per_task"]) == ("2", "8", "8")
    assert (train["gres"], train["mem_mb"], train["runtime"]) == ("gpu:4", "24000", "90")

    class Resources(dict):
        __getattr__ = dict.get

    typed = Resources(
        nodes=2,
        tasks=8,
        cpus_per_task=8,
        gres="gpu:4",
        tasks_per_gpu=1,
        mem_mb=24000,
        runtime=90,
        mpi="",
    )
    job = SimpleNamespace(resources=typed, threads=32)
    params = {
        "run_uuid": "u",
        "slurm_logfile": "l",
        "comment_str": "c",
        "account": "-A 'proj'",
        "partition": "-p 'gpu'",
        "workdir": ".",
    }
    cmd = get_submit_command(job, params)
    for part in ("--nodes=2", "--mem 24000", "-t 90", "--ntasks-per-gpu=1", "--cpus-per-task=8"):
        assert part in cmd, cmd


@pytest.mark.slow
def test_a_study_point_asks_for_its_nodes_ranks_cores_and_gpus(tmp_path) -> None:
    import snakemake_executor_plugin_slurm  # noqa: F401  (a declared test dependency)

    jobs = dry_run("slurm", tmp_path, config=STUDY, targets=("network_study",))
    point = jobs["study_point"]
    # 2 emulated nodes × 2 ranks: namespaces of one machine, so one node with all 4 ranks.
    assert (point["nodes"], point["tasks"], point["cpus_per_task"]) == ("1", "4", "8")
    assert (point["gres"], point["mem_mb"], point["runtime"]) == ("gpu:4", "24000", "90")
    assert (point["gpus_per_task"], point["cpus_per_node"], point["cpus_total"]) == (
        "1",
        "32",
        "32",
    )
    assert point["mpi"] in ("", "''", '""')  # the point's launcher starts its ranks itself
    # The same request in Flux's and LSF's terms (their profiles' site settings left empty).
    flux = submit_command("flux", {**point, "flux_extra": ""}, "study_point")
    for part in ("--nodes=1", "--ntasks=4", "--cores-per-task=8", "--gpus-per-task=1"):
        assert part in flux, flux
    lsf = submit_command("lsf", {**point, "lsf_extra": ""}, "study_point")
    for part in ("-n 32", "span[ptile=32]", "rusage[mem=24000]", "-W 90"):
        assert part in lsf, lsf
