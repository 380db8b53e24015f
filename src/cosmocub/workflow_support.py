"""What the Snakefile asks of the package: universe names, the resolved config file, the parent run.

Kept here so the rule files stay declarative; nothing in this module does science.
"""

from __future__ import annotations

import os
from pathlib import Path

from cosmocub.config import Config, ConfigError, write_config
from cosmocub.io import atomic_path
from cosmocub.tracking.tracker import PARENT_RUN_ENV  # imports no MLflow at module level

# The resolved config file a workflow job reads when no --config is given.
CONFIG_ENV = "COSMOCUB_CONFIG"


def universe_seed(index: int, *, master_seed: int) -> int:
    """Seed of the index-th synthetic universe: disjoint ranges per master seed."""
    return master_seed * 1_000_000 + index


def universe_ids(cfg: Config) -> list[str]:
    """File stems (without .hdf5) of every universe the workflow uses, in a stable order."""
    if cfg.universes.source == "synthetic":
        return [
            f"synth_{universe_seed(i, master_seed=cfg.seed)}" for i in range(cfg.universes.count)
        ]
    folder = Path(cfg.universes.cosmoflow_dir or "")
    if not folder.is_dir():
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} is not a folder")
    stems = sorted(p.stem for p in folder.glob("univ_*.hdf5"))
    if not stems:
        raise ConfigError(f"key 'universes.cosmoflow_dir': {folder} holds no univ_*.hdf5 files")
    return stems[: cfg.universes.max_files] if cfg.universes.max_files else stems


def resolved_config_path(cfg: Config) -> str:
    """Content-addressed: the same config always maps to the same file, a new one to a new file."""
    return str(cfg.results / "config" / f"config-{cfg.hash}.yaml")


def write_resolved_config(cfg: Config, path: str) -> None:
    if not Path(path).exists():
        write_config(cfg.values, path)


def start_tracking(cfg: Config) -> None:
    """Create the store once, before jobs fan out, and open this invocation's parent run."""
    if not cfg.tracking.enabled:
        return
    from cosmocub.tracking.tracker import start_workflow_run

    if cfg.tracking.server.start:
        from cosmocub.tracking.server import SERVER_PID_ENV, start_server

        os.environ[SERVER_PID_ENV] = str(start_server(cfg).pid)
    # start_workflow_run creates the store and experiment first. Jobs are child processes of
    # this one (locally) or inherit its environment (srun/sbatch).
    os.environ[PARENT_RUN_ENV] = start_workflow_run(cfg)


def finish_tracking(cfg: Config, status: str) -> None:
    """Close the parent run; stop the tracking server this invocation started, if any."""
    run_id = os.environ.get(PARENT_RUN_ENV)
    try:
        if cfg.tracking.enabled and run_id:
            from cosmocub.tracking.tracker import end_workflow_run

            end_workflow_run(cfg, run_id, status)
    finally:
        from cosmocub.tracking.server import SERVER_PID_ENV, stop_server

        if pid := os.environ.pop(SERVER_PID_ENV, None):
            stop_server(int(pid))


# MLflow 3 opens an experiment in its GenAI view in a fresh browser, whatever the experiment's
# tags (the UI keeps the mode per browser); this query after the hash route opens the runs view.
RUNS_VIEW_QUERY = "workflowType=machine_learning"


def runs_view_url(base_url: str, experiment_id: str) -> str:
    """The MLflow UI's runs table (not its GenAI view) of one experiment."""
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{RUNS_VIEW_QUERY}"


def mlflow_runs_link(cfg: Config) -> str:
    """One line for the end of a workflow: where to see its runs in the MLflow UI ("" when
    tracking is off or the store cannot be read)."""
    if not cfg.tracking.enabled:
        return ""
    from cosmocub.tracking.tracker import init_store, tracking_uri

    try:
        experiment_id = init_store(cfg)
    except ValueError:
        return ""
    uri = tracking_uri(cfg)
    if uri.startswith(("http://", "https://")):
        return f"MLflow runs: {runs_view_url(uri, experiment_id)}"
    # A file store: the UI is the user's `mlflow ui` (port 5000 by default).
    return (
        f"MLflow runs: {runs_view_url('http://127.0.0.1:5000', experiment_id)} "
        f"(start the UI with: mlflow ui --backend-store-uri {uri})"
    )


def num_preprocess_groups(cfg: Config, num_universes: int) -> int:
    """Preprocess jobs: the universes in groups of cluster.preprocess.universes_per_job."""
    return -(-num_universes // cfg.cluster.preprocess.universes_per_job)


def train_world_size(cfg: Config) -> int:
    """Training ranks: nodes × ranks per node."""
    return cfg.cluster.train.nodes * cfg.train.nproc_per_node


def unet_ranks(cfg: Config) -> int:
    """Ranks of the `snakemake unet` run, all on one node: its spatial ranks × nproc_per_node."""
    from cosmocub.config import ConfigError
    from cosmocub.fields.run_config import unet_config_values

    try:
        return unet_config_values(cfg)["train"]["nproc_per_node"]
    except ConfigError:
        return 1  # the unet_config job reports it, if the U-Net is asked for at all


def train_threads(cfg: Config) -> int:
    """Cores the training job asks for on each node: its ranks there × cores per rank."""
    return cfg.train.nproc_per_node * cfg.cluster.train.cpus_per_rank


def train_gres(cfg: Config) -> str:
    """Slurm generic resources per node ("gpu:4"), or "" on CPU nodes."""
    gpus = cfg.cluster.train.gpus_per_rank * cfg.train.nproc_per_node
    return f"gpu:{gpus}" if gpus else ""


def link_universe(source: Path, dest: Path) -> None:
    """Validate a public universe file and symlink it into the results folder (atomically)."""
    from cosmocub.data.universe import read_universe_meta

    read_universe_meta(source)  # raises with the file and the problem
    with atomic_path(dest) as tmp:
        tmp.symlink_to(source.resolve())
