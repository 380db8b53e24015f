"""What the workflow's jobs ask the executor for: job counts, ranks, cores and GPUs per node.

Pure arithmetic on the config's `cluster` and `train` sections, read by the rule files.
"""

from __future__ import annotations

import math

from cosmocub.config import Config


def num_preprocess_groups(cfg: Config, num_universes: int) -> int:
    """Preprocess jobs: the universes in groups of cluster.preprocess.universes_per_job."""
    return -(-num_universes // cfg.cluster.preprocess.universes_per_job)


def simulate_runtime(cfg: Config) -> int:
    """Minutes a simulate job asks for: its universes × cluster.simulate.minutes_per_universe."""
    per_job = cfg.cluster.simulate
    return max(1, math.ceil(per_job.universes_per_job * per_job.minutes_per_universe))


def train_world_size(cfg: Config) -> int:
    """Training ranks: nodes × ranks per node."""
    return cfg.world_size


def train_threads(cfg: Config) -> int:
    """Cores the training job asks for on each node: its ranks there × cores per rank."""
    return cfg.train.ranks_per_node * cfg.cluster.train.cpus_per_rank


def train_gres(cfg: Config) -> str:
    """Slurm generic resources per node ("gpu:4"), or "" on CPU nodes."""
    return node_gres(cfg, cfg.train.ranks_per_node)


def node_cpus(cfg: Config, ranks_per_node: int) -> int:
    """Cores a node of `ranks_per_node` ranks asks for: cluster.train.cpus_per_rank each."""
    return ranks_per_node * cfg.cluster.train.cpus_per_rank


def node_mem_mb(cfg: Config, ranks_per_node: int) -> int:
    """Memory a node of `ranks_per_node` ranks asks for (Slurm's --mem is per node)."""
    return ranks_per_node * cfg.cluster.train.mem_mb_per_rank


def node_gres(cfg: Config, ranks_per_node: int) -> str:
    """Slurm generic resources of a node of `ranks_per_node` ranks ("gpu:4"), or "" on CPUs."""
    gpus = cfg.cluster.train.gpus_per_rank * ranks_per_node
    return f"gpu:{gpus}" if gpus else ""


def study_cpus_per_rank(cfg: Config, *, largest_ranks: int, machine_cores: int | None) -> int:
    """Cores every rank of every point of one study gets, so that its points compare like with
    like: cluster.train.cpus_per_rank, and on one machine of `machine_cores` cores (a local run;
    None on a cluster, where each point has its own allocation) at most their share among the
    study's largest point's ranks, at least 1 (a point whose ranks then need more cores than the
    machine has shares them: oversubscribed)."""
    per_rank = cfg.cluster.train.cpus_per_rank
    if machine_cores is None:
        return per_rank
    if largest_ranks < 1 or machine_cores < 1:
        raise ValueError(
            f"study cores per rank: largest_ranks {largest_ranks} and machine_cores "
            f"{machine_cores} must be >= 1"
        )
    return min(per_rank, max(1, machine_cores // largest_ranks))
