"""Start the training ranks with the launcher of the allocation this runs in.

Inside a Slurm job: `srun` over the job's tasks (ParallelDims reads SLURM_PROCID/…); inside a
Flux or LSF job: one `torchrun` per node (`flux run` / `blaunch`) meeting at this host, which is
the allocation's first node; outside any: `torchrun --standalone` on this machine.

Restarts are the launcher's, not torchrun's: torchrun restarts every rank whatever the cause, so
a bad config or a non-finite loss ran and failed max_restarts + 1 times. A rank that stops on a
user error (exit 2) leaves a marker file (`cosmocub.cli` writes it); only a launch that failed
without one is started again, and training resumes from its checkpoint. Inside an allocation
(Slurm, Flux, LSF) a rank that lost a peer's connection leaves another marker, and Slurm may
report a node down: then nothing is started again there (the allocation may still hold the dead
node); the job ends, and Slurm's requeue or a rerun resumes it from its checkpoint.

Nothing outlives the launcher: what it starts runs in a session of its own (a signal to the
launcher's terminal or group reaches it only through the launcher) with the kernel's death signal
armed (SIGTERM when the launcher dies, even by `kill -9`); torchrun's ranks die with torchrun
(`cosmocub.launch.agent`); srun forwards the SIGTERM to its step's tasks, which Slurm ends. The
job log ends with the launcher's own line: the rank's one-line user error, the signal that
stopped it, or the crash.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cosmocub.launch.agent import exit_with_parent
from cosmocub.launch.env import ATTEMPT_ENV, CPUS_PER_RANK_ENV, PEER_LOST_ENV, USER_ERROR_ENV
from cosmocub.launch.torchrun import Rendezvous, cli_program, torchrun_argv

# torchrun's c10d rendezvous port on Flux/LSF (Slurm derives its port from the job id).
RENDEZVOUS_PORT = 29400
USER_ERROR_EXIT = 2
# What torch's collectives say when a peer is gone (gloo's TCP pairs; NCCL's network errors).
PEER_LOST_SIGNS = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "Connection refused",
    "Timed out waiting",
    "remote process exited",
    "NCCL communicator was aborted",
)
# Slurm node states (sinfo %T, "*" = not responding) that mean a node of the job is lost.
LOST_NODE_STATES = ("down", "drain", "fail", "not_responding", "power_down", "unknown")


@dataclass(frozen=True, kw_only=True)
class RankLayout:
    """How many processes to start where: nodes × ranks_per_node ranks of cpus_per_rank cores."""

    nodes: int
    ranks_per_node: int
    cpus_per_rank: int
    max_restarts: int = 0

    def __post_init__(self) -> None:
        for name in ("nodes", "ranks_per_node", "cpus_per_rank"):
            if getattr(self, name) < 1:
                raise ValueError(f"launch: {name} must be >= 1, got {getattr(self, name)}")

    @property
    def world_size(self) -> int:
        return self.nodes * self.ranks_per_node


def detect_scheduler(environ: Mapping[str, str]) -> str:
    """ "slurm", "flux" or "lsf" when running inside that scheduler's job, else "local"."""
    if "SLURM_JOB_ID" in environ:
        return "slurm"
    if "FLUX_JOB_ID" in environ:
        return "flux"
    if "LSB_JOBID" in environ:
        return "lsf"
    return "local"


def _lsf_hosts(environ: Mapping[str, str]) -> list[str]:
    # LSB_MCPU_HOSTS = "hostA 4 hostB 4": each host once, in allocation order.
    words = environ.get("LSB_MCPU_HOSTS", "").split()
    return list(dict.fromkeys(words[::2]))


