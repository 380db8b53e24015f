"""What the workflow's rules (workflow/rules/*.smk) take from the package, in one import: the
config as Snakemake hands it over, the universes' jobs, every ranked job's request to the
executor, the studies' plans and the tracking hooks. The rules hold no arithmetic of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import yaml

from cosmocub.config import (
    Config,
    ConfigError,
    coerce_cli_strings,
    config_hash,
    from_values,
    resolve,
    write_config,
)
from cosmocub.config.held import held_values
from cosmocub.data.mlperf import file_groups
from cosmocub.data.naming import (
    public_groups,
    seeds_of_group,
    universe_group_names,
    universe_ids,
)
from cosmocub.emulator.unet_run_config import unet_world_size
from cosmocub.launch.resources import (
    RankedJob,
    num_preprocess_groups,
    ranked_job,
    simulate_runtime,
    study_cpus_per_rank,
    train_job,
)
from cosmocub.studies.engine import (
    STUDY_MODULES,
    PlannedPoint,
    find_point,
    plan,
    point_config,
    study_shard_sources,
)
from cosmocub.studies.engine import definition as study_definition
from cosmocub.studies.launch_plan import LaunchPlan
from cosmocub.tracking.runs import RULE_ENV, WILDCARDS_ENV
from cosmocub.tracking.workflow_run import (
    finish_tracking,
    mlflow_runs_link,
    resolved_config_path,
    start_tracking,
    write_resolved_config,
)

__all__ = [
    "STUDY_NAMES",
    "RankedJob",
    "calibration_threads",
    "checked",
    "finish_tracking",
    "job_config_path",
    "mlflow_runs_link",
    "mlperf_group_files",
    "perf_model_bench_threads",
    "planned_points",
    "preprocess_groups",
    "public_group_files",
    "resolved_config_path",
    "simulate_runtime",
    "start_tracking",
    "study_definition",
    "study_point_cores",
    "study_point_job",
    "study_points_cpus",
    "study_shard_point",
    "study_universe_groups",
    "tracking_env",
    "train_job",
    "unet_job",
    "universe_group_names",
    "universe_group_seeds",
    "universe_ids",
    "workflow_config",
    "write_resolved_config",
]

T = TypeVar("T")


def checked(make: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`make(*args, **kwargs)`, a config check made while Snakemake reads the workflow or builds
    its DAG (an input function's: the `unet` section, a study's block). A mistake ends Snakemake
    with the checker's one line on stderr and exit 1. SystemExit, not an Exception: Snakemake lets
    it through an input function, where it would wrap an Exception in its own block, and Python
    exits without a traceback. Threads and resources functions wrap even that, so a rule makes
    such a check in an input function first."""
    try:
        return make(*args, **kwargs)
    except ValueError as err:
        print(f"cosmocub: error: {' '.join(str(err).split())}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


# The studies a workflow has a target for (`snakemake <name>_study`).
STUDY_NAMES = tuple(STUDY_MODULES)


def workflow_config(config: dict[str, Any], *, source: str) -> Config:
    """Snakemake's `config`, made what a job reads, in place: nested --config strings typed by the
    schema, validated (one line naming `source` and the key), every default filled; then typed.
    The package's own validation, which `cosmocub` runs by hand too."""
    coerce_cli_strings(config)
    config.update(resolve(config, source=source))
    return from_values(config, source=source)


def job_config_path(
    cfg: Config, sections: Sequence[str], *, named_by_params: Sequence[str] = ()
) -> str:
    """The --config of a job that reads `sections` (top-level keys, or dotted ones such as
    "perf_model.bench"): a file named by the hash of those sections that holds them alone (and
    where the job records: config.held), written here where missing or different. As a rule's
    param it reruns the job when one of its sections changes and only then; a stage reading
    any other key fails, naming it; its command names the file, so it runs by hand as the
    workflow ran it. `named_by_params`: keys the job reads whose effect on it another param
    names already (a universe group's seeds): held, not hashed, so that raising
    universes.count makes only the new groups."""
    read = {name: _section(cfg.values, name) for name in sections}
    path = cfg.results / "config" / f"sections-{config_hash(read)}.yaml"
    # The name is the sections' alone (a universe group's file kept its name, so no group is
    # made again); two rules that list the same sections must then hold the same keys.
    if _named_by_params.setdefault(str(path), tuple(named_by_params)) != tuple(named_by_params):
        raise ValueError(
            f"job_config{tuple(sections)}: asked with named_by_params {tuple(named_by_params)} "
            f"and {_named_by_params[str(path)]}: one file cannot hold both"
        )
    # Checked once a process: every job of a rule asks (200 jobs parsed the same YAML 200
    # times, 6 s of a 13 s dry run), and within one Snakemake the config does not change.
    if _checked.get(str(path)) != cfg.hash:
        values = held_values(cfg.values, [*sections, *named_by_params])
        if not path.exists() or yaml.safe_load(path.read_text()) != values:
            write_config(values, path)
        _checked[str(path)] = cfg.hash
    return str(path)


# The job config files this process has checked or written, with the config's hash then, and
# the keys each holds beside its sections.
_checked: dict[str, str] = {}
_named_by_params: dict[str, tuple[str, ...]] = {}


def _section(values: Mapping[str, Any], dotted: str) -> Any:
    for key in dotted.split("."):
        values = values[key]
    return values


def universe_group_seeds(cfg: Config, master_seed: int | str, group: int | str) -> list[int]:
    """The seeds universe group `group` makes at top-level seed `master_seed` (a rule's
    wildcards): a param of its job, so that a group whose seeds change runs again and the others
    stay as they are."""
    return seeds_of_group(cfg, int(group), master_seed=int(master_seed))


def public_group_files(cfg: Config, group: int | str) -> list[str]:
    """The public universe files that link group `group` validates (its job's inputs)."""
    folder = cfg.universes.cosmoflow_dir or ""
    return [f"{folder}/{stem}.hdf5" for stem in public_groups(cfg)[int(group)]]


def preprocess_groups(cfg: Config, universes: Sequence[str]) -> range:
    """The preprocess groups' indices: `universes` cluster.preprocess.universes_per_job a group
    (the MLPerf folders: the groups of files their jobs validate)."""
    if cfg.universes.source == "mlperf":
        return range(len(file_groups(cfg)))
    return range(num_preprocess_groups(cfg, len(universes)))


def mlperf_group_files(cfg: Config, group: int | str) -> list[str]:
    """The files (paths under universes.mlperf_dir) an mlperf_group job validates: a param,
    not inputs (6,400 files a job), so that another set of files makes the group again."""
    return file_groups(cfg)[int(group)]


def tracking_env(rule_name: str) -> Callable[[Mapping[str, str]], str]:
    """A rule's params function: the environment that tags a job's MLflow child run with its
    rule and wildcards (cosmocub.tracking.runs reads it)."""

    def env(wildcards: Mapping[str, str]) -> str:
        pairs = ",".join(f"{k}={v}" for k, v in wildcards.items())
        return f"{RULE_ENV}={rule_name} {WILDCARDS_ENV}='{pairs}'"

    return env


def unet_job(cfg: Config) -> RankedJob:
    """The `snakemake unet` run's request: its ranks on one node (a bad `unet` section is a
    ConfigError, so the unet rules ask for it in functions and fail only the unet targets)."""
    return ranked_job(cfg, nodes=1, ranks_per_node=unet_world_size(cfg))


def planned_points(cfg: Config, study: str) -> dict[str, PlannedPoint]:
    """A study's points by name, as cosmocub.studies.engine plans them at parse time."""
    return {p.point.name: p for p in plan(cfg, study)}


def study_point_job(cfg: Config, launch: LaunchPlan) -> RankedJob:
    """A study point's request, as `train` asks for training's: its ranks with cluster.train's
    cores and GPUs per rank, on its nodes (one for emulated nodes, which share one machine)."""
    return ranked_job(
        cfg, nodes=launch.allocated_nodes, ranks_per_node=launch.ranks_per_allocated_node
    )


def study_points_cpus(
    cfg: Config, points: Mapping[str, PlannedPoint], *, machine_cores: int | None
) -> int:
    """Cores per rank, the same for every point of a study so that they compare like with like
    (launch.resources.study_cpus_per_rank, shared among its largest point's ranks locally)."""
    largest = max(p.ranks for p in points.values())
    return study_cpus_per_rank(cfg, largest_ranks=largest, machine_cores=machine_cores)


def study_point_cores(launch: LaunchPlan, *, cpus_per_rank: int, machine_cores: int | None) -> int:
    """Like `train`: the point's ranks on one node × cores per rank. Locally (`machine_cores`
    given) an emulated point pins its nodes to the machine's cores from the first, so it claims
    them all and no other job runs beside it (its ranks would slow down and its times lie)."""
    if launch.runner == "emulated" and machine_cores is not None:
        return machine_cores
    return launch.ranks_per_node * cpus_per_rank


def study_shard_point(cfg: Config, key: str) -> tuple[str, str]:
    """(study, point) whose config makes the study shards under `key` (all such points agree).
    A study whose block does not fit the config (the sample-size study's crops on 32³
    known-answer universes, say) holds none: it fails its own targets, not another study's."""
    for study in STUDY_NAMES:
        try:
            sources = study_shard_sources(cfg, [study])
        except ConfigError:
            continue
        if key in sources:
            return sources[key]
    raise KeyError(f"study shards {key}: no study point of this config makes them")


def study_universe_groups(cfg: Config, key: str) -> list[str]:
    """The universe groups' manifest names (naming.universe_group_names) of the study shards
    under `key`: those of the point's config, whose top-level seed may be its own
    (known_answer_study.seeds)."""
    study, name = study_shard_point(cfg, key)
    return universe_group_names(point_config(cfg, study, find_point(cfg, study, name)))


def calibration_threads(cfg: Config, *, machine_cores: int | None) -> int:
    """Cores the compute calibration holds, every one of its machine so that nothing runs
    beside its timings: cluster.calibrate.threads, else a local run's cores (`machine_cores`,
    Snakemake's --cores; never the submit host's, which may not be the node it runs on); a
    ValueError on a cluster without the key."""
    threads = cfg.cluster.calibrate.threads
    if threads is not None:
        return threads
    if machine_cores is None:
        raise ValueError(
            "key 'cluster.calibrate.threads': required on a cluster (the cores of the node the "
            "calibration runs on, all of which it holds); null takes a local run's --cores"
        )
    return machine_cores


def perf_model_bench_threads(cfg: Config) -> int:
    """Cores the links' benchmark holds: one per rank of its largest run (ranks on loopback,
    or one per emulated node)."""
    return max(cfg.perf_model.bench.ranks, cfg.perf_model.bench.nodes)
