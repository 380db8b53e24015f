"""Training across nodes on a real multi-node Slurm: Debian's slurmctld on this machine and one
slurmd per emulated node (scripts/slurm-emulated-nodes.sh: a network namespace, hostname and
shaped link each, the host on the same network).

A job of 2 nodes × 2 ranks, started by `cosmocub launch` (srun), meets at the first node's
address; the run records which node and local rank each rank had, and Lion Cub's two-level
exchange takes its node groups from that. The same job cancelled by scancel after its first
checkpoint and run again ends with the weights of the uninterrupted job, bit for bit. A
network-study point of `network_study.runner: local` runs its ranks on both nodes, at the links'
shaped rate, and records that cosmocub did not set it. A preprocessing group job starts 2 Dask
workers as Slurm jobs, one on each node, which write the shards and say so (`long`). Skips in
one line where namespaces or Slurm cannot start (not root, no CAP_NET_ADMIN, no packages).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "slurm-emulated-nodes.sh"
STATE = Path("/var/lib/cosmocub-slurm-emu")
PREFIX = "ccemu-"
NODES = ["emu1", "emu2"]
# 16 samples, 2 a rank: 2 steps an epoch over 4 ranks; a checkpoint every 2 steps, so the
# scheduler can cancel after the first and the rerun trains the other 4 epochs from it.
CONFIG = {
    "preprocess": {"sample_size": 8},
    "model": {"input_size": 8, "base_filters": 4, "num_conv_blocks": 2, "dense_sizes": [16]},
    "optimizer": {
        "name": "lion_cub",
        "lr": 0.0003,
        "lion_cub": {"quantizer": "l1", "bits": 4, "collective": "alltoall", "hierarchy": "node"},
    },
    "train": {
        "epochs": 6,
        "local_batch_size": 2,
        "checkpoint_every_steps": 2,
        "deterministic": True,
        "ranks_per_node": 2,
    },
    # The world the launch makes (2 nodes x 2 ranks): training refuses another.
    "cluster": {"train": {"nodes": 2}},
    "tracking": {"enabled": False},
}

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _script(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture(scope="module")
def emulated_slurm() -> dict[str, str]:
    """2 emulated nodes at 100 Mbit/s; the environment for their Slurm's clients."""
    if os.geteuid() != 0:
        pytest.skip("emulated Slurm nodes need root (network namespaces, daemons)")
    started = _script("start", "--nodes", "2", "--rate-mbit", "100", timeout=600)
    if started.returncode != 0:
        _script("stop")
        reason = (started.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"cannot start emulated Slurm nodes: {reason}")
    try:
        yield {**os.environ, "SLURM_CONF": str(STATE / "etc" / "slurm.conf")}
    finally:
        _script("stop")


