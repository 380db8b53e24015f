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
    shell:
        "cosmocub link-universe {input} {output} > {log} 2>&1"


rule preprocess:
    input:
        universe_files,
    output:
        train=f"{RESULTS}/shards/train.h5",
        val=f"{RESULTS}/shards/val.h5",
        test=f"{RESULTS}/shards/test.h5",
        stats=f"{RESULTS}/shards/stats.json",
        manifest=f"{RESULTS}/shards/manifest.json",
    log:
        f"{RESULTS}/logs/preprocess.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: lambda wildcards: workflow.cores
    params:
        settings=section("preprocess", "seed"),
        out=lambda w, output: os.path.dirname(output.manifest),
        env=tracking_env("preprocess"),
    shell:
        "{params.env} cosmocub preprocess {input} --out {params.out}" " > {log} 2>&1"