def launch_command(
    layout: RankLayout,
    module_args: Sequence[str],
    *,
    environ: Mapping[str, str] | None = None,
    python: str = sys.executable,
    host: str | None = None,
) -> list[str]:
    """The argv that starts `python -m cosmocub.cli <module_args>` as every rank of `layout`."""
    env = os.environ if environ is None else environ
    scheduler = detect_scheduler(env)
    args = list(module_args)
    if scheduler == "local":
        if layout.nodes > 1:
            raise ValueError(
                f"key 'cluster.train.nodes': {layout.nodes} nodes need a scheduler allocation "
                f"(run with --profile profiles/slurm, or set it to 1 on one machine)"
            )
        # torchrun, reporting failures in one line and arming its ranks to die with it;
        # restarts are run_launch's, not torchrun's.
        return torchrun_argv(layout.ranks_per_node, *cli_program(args), python=python)
    if scheduler == "slurm":
        if layout.world_size == 1:
            # The job is one task already; ParallelDims reads SLURM_PROCID=0 / SLURM_NTASKS=1.
            return [python, *cli_program(args)]
        return [
            "srun",
            f"--nodes={layout.nodes}",
            f"--ntasks={layout.world_size}",
            f"--ntasks-per-node={layout.ranks_per_node}",
            f"--cpus-per-task={layout.cpus_per_rank}",
            "--kill-on-bad-exit=1",
            python,
            *cli_program(args),
        ]
    # Flux and LSF: one torchrun agent per node; the batch script runs on the allocation's first
    # node, so its hostname is an address every agent can reach.
    job_id = env.get("FLUX_JOB_ID") or env.get("LSB_JOBID") or "0"
    endpoint = f"{host or socket.gethostname()}:{RENDEZVOUS_PORT}"
    agent = torchrun_agent(layout, args, endpoint=endpoint, rdzv_id=job_id, python=python)
    if scheduler == "flux":
        return [
            "flux",
            "run",
            f"--nodes={layout.nodes}",
            "--tasks-per-node=1",
            f"--cores-per-task={layout.cpus_per_rank * layout.ranks_per_node}",
            *agent,
        ]
    hosts = _lsf_hosts(env)
    if len(hosts) < layout.nodes:
        raise ValueError(
            f"LSF job {job_id}: cluster.train.nodes is {layout.nodes} but LSB_MCPU_HOSTS names "
            f"{len(hosts)} host(s)"
        )
    return ["blaunch", "-z", " ".join(hosts[: layout.nodes]), *agent]


def torchrun_agent(
    layout: RankLayout,
    module_args: Sequence[str],
    *,
    endpoint: str,
    rdzv_id: str,
    python: str = sys.executable,
    local_addr: str | None = None,
    is_host: bool | None = None,
) -> list[str]:
    """One node's torchrun agent of a multi-node launch (Flux, LSF, emulated nodes): it meets the
    other nodes' agents at the c10d `endpoint` and starts ranks_per_node ranks. Where hostnames
    do not tell the nodes apart (emulated nodes share the machine's): `local_addr`, the address
    the other nodes reach this one at, and `is_host`, whether this agent serves the endpoint."""
    rendezvous = Rendezvous(
        nodes=layout.nodes,
        endpoint=endpoint,
        rdzv_id=rdzv_id,
        local_addr=local_addr,
        is_host=is_host,
    )
    # Restarts are run_launch's / run_attempts', not torchrun's.
    return torchrun_argv(
        layout.ranks_per_node, *cli_program(module_args), python=python, rendezvous=rendezvous
    )


