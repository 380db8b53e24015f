# The sample-size study (`snakemake sample_size_study`): the recipe of the config trained on crops
# of each size in sample_size_study.sizes, cut from the same universes, each its own run (on one
# node, launched like `train`).

STUDY = f"{RESULTS}/studies/sample_size"


rule sample_size_config:
    output:
        f"{STUDY}/{{size}}/config.yaml",
    log:
        f"{STUDY}/logs/config_{{size}}.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        settings=section(
            "universes",
            "preprocess",
            "model",
            "parallel",
            "optimizer",
            "train",
            "evaluate",
            "sample_size_study",
            "seed",
        ),
    shell:
        "cosmocub sample-size-config --size {wildcards.size} --out {output} > {log} 2>&1"


rule sample_size_preprocess:
    input:
        config=rules.sample_size_config.output,
        universes=universe_files,
    output:
        train=f"{STUDY}/{{size}}/shards/train.h5",
        val=f"{STUDY}/{{size}}/shards/val.h5",
        test=f"{STUDY}/{{size}}/shards/test.h5",
        stats=f"{STUDY}/{{size}}/shards/stats.json",
        manifest=f"{STUDY}/{{size}}/shards/manifest.json",
        features=f"{STUDY}/{{size}}/shards/features.h5",
    log:
        f"{STUDY}/logs/preprocess_{{size}}.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.preprocess.threads
    resources:
        mem_mb=CFG.cluster.preprocess.mem_mb,
        runtime=CFG.cluster.preprocess.runtime,
    params:
        out=lambda w, output: os.path.dirname(output.manifest),
        env=tracking_env("sample_size_preprocess"),
    shell:
        "{params.env} cosmocub preprocess {input.universes} --out {params.out}"
        " --config {input.config} --threads {threads} > {log} 2>&1"


rule sample_size_train:
    input:
        config=rules.sample_size_config.output,
        shards=rules.sample_size_preprocess.output,
        manifest=rules.sample_size_preprocess.output.manifest,
    output:
        model=f"{STUDY}/{{size}}/run/model.pt",
        metrics=f"{STUDY}/{{size}}/run/metrics.jsonl",
        summary=f"{STUDY}/{{size}}/run/train_summary.json",
    log:
        f"{STUDY}/logs/train_{{size}}.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    # Like `train`, the ranks (spatial × nproc_per_node here) ask for cluster.train.cpus_per_rank.
    threads: lambda w: study_ranks(w) * CFG.cluster.train.cpus_per_rank
    resources:
        mem_mb=lambda w: study_ranks(w) * CFG.cluster.train.mem_mb_per_rank,
        runtime=CFG.cluster.train.runtime,
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        out=lambda w, output: os.path.dirname(output.model),
        nproc=study_ranks,
        cpus=lambda w, threads: max(1, threads // study_ranks(w)),  # as granted
        max_restarts=CFG.train.max_restarts,
        env=tracking_env("sample_size_train"),
    shell:
        "{params.env} cosmocub launch --tasks-per-node {params.nproc}"
        " --cpus-per-rank {params.cpus} --max-restarts {params.max_restarts}"
        " -- train --config {input.config} --shards {params.shards} --out {params.out}"
        " > {log} 2>&1"


rule sample_size_evaluate:
    input:
        config=rules.sample_size_config.output,
        model=rules.sample_size_train.output.model,
        manifest=rules.sample_size_preprocess.output.manifest,
    output:
        metrics=f"{STUDY}/{{size}}/eval/metrics.json",
        predictions=f"{STUDY}/{{size}}/eval/predictions.npz",
    log:
        f"{STUDY}/logs/evaluate_{{size}}.log",
    wildcard_constraints:
        size=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        run_dir=lambda w, input: os.path.dirname(input.model),
        out=lambda w, output: os.path.dirname(output.metrics),
        env=tracking_env("sample_size_evaluate"),
    shell:
        "{params.env} cosmocub evaluate --config {input.config} --shards {params.shards}"
        " --run-dir {params.run_dir} --out {params.out} > {log} 2>&1"


rule sample_size_study:
    input:
        expand(
            f"{STUDY}/{{size}}/eval/predictions.npz", size=CFG.sample_size_study.sizes
        ),
    output:
        tsv=report(
            f"{STUDY}/sample_size.tsv",
            caption="../report/sample_size.rst",
            category="Sample-size study",
        ),
        plot=report(
            f"{STUDY}/sample_size.png",
            caption="../report/sample_size.rst",
            category="Sample-size study",
        ),
    log:
        f"{STUDY}/logs/sample_size_study.log",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        evals=lambda w, input: " ".join(
            f"{size}={os.path.dirname(path)}"
            for size, path in zip(CFG.sample_size_study.sizes, input)
        ),
        env=tracking_env("sample_size_study"),
    shell:
        "{params.env} cosmocub sample-size-study --eval {params.evals}"
        " --tsv {output.tsv} --plot {output.plot} > {log} 2>&1"
