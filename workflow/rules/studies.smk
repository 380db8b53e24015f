# Studies (`snakemake <name>_study`, names in cosmocub.studies.engine.STUDY_MODULES): the same
# rules for every study. Each point is one training run of the base config with the point's
# overrides (cosmocub study-point: `cosmocub launch -- train` here, another runner where the
# point names one); the gather writes points.tsv, <study>.png and a report section, and makes
# the study's MLflow run the parent of the points' training runs.

STUDIES = f"{RESULTS}/studies"


wildcard_constraints:
    study="|".join(STUDY_NAMES),
    point=r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    key=r"data-[0-9a-f]+",


rule study_point_config:
    output:
        config=f"{STUDIES}/{{study}}/{{point}}/config.yaml",
        # What study_point runs (nodes, ranks, runner), planned once: cosmocub study-point reads it.
        plan=f"{STUDIES}/{{study}}/{{point}}/launch.json",
    log:
        f"{STUDIES}/{{study}}/logs/config_{{point}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=CFG.cluster.small.runtime,
    params:
        config=study_settings,
    shell:
        "cosmocub study-point-config --config {params.config} --study {wildcards.study}"
        " --point {wildcards.point} --out {output.config} > {log} 2>&1"


# Shards of points whose data sections differ from the base run's (points that agree share
# them; points that agree with the base use its shards): the plan/group/gather path of data.smk.
rule study_preprocess_plan:
    input:
        config=study_shard_config,
        universes=study_universe_manifests,
    output:
        temp(directory(f"{STUDIES}/.staging/{{key}}")),
    log:
        f"{STUDIES}/logs/preprocess_plan_{{key}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        universes=f"{RESULTS}/universes",
    shell:
        "cosmocub preprocess-plan --config {input.config} --universes-dir {params.universes}"
        " --staging {output} > {log} 2>&1"


rule study_preprocess_group:
    input:
        config=study_shard_config,
        staging=f"{STUDIES}/.staging/{{key}}",
    output:
        temp(f"{STUDIES}/.groups/{{key}}/{{group}}.npz"),
    log:
        f"{STUDIES}/logs/preprocess_{{key}}_group_{{group}}.log",
    wildcard_constraints:
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.preprocess.threads
    resources:
        mem_mb=CFG.cluster.preprocess.mem_mb,
        runtime=CFG.cluster.preprocess.runtime,
    params:
        env=tracking_env("study_preprocess_group"),
    shell:
        "{params.env} cosmocub preprocess-group --config {input.config} --staging {input.staging}"
        " --group {wildcards.group} --out {output} --threads {threads} > {log} 2>&1"


rule study_preprocess:
    input:
        config=study_shard_config,
        staging=f"{STUDIES}/.staging/{{key}}",
        groups=expand(
            f"{STUDIES}/.groups/{{{{key}}}}/{{group}}.npz",
            group=PREPROCESS_GROUPS,
        ),
    output:
        train=f"{STUDIES}/shards/{{key}}/train.h5",
        val=f"{STUDIES}/shards/{{key}}/val.h5",
        test=f"{STUDIES}/shards/{{key}}/test.h5",
        stats=f"{STUDIES}/shards/{{key}}/stats.json",
        manifest=f"{STUDIES}/shards/{{key}}/manifest.json",
        features=f"{STUDIES}/shards/{{key}}/features.h5",
    log:
        f"{STUDIES}/logs/preprocess_{{key}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        out=lambda w, output: os.path.dirname(output.manifest),
        groups=lambda w, input: os.path.dirname(input.groups[0]),
        env=tracking_env("study_preprocess"),
    shell:
        "{params.env} cosmocub preprocess-gather --config {input.config}"
        " --staging {input.staging} --groups-dir {params.groups} --out {params.out} > {log} 2>&1"


