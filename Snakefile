# cosmocub: universes → shards → trained CosmoFlow → evaluation → report.
# Rules are thin: each calls the `cosmocub` CLI; the science lives in the package.


# The embedded default, only when no --configfile is given: Snakemake would otherwise deep-merge
# the given file over it, and config/test.yaml would run with this file's batch norm and
# augmentation. A given config is that file plus the schema's defaults, nothing else.
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/studies.smk"
include: "workflow/rules/unet.smk"
include: "workflow/rules/perf_model.smk"


# Rules that only write a small file (a plan, a group's links and manifest, a resolved config,
# the report) run where Snakemake runs: under a cluster profile each would otherwise wait in the
# queue, and start a Snakemake of its own inside its job, for a second of work.
localrules:
    link_group,
    preprocess_plan,
    study_point_config,
    study_preprocess_plan,
    unet_config,
    summary_report,


# The resolved config and the MLflow parent run, named after the targets, exist before any
# job starts.
onstart:
    write_resolved_config(CFG, RESOLVED_CONFIG)
    start_tracking(CFG, invocation_targets())


# The last line of the log: where the runs are in the MLflow UI (its runs view: docs/getting-started/mlflow.md).
onsuccess:
    link = mlflow_runs_link(CFG)  # before a server the workflow started stops
    finish_tracking(CFG, "FINISHED")
    if link:
        logger.info(link)


onerror:
    link = mlflow_runs_link(CFG)
    finish_tracking(CFG, "FAILED")
    if link:
        logger.info(link)


rule all:
    """The default target: universes, shards, the trained CosmoFlow, its evaluation and the summary report."""
    default_target: True
    input:
        rules.summary_report.output,
