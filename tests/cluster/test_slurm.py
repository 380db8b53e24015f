"""The workflow on a real Slurm: Debian's slurmctld/slurmd/munge as a one-node cluster on this
machine (scripts/slurm-single-node.sh), driven through `--profile profiles/slurm`.

One training job of 2 tasks is started by srun, cancelled by the scheduler after its first
checkpoint, and the rerun resumes from that checkpoint. Skips (saying why) where not root, where
the Slurm packages cannot be installed, or without the executor plugin (pip install -e '.[slurm]').
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import h5py
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-single-node.sh"
SNAKEMAKE = Path(sys.executable).with_name("snakemake")
# Fast polling: the executor's defaults (40 s before the first check) are meant for busy sites.
# After each check that finds nothing finished it waits 10 s longer than before (back to the
# first wait once a job ends), so with 5 s and 5 s a job is seen 5, 20 or 50 s after its
# submission. The jobs here take 8-18 s (two Snakemakes in each, then the command): with the
# first wait at 1 s they were seen 33-35 s after submission.
POLL = ["--slurm-init-seconds-before-status-checks", "5", "--seconds-between-status-checks", "5"]
# config/test.yaml made to fit a 2-CPU node: 2 training ranks of one core each, and a training
# long enough that the scheduler can cancel it after its first checkpoint (step 2 of 48: ~0.2 s
# an epoch on 2 CPUs, so ~4.5 s to spare, more on a busy machine), and no longer: the rerun
# trains the rest, and its job (~17 s) is seen at the executor's second look.
FIT = {
    "universes": {"count": 4},
    "train": {"ranks_per_node": 2, "epochs": 24, "checkpoint_every_steps": 2},
    "cluster": {
        "train": {"cpus_per_rank": 1, "mem_mb_per_rank": 1500, "runtime": 10},
        "preprocess": {"threads": 2, "mem_mb": 2000, "runtime": 10},
        "simulate": {"threads": 2, "mem_mb": 1000},
        "small": {"threads": 1, "mem_mb": 1000, "runtime": 10},
    },
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def slurm():
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm needs root (apt-get install, daemons)")
    try:
        import snakemake_executor_plugin_slurm  # noqa: F401
    except ImportError:
        pytest.skip("snakemake-executor-plugin-slurm missing: pip install -e '.[slurm]'")
    started = subprocess.run(
        ["bash", str(SCRIPT), "start"], capture_output=True, text=True, timeout=600
    )
    if started.returncode != 0:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)
        pytest.skip(f"cannot start a one-node Slurm: {started.stderr.strip()[-300:]}")
    try:
        yield
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, timeout=120)


def _snakemake(cwd: Path, *args: str, **kwargs) -> subprocess.Popen:
    cmd = [
        str(SNAKEMAKE),
        "-s",
        str(REPO / "Snakefile"),
        "--profile",
        str(REPO / "profiles" / "slurm"),
        "--configfile",
        str(REPO / "config" / "test.yaml"),
        str(cwd / "fit.yaml"),
        *POLL,
        *args,
    ]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs
    )


def _slurm_jobs() -> dict[str, str]:
    """Job id → state of every job squeue still knows (MinJobAge keeps finished ones)."""
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i %T %j"], capture_output=True, text=True, check=True
    ).stdout
    return {line.split()[0]: line.split()[1] for line in out.splitlines() if line.strip()}


def _train_job_id(log: str) -> str | None:
    for line in log.splitlines():
        if "rule_train" in line and "SLURM jobid" in line:
            return line.split("SLURM jobid")[1].split()[0]
    return None


# 3.5-5 min (each job waits for the executor's polls): beyond the 12-minute suite. Submission
# through the profile stays in it (the requests refused below); cancel and resume of a training
# job in tests/cluster/test_slurm_nodes.py.
@pytest.mark.long
def test_workflow_on_slurm_cancel_and_resume(slurm, tmp_path):
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(FIT))
    results = tmp_path / "results-test"
    run_dir = results / "runs" / "test"
    t0 = time.perf_counter()

    # 1. Everything up to training, then cancel the training job once it has a checkpoint.
    log = tmp_path / "first.log"
    first = _snakemake(tmp_path)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(first.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 420
    job_id = None
    try:
        while not (job_id and list(run_dir.glob("checkpoints/*/step_????????.pt"))):
            assert first.poll() is None, "workflow ended early:\n" + "".join(lines)[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time:\n" + "".join(lines)[-3000:]
            job_id = job_id or _train_job_id("".join(lines))
            time.sleep(0.2)
        subprocess.run(["scancel", job_id], check=True)
        first.wait(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
        reader.join(timeout=30)
        log.write_text("".join(lines))
    assert first.returncode != 0
    assert _slurm_jobs()[job_id] == "CANCELLED"
    # Nothing of the cancelled job looks finished; its checkpoint is there to resume from.
    for name in ("model.pt", "train_summary.json", "metrics.jsonl"):
        assert not (run_dir / name).exists(), name
    assert not list(run_dir.glob("**/*.tmp*")), list(run_dir.glob("**/*.tmp*"))
    checkpoints = sorted(run_dir.glob("checkpoints/*/step_????????.pt"))
    assert checkpoints

    # 2. The rerun resumes training from the checkpoint and finishes the workflow.
    second = _snakemake(tmp_path)
    output, _ = second.communicate(timeout=480)
    (tmp_path / "second.log").write_text(output)
    assert second.returncode == 0, output[-4000:]
    wall = time.perf_counter() - t0
    print(f"real-Slurm workflow (cancel + resume): {wall:.0f} s")

    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert summary["world_size"] == 2 and summary["data_parallel"] == 2
    assert summary["resumed_from"] is not None
    assert Path(summary["resumed_from"]).name in {p.name for p in checkpoints}
    train_log = (results / "logs" / "train" / "test.log").read_text()
    assert "cosmocub launch: srun" in train_log and "--ntasks=2" in train_log
    manifest = json.loads((results / "shards" / "manifest.json").read_text())
    assert manifest["counts"] == {"train": 16, "val": 8, "test": 8}
    with h5py.File(results / "shards" / "train.h5") as f:
        assert f["x"].shape == (16, 4, 8, 8, 8)
    metrics = json.loads((run_dir / "eval" / "metrics.json").read_text())
    assert metrics["num_samples"] == 8
    assert (results / "report" / "summary.md").exists()
    assert not (results / ".shards-staging").exists()  # temp: dropped after the gather

    # 3. Every job's MLflow run carries the Slurm job id it ran under.
    from mlflow.tracking import MlflowClient

    jobs = _slurm_jobs()
    client = MlflowClient(tracking_uri=f"sqlite:///{results / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cosmocub-test")
    runs = client.search_runs([experiment.experiment_id], max_results=200)
    children = [r for r in runs if r.data.tags.get("cosmocub.kind") == "job"]
    rules = sorted(r.data.tags["rule"] for r in children)
    assert rules == sorted(
        # 4 universes: one universe group (cluster.simulate.universes_per_job 100)
        ["evaluate", "preprocess", "preprocess_group", "train", "train", "universe_group"]
    )
    for run in children:
        assert run.data.tags["scheduler"] == "slurm"
        assert run.data.tags["scheduler_job_id"] in jobs
    train_runs = {
        r.data.tags["scheduler_job_id"]: r for r in children if r.data.tags["rule"] == "train"
    }
    assert job_id in train_runs and train_runs[job_id].info.status in (
        "FAILED",
        "KILLED",
        "RUNNING",
    )
    assert any(r.info.status == "FINISHED" for r in train_runs.values())
    assert shutil.which("squeue")


@pytest.mark.parametrize(
    ("args", "said"),
    [
        # A partition this cluster does not have (as a profile naming the wrong one would).
        (["--default-resources", "slurm_partition=nosuch"], "invalid partition"),
        # More time than the partition allows (MaxTime=60 min; EnforcePartLimits=ALL).
        (["--set-resources", "universe_group:runtime=600"], "time limit"),
    ],
)
def test_requests_the_cluster_refuses_fail_fast(slurm, tmp_path, args, said) -> None:
    (tmp_path / "fit.yaml").write_text(yaml.safe_dump(FIT))
    t0 = time.perf_counter()
    proc = _snakemake(tmp_path, *args)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode != 0
    assert said in out.lower(), out[-3000:]
    assert time.perf_counter() - t0 < 120
    assert not list((tmp_path / "results-test").glob("universes/*.hdf5"))


def test_kill_9_of_the_launcher_under_srun_leaves_no_task(slurm, tmp_path) -> None:
    """`cosmocub launch` in a batch job starts the ranks with srun; killing the launcher with
    SIGKILL (as an OOM killer would) must end srun and its tasks within 10 s, while the job itself
    goes on: the kernel's death signal (SIGTERM to srun, which passes it to the step's tasks) is
    what ends them. (Without it the orphaned srun and its tasks train on until the job ends.)"""
    import psutil
    from shard_fixtures import make_random_shards

    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    values = {
        "preprocess": {"sample_size": 8},
        "model": {"input_size": 8, "base_filters": 4, "num_conv_blocks": 2, "dense_sizes": [16]},
        "train": {
            "epochs": 1000,
            "local_batch_size": 4,
            "checkpoint_every_steps": 2,
            "ranks_per_node": 2,
        },
        "tracking": {"enabled": False},
    }
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(values))
    run = tmp_path / "run"
    launch = (
        f"{sys.executable} -m cosmocub.cli launch --ranks-per-node 2 --cpus-per-rank 1 -- train "
        f"--config {tmp_path / 'cfg.yaml'} --shards {shards} --out {run}"
    )
    # The job outlives its launcher (as a batch script with more to do would): Slurm's end of
    # the job cannot be what stops the tasks, only the launcher's death can.
    (tmp_path / "job.sh").write_text(f"#!/bin/bash\n{launch}\nsleep 300\n")
    sbatch = ["sbatch", "--parsable", "--ntasks=2", "--cpus-per-task=1", "--mem=3000", "--time=10"]
    job_id = subprocess.run(
        [
            *sbatch,
            f"--chdir={tmp_path}",
            f"--output={tmp_path / 'job.log'}",
            str(tmp_path / "job.sh"),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    def ours(stage: str) -> list[psutil.Process]:
        """The python processes running `cosmocub <stage>` on this run folder."""
        found = []
        for p in psutil.process_iter(["name", "cmdline"]):
            cmd = " ".join(p.info["cmdline"] or [])
            python = (p.info["name"] or "").startswith("python")
            if python and f"cosmocub.cli {stage} " in cmd and str(run) in cmd:
                found.append(p)
        return found

    try:
        deadline = time.monotonic() + 180
        while not list(run.glob("checkpoints/*/step_????????.pt")):
            assert time.monotonic() < deadline, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.2)
        (launcher,) = ours("launch")
        ranks = ours("train")
        assert len(ranks) == 2, ranks
        launcher.kill()
        t0 = time.monotonic()
        _, alive = psutil.wait_procs(ranks, timeout=10)
        assert not alive, f"{alive} outlived the launcher by 10 s"
        print(f"srun tasks ended {time.monotonic() - t0:.1f} s after kill -9 of the launcher")
    finally:
        subprocess.run(["scancel", job_id], capture_output=True)


def test_stop_leaves_no_config_that_names_a_stopped_controller(slurm) -> None:
    """Last in this module, as it stops the cluster the module's fixture started: stop
    takes away the slurm.conf it wrote. Left behind, every Slurm client, and so every
    `snakemake` start (snakemake-executor-plugin-slurm runs `scontrol show config` when it is
    imported), retried the stopped controller for 9 s."""
    conf = Path("/etc/slurm/slurm.conf")
    assert "written by cosmocub" in conf.read_text()
    stopped = subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True)
    assert stopped.returncode == 0, stopped.stderr
    assert not conf.exists()
    t0 = time.perf_counter()
    subprocess.run(["scontrol", "show", "config"], capture_output=True, timeout=30)
    assert time.perf_counter() - t0 < 3
