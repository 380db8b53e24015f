"""cosmocub.launch.launcher: the launcher follows the allocation (none, Slurm, Flux, LSF); and the
rendezvous on Slurm is where rank 0 runs."""

from __future__ import annotations

import pytest

from cosmocub.launch.env import ATTEMPT_ENV, PEER_LOST_ENV
from cosmocub.launch.launcher import RankLayout, launch_command, lost_nodes, run_attempts
from cosmocub.parallel.parallel_dims import detect_launch_env

TRAIN = ["train", "--shards", "s", "--out", "r"]


def test_local_is_torchrun_standalone() -> None:
    argv = launch_command(
        RankLayout(nodes=1, ranks_per_node=2, cpus_per_rank=3, max_restarts=2),
        TRAIN,
        environ={},
        python="py",
    )
    assert argv == [
        "py",
        "-m",
        "cosmocub.launch.agent",
        "--standalone",
        "--nproc-per-node=2",
        "--max-restarts=0",
        "-m",
        "cosmocub.cli",
        *TRAIN,  # restarts are run_launch's
    ]
    with pytest.raises(ValueError, match=r"cluster.train.nodes': 2 nodes need a scheduler"):
        launch_command(RankLayout(nodes=2, ranks_per_node=1, cpus_per_rank=1), TRAIN, environ={})


def test_slurm_is_srun_over_every_task() -> None:
    env = {"SLURM_JOB_ID": "77"}
    argv = launch_command(
        RankLayout(nodes=2, ranks_per_node=4, cpus_per_rank=8), TRAIN, environ=env, python="py"
    )
    assert argv[:6] == [
        "srun",
        "--nodes=2",
        "--ntasks=8",
        "--ntasks-per-node=4",
        "--cpus-per-task=8",
        "--kill-on-bad-exit=1",
    ]
    assert argv[6:] == ["py", "-m", "cosmocub.cli", *TRAIN]
    # One task: the batch job is that task already.
    one = launch_command(RankLayout(nodes=1, ranks_per_node=1, cpus_per_rank=2), TRAIN, environ=env)
    assert one[1:4] == ["-m", "cosmocub.cli", "train"]