rule study_point:
    input:
        config=f"{STUDIES}/{{study}}/{{point}}/config.yaml",
        plan=f"{STUDIES}/{{study}}/{{point}}/launch.json",
        manifest=study_point_manifest,
    output:
        # The run's files (run/model.pt, metrics.jsonl, train_summary.json) are not declared:
        # a point skipped here (emulated nodes without CAP_NET_ADMIN) has only its point.json.
        record=f"{STUDIES}/{{study}}/{{point}}/point.json",
    log:
        f"{STUDIES}/{{study}}/logs/point_{{point}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    # Snakemake caps at --cores; see study_point_threads.
    threads: study_point_threads
    # A scheduler is asked for the point's own allocation, as rule train asks for training's:
    # its ranks with cluster.train's cores and GPUs per rank, on its nodes (one node for
    # emulated ones, which share one machine); locally only threads count.
    resources:
        nodes=lambda w: study_point_request(w).nodes,
        tasks=lambda w: study_point_request(w).world_size,
        cpus_per_task=CFG.cluster.train.cpus_per_rank,
        mem_mb=lambda w: study_point_request(w).mem_mb,
        runtime=CFG.cluster.train.runtime,
        gres=lambda w: study_point_request(w).gres,
        tasks_per_gpu=1,
        # The same request in the terms of Flux and LSF (profiles/flux, profiles/lsf).
        gpus_per_task=CFG.cluster.train.gpus_per_rank,
        cpus_per_node=lambda w: study_point_request(w).threads,
        cpus_total=lambda w: study_point_request(w).cpus_total,
        mpi="",  # see rule train: `cosmocub launch` starts the ranks itself
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        out=lambda w, output: os.path.dirname(output.record),
        # The same for every point of the study, so they compare like with like.
        cpus=study_cpus,
        max_restarts=CFG.train.max_restarts,
        env=tracking_env("study_point"),
    shell:
        "{params.env} cosmocub study-point --study {wildcards.study} --point {wildcards.point}"
        " --point-config {input.config} --shards {params.shards} --out {params.out}"
        " --cpus-per-rank {params.cpus} --max-restarts {params.max_restarts} > {log} 2>&1"


rule study_evaluate:
    input:
        config=f"{STUDIES}/{{study}}/{{point}}/config.yaml",
        record=f"{STUDIES}/{{study}}/{{point}}/point.json",
        manifest=study_point_manifest,
    output:
        metrics=f"{STUDIES}/{{study}}/{{point}}/eval/metrics.json",
        predictions=f"{STUDIES}/{{study}}/{{point}}/eval/predictions.npz",
    log:
        f"{STUDIES}/{{study}}/logs/evaluate_{{point}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.small.threads
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        run_dir=lambda w, input: os.path.join(os.path.dirname(input.record), "run"),
        out=lambda w, output: os.path.dirname(output.metrics),
        env=tracking_env("study_evaluate"),
    shell:
        "{params.env} cosmocub evaluate --config {input.config} --shards {params.shards}"
        " --run-dir {params.run_dir} --out {params.out} > {log} 2>&1"


rule study_gather:
    input:
        study_gather_inputs,
    output:
        tsv=report(
            f"{STUDIES}/{{study}}/points.tsv",
            caption="../report/study.rst",
            category="Studies",
            subcategory="{study}",
        ),
        plot=report(
            f"{STUDIES}/{{study}}/{{study}}.png",
            caption="../report/study.rst",
            category="Studies",
            subcategory="{study}",
        ),
        summary=f"{STUDIES}/{{study}}/summary.md",
    log:
        f"{STUDIES}/{{study}}/logs/gather.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=study_gather_config,
        folder=lambda w, output: os.path.dirname(output.tsv),
        env=tracking_env("study_gather"),
    shell:
        "{params.env} cosmocub study-gather --config {params.config} --study {wildcards.study}"
        " --dir {params.folder}"
        " > {log} 2>&1"


# One target per study: `snakemake --cores all sample_size_study`.
for _study in STUDY_NAMES:

    rule:
        """A study: every point trained (and evaluated), then points.tsv, a plot and summary.md."""
        name:
            f"{_study}_study"
        input:
            f"{STUDIES}/{_study}/points.tsv",
            f"{STUDIES}/{_study}/{_study}.png",
            f"{STUDIES}/{_study}/summary.md",
        localrule: True
