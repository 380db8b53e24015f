# Config validation (the schema fills defaults), derived paths, and every input function. What
# the rules take from the package comes from one module, cosmocub.workflow_support.
import functools
import os

from cosmocub.workflow_support import (
    STUDY_NAMES,
    calibration_threads,
    checked,
    finish_tracking,
    job_config_path,
    mlflow_runs_link,
    perf_model_bench_threads,
    planned_points,
    preprocess_groups,
    mlperf_group_files,
    public_group_files,
    resolved_config_path,
    simulate_runtime,
    start_tracking,
    study_definition,
    study_point_cores,
    study_point_job,
    study_points_cpus,
    study_shard_point,
    study_universe_groups,
    tracking_env,
    train_job,
    unet_job,
    universe_group_names,
    universe_group_seeds,
    universe_ids,
    workflow_config,
    write_resolved_config,
)

# The package's own validation (the one `cosmocub` runs by hand), the nested --config strings
# typed first: one line naming the file and the key (checked: no frames of this file),
# and the schema read once (Snakemake's validate would read and check it a second time).
CFG = checked(
    workflow_config,
    config,
    source=" + ".join(map(str, workflow.configfiles)) or "config",
)
# Which config is in effect, in every invocation's output (dry runs too): the files given, or the
# embedded default, plus the schema's defaults; the hash names the resolved file jobs read.
logger.info(
    f"cosmocub config {CFG.hash}: "
    f"{' + '.join(map(str, workflow.configfiles)) or 'no config file'} + schema defaults"
)
RESULTS = str(CFG.results)
UNIVERSE_IDS = universe_ids(CFG)
# The groups that make (or link) them, a job each: their manifests' names.
UNIVERSE_GROUPS = universe_group_names(CFG)
# The resolved config, content-addressed (results/config/config-<hash>.yaml), as the
# invocation's record; jobs name their own copy of it (job_config).
RESOLVED_CONFIG = resolved_config_path(CFG)
RUN = CFG.train.run_name


def job_config(*names, named_by_params=()):
    """A job's `params: config`, its command's --config: the sections `names` (or dotted
    sub-sections) it reads, alone, in a file named by their hash, so a change there, and only
    there, reruns it; a stage reading another key fails, naming it; the command `snakemake -p`
    prints runs by hand the same way. (Not an input: a file's new mtime would rerun every job.)
    `named_by_params`: keys read whose effect another param names (workflow_support)."""
    return lambda wildcards: job_config_path(
        CFG, names, named_by_params=named_by_params
    )


# What the training run asks the executor for (nodes, ranks, cores, memory, GPUs per node).
TRAIN_JOB = train_job(CFG)
# The preprocess jobs' groups of universes (cluster.preprocess.universes_per_job a group).
PREPROCESS_GROUPS = preprocess_groups(CFG, UNIVERSE_IDS)


def universe_group_manifests(wildcards=None):
    """The manifests of the config's universe groups (data.smk): what preprocessing reads."""
    return [f"{RESULTS}/universes/groups/{name}.json" for name in UNIVERSE_GROUPS]


@functools.cache
def _study_universe_groups(key):
    return study_universe_groups(CFG, key)


def study_universe_manifests(wildcards):
    """The group manifests of the universes of the study shards under wildcards.key (their
    point's seed's)."""
    return [
        f"{RESULTS}/universes/groups/{name}.json"
        for name in _study_universe_groups(wildcards.key)
    ]


def invocation_targets():
    """What this invocation makes, as Snakemake itself decides it (Workflow.execute): the
    command line's targets (rules or files), else the default target (rule `all`); [] only
    where neither is known (the parent run is then named workflow-<date>)."""
    given = sorted(workflow.dag_settings.targets)
    if given:
        return given
    return [workflow.default_target] if workflow.default_target else []


# The `snakemake unet` run's request, made when a unet rule first asks (a bad `unet` section
# fails the unet targets, not `all`).
@functools.cache
def unet_train_job():
    return checked(unet_job, CFG)  # a mistake: its one line, no traceback


def unet_run_config(wildcards):
    """The U-Net run's config file, for the rule that runs it. The run's request is made here,
    before its threads and resources ask: a bad `unet` section ends in the checker's one line
    (workflow_support.checked), where Snakemake would wrap it in its own block there."""
    unet_train_job()
    return rules.unet_config.output[0]


# Studies (workflow/rules/studies.smk): what each point needs, planned by cosmocub.studies.engine
# when a study's rule first asks (a bad study block fails its own targets, not `all`).
@functools.cache
def study_plan(study):
    return checked(planned_points, CFG, study)


def study_point_plan(wildcards):
    return study_plan(wildcards.study)[wildcards.point]


# The sections a study's points are made of (its block, and what its points' jobs read: their
# shards, training, evaluation, contention limits): a change there makes its points again.
STUDY_POINT_SECTIONS = (
    "universes",
    "preprocess",
    "model",
    "parallel",
    "optimizer",
    "train",
    "evaluate",
    "seed",
    "cluster",
    "studies",
)


def study_settings(wildcards):
    """A point's config: the sections it is made of (job_config)."""
    block = study_definition(wildcards.study).config_key
    return job_config_path(CFG, (*STUDY_POINT_SECTIONS, block))


def study_gather_config(wildcards):
    """The gather plans its study's points again (their names, labels and runners): the same
    sections, in the same order, so the same file."""
    return study_settings(wildcards)


def study_point_manifest(wildcards):
    return f"{study_point_plan(wildcards).shards}/manifest.json"


def study_point_launch(wildcards):
    """The point's launch plan: its nodes, ranks per node and runner."""
    return study_point_plan(wildcards).launch


def study_point_request(wildcards):
    """What the point's job asks a scheduler for (its allocated nodes, ranks, cores, GPUs)."""
    return study_point_job(CFG, study_point_launch(wildcards))


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
    return study_points_cpus(
        CFG, study_plan(wildcards.study), machine_cores=machine_cores()
    )


def study_point_threads(wildcards):
    """Like `train`: the point's ranks on one node × cores per rank; all the workflow's cores for
    an emulated point run here (workflow_support.study_point_cores)."""
    return study_point_cores(
        study_point_launch(wildcards),
        cpus_per_rank=study_cpus(wildcards),
        machine_cores=machine_cores(),
    )


@functools.cache
def _study_shard_point(key):
    return study_shard_point(CFG, key)


def study_shard_config(wildcards):
    """The config of a point whose shards have this key (all such points agree on them)."""
    study, point = _study_shard_point(wildcards.key)
    return f"{RESULTS}/studies/{study}/{point}/config.yaml"


def study_gather_inputs(wildcards):
    """Every point's outputs that its study's rows read."""
    folder = f"{RESULTS}/studies/{wildcards.study}"
    names = study_plan(wildcards.study)
    files = [f"{folder}/{p}/point.json" for p in names]
    if study_definition(wildcards.study).evaluate:
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
    tables = {
        s: f"{RESULTS}/studies/{s}/points.tsv"
        for s in ("step_time", "network", "scaling")
    }
    return [
        t
        for s, t in tables.items()
        if s == "step_time" or os.path.exists(t) or f"{s}_study" in asked or t in asked
    ]


def gathered_study_sections(wildcards):
    # The studies' report sections (summary.md) that exist already: params, never input, so the
    # summary makes no study run; a newly gathered one re-makes the summary (params changed).
    paths = [f"{RESULTS}/studies/{s}/summary.md" for s in STUDY_NAMES]
    return [p for p in paths if os.path.exists(p)]