def test_flux_and_lsf_start_one_torchrun_per_node_meeting_here() -> None:
    layout = RankLayout(nodes=2, ranks_per_node=4, cpus_per_rank=8)
    flux = launch_command(layout, TRAIN, environ={"FLUX_JOB_ID": "f2"}, python="py", host="n1")
    assert flux[:5] == ["flux", "run", "--nodes=2", "--tasks-per-node=1", "--cores-per-task=32"]
    assert "--nnodes=2" in flux and "--nproc-per-node=4" in flux
    assert "--rdzv-endpoint=n1:29400" in flux and "--rdzv-id=f2" in flux
    lsf_env = {"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "a1 32 a2 32"}
    lsf = launch_command(layout, TRAIN, environ=lsf_env, python="py", host="a1")
    assert lsf[:3] == ["blaunch", "-z", "a1 a2"] and "--rdzv-endpoint=a1:29400" in lsf
    with pytest.raises(ValueError, match="LSB_MCPU_HOSTS names 1 host"):
        launch_command(layout, TRAIN, environ={"LSB_JOBID": "9", "LSB_MCPU_HOSTS": "a1 32"})


def test_slurm_rendezvous_is_rank_zeros_node_not_the_login_node() -> None:
    # After `salloc` on a login node, srun runs from there: SLURM_LAUNCH_NODE_IPADDR is the login
    # node's address, where nothing listens; rank 0 runs on the step's first node.
    env = detect_launch_env(
        {
            "SLURM_PROCID": "3",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_ID": "5",
            "SLURM_LAUNCH_NODE_IPADDR": "10.1.2.3",
            "SLURM_JOB_NODELIST": "gpu[007-009]",
            "SLURM_STEP_NODELIST": "gpu[008-009]",
        }
    )
    assert env.master_addr == "gpu008"
    env = detect_launch_env(
        {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "cn[1-2]"}
    )
    assert env.master_addr == "cn1"


def test_torchrun_ranks_get_the_cores_the_launcher_granted() -> None:
    env = detect_launch_env({"RANK": "0", "WORLD_SIZE": "2", "COSMOCUB_CPUS_PER_RANK": "3"})
    assert env.cpus_per_rank == 3
    assert detect_launch_env({"RANK": "0", "WORLD_SIZE": "2"}).cpus_per_rank is None


def test_cluster_section_and_server_settings(tmp_path) -> None:
    from cosmocub.config import ConfigError, load_config
    from cosmocub.launch.resources import num_preprocess_groups, train_job

    cfg = load_config(None, {"train": {"ranks_per_node": 4}, "cluster": {"train": {"nodes": 3}}})
    job = train_job(cfg)
    assert (job.nodes, job.ranks_per_node, job.world_size) == (3, 4, 12) == (3, 4, cfg.world_size)
    # 4 ranks of 8 cores and 8000 MB a node; 3 nodes of them.
    assert (job.threads, job.cpus_total, job.mem_mb, job.gres) == (32, 96, 32_000, "")
    # Snakemake capped the job at 6 cores here: 1 a rank; at 2, still 1 (never 0).
    assert job.cpus_per_rank_within(6) == 1 and job.cpus_per_rank_within(2) == 1
    assert job.cpus_per_rank_within(32) == 8
    gpu = load_config(
        None, {"train": {"ranks_per_node": 4}, "cluster": {"train": {"gpus_per_rank": 1}}}
    )
    assert train_job(gpu).gres == "gpu:4"
    assert num_preprocess_groups(cfg, 10_000) == 100  # 100 universes a job
    with pytest.raises(ConfigError, match=r"tracking.server.start': true .* set one of them"):
        load_config(None, {"tracking": {"uri": "http://x:5000", "server": {"start": True}}})


def test_emulated_nodes_name_their_address_and_which_one_serves_the_rendezvous() -> None:
    from cosmocub.launch.launcher import torchrun_agent

    layout = RankLayout(nodes=2, ranks_per_node=1, cpus_per_rank=1)
    argv = torchrun_agent(
        layout,
        TRAIN,
        endpoint="10.77.0.1:29400",
        rdzv_id="x",
        python="py",
        local_addr="10.77.0.2",
        is_host=False,
    )
    assert argv == [
        "py",
        "-m",
        "cosmocub.launch.agent",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.77.0.1:29400",
        "--rdzv-id=x",
        "--rdzv-conf=is_host=0",
        "--local-addr=10.77.0.2",
        "--max-restarts=0",
        "-m",
        "cosmocub.cli",
        *TRAIN,
    ]


# --- no restart inside an allocation that lost a node -------------------------------------------


def _crash_losing_a_peer(calls: list[int]):
    """A run_once whose ranks crash, one of them having lost its peer (as cosmocub.cli says)."""

    def run_once(env: dict[str, str]) -> tuple[int, int | None]:
        calls.append(int(env[ATTEMPT_ENV]))
        with open(env[PEER_LOST_ENV], "a") as f:
            f.write("rank 0: cosmocub train: error: lost a peer rank: Connection closed by peer\n")
        return 1, None

    return run_once


@pytest.mark.parametrize(
    ("scheduler", "lost", "attempts"),
    [("local", [], 3), ("slurm", [], 1), ("slurm", ["n2"], 1), ("flux", [], 1)],
)
def test_a_lost_peer_ends_the_job_inside_an_allocation(
    tmp_path, monkeypatch, capsys, scheduler, lost, attempts
) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[int] = []
    rc = run_attempts(
        2, _crash_losing_a_peer(calls), scheduler=scheduler, find_lost_nodes=lambda env: lost
    )
    assert (rc, calls) == (1, list(range(attempts)))
    err = capsys.readouterr().err
    if scheduler != "local":
        last = err.strip().splitlines()[-1]
        assert "not starting them again inside this allocation" in last
        assert ("n2 lost" in last) == bool(lost)
    assert not list(tmp_path.iterdir())  # both markers cleaned up


def test_a_node_slurm_reports_lost_ends_the_job_without_a_marker(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    calls: list[int] = []

    def crash(env):
        calls.append(1)
        return 137, None

    assert run_attempts(3, crash, scheduler="slurm", find_lost_nodes=lambda e: ["n3"]) == 137
    assert calls == [1]
    assert run_attempts(1, crash, scheduler="slurm", find_lost_nodes=lambda e: []) == 137
    assert calls == [1, 1, 1]  # a crash with nothing lost is started again


def test_lost_nodes_reads_sinfo_states() -> None:
    out = "n1 allocated\nn2 down*\nn3 idle*\nn4 mixed\nn5 drained\nn6 completing\n"
    assert lost_nodes(out) == ["n2", "n3", "n5"]


# Two ranks that train until one is killed (15 s at a load of 2): on request; the launcher's
# decision on what a rank reports is tested above in the suite.
@pytest.mark.long
def test_a_rank_whose_peer_dies_says_so_in_one_line(tmp_path) -> None:
    """Two real gloo ranks (no torchrun to end the survivor): rank 1 is SIGKILLed mid-training;
    rank 0 exits within seconds with one line naming the lost peer, and marks it."""
    import socket
    import sys
    import time

    import yaml
    from shard_fixtures import make_random_shards
    from test_train import TINY

    from cosmocub.launch import multirank

    shards = make_random_shards(tmp_path / "shards", counts={"train": 16, "val": 8}, size=8)
    values = {**TINY, "train": {**TINY["train"], "epochs": 1000, "ranks_per_node": 2}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(values))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "cosmocub.cli", "train", "--config", str(tmp_path / "cfg.yaml")]
    argv += ["--shards", str(shards), "--out", str(tmp_path / "run")]
    marker = tmp_path / "peer-lost"
    ranks = []
    try:
        for rank in (0, 1):
            env = multirank.rank_env(
                {
                    "RANK": str(rank),
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "2",
                    "LOCAL_WORLD_SIZE": "2",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    PEER_LOST_ENV: str(marker),
                }
            )
            ranks.append(multirank.start_ranks(argv, env=env, cwd=tmp_path))
        deadline = time.monotonic() + 120
        while not list((tmp_path / "run").glob("checkpoints/*/step_*.pt")):
            assert ranks[0].poll() is None, ranks[0].communicate()[1][-2000:]
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.1)
        multirank.kill_tree(ranks[1])
        _, err = ranks[0].communicate(timeout=60)
    finally:
        for proc in ranks:
            multirank.kill_tree(proc)
    assert ranks[0].returncode == 1, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("cosmocub train: error: lost a peer rank: "), last
    assert "by peer" in last
    assert marker.read_text() == f"rank 0: {last}\n"
