# The field emulator (`snakemake unet`): a 3D U-Net trained on the same shards to predict the
# z = 0 field from the z = 3 one (task), with the config's `unet` section merged over the config,
# launched, checkpointed, resumed and tracked like `train`; then P(k), r(k) and PDF on the test
# split against linear growth.

UNET = f"{RESULTS}/unet"


rule unet_config:
    """The U-Net run's config, derived from the config in effect (unet section)."""
    output:
        f"{UNET}/config.yaml",
    log:
        f"{UNET}/logs/config.log",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        config=job_config(
            "preprocess",
            "model",
            "parallel",
            "optimizer",
            "train",
            "evaluate",
            "task",
            "unet",
            "seed",
        ),
    shell:
        "cosmocub unet-config --config {params.config} --out {output} > {log} 2>&1"


rule unet_train:
    """The 3D U-Net field emulator trained to map the z = 3 field to z = 0."""
    input:
        config=unet_run_config,
        shards=rules.preprocess.output,
        manifest=rules.preprocess.output.manifest,
    output:
        model=f"{UNET}/run/model.pt",
        metrics=f"{UNET}/run/metrics.jsonl",
        summary=f"{UNET}/run/train_summary.json",
    log:
        f"{UNET}/logs/train.log",
    conda:
        "../../envs/cosmocub.yaml"
    # Functions, not values: a bad `unet` section fails the unet targets only, not `all`.
    threads: lambda w: unet_train_job().threads
    resources:
        mem_mb=lambda w: unet_train_job().mem_mb,
        runtime=CFG.cluster.train.runtime,
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        out=lambda w, output: os.path.dirname(output.model),
        cpus=lambda w, threads: unet_train_job().cpus_per_rank_within(threads),
        max_restarts=CFG.train.max_restarts,
        env=tracking_env("unet_train"),
    shell:
        "{params.env} cosmocub launch --cpus-per-rank {params.cpus}"
        " --max-restarts {params.max_restarts}"
        " -- train --config {input.config} --shards {params.shards} --out {params.out}"
        " > {log} 2>&1"


rule unet_evaluate:
    """The U-Net's test fields against the truth: P(k), r(k) and the linear-growth baseline."""
    input:
        config=rules.unet_config.output,
        model=rules.unet_train.output.model,
        manifest=rules.preprocess.output.manifest,
    output:
        metrics=f"{UNET}/eval/metrics.json",
        spectra=f"{UNET}/eval/spectra.tsv",
        slices=report(
            f"{UNET}/eval/slices.png", caption="../report/unet.rst", category="U-Net"
        ),
        power=report(
            f"{UNET}/eval/power.png", caption="../report/unet.rst", category="U-Net"
        ),
        pdf=report(
            f"{UNET}/eval/pdf.png", caption="../report/unet.rst", category="U-Net"
        ),
        loss=f"{UNET}/eval/loss.png",
    log:
        f"{UNET}/logs/evaluate.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.small.threads
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        shards=lambda w, input: os.path.dirname(input.manifest),
        run_dir=lambda w, input: os.path.dirname(input.model),
        out=lambda w, output: os.path.dirname(output.metrics),
        env=tracking_env("unet_evaluate"),
    shell:
        "{params.env} cosmocub evaluate-fields --config {input.config} --shards {params.shards}"
        " --run-dir {params.run_dir} --out {params.out} > {log} 2>&1"


rule unet:
    """The U-Net field emulator, trained and evaluated (unet/run, unet/eval)."""
    input:
        rules.unet_evaluate.output,
