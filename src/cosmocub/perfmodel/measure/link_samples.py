"""`cosmocub perf-model bench`: the micro-benchmark on every link the studies' collectives cross,
loopback and the emulated network at each study rate, in one samples table.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config
from cosmocub.launch.env import CPUS_PER_RANK_ENV
from cosmocub.launch.launcher import RENDEZVOUS_PORT, RankLayout, run_launch, torchrun_agent
from cosmocub.perfmodel.measure.link_fits import LOOPBACK, emulated_link
from cosmocub.perfmodel.measure.microbench import read_samples, write_samples

log = logging.getLogger(__name__)
AGENT_GRACE_S = 10.0  # an agent still running this long after its peer failed is killed


def study_rates(cfg: Config) -> tuple[float, ...]:
    """The emulated link rates the studies run at: network_study's, then scaling_study's."""
    return tuple(dict.fromkeys([*cfg.network_study.rates_mbit, cfg.scaling_study.rate_mbit]))


def sizes_for_rate(sizes_bytes: Sequence[int], rate_mbit: float, max_call_s: float) -> list[int]:
    """The sizes whose halo swap (2 × size bytes from each rank) fits in max_call_s at the rate
    (0: unshaped, every size); raises ValueError when fewer than two are left to fit α and β."""
    if rate_mbit == 0:
        return list(sizes_bytes)
    kept = [n for n in sizes_bytes if 2 * n * 8 / (rate_mbit * 1e6) <= max_call_s]
    if len(kept) < 2:
        raise ValueError(
            f"key 'perf_model.bench.max_call_s': {max_call_s} s leaves {len(kept)} of the sizes "
            f"{list(sizes_bytes)} at {rate_mbit:g} Mbit/s; need 2 to fit alpha and beta"
        )
    return kept


def bench_links(cfg: Config, *, config_path: str | None, out: Path) -> None:
    """Loopback and every study rate's emulated link, one samples table (with `link`) at `out`.

    Loopback: perf_model.bench.ranks ranks on this node, started as `cosmocub launch` starts them.
    Emulated: perf_model.bench.nodes emulated nodes of one rank each (cosmocub.netemu), one
    torchrun agent per node inside its namespace with gloo on the node's veth, as the studies'
    points run, at every rate of network_study and scaling_study. Without CAP_NET_ADMIN the
    emulated links are skipped with one line saying why (as the studies skip their emulated
    points) and the table holds loopback alone. Each rank runs `perf-model bench-ranks`.
    """
    from cosmocub.netemu import EmulationUnavailableError
    from cosmocub.netemu.namespaces import check_privileges

    settings = cfg.perf_model.bench
    try:
        check_privileges()
        sizes = {
            emulated_link(r): (r, sizes_for_rate(settings.sizes_bytes, r, settings.max_call_s))
            for r in study_rates(cfg)
        }
    except EmulationUnavailableError as err:
        links = ", ".join(emulated_link(r) for r in study_rates(cfg))
        print(f"emulated points skipped: perf-model bench {links}: {err}", file=sys.stderr)
        sizes = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out.parent) as tmp:
        part = Path(tmp) / f"{LOOPBACK}.tsv"
        layout = RankLayout(nodes=1, ranks_per_node=settings.ranks, cpus_per_rank=1)
        args = _bench_args(LOOPBACK, settings.sizes_bytes, settings.repeats, config_path, part)
        if (rc := run_launch(layout, args)) != 0:
            raise RuntimeError(f"perf-model bench: the {LOOPBACK} ranks failed (exit {rc})")
        merged = read_samples(part)
        for link, (rate, link_sizes) in sizes.items():
            if left_out := [n for n in settings.sizes_bytes if n not in link_sizes]:
                log.info("%s: sizes %s left out (over max_call_s)", link, left_out)
            part = Path(tmp) / f"{link}.tsv"
            args = _bench_args(link, link_sizes, settings.repeats, config_path, part)
            log_path = Path(tmp) / f"{link}.log"
            run_on_emulated_nodes(args, nodes=settings.nodes, rate_mbit=rate, log_path=log_path)
            merged |= read_samples(part)
        write_samples(merged, out)


def _bench_args(
    link: str, sizes: Sequence[int], repeats: int, config_path: str | None, out: Path
) -> list[str]:
    args = ["perf-model", "bench-ranks", "--link", link, "--out", str(out)]
    args += ["--sizes", *map(str, sizes), "--repeats", str(repeats)]
    return args + (["--config", str(config_path)] if config_path else [])


def run_on_emulated_nodes(
    module_args: Sequence[str],
    *,
    nodes: int,
    rate_mbit: float,
    log_path: Path,
    timeout_s: float = 1800.0,
) -> None:
    """`cosmocub <module_args>` on `nodes` emulated nodes of one rank each, links at
    rate_mbit, each node's agent pinned to its block of this process's cores; raises
    RuntimeError with the agents' log when one fails or they outlast timeout_s."""
    from cosmocub.netemu import emulated_nodes
    from cosmocub.netemu.runner import split_cores

    node_cores, _ = split_cores(os.sched_getaffinity(0), nodes, 1)
    layout = RankLayout(nodes=nodes, ranks_per_node=1, cpus_per_rank=1)
    with emulated_nodes(nodes=nodes, rate_mbit=rate_mbit) as net, log_path.open("w") as f:
        endpoint = f"{net.nodes[0].address}:{RENDEZVOUS_PORT}"
        agents = []
        for node in net.nodes:
            agent = torchrun_agent(
                layout,
                module_args,
                endpoint=endpoint,
                rdzv_id=net.switch_netns,
                python=sys.executable,
                local_addr=node.address,
                is_host=node.index == 0,
            )
            cores = ",".join(map(str, node_cores[node.index]))
            env = {**os.environ, "GLOO_SOCKET_IFNAME": node.interface, CPUS_PER_RANK_ENV: "1"}
            agents.append(
                subprocess.Popen(
                    [*node.exec_prefix(), "taskset", "-c", cores, *agent],
                    env=env,
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        # Leaving the block deletes the namespaces, which kills whatever still runs in them.
        failure = _wait(agents, timeout_s)
    if failure:
        tail = "\n".join(log_path.read_text().splitlines()[-30:])
        raise RuntimeError(
            f"perf-model bench on {nodes} emulated nodes at {rate_mbit:g} Mbit/s: "
            f"{failure}; the agents' log ends:\n{tail}"
        )


def _wait(agents: Sequence[subprocess.Popen], timeout_s: float) -> str | None:
    """Wait for every agent: None when all exited 0, else why not. Once one has failed, the
    others get AGENT_GRACE_S to end on their own (their peer's loss ends their collectives)."""
    deadline = time.monotonic() + timeout_s
    while any(a.poll() is None for a in agents):
        if any(a.returncode not in (None, 0) for a in agents):
            deadline = min(deadline, time.monotonic() + AGENT_GRACE_S)
        if time.monotonic() > deadline:
            codes = [a.returncode for a in agents]
            return f"agents' exit codes {codes} after {timeout_s:g} s or a failure (None: killed)"
        time.sleep(0.1)
    codes = [a.returncode for a in agents]
    return None if not any(codes) else f"agents' exit codes {codes}"
