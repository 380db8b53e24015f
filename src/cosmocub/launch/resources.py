"""What the workflow's jobs ask the executor for: job counts, ranks, cores and GPUs per node.

Pure arithmetic on the config's `cluster` and `train` sections, read by the rule files through
cosmocub.workflow_support.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cosmocub.config import Config
from cosmocub.launch.launcher import RankLayout


def num_preprocess_groups(cfg: Config, num_universes: int) -> int:
    """Preprocess jobs: the universes in groups of cluster.preprocess.universes_per_job."""
    return -(-num_universes // cfg.cluster.preprocess.universes_per_job)


def simulate_runtime(cfg: Config) -> int:
    """Minutes a universe_group job asks for: its universes × cluster.simulate.minutes_per_universe,
    made cluster.simulate.threads at a time."""
    per_job = cfg.cluster.simulate
    rounds = math.ceil(per_job.universes_per_job / per_job.threads)
    return max(1, math.ceil(rounds * per_job.minutes_per_universe))


@dataclass(frozen=True, kw_only=True)
class RankedJob(RankLayout):
    """A job that starts ranks, as it asks the executor: its rank layout (`nodes` nodes of
    `ranks_per_node` ranks, world_size in all, `cpus_per_rank` cores each) and each rank's
    memory and GPUs from cluster.train (Slurm's --mem and gres are per node)."""

    mem_mb: int  # per node
    gpus_per_rank: int

    @property
    def threads(self) -> int:
        """Cores on each node: its ranks × cores per rank (Snakemake's threads)."""
        return self.ranks_per_node * self.cpus_per_rank

    @property
    def cpus_total(self) -> int:
        return self.threads * self.nodes

    @property
    def gres(self) -> str:
        """Slurm generic resources per node ("gpu:4"), or "" on CPU nodes."""
        gpus = self.gpus_per_rank * self.ranks_per_node
        return f"gpu:{gpus}" if gpus else ""

    def cpus_per_rank_within(self, threads: int) -> int:
        """Cores each rank runs with when the job got `threads` cores on its node (Snakemake
        caps threads at --cores locally): their share, at least 1."""
        return max(1, threads // self.ranks_per_node)


def ranked_job(cfg: Config, *, nodes: int, ranks_per_node: int) -> RankedJob:
    """The request of `nodes` nodes of `ranks_per_node` ranks with cluster.train's resources."""
    per_rank = cfg.cluster.train
    return RankedJob(
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        cpus_per_rank=per_rank.cpus_per_rank,
        mem_mb=ranks_per_node * per_rank.mem_mb_per_rank,
        gpus_per_rank=per_rank.gpus_per_rank,
    )


def train_job(cfg: Config) -> RankedJob:
    """The training run's request: cluster.train.nodes × train.ranks_per_node ranks."""
    return ranked_job(cfg, nodes=cfg.cluster.train.nodes, ranks_per_node=cfg.train.ranks_per_node)


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
