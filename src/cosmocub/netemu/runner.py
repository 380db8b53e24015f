"""One training run on emulated nodes: the per-point runner of the network and scaling studies.

`run_training_on_nodes` makes the network (`emulated_nodes`), starts one torchrun agent per node
inside its namespace — the same agent a Flux/LSF allocation starts (`launcher.torchrun_agent`),
meeting at node 0's bridge address, gloo on the node's veth (GLOO_SOCKET_IFNAME) — pinned to a
fixed core set, restarts them like `cosmocub launch` does (`launch.run_attempts`), and returns
what the run measured: each node's tx bytes over the whole run, the cores each rank had, and what
the training wrote (metrics.jsonl, with per-epoch `wire_bytes_per_step` from inside the ranks,
and train_summary.json).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmocub.io import read_json, read_jsonl
from cosmocub.launch.env import CPUS_PER_RANK_ENV
from cosmocub.launch.launcher import (
    RENDEZVOUS_PORT,
    RankLayout,
    format_command,
    run_attempts,
    torchrun_agent,
)
from cosmocub.netemu.namespaces import DEFAULT_PREFIX, EmulatedNetwork, emulated_nodes

# An agent still running this long after another one failed is stopped (its ranks would wait
# for the collective timeout anyway); then killed after the same again.
STOP_GRACE_S = 10.0


@dataclass(frozen=True, kw_only=True)
class NodesRunResult:
    returncode: int
    nodes: int
    ranks_per_node: int
    rate_mbit: float
    node_cores: list[list[int]]  # the cores node k's ranks were pinned to
    cores_per_rank: float  # below threads_per_rank: ranks share cores (oversubscribed)
    threads_per_rank: int  # each rank's torch threads
    attempts: int  # 1 + restarts the launcher made
    wall_s: float
    node_tx_bytes: list[int]  # per node, over the whole run (start-up and every attempt)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl
    summary: dict[str, Any] | None = None  # train_summary.json
    logs: list[Path] = field(default_factory=list)  # one per node

    @property
    def oversubscribed(self) -> bool:
        """The ranks had fewer cores than threads: they shared cores."""
        return self.cores_per_rank < self.threads_per_rank


def split_cores(
    cores: Sequence[int], nodes: int, ranks_per_node: int, cpus_per_rank: int | None = None
) -> tuple[list[list[int]], float]:
    """Node k's cores and the cores per rank. With `cpus_per_rank`, when every rank's share fits:
    node k a disjoint block of ranks_per_node × cpus_per_rank cores (any others stay idle, so
    that every point of a study has the same cores per rank). Otherwise all of them shared out:
    disjoint equal blocks when there are at least as many cores as nodes, else every node on all
    cores (cores / ranks each)."""
    cores = sorted(cores)
    if cpus_per_rank is not None and nodes * ranks_per_node * cpus_per_rank <= len(cores):
        size = ranks_per_node * cpus_per_rank
        return [cores[k * size : (k + 1) * size] for k in range(nodes)], float(cpus_per_rank)
    if len(cores) >= nodes:
        size = len(cores) // nodes
        blocks = [cores[k * size : (k + 1) * size] for k in range(nodes)]
        return blocks, size / ranks_per_node
    return [list(cores) for _ in range(nodes)], len(cores) / (nodes * ranks_per_node)


def run_training_on_nodes(
    *,
    config_path: str | os.PathLike,
    shards_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    nodes: int,
    ranks_per_node: int,
    rate_mbit: float,
    cores: Sequence[int] | None = None,
    cpus_per_rank: int | None = None,
    max_restarts: int = 0,
    prefix: str = DEFAULT_PREFIX,
    python: str = sys.executable,
    during: Callable[[EmulatedNetwork], None] | None = None,
) -> NodesRunResult:
    """Train `cosmocub train --config … --shards … --out out_dir` on `nodes` emulated nodes of
    `ranks_per_node` ranks, links at rate_mbit (0 = unshaped). `cores`: the CPUs to share
    out (default: this process's affinity); `cpus_per_rank`: each rank's threads and, where they
    fit, its own cores (`split_cores`; None: all the cores shared out). `during(network)` runs in
    a thread while training (e.g. to cut a link). Raises EmulationUnavailableError without
    CAP_NET_ADMIN."""
    out_dir = Path(out_dir)
    log_dir = out_dir / "node_logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    node_cores, cores_per_rank = split_cores(
        cores if cores is not None else os.sched_getaffinity(0),
        nodes,
        ranks_per_node,
        cpus_per_rank,
    )
    layout = RankLayout(
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        cpus_per_rank=max(1, int(cores_per_rank)) if cpus_per_rank is None else cpus_per_rank,
        max_restarts=max_restarts,
    )
    train_args = ["train", "--config", str(config_path), "--shards", str(shards_dir)]
    train_args += ["--out", str(out_dir)]
    logs = [log_dir / f"node{k}.log" for k in range(nodes)]
    attempts: list[int] = []
    stopped_by: list[int] = []
    started = time.perf_counter()
    with emulated_nodes(nodes=nodes, rate_mbit=rate_mbit, prefix=prefix) as net:
        tx_start = net.tx_bytes()
        helper = threading.Thread(target=during, args=(net,), daemon=True) if during else None

        def run_once(env: dict[str, str]) -> tuple[int, int | None]:
            attempt = len(attempts)
            attempts.append(attempt)
            # A fresh rendezvous per attempt: the last one's port may still be in TIME_WAIT.
            endpoint = f"{net.nodes[0].address}:{RENDEZVOUS_PORT + attempt}"
            rdzv_id = f"{net.switch_netns}-{attempt}"
            argvs = [
                [
                    *node.exec_prefix(),
                    "taskset",
                    "-c",
                    ",".join(map(str, node_cores[node.index])),
                    *torchrun_agent(
                        layout,
                        train_args,
                        endpoint=endpoint,
                        rdzv_id=rdzv_id,
                        python=python,
                        local_addr=node.address,
                        is_host=node.index == 0,
                    ),
                ]
                for node in net.nodes
            ]
            envs = [
                {
                    **env,
                    # gloo's interface; also the one train/wire_meter.py reads tx_bytes of
                    "GLOO_SOCKET_IFNAME": node.interface,
                    CPUS_PER_RANK_ENV: str(layout.cpus_per_rank),
                }
                for node in net.nodes
            ]
            rc, signum = _run_agents(argvs, envs, logs)
            if signum is not None:
                stopped_by.append(signum)
            return rc, signum

        if helper is not None:
            helper.start()
        rc = run_attempts(max_restarts, run_once)
        if helper is not None:
            helper.join()
        tx_end = net.tx_bytes()
        if stopped_by:  # the study was asked to stop: go the way the signal says, network removed
            signal.raise_signal(stopped_by[0])
    # A training that failed or was stopped may leave neither file: the caller reads returncode.
    metrics_path, summary_path = out_dir / "metrics.jsonl", out_dir / "train_summary.json"
    return NodesRunResult(
        returncode=rc,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        rate_mbit=rate_mbit,
        node_cores=node_cores,
        cores_per_rank=cores_per_rank,
        threads_per_rank=layout.cpus_per_rank,
        attempts=len(attempts),
        wall_s=time.perf_counter() - started,
        node_tx_bytes=[end - start for start, end in zip(tx_start, tx_end, strict=True)],
        metrics=read_jsonl(metrics_path) if metrics_path.exists() else [],
        summary=read_json(summary_path) if summary_path.exists() else None,
        logs=logs,
    )


def _run_agents(
    argvs: list[list[str]], envs: list[dict[str, str]], logs: list[Path]
) -> tuple[int, int | None]:
    """Start every node's agent, wait for all; when one fails, stop the others. SIGTERM/SIGINT
    go on to every agent. Returns (first failing exit status or 0, the stopping signal)."""
    children = []
    for argv, env, log in zip(argvs, envs, logs, strict=True):
        with log.open("a") as f:
            f.write(f"cosmocub netemu: {format_command(argv)}\n")
            f.flush()
            # Own session: a stop reaches the agent and its ranks, not the study's terminal.
            children.append(
                subprocess.Popen(
                    argv, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True
                )
            )
    stopped: list[int] = []

    def forward(signum: int, frame: object) -> None:
        stopped.append(signum)
        _signal_all(children, signum)

    in_main = threading.current_thread() is threading.main_thread()
    previous = (
        {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} if in_main else {}
    )
    try:
        failed_at = None
        while any(c.poll() is None for c in children):
            if failed_at is None and any(c.poll() not in (None, 0) for c in children):
                failed_at = time.monotonic()
                _signal_all(children, signal.SIGTERM)
            elif failed_at is not None and time.monotonic() - failed_at > STOP_GRACE_S:
                _signal_all(children, signal.SIGKILL)
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if stopped:
        return -stopped[0], stopped[0]
    codes = [c.returncode for c in children]
    return next((rc for rc in codes if rc != 0), 0), None


def _signal_all(children: list[subprocess.Popen], signum: int) -> None:
    for child in children:
        if child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signum)
