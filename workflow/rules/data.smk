# Universes (simulated here, or linked from the public CosmoFlow set) and their shards.


# Synthetic universes are made several to a job (cluster.simulate.universes_per_job: one Python
# start and one set of force-mesh k-grids for the group), each group into a staging folder of its
# own; `simulate` then hard-links each file to its final name (no copy, no process of its own),
# so every universe stays a target of its own and a group's folder is dropped once all of its
# universes are in place. Like preprocessing, no command line lists the seeds: the CLI reads the
# group's seeds from the config, as simulate_group_of does here.
SIMULATE_STAGING = f"{RESULTS}/.universes-groups"


rule simulate_group:
    output:
        temp(directory(f"{SIMULATE_STAGING}/{{group}}")),
    log:
        f"{RESULTS}/logs/simulate/group_{{group}}.log",
    wildcard_constraints:
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.simulate.mem_mb,
        runtime=simulate_runtime(CFG),
    params:
        config=job_config("simulate"),
        size=CFG.universes.size,
        env=tracking_env("simulate_group"),
    shell:
        "{params.env} cosmocub simulate-group --config {params.config}"
        " --group {wildcards.group} --out {output} > {log} 2>&1"


# A study point's universes at a top-level seed of its own (known_answer_study.seeds): the same
# groups of that seed's universes, staged under seed<s>/.
rule simulate_seed_group:
    output:
        temp(directory(f"{SIMULATE_STAGING}/seed{{master}}/{{group}}")),
    log:
        f"{RESULTS}/logs/simulate/seed{{master}}_group_{{group}}.log",
    wildcard_constraints:
        master=r"\d+",
        group=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.simulate.mem_mb,
        runtime=simulate_runtime(CFG),
    params:
        config=job_config("simulate"),
        size=CFG.universes.size,
        env=tracking_env("simulate_seed_group"),
    shell:
        "{params.env} cosmocub simulate-group --config {params.config} --seed {wildcards.master}"
        " --group {wildcards.group} --out {output} > {log} 2>&1"


rule simulate:
    input:
        lambda w: simulate_staging(w.seed),
    output:
        f"{RESULTS}/universes/synth_{{seed}}.hdf5",
    log:
        f"{RESULTS}/logs/simulate/synth_{{seed}}.log",
    wildcard_constraints:
        seed=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        # The group's settings here too: a change reruns this universe, hence its group (whose
        # folder is temp, so would not be asked for otherwise).
        settings=section("simulate"),
        size=CFG.universes.size,
    # touch: the link shares the staged file's mtime, older than its folder (the input).
    shell:
        "(ln -f {input}/synth_{wildcards.seed}.hdf5 {output} && touch {output}) > {log} 2>&1"


rule link_universe:
    input:
        lambda w: os.path.join(CFG.universes.cosmoflow_dir, f"{w.name}.hdf5"),
    output:
        f"{RESULTS}/universes/{{name}}.hdf5",
    log:
        f"{RESULTS}/logs/link_universe/{{name}}.log",
    wildcard_constraints:
        name=r"univ_[^/]+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=CFG.cluster.small.runtime,
    shell:
        "cosmocub link-universe {input} {output} > {log} 2>&1"


# Preprocessing as many jobs: plan (allocate the shards), one job per group of universes (each
# writes its samples in place), gather (statistics, manifest, shards into place). No command line
# lists the universes: the CLI reads them from the config, as UNIVERSE_IDS does here.
STAGING = f"{RESULTS}/.shards-staging"


rule preprocess_plan:
    input:
        universe_files,
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
        config=job_config("preprocess", "seed", "cluster"),
        universes=f"{RESULTS}/universes",
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
        config=job_config("preprocess", "seed", "cluster"),
        env=tracking_env("preprocess_group"),
    shell:
        "{params.env} cosmocub preprocess-group --config {params.config} --staging {input}"
        " --group {wildcards.group} --out {output} --threads {threads} > {log} 2>&1"


rule preprocess:
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
        config=job_config("preprocess", "seed"),
        out=lambda w, output: os.path.dirname(output.manifest),
        groups=lambda w, input: os.path.dirname(input.groups[0]),
        env=tracking_env("preprocess"),
    shell:
        "{params.env} cosmocub preprocess-gather --config {params.config}"
        " --staging {input.staging} --groups-dir {params.groups} --out {params.out} > {log} 2>&1"