def _leftovers() -> list[str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    daemons = subprocess.run(["pgrep", "-a", "-f", "slurmd -N emu"], capture_output=True, text=True)
    hosts = Path("/etc/hosts").read_text()
    return [
        *[f"netns {line.split()[0]}" for line in namespaces.splitlines() if PREFIX in line],
        *[f"process {line}" for line in daemons.stdout.splitlines()],
        *[f"/etc/hosts {line}" for line in hosts.splitlines() if "slurm-emulated-nodes" in line],
        *([f"link {PREFIX}host"] if Path(f"/sys/class/net/{PREFIX}host").exists() else []),
    ]


def _sbatch(
    env: dict[str, str],
    folder: Path,
    name: str,
    *,
    cfg: Path,
    shards: Path,
    command: str | None = None,
    ranks_per_node: int = 2,
) -> str:
    """A job of 2 nodes × ranks_per_node tasks running `command` (default: the training's
    `cosmocub launch`)."""
    run = folder / "run"
    launch = command or (
        f"{sys.executable} -m cosmocub.cli launch --nodes 2 --ranks-per-node 2 --cpus-per-rank 1"
        f" -- train --config {cfg} --shards {shards} --out {run}"
    )
    (folder / "job.sh").write_text(f"#!/bin/bash\n{launch}\n")
    args = ["--nodes=2", f"--ntasks={2 * ranks_per_node}", f"--ntasks-per-node={ranks_per_node}"]
    args.append("--cpus-per-task=1")
    return subprocess.run(
        [
            "sbatch",
            "--parsable",
            *args,
            "--mem=3000",
            "--time=10",
            f"--job-name={name}",
            f"--chdir={folder}",
            f"--output={folder / 'job.log'}",
            str(folder / "job.sh"),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def _state(env: dict[str, str], job_id: str) -> str:
    squeue = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"]
    out = subprocess.run(squeue, env=env, capture_output=True, text=True).stdout.strip()
    return out or "GONE"


def _wait(env: dict[str, str], job_id: str, folder: Path, timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    while (state := _state(env, job_id)) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        if time.monotonic() > deadline:
            subprocess.run(["scancel", job_id], env=env)
            pytest.fail(f"job {job_id} still {state} after {timeout} s:\n{_log(folder)}")
        time.sleep(0.5)
    return state


def _log(folder: Path) -> str:
    path = folder / "job.log"
    return path.read_text()[-3000:] if path.exists() else "(no job log)"


def test_two_nodes_train_cancel_and_resume_bit_identical(emulated_slurm, tmp_path) -> None:
    from shard_fixtures import make_random_shards

    env = emulated_slurm
    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    t0 = time.perf_counter()

    # 1. Uninterrupted: both nodes' ranks, as Slurm placed them, in the run's own record.
    whole = tmp_path / "whole"
    whole.mkdir()
    job = _sbatch(env, whole, "whole", cfg=cfg, shards=shards)
    assert _wait(env, job, whole) == "COMPLETED", _log(whole)
    summary = json.loads((whole / "run" / "train_summary.json").read_text())
    placement = summary["placement"]
    assert [p["host"] for p in placement] == ["emu1", "emu1", "emu2", "emu2"], placement
    assert [p["local_rank"] for p in placement] == [0, 1, 0, 1]
    assert len({p["node"] for p in placement}) == 2
    assert summary["ranks_per_node"] == 2 and summary["world_size"] == 4
    # The two-level exchange used node groups of 2: only the vote on each rank's half crosses
    # nodes, the fp32 average and the 1-bit share stay inside (a flat group would send all).
    last = [json.loads(line) for line in (whole / "run" / "metrics.jsonl").read_text().splitlines()]
    inter, intra = last[-1]["comm_bytes_inter_per_step"], last[-1]["comm_bytes_intra_per_step"]
    assert 0 < inter < intra, last[-1]
    # Each node's NIC, read inside its namespace (TaskProlog sets GLOO_SOCKET_IFNAME=eth0):
    # the node sent at least what the run counted as crossing nodes.
    assert last[-1]["wire_bytes_per_step"] >= 2 * inter, last[-1]
    assert "srun --nodes=2 --ntasks=4" in _log(whole)

    # 2. Cancelled after its first checkpoint, then run again: the same weights, bit for bit.
    cut = tmp_path / "cut"
    cut.mkdir()
    job = _sbatch(env, cut, "cut", cfg=cfg, shards=shards)
    deadline = time.monotonic() + 240
    # The checkpoint rank 0 writes last (step_NNNNNNNN.pt), not the data ranks' own files that
    # come before it: a cancel between the two leaves nothing to resume from.
    while not list((cut / "run").glob("checkpoints/*/step_????????.pt")):
        assert _state(env, job) in ("PENDING", "CONFIGURING", "RUNNING"), _log(cut)
        assert time.monotonic() < deadline, _log(cut)
        time.sleep(0.1)
    subprocess.run(["scancel", job], env=env, check=True)
    assert _wait(env, job, cut) == "CANCELLED", _log(cut)
    assert not (cut / "run" / "model.pt").exists(), "the cancel came too late to test a resume"
    job = _sbatch(env, cut, "resume", cfg=cfg, shards=shards)
    assert _wait(env, job, cut) == "COMPLETED", _log(cut)
    resumed = json.loads((cut / "run" / "train_summary.json").read_text())
    assert resumed["resumed_from"] is not None
    assert [p["host"] for p in resumed["placement"]] == ["emu1", "emu1", "emu2", "emu2"]
    a = torch.load(whole / "run" / "model.pt", weights_only=True)
    b = torch.load(cut / "run" / "model.pt", weights_only=True)
    a, b = a["state_dict"], b["state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    wall = time.perf_counter() - t0
    print(f"2 nodes x 2 ranks: whole, cancelled and resumed jobs in {wall:.0f} s")


# A network-study point of runner local: Lion on 2 nodes × 1 rank at the fixture's 100 Mbit/s,
# which labels it (cosmocub does not shape the cluster's links). The 49k-parameter model of
# config/test.yaml's study: 196 kB of gradients a step, so the link's rate shows in its time.
STUDY_CONFIG = {
    "preprocess": {"sample_size": 8},
    "model": {"input_size": 8, "num_conv_blocks": 2},
    "studies": {"contended_ready_share": 0.01, "contended_steal_share": 0.99},  # no rerun
    "network_study": {
        "runner": "local",
        "rates_mbit": [100],
        "nodes": 2,
        "ranks_per_node": 1,
        "seeds": [0],
        "epochs": 3,
        "max_steps_per_epoch": 4,
        "lr": 0.001,
        "model": {"base_filters": 16, "dense_sizes": [128], "batch_norm": False},
        "variants": {"lion": {"name": "lion"}},
        "reference": "lion",
    },
    "tracking": {"enabled": False},
}


def test_a_network_study_point_runs_across_both_nodes(emulated_slurm, tmp_path) -> None:
    from shard_fixtures import make_random_shards

    from cosmocub import cli

    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(STUDY_CONFIG))
    folder, point = tmp_path / "lion_100mbit", "lion_100mbit"
    base = ["--study", "network", "--point", point]
    written = ["study-point-config", "--config", str(cfg), *base]
    assert cli.main([*written, "--out", str(folder / "config.yaml")]) == 0
    command = (
        f"{sys.executable} -m cosmocub.cli study-point {' '.join(base)} --point-config"
        f" {folder / 'config.yaml'} --shards {shards} --out {folder} --cpus-per-rank 1"
        " --max-restarts 0"
    )
    t0 = time.perf_counter()
    one_rank = {"command": command, "ranks_per_node": 1}
    job = _sbatch(emulated_slurm, folder, "point", cfg=cfg, shards=shards, **one_rank)
    assert _wait(emulated_slurm, job, folder) == "COMPLETED", _log(folder)
    record = json.loads((folder / "point.json").read_text())
    assert (record["runner"], record["nodes"], record["ranks_per_node"]) == ("local", 2, 1)
    assert (record["rate_mbit"], record["rate_set_by_runner"]) == (100.0, False)
    assert "srun --nodes=2 --ntasks=2" in _log(folder)
    summary = json.loads((folder / "run" / "train_summary.json").read_text())
    assert [p["host"] for p in summary["placement"]] == ["emu1", "emu2"]
    epochs = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").open()]
    last = epochs[-1]
    # DDP's ring over 2 ranks: each sends its gradient's size a step, all of it across nodes;
    # each node's NIC carries that and the TCP/IP framing (docs/cluster/netemu.md: within 15 %).
    assert last["comm_bytes_per_step"] == last["comm_bytes_inter_per_step"] > 190_000
    assert 1.0 <= last["wire_bytes_per_step"] / last["comm_bytes_per_step"] < 1.15, last
    # The exchange ran at the link's rate or slower, never faster: the link is shaped.
    floor_s = last["wire_bytes_per_step"] * 8 / 100e6
    assert last["time_exchange_busy_s"] >= 0.9 * floor_s, (last, floor_s)
    wall = time.perf_counter() - t0
    busy = last["time_exchange_busy_s"]
    print(f"network point on 2 nodes: {wall:.0f} s, exchange {busy:.4f} s, wire {floor_s:.4f} s")


# 32³ universes with 8³ samples: 4 blocks a universe (data/crop.py), 32 for 2 workers to share.
NUM_UNIVERSES = 8
LIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED")


def _squeue(env: dict[str, str], *args: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", *args], env=env, capture_output=True, text=True)
    return out.stdout.split()


@pytest.mark.long
def test_dask_workers_on_both_nodes_write_the_shards(emulated_slurm, make_universe, tmp_path):
    """Preprocessing on Dask workers that the group job starts as Slurm jobs (preprocess.
    dask_slurm_workers): the workflow's commands, plan here, the group job through sbatch (it
    starts 2 worker jobs, which Slurm places one a node, computes on them and cancels them),
    gather here. The shards are the bytes of a preprocessing on local threads; the workers' own
    record says both nodes wrote them; no worker job or process is left."""
    from cosmocub.config import load_config
    from cosmocub.data.preprocess import preprocess
    from cosmocub.io import sha256_file

    env = emulated_slurm
    folder = tmp_path / "universes"
    folder.mkdir()
    paths = [
        make_universe(f"universes/univ_{i}.hdf5", size=32, seed=i) for i in range(NUM_UNIVERSES)
    ]
    # Each worker job asks for 60 % of a node's memory, so Slurm puts one on each node (the group
    # job, one CPU and 500 MB, fits beside either).
    node_mb = min(int(mb) for mb in _node_memory(env))
    values = {
        "results": str(tmp_path / "results"),
        "tracking": {"enabled": False},
        "seed": 3,
        "universes": {"source": "cosmoflow", "cosmoflow_dir": str(folder), "size": 32},
        "preprocess": {"sample_size": 8, "slab_depth": 4},
        "model": {"input_size": 8, "num_conv_blocks": 2},
        "cluster": {
            "preprocess": {
                "universes_per_job": NUM_UNIVERSES,
                "threads": 1,
                "mem_mb": int(0.6 * node_mb),
                "runtime": 10,
            }
        },
    }
    threads_cfg = load_config(_write(tmp_path / "threads.yaml", values))
    values["preprocess"] |= {"dask_slurm_workers": 2, "dask_slurm_wait_s": 240}
    config = _write(tmp_path / "workers.yaml", values)
    assert load_config(config).hash != threads_cfg.hash
    # The workflow's link group: the universes linked, with the manifest the plan reads.
    cli = [sys.executable, "-m", "cosmocub.cli"]
    linked = tmp_path / "linked"
    link = [*cli, "link-group", "--config", str(config), "--group", "0", "--out", str(linked)]
    subprocess.run(link, env=env, check=True)
    paths = [linked / p.name for p in paths]

    # The same universes on local threads, in this process.
    preprocess(
        paths,
        tmp_path / "threads",
        settings=threads_cfg.preprocess,
        seed=3,
        config_hash=load_config(config).hash,
        universes_per_job=NUM_UNIVERSES,
    )

    # The workflow's three commands, the group as a job on the nodes.
    staging, group, out = tmp_path / "staging", tmp_path / "groups" / "0.npz", tmp_path / "shards"
    plan = [*cli, "preprocess-plan", "--config", str(config), "--universes-dir", str(linked)]
    subprocess.run([*plan, "--staging", str(staging)], env=env, check=True)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    crop = [*cli, "preprocess-group", "--config", str(config), "--staging", str(staging)]
    crop += ["--group", "0", "--out", str(group), "--threads", "1"]
    (job_dir / "job.sh").write_text("#!/bin/bash\n" + " ".join(crop) + "\n")
    t0 = time.perf_counter()
    sbatch = ["sbatch", "--parsable", "--cpus-per-task=1", "--mem=500", "--time=10"]
    sbatch += [f"--chdir={job_dir}", f"--output={job_dir / 'job.log'}", str(job_dir / "job.sh")]
    job = subprocess.run(sbatch, env=env, capture_output=True, text=True, check=True).stdout
    job = job.strip()
    assert _wait(env, job, job_dir, timeout=420) == "COMPLETED", _log(job_dir)
    wall = time.perf_counter() - t0
    gather = [*cli, "preprocess-gather", "--config", str(config), "--staging", str(staging)]
    gather += ["--groups-dir", str(group.parent), "--out", str(out)]
    subprocess.run(gather, env=env, check=True)

    # Bit for bit the shards, statistics and features of local threads.
    for name in ("train.h5", "val.h5", "test.h5", "stats.json", "features.h5"):
        assert sha256_file(out / name) == sha256_file(tmp_path / "threads" / name), name
    ma, mb = (json.loads((d / "manifest.json").read_text()) for d in (out, tmp_path / "threads"))
    written_by = ma.pop("written_by")
    ma.pop("created"), mb.pop("created")
    assert ma == mb
    # The workers' own record: every universe's 4 blocks written, and workers on both nodes.
    assert sorted(written_by) == sorted(str(p) for p in paths)
    assert all(sum(hosts.values()) == 4 for hosts in written_by.values()), written_by
    assert {h for hosts in written_by.values() for h in hosts} == {"emu1", "emu2"}, written_by
    assert "preprocess: 2 Dask workers as Slurm jobs" in _log(job_dir)

    # The two worker jobs were cancelled when the group ended: none left alive, and no worker
    # process left on the machine (their ends take Slurm's KillWait, 5 s, at most).
    name = f"cosmocub-dask-{job}"
    deadline = time.monotonic() + 60
    while True:
        states = _squeue(env, "-t", "all", "--name", name, "-o", "%T")
        workers = subprocess.run(
            ["pgrep", "-af", "distributed.cli.dask_worker"], capture_output=True, text=True
        ).stdout
        if not (set(states) & set(LIVE) or workers) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states == ["CANCELLED", "CANCELLED"], states
    assert workers == "", workers
    print(f"group job with 2 Dask worker jobs on emu1 and emu2: {wall:.0f} s; {written_by}")


def _node_memory(env: dict[str, str]) -> list[str]:
    """Each node's RealMemory (MB) as sinfo lists it."""
    out = subprocess.run(
        ["sinfo", "-h", "-N", "-o", "%m"], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def _write(path: Path, values: dict) -> Path:
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.long
@pytest.mark.parametrize("link", ["cut", "up"])
def test_a_lost_node_ends_the_job_without_a_restart_in_its_allocation(
    emulated_slurm, tmp_path, link
) -> None:
    """A training of 2 × 2 ranks launched with 2 restarts to spare loses emu2 after its first
    checkpoint: its slurmd and ranks killed, its link cut (a dead machine: emu1's ranks hear
    nothing) or left up (its kernel closes their connections: emu1's ranks fail at once on a
    peer's closed connection). Either way no second attempt starts inside the allocation that
    still holds the dead node; the job leaves RUNNING (ended, or requeued by Slurm to wait for a
    node), and no rank of it is left on emu1."""
    from shard_fixtures import make_random_shards

    env = emulated_slurm
    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    cfg = _write(tmp_path / "cfg.yaml", {**CONFIG, "train": {**CONFIG["train"], "epochs": 200}})
    folder = tmp_path / "lost"
    folder.mkdir()
    launch = (
        f"{sys.executable} -m cosmocub.cli launch --nodes 2 --ranks-per-node 2 --cpus-per-rank 1"
        f" --max-restarts 2 -- train --config {cfg} --shards {shards} --out {folder / 'run'}"
    )
    job = _sbatch(env, folder, f"lost-{link}", cfg=cfg, shards=shards, command=launch)
    deadline = time.monotonic() + 240
    while not list((folder / "run").glob("checkpoints/*/step_????????.pt")):
        assert _state(env, job) in ("PENDING", "CONFIGURING", "RUNNING"), _log(folder)
        assert time.monotonic() < deadline, _log(folder)
        time.sleep(0.1)
    lost = time.monotonic()
    try:
        killed = _script("lose", "emu2", *(["--link-up"] if link == "up" else []))
        assert killed.returncode == 0, killed.stderr
        # Out of RUNNING: ended, or requeued by Slurm (JobRequeue), PENDING for a node.
        while (state := _state(env, job)) in ("CONFIGURING", "RUNNING", "COMPLETING"):
            assert time.monotonic() - lost < 180, f"job {job} still {state}:\n{_log(folder)}"
            time.sleep(0.5)
        ended_s = time.monotonic() - lost
        ranks_left = subprocess.run(
            ["pgrep", "-af", "--", f"--out {folder / 'run'}"], capture_output=True, text=True
        ).stdout
    finally:
        subprocess.run(["scancel", job], env=env)  # a requeued job would run again on revive
        revived = _script("revive", "emu2")
    log = _log(folder)
    assert revived.returncode == 0, revived.stderr
    assert "attempt 1 of 3" in log and "attempt 2 of 3" not in log, log
    assert state != "COMPLETED" and not (folder / "run" / "model.pt").exists(), (state, log)
    assert ranks_left == "", ranks_left
    # Where the launcher saw the ranks end before Slurm ended the job, its line says why it
    # did not start them again (a "crashed … starting them again" line would fail above).
    launcher = [line for line in log.splitlines() if line.startswith("cosmocub launch: ranks")]
    assert all("not starting them again inside this allocation" in x for x in launcher), log
    print(f"lost emu2 (link {link}): job {state} {ended_s:.1f} s after the kill")


def test_stop_leaves_nothing_behind(emulated_slurm) -> None:
    assert _leftovers(), "the fixture's nodes are not up"
    status = _script("status")
    assert status.returncode == 0 and status.stdout.count("slurmd yes") == 2, status.stdout
    stopped = _script("stop")
    assert stopped.returncode == 0, stopped.stderr
    assert _leftovers() == []
