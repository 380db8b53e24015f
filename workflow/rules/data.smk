# Universes (simulated here, or linked from the public CosmoFlow set) and their shards.


rule simulate:
    output:
        f"{RESULTS}/universes/synth_{{seed}}.hdf5",
    log:
        f"{RESULTS}/logs/simulate/synth_{{seed}}.log",
    wildcard_constraints:
        seed=r"\d+",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        settings=section("simulate"),
        size=CFG.universes.size,
        env=tracking_env("simulate"),
    shell:
        "{params.env} cosmocub simulate {output} --size {params.size}"
        " --seed {wildcards.seed} > {log} 2>&1"


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
        settings=section("preprocess", "seed", "cluster"),
        universes=f"{RESULTS}/universes",
    shell:
        "cosmocub preprocess-plan --universes-dir {params.universes} --staging {output}"
        " > {log} 2>&1"


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
        env=tracking_env("preprocess_group"),
    shell:
        "{params.env} cosmocub preprocess-group --staging {input} --group {wildcards.group}"
        " --out {output} --threads {threads} > {log} 2>&1"


rule preprocess:
    input:
        staging=STAGING,
        groups=expand(
            f"{RESULTS}/.shards-groups/{{group}}.npz",
            group=range(num_preprocess_groups(CFG, len(UNIVERSE_IDS))),
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
        settings=section("preprocess", "seed"),
        out=lambda w, output: os.path.dirname(output.manifest),
        groups=lambda w, input: os.path.dirname(input.groups[0]),
        env=tracking_env("preprocess"),
    shell:
        "{params.env} cosmocub preprocess-gather --staging {input.staging}"
        " --groups-dir {params.groups} --out {params.out} > {log} 2>&1"
