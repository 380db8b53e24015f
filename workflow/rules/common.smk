# Config validation (the schema fills defaults), derived paths, and every input function.
import functools
import os

from snakemake.utils import validate

from cosmocub.config import coerce_cli_strings, from_values
from cosmocub.data.naming import universe_ids
from cosmocub.fields.run_config import unet_world_size
from cosmocub.launch.resources import (
    num_preprocess_groups,
    train_gres,
    train_threads,
    train_world_size,
)
from cosmocub.studies import engine as study_engine
from cosmocub.tracking.workflow import (
    CONFIG_ENV,
    finish_tracking,
    mlflow_runs_link,
    resolved_config_path,
    start_tracking,
    write_resolved_config,
)

coerce_cli_strings(config)  # nested --config values arrive as strings
validate(config, "../schemas/config.schema.yaml")
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


def universe_files(wildcards=None):
    return expand(f"{RESULTS}/universes/{{universe}}.hdf5", universe=UNIVERSE_IDS)


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


def study_point_ranks(wildcards):
    """Ranks one point starts on this node (emulated nodes share it)."""
    return study_point_plan(wildcards).ranks


def study_point_threads(wildcards):
    """Like `train`, every rank asks for cluster.train.cpus_per_rank; an emulated point's nodes
    are pinned over all the cores this machine gives the workflow, so it claims them all and no
    other job runs beside it (that would slow its ranks and falsify its times)."""
    planned = study_point_plan(wildcards)
    threads = planned.ranks * CFG.cluster.train.cpus_per_rank
    cores = workflow.cores if isinstance(workflow.cores, int) else 0
    return max(threads, cores) if planned.point.runner == "emulated" else threads


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
    scaling studies' where they have been run: `snakemake perf_model` does not run them.
    """
    tables = [
        f"{RESULTS}/studies/{s}/points.tsv" for s in ("step_time", "network", "scaling")
    ]
    return tables[:1] + [t for t in tables[1:] if os.path.exists(t)]


def gathered_study_sections(wildcards):
    # The studies' report sections (summary.md) that exist already: params, never input, so the
    # summary makes no study run; a newly gathered one re-makes the summary (params changed).
    paths = [f"{RESULTS}/studies/{s}/summary.md" for s in study_engine.STUDY_MODULES]
    return [p for p in paths if os.path.exists(p)]
