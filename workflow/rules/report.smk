# A one-page summary of the pipeline's results; `snakemake --report report.html` adds the plots.


report: "../report/workflow.rst"


rule summary_report:
    """The pipeline's results on one page (report/summary.md), each study's summary already gathered appended."""
    input:
        metrics=expand(f"{RESULTS}/runs/{{run}}/eval/metrics.json", run=RUN),
        manifest=rules.preprocess.output.manifest,
    output:
        report(
            f"{RESULTS}/report/summary.md",
            caption="../report/summary.rst",
            category="Summary",
        ),
    log:
        f"{RESULTS}/logs/summary_report.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=CFG.cluster.small.runtime,
    params:
        studies=gathered_study_sections,
    shell:
        "cosmocub summarize --manifest {input.manifest} --metrics {input.metrics}"
        " --studies {params.studies:q} --out {output} > {log} 2>&1"
