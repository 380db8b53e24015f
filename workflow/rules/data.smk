# Universes (simulated here, or linked from the public CosmoFlow set) and their shards.


# Universes are made (or, public ones, validated and linked) a group to a job: the
# cluster.simulate.universes_per_job seeds of a group, or cluster.preprocess.universes_per_job
# public files. Each job writes its universes under results/universes/ and, last, the group's
# manifest (paths, seeds, headers, checksums) under universes/groups/: the one output Snakemake
# tracks, and what preprocessing reads. So the DAG holds a job per group, never one per
# universe, and raising universes.count makes only the new groups (a group reruns only when its
# own seeds or the settings that make it change). No command line lists the seeds: the CLI
# reads the group's from the config, as universe_group_seeds does here.
UNIVERSES = f"{RESULTS}/universes"


rule universe_group:
    output:
        f"{UNIVERSES}/groups/seed{{master}}-{{group}}.json",
    log:
        f"{RESULTS}/logs/universes/seed{{master}}-{{group}}.log",
    wildcard_constraints:
        master=r"\d+",
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.simulate.threads
    resources:
        mem_mb=CFG.cluster.simulate.mem_mb,
        runtime=simulate_runtime(CFG),
    params:
        # The group's seeds (from universes.count and the group size) are a param: a group
        # whose seeds are the same is not made again when universes.count grows.
        config=job_config(
            "simulate",
            "universes.size",
            "universes.source",
            named_by_params=(
                "universes.count",
                "cluster.simulate.universes_per_job",
            ),
        ),
        seeds=lambda w: universe_group_seeds(CFG, w.master, w.group),
        # The universes' folder: the manifest's groups/ folder's parent.
        universes=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
        env=tracking_env("universe_group"),
    shell:
        "{params.env} cosmocub simulate-group --config {params.config} --seed {wildcards.master}"
        " --group {wildcards.group} --out {params.universes} --threads {threads} > {log} 2>&1"


rule link_group:
    input:
        lambda w: public_group_files(CFG, w.group),
    output:
        f"{UNIVERSES}/groups/public-{{group}}.json",
    log:
        f"{RESULTS}/logs/universes/public-{{group}}.log",
    wildcard_constraints:
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config(
            "universes.source",
            "universes.cosmoflow_dir",
            "universes.max_files",
            "cluster.preprocess.universes_per_job",
        ),
        universes=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    shell:
        "cosmocub link-group --config {params.config} --group {wildcards.group}"
        " --out {params.universes} > {log} 2>&1"


# The MLPerf HPC TFRecord folders (universes.source mlperf): each job reads and checks a group of
# cluster.preprocess.files_per_job files (CRCs, shapes, labels) and writes the group's manifest;
# the files stay where they are. No job per file: 589,824 files are ~93 groups.
rule mlperf_group:
    output:
        f"{UNIVERSES}/groups/mlperf-{{group}}.json",
    log:
        f"{RESULTS}/logs/universes/mlperf-{{group}}.log",
    wildcard_constraints:
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.preprocess.mem_mb,
        runtime=CFG.cluster.preprocess.runtime,
    params:
        config=job_config(
            "universes.mlperf_dir", "seed", "cluster.preprocess.files_per_job"
        ),
        files=lambda w: mlperf_group_files(CFG, w.group),
        universes=lambda w, output: os.path.dirname(os.path.dirname(output[0])),
    shell:
        "cosmocub mlperf-group --config {params.config} --group {wildcards.group}"
        " --out {params.universes} > {log} 2>&1"


# Preprocessing as many jobs: plan (allocate the shards from the universe groups' manifests), one
# job per group of universes (each writes its samples in place, reads them back and computes
# their features), gather (statistics, manifest, features and shards into place, from what the
# groups wrote about themselves). No command line lists the universes: the CLI reads them from
# the config and the manifests, as UNIVERSE_IDS does here.
STAGING = f"{RESULTS}/.shards-staging"


rule preprocess_plan:
    """Which universes go to which split and preprocessing group (the staging folder the groups read)."""
    input:
        universe_group_manifests,
    output:
        temp(directory(STAGING)),
    log:
        f"{RESULTS}/logs/preprocess/plan.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("preprocess", "seed", "cluster", "universes"),
        universes=UNIVERSES,
    shell:
        "cosmocub preprocess-plan --config {params.config} --universes-dir {params.universes}"
        " --staging {output} > {log} 2>&1"


rule preprocess_group:
    input:
        STAGING,
    output:
        temp(f"{RESULTS}/.shards-groups/{{group}}.npz"),
    log:
        f"{RESULTS}/logs/preprocess/group_{{group}}.log",
    wildcard_constraints:
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.preprocess.threads
    resources:
        mem_mb=CFG.cluster.preprocess.mem_mb,
        runtime=CFG.cluster.preprocess.runtime,
    params:
        # Its staging folder is the plan's: the same sections.
        config=job_config("preprocess", "seed", "cluster", "universes"),
        env=tracking_env("preprocess_group"),
    shell:
        "{params.env} cosmocub preprocess-group --config {params.config} --staging {input}"
        " --group {wildcards.group} --out {output} --threads {threads} > {log} 2>&1"


rule preprocess:
    """The shards: train/val/test.h5 of log1p sub-volumes, stats.json, manifest.json and features.h5 (one job per group of universes, then a gather)."""
    input:
        staging=STAGING,
        groups=expand(
            f"{RESULTS}/.shards-groups/{{group}}.npz",
            group=PREPROCESS_GROUPS,
        ),
    output:
        train=f"{RESULTS}/shards/train.h5",
        val=f"{RESULTS}/shards/val.h5",
        test=f"{RESULTS}/shards/test.h5",
        stats=f"{RESULTS}/shards/stats.json",
        manifest=f"{RESULTS}/shards/manifest.json",
        features=f"{RESULTS}/shards/features.h5",
    log:
        f"{RESULTS}/logs/preprocess.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("preprocess", "seed", "universes"),
        out=lambda w, output: os.path.dirname(output.manifest),
        groups=lambda w, input: os.path.dirname(input.groups[0]),
        env=tracking_env("preprocess"),
    shell:
        "{params.env} cosmocub preprocess-gather --config {params.config}"
        " --staging {input.staging} --groups-dir {params.groups} --out {params.out} > {log} 2>&1"