def format_command(argv: Sequence[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def record_user_error(message: str) -> None:
    """Called by a rank that exits on a user error: tell the launcher not to start it again."""
    path = os.environ.get(USER_ERROR_ENV)
    if not path:
        return
    with open(path, "a") as f:
        f.write(f"rank {os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))}: {message}\n")


def peer_lost(err: BaseException) -> bool:
    """Whether `err` (a rank's) is a collective that lost its peer rather than a bug."""
    return isinstance(err, RuntimeError) and any(sign in str(err) for sign in PEER_LOST_SIGNS)


def record_peer_lost(message: str) -> None:
    """Called by a rank whose peer's connection dropped: the launcher decides on a restart."""
    if path := os.environ.get(PEER_LOST_ENV):
        with open(path, "a") as f:
            f.write(
                f"rank {os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))}: {message}\n"
            )


def lost_nodes(sinfo_out: str) -> list[str]:
    """The nodes of `sinfo --noheader -o "%N %T"` output whose state says they are lost."""
    lost = []
    for line in sinfo_out.splitlines():
        name, _, state = line.strip().partition(" ")
        state = state.strip().lower()
        if name and (state.endswith("*") or state.startswith(LOST_NODE_STATES)):
            lost.append(name)
    return lost


def _slurm_lost_nodes(environ: Mapping[str, str]) -> list[str]:
    nodes = environ.get("SLURM_JOB_NODELIST")
    if not nodes:
        return []
    try:
        out = subprocess.run(
            ["sinfo", "--noheader", f"--nodes={nodes}", "--Node", "-o", "%N %T"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []  # no answer is no report of a failure; a lost peer is still seen by the ranks
    return lost_nodes(out.stdout)


def run_launch(layout: RankLayout, module_args: Sequence[str]) -> int:
    """Start the ranks up to 1 + max_restarts times: again after a crash, never after a user
    error; returns the exit status for the job. The last line it prints says why it stopped."""
    argv = launch_command(layout, module_args)
    _say(f"{format_command(argv)}")
    # The ranks' torch threads: what the scheduler or the rule granted each rank.
    os.environ[CPUS_PER_RANK_ENV] = str(layout.cpus_per_rank)
    return run_attempts(
        layout.max_restarts,
        lambda env: _run_forwarding_signals(argv, env),
        scheduler=detect_scheduler(os.environ),
    )


def run_attempts(
    max_restarts: int,
    run_once: Callable[[dict[str, str]], tuple[int, int | None]],
    *,
    scheduler: str = "local",
    find_lost_nodes: Callable[[Mapping[str, str]], list[str]] = _slurm_lost_nodes,
) -> int:
    """Call `run_once(env)` (start every rank, wait for them: (exit status, stopping signal or
    None)) up to 1 + max_restarts times: again after a crash, never after a user error or a
    signal, nor inside a `scheduler`'s allocation after a lost peer or (Slurm) node; env is
    os.environ plus the markers and the attempt number."""
    marker = Path.cwd() / f".cosmocub-user-error-{uuid.uuid4().hex}"
    lost_marker = marker.with_name(marker.name.replace("user-error", "peer-lost"))
    attempts = max_restarts + 1
    try:
        for attempt in range(attempts):
            env = {
                **os.environ,
                USER_ERROR_ENV: str(marker),
                PEER_LOST_ENV: str(lost_marker),
                ATTEMPT_ENV: str(attempt),
            }
            _say(f"attempt {attempt + 1} of {attempts}")
            rc, stopped_by = run_once(env)
            if stopped_by is not None:
                _say(f"stopped by {signal.Signals(stopped_by).name} (exit {rc}); the ranks ended")
                return rc
            if rc == 0:
                return 0
            if marker.exists():
                _say("stopped by a user error; not starting the ranks again:")
                # The rank's own one-line error is the job log's last line.
                print(marker.read_text().splitlines()[0].split(": ", 1)[1], file=sys.stderr)
                return USER_ERROR_EXIT
            if scheduler != "local" and (
                lost := _lost_here(scheduler, lost_marker, find_lost_nodes)
            ):
                _say(
                    f"ranks stopped (exit {rc}): {lost}; not starting them again inside this "
                    "allocation, which may hold the lost node: the job ends, and Slurm's requeue "
                    "(or a rerun) resumes from the last checkpoint"
                )
                return rc
            if attempt < max_restarts:
                _say(f"ranks crashed (exit {rc}); starting them again, from the last checkpoint")
        _say(f"ranks crashed (exit {rc}) in all {attempts} attempt(s); giving up")
        return rc
    finally:
        marker.unlink(missing_ok=True)
        lost_marker.unlink(missing_ok=True)


def _lost_here(
    scheduler: str, lost_marker: Path, find_lost_nodes: Callable[[Mapping[str, str]], list[str]]
) -> str:
    """Why the allocation is not to be used again ("" where nothing says it lost a part)."""
    if scheduler == "slurm" and (nodes := find_lost_nodes(os.environ)):
        return f"Slurm reports node(s) {', '.join(nodes)} lost"
    if lost_marker.exists():
        first = lost_marker.read_text().splitlines()[0]
        return f"a peer's connection dropped ({first})"
    return ""


def _say(line: str) -> None:
    print(f"cosmocub launch: {line}", file=sys.stderr, flush=True)


def _start_child(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    """argv in a session of its own, armed to get SIGTERM when this process dies."""
    launcher = os.getpid()

    def arm() -> None:  # in the child, between fork and exec: the death signal survives exec
        if sys.platform.startswith("linux"):
            exit_with_parent(launcher, signal.SIGTERM)

    return subprocess.Popen(list(argv), env=env, start_new_session=True, preexec_fn=arm)


def _run_forwarding_signals(argv: Sequence[str], env: dict[str, str]) -> tuple[int, int | None]:
    """Run argv; SIGTERM/SIGINT to this process (Snakemake, scancel, Ctrl-C) go on to its
    process group and end the attempts. Returns (exit status, the signal that stopped us or
    None)."""
    child = _start_child(argv, env)
    stopped: list[int] = []

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        with contextlib.suppress(ProcessLookupError):  # already gone
            os.killpg(child.pid, signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        rc = child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return rc, (stopped[0] if stopped else None)
