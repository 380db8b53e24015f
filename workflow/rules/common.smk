# Config validation (the schema fills defaults), derived paths, and every input function.
import functools
import os

from cosmocub.config import CONFIG_ENV, coerce_cli_strings, from_values, resolve
from cosmocub.data.naming import universe_ids
from cosmocub.data.naming import group_seeds
from cosmocub.emulator.unet_run_config import unet_world_size
from cosmocub.launch.resources import (
    node_cpus,
    node_gres,
    node_mem_mb,
    num_preprocess_groups,
    simulate_runtime,
    study_cpus_per_rank,
    train_gres,
    train_threads,
    train_world_size,
)
from cosmocub.studies import engine as study_engine
from cosmocub.tracking.workflow_run import (
    finish_tracking,
    mlflow_runs_link,
    resolved_config_path,
    start_tracking,
    write_resolved_config,
)

coerce_cli_strings(config)  # nested --config values arrive as strings
# The package's own validation (the one `cosmocub` runs by hand): one line naming the file and the
# key, and the schema read once (Snakemake's validate would read and check it a second time).
config.update(resolve(config, source=" + ".join(map(str, workflow.configfiles)) or "config"))
CFG = from_values(config, source="snakemake config")
# Which config is in effect, in every invocation's output (dry runs too): the files given, or the
# embedded default, plus the schema's defaults; the hash names the resolved file jobs read.
logger.info(
    f"cosmocub config {CFG.hash}: "
    f"{' + '.join(map(str, workflow.configfiles)) or 'no config file'} + schema defaults"
)
RESULTS = str(CFG.results)
UNIVERSE_IDS = universe_ids(CFG)
# The resolved config is content-addressed: jobs read it by path, and a config change that
# does not touch a rule's own sections (its params) does not rerun that rule.
RESOLVED_CONFIG = resolved_config_path(CFG)
# Jobs find it through the environment rather than an input file or param, so that changing one
# section reruns only the rules whose `params: settings=section(...)` hold that section.
os.environ[CONFIG_ENV] = RESOLVED_CONFIG
RUN = CFG.train.run_name


def section(*names):
    """Config sections that a job depends on, for its params (a change there reruns it)."""
    return {name: config[name] for name in names}


# Which simulate group makes each synthetic universe (cluster.simulate.universes_per_job).
SIMULATE_GROUP_OF = (
    {seed: g for g, seeds in enumerate(group_seeds(CFG)) for seed in seeds}
    if CFG.universes.made_here
    else {}
)


def simulate_group_of(seed):
    """The group that makes synth_<seed>; only the config's own universes have one."""
    if int(seed) not in SIMULATE_GROUP_OF:
        raise ValueError(
            f"synth_{seed}.hdf5 is not one of this config's {len(SIMULATE_GROUP_OF)} synthetic "
            f"universes (universes.count, seed)"
        )
    return SIMULATE_GROUP_OF[int(seed)]


def universe_files(wildcards=None):
    return expand(f"{RESULTS}/universes/{{universe}}.hdf5", universe=UNIVERSE_IDS)


def invocation_targets():
    """What this invocation makes, as Snakemake itself decides it (Workflow.execute): the
    command line's targets (rules or files), else the default target (rule `all`); [] only
    where neither is known (the parent run is then named workflow-<date>)."""
    given = sorted(workflow.dag_settings.targets)
    if given:
        return given
    return [workflow.default_target] if workflow.default_target else []


def tracking_env(rule_name):
    """Environment that tags a job's MLflow child run with its rule and wildcards."""

    def env(wildcards):
        pairs = ",".join(f"{k}={v}" for k, v in wildcards.items())
        return f"COSMOCUB_RULE={rule_name} COSMOCUB_WILDCARDS='{pairs}'"

    return env


# Studies (workflow/rules/studies.smk): what each point needs, planned by cosmocub.studies.engine
# when a study's rule first asks (a bad study block fails its own targets, not `all`).
@functools.cache
def study_plan(study):
    return {p.point.name: p for p in study_engine.plan(CFG, study)}


def study_point_plan(wildcards):
    return study_plan(wildcards.study)[wildcards.point]


def study_settings(wildcards):
    """A point's config depends on the sections it may override and its study's block."""
    names = (
        "preprocess",
        "model",
        "parallel",
        "optimizer",
        "train",
        "evaluate",
        "seed",
    )
    return section(*names, study_engine.definition(wildcards.study).config_key)


def study_point_manifest(wildcards):
    return f"{study_point_plan(wildcards).shards}/manifest.json"


def study_point_launch(wildcards):
    """The point's launch plan: its nodes, ranks per node and runner."""
    return study_point_plan(wildcards).launch


def machine_cores():
    """The cores of the one machine a local run has (--cores); None where jobs run on a
    cluster's nodes (in the job there, and where it is submitted). A dry run counts as local
    whatever its profile, so only the rules' resources, never threads or params, may show a
    cluster's request there."""
    return workflow.cores if workflow.local_exec else None


def study_cpus(wildcards):
    """Cores per rank, the same for every point of the study (launch.resources): what the
    point's ranks run with (the request to a scheduler is cluster.train.cpus_per_rank, this
    value on a cluster)."""
    largest = max(p.ranks for p in study_plan(wildcards.study).values())
    cores = machine_cores()
    return study_cpus_per_rank(CFG, largest_ranks=largest, machine_cores=cores)


def study_point_threads(wildcards):
    """Like `train`: the point's ranks on one node × cores per rank. Locally an emulated point
    pins its nodes to this machine's cores from the first, so it claims all the workflow's cores
    and no other job runs beside it (its ranks would slow down and its times lie)."""
    launch = study_point_launch(wildcards)
    if launch.runner == "emulated" and machine_cores() is not None:
        return machine_cores()
    return launch.ranks_per_node * study_cpus(wildcards)


def study_shard_config(wildcards):
    """The config of a point whose shards have this key (all such points agree on them)."""
    sources = study_engine.study_shard_sources(CFG, list(study_engine.STUDY_MODULES))
    study, point = sources[wildcards.key]
    return f"{RESULTS}/studies/{study}/{point}/config.yaml"


def study_gather_inputs(wildcards):
    """Every point's outputs that its study's rows read."""
    folder = f"{RESULTS}/studies/{wildcards.study}"
    names = study_plan(wildcards.study)
    files = [f"{folder}/{p}/point.json" for p in names]
    if study_engine.definition(wildcards.study).evaluate:
        files += [f"{folder}/{p}/eval/predictions.npz" for p in names]
    return files


def perf_model_tables(wildcards):
    """The step-time study's table (it holds the calibration point), and the network and
    scaling studies' where they have been run or are asked for in the same invocation
    (`snakemake network_study perf_model` validates on the table it makes): `snakemake
    perf_model` alone does not run them.
    """
    # The invocation's targets (rule names or files); None in a job that names none.
    asked = {str(t) for t in (workflow.dag_settings.targets or ())}
    tables = {s: f"{RESULTS}/studies/{s}/points.tsv" for s in ("step_time", "network", "scaling")}
    return [
        t
        for s, t in tables.items()
        if s == "step_time" or os.path.exists(t) or f"{s}_study" in asked or t in asked
    ]


def gathered_study_sections(wildcards):
    # The studies' report sections (summary.md) that exist already: params, never input, so the
    # summary makes no study run; a newly gathered one re-makes the summary (params changed).
    paths = [f"{RESULTS}/studies/{s}/summary.md" for s in study_engine.STUDY_MODULES]
    return [p for p in paths if os.path.exists(p)]
