"""What the workflow's jobs ask the executor for: job counts, ranks, cores and GPUs per node.

Pure arithmetic on the config's `cluster` and `train` sections, read by the rule files.
"""

from __future__ import annotations

from cosmocub.config import Config


def num_preprocess_groups(cfg: Config, num_universes: int) -> int:
    """Preprocess jobs: the universes in groups of cluster.preprocess.universes_per_job."""
    return -(-num_universes // cfg.cluster.preprocess.universes_per_job)


def train_world_size(cfg: Config) -> int:
    """Training ranks: nodes × ranks per node."""
    return cfg.cluster.train.nodes * cfg.train.nproc_per_node


def train_threads(cfg: Config) -> int:
    """Cores the training job asks for on each node: its ranks there × cores per rank."""
    return cfg.train.nproc_per_node * cfg.cluster.train.cpus_per_rank


def train_gres(cfg: Config) -> str:
    """Slurm generic resources per node ("gpu:4"), or "" on CPU nodes."""
    gpus = cfg.cluster.train.gpus_per_rank * cfg.train.nproc_per_node
    return f"gpu:{gpus}" if gpus else ""
