# Training (torchrun locally; it restarts a dead rank, which resumes from the last checkpoint)
# and evaluation on the test split.


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
    threads: lambda wildcards: workflow.cores
    params:
        settings=section("model", "optimizer", "train", "preprocess", "seed"),
        shards=lambda w, input: os.path.dirname(input.manifest),
        out=lambda w, output: os.path.dirname(output.model),
        nproc=CFG.train.nproc_per_node,
        max_restarts=CFG.train.max_restarts,
        env=tracking_env("train"),
    shell:
        "{params.env} torchrun --standalone"
        " --nproc-per-node {params.nproc} --max-restarts {params.max_restarts}"
        " -m cosmocub.cli train --shards {params.shards} --out {params.out}"
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
    log:
        f"{RESULTS}/logs/evaluate/{{run}}.log",
    conda:
        "../../envs/cosmocub.yaml"
    params:
        settings=section("model", "evaluate"),
        shards=lambda w, input: os.path.dirname(input.manifest),
        run_dir=lambda w, input: os.path.dirname(input.model),
        out=lambda w, output: os.path.dirname(output.metrics),
        env=tracking_env("evaluate"),
    shell:
        "{params.env} cosmocub evaluate --shards {params.shards}"
        " --run-dir {params.run_dir} --out {params.out} > {log} 2>&1"
