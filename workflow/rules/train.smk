# Training, launched by `cosmocub launch` as the allocation asks: torchrun locally, srun on Slurm,
# flux run / blaunch + torchrun on Flux and LSF; a crash starts the ranks again (they resume from
# the last checkpoint), a user error fails the job at once. And evaluation on the test split.


rule train:
    input:
        shards=rules.preprocess.output,
        manifest=rules.preprocess.output.manifest,
    output:
        model=f"{RESULTS}/runs/{{run}}/model.pt",
        metrics=f"{RESULTS}/runs/{{run}}/metrics.jsonl",
        summary=f"{RESULTS}/runs/{{run}}/train_summary.json",
    log:
        f"{RESULTS}/logs/train/{{run}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    # Ranks on this node × cores per rank; locally Snakemake caps it at --cores.
    threads: TRAIN_JOB.threads
    resources:
        nodes=TRAIN_JOB.nodes,
        tasks=TRAIN_JOB.world_size,
        cpus_per_task=TRAIN_JOB.cpus_per_rank,
        # Slurm's --mem is per node.
        mem_mb=TRAIN_JOB.mem_mb,
        runtime=CFG.cluster.train.runtime,
        gres=TRAIN_JOB.gres,
        tasks_per_gpu=1,
        # The same request in the terms of Flux and LSF (profiles/flux, profiles/lsf).
        gpus_per_task=TRAIN_JOB.gpus_per_rank,
        cpus_per_node=TRAIN_JOB.threads,
        cpus_total=TRAIN_JOB.cpus_total,
        # Present (even empty) so that the Slurm jobstep runs the command as it is instead of
        # wrapping it in `srun -n1`: `cosmocub launch` starts the ranks itself.
        mpi="",
    params:
        config=job_config(
            "model",
            "parallel",
            "optimizer",
            "train",
            "preprocess",
            "seed",
            "cluster.train.nodes",
        ),
        shards=lambda w, input: os.path.dirname(input.manifest),
        out=lambda w, output: os.path.dirname(output.model),
        cpus=lambda w, threads: TRAIN_JOB.cpus_per_rank_within(threads),
        max_restarts=CFG.train.max_restarts,
        env=tracking_env("train"),
    shell:
        "{params.env} cosmocub launch --cpus-per-rank {params.cpus}"
        " --max-restarts {params.max_restarts}"
        " -- train --config {params.config} --shards {params.shards} --out {params.out}"
        " > {log} 2>&1"


rule evaluate:
    input:
        model=rules.train.output.model,
        manifest=rules.preprocess.output.manifest,
    output:
        metrics=report(
            f"{RESULTS}/runs/{{run}}/eval/metrics.json",
            caption="../report/metrics.rst",
            category="Evaluation",
        ),
        scatter=report(
            f"{RESULTS}/runs/{{run}}/eval/pred_vs_true.png",
            caption="../report/pred_vs_true.rst",
            category="Evaluation",
        ),
        curves=report(
            f"{RESULTS}/runs/{{run}}/eval/loss_curves.png",
            caption="../report/loss_curves.rst",
            category="Training",
        ),
        calibration=report(
            f"{RESULTS}/runs/{{run}}/eval/calibration.png",
            caption="../report/calibration.rst",
            category="Evaluation",
        ),
    log:
        f"{RESULTS}/logs/evaluate/{{run}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.small.threads
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("model", "evaluate", "universes.source", "train.universes"),
        shards=lambda w, input: os.path.dirname(input.manifest),
        run_dir=lambda w, input: os.path.dirname(input.model),
        out=lambda w, output: os.path.dirname(output.metrics),
        env=tracking_env("evaluate"),
    shell:
        "{params.env} cosmocub evaluate --config {params.config} --shards {params.shards}"
        " --run-dir {params.run_dir} --out {params.out} > {log} 2>&1"
