# The performance model (`snakemake perf_model`): an α–β fit per link of the collectives timed
# here, the step_time study's measured steps against the model's prediction, and the
# extrapolation of perf_model.extrapolate.config to GPU clusters with its assumptions.

PERF = f"{RESULTS}/perf_model"
# A relative config path is the repository's (beside this workflow), not the working folder's.
PERF_MODEL_CONFIG = os.path.join(workflow.basedir, CFG.perf_model.extrapolate.config)
CALIBRATION = CFG.perf_model.calibration.path or f"{PERF}/calibration.json"


# On loopback (ranks of one node) and, as root, on the emulated link at every study rate (else
# skipped with the reason, as the studies' emulated points are); fit.tsv has one fit per link.
rule perf_model_bench:
    """Micro-benchmarks of the collectives on this machine's links (loopback, and the emulated links as root)."""
    output:
        f"{PERF}/bench.tsv",
    log:
        f"{PERF}/logs/bench.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: perf_model_bench_threads(CFG)
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
        mpi="",  # `cosmocub perf-model bench` starts the ranks itself
    params:
        # Its own settings and the studies' link rates it emulates: a change to the
        # extrapolation or the calibration does not rerun the links' benchmark (and so the fit
        # and every validation).
        config=job_config(
            "perf_model.bench",
            "network_study.rates_mbit",
            "scaling_study.rate_mbit",
        ),
    shell:
        "cosmocub perf-model bench --config {params.config} --out {output} > {log} 2>&1"


rule perf_model_fit:
    """The α–β fit per link and collective kind from the micro-benchmarks."""
    input:
        rules.perf_model_bench.output,
    output:
        f"{PERF}/fit.tsv",
    log:
        f"{PERF}/logs/fit.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=1000,
        runtime=CFG.cluster.small.runtime,
    shell:
        "cosmocub perf-model fit --samples {input} --out {output} > {log} 2>&1"


# This CPU's compute rates over a small grid (conv blocks, dense heads, updates), every core
# held so that nothing runs beside the timings; the cache is refused on another machine.
rule perf_model_calibrate:
    """This CPU's compute rates over a small grid of layers and updates (cached per machine)."""
    output:
        CALIBRATION,
    log:
        f"{PERF}/logs/calibrate.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: lambda w: checked(calibration_threads, CFG, machine_cores=machine_cores())
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("perf_model.calibration", "perf_model.cores"),
    shell:
        "cosmocub perf-model calibrate --config {params.config} --out {output} > {log} 2>&1"


rule perf_model_validate:
    """The performance model against the measured study points (step_time_study's table, and the network and scaling studies' where run)."""
    input:
        points=perf_model_tables,
        fit=rules.perf_model_fit.output,
        calibration=rules.perf_model_calibrate.output,
    output:
        tsv=report(
            f"{PERF}/validation.tsv",
            caption="../report/perf_model.rst",
            category="Performance model",
        ),
        plot=report(
            f"{PERF}/validation.png",
            caption="../report/perf_model.rst",
            category="Performance model",
        ),
        errors=f"{PERF}/validation.json",
    log:
        f"{PERF}/logs/validate.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: CFG.cluster.small.threads
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("perf_model"),
    shell:
        "cosmocub perf-model validate --config {params.config} --points {input.points}"
        " --fit {input.fit}"
        " --calibration {input.calibration} --tsv {output.tsv} --plot {output.plot}"
        " > {log} 2>&1"


rule perf_model_extrapolate:
    """Step time and time to train predicted on GPU clusters (config/cosmoflow-mlperf.yaml), with the assumptions."""
    input:
        PERF_MODEL_CONFIG,
    output:
        tsv=f"{PERF}/extrapolation.tsv",
        headline=report(
            f"{PERF}/headline.tsv",
            caption="../report/perf_model.rst",
            category="Performance model",
        ),
        plot=report(
            f"{PERF}/extrapolation.png",
            caption="../report/perf_model.rst",
            category="Performance model",
        ),
        assumptions=report(
            f"{PERF}/assumptions.md",
            caption="../report/perf_model.rst",
            category="Performance model",
        ),
    log:
        f"{PERF}/logs/extrapolate.log",
    conda:
        "../../envs/cosmocub.yaml"
    threads: 1
    resources:
        mem_mb=CFG.cluster.small.mem_mb,
        runtime=CFG.cluster.small.runtime,
    params:
        config=job_config("perf_model"),
        out=lambda w, output: os.path.dirname(output.tsv),
    shell:
        "cosmocub perf-model extrapolate --config {params.config} --model-config {input}"
        " --out {params.out} > {log} 2>&1"


rule perf_model:
    """The performance model: fit, calibration, validation against measured steps, extrapolation to 2,048 GPUs."""
    input:
        rules.perf_model_validate.output,
        rules.perf_model_extrapolate.output,
    localrule: True
