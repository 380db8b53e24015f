"""One measured run to any scale: `perf-model calibrate --from-run PATH` reads a run's record (an
MLPerf result log, or a cosmocub run folder) and writes how much slower that accelerator and
software ran than the model prices it, with the model's other parts (host, exchange, the wait for
the slowest rank) taken out at the run's own scale; `perf-model predict --gpu-calibration FILE`
prices any other scale with it.

    layer_scale  the run's own device time of the layers ÷ the model's (roofline or layer times)
    eval_scale   the run's evaluation step ÷ the model's with layer_scale applied (its first
                 evaluation where a node's staged share outgrows the node's memory)
    cpu_scale    (a CPU run) its measured compute ÷ this CPU's calibration at the run's config
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmocub.config import Config
from cosmocub.io import read_jsonl, write_json
from cosmocub.perfmodel.cost_model.cluster_presets import CLUSTERS, preset_for_system
from cosmocub.perfmodel.cost_model.machines import THIS_CPU, this_cpu
from cosmocub.perfmodel.cost_model.software import SoftwareProfile, profile, software_for
from cosmocub.perfmodel.cost_model.stragglers import Stragglers
from cosmocub.perfmodel.measure.cpu_model import Calibration
from cosmocub.perfmodel.uses.mllog import RunTimes, read_events, run_times, system_description
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import (
    MLPERF_COSMOFLOW,
    TimeToTrain,
    predict_cluster,
    staged_beyond_memory,
)

FORMAT = "cosmocub-run-calibration-1"

# The GPU ranks' spread (stragglers.Stragglers.cv): fitted on the five published scale pairs of
# one system and software each (benchmarks/against_mlperf.py prints the fit and each pair's
# leave-one-out prediction). No public per-step spread of GPU ranks was found to source it.
GPU_STRAGGLERS = Stragglers(
    cv=0.158,
    source="fitted on the six MLPerf HPC CosmoFlow scale pairs (Eos v3.0 32->512, DGX A100 v2.0 "
    "32->512, DGX A100 MXNet 128->1024 twice, JUWELS 512->1024, Perlmutter 2021 512->1024): "
    "benchmarks/against_mlperf.py, which predicts each pair from the others' fit",
)


@dataclass(frozen=True, kw_only=True)
class RunCalibration:
    """One run's device time against the model's, and the run it came from."""

    source: str
    preset: str
    software: str | None
    nodes: int
    ranks_per_node: int
    global_batch: int
    step_s: float
    eval_step_s: float | None
    layer_scale: float
    eval_scale: float
    stragglers_cv: float

    def write(self, path: Path) -> None:
        write_json(path, {"format": FORMAT, **dataclasses.asdict(self)})

    @classmethod
    def read(cls, path: Path) -> RunCalibration:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a run calibration ({err})") from None
        if not isinstance(data, dict) or data.pop("format", None) != FORMAT:
            raise ValueError(
                f"{path}: not a run calibration ({FORMAT}); write one with perf-model "
                "calibrate --from-run"
            )
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(f"{path}: {FORMAT} with other keys ({err})") from None

    @property
    def software_profile(self) -> SoftwareProfile | None:
        return None if self.software is None else profile(self.software)


def is_run_calibration(path: Path) -> bool:
    try:
        return json.loads(path.read_text()).get("format") == FORMAT
    except (OSError, json.JSONDecodeError, AttributeError):
        return False


def _predict(
    base: Workload,
    run: RunTimes,
    preset: str,
    software: SoftwareProfile | None,
    stragglers: Stragglers,
    *,
    layer_scale: float = 1.0,
    eval_scale: float = 1.0,
) -> TimeToTrain:
    """The model's times of `run` (its nodes, GPUs a node, batch, dropout, epochs)."""
    gpus = run.nodes * run.accelerators_per_node
    model = (
        base.model if run.dropout is None else dataclasses.replace(base.model, dropout=run.dropout)
    )
    work = dataclasses.replace(base, model=model, local_batch=max(1, run.global_batch // gpus))
    _, t = predict_cluster(
        work,
        CLUSTERS[preset],
        nodes=run.nodes,
        epochs=run.epochs,
        dataset=dataclasses.replace(
            MLPERF_COSMOFLOW, train_samples=run.train_samples, val_samples=run.eval_samples
        ),
        staging_in_run=run.staging_in_run,
        software=software,
        stragglers=stragglers,
        layer_scale=layer_scale,
        eval_scale=eval_scale,
    )
    return t


def mllog_preset(path: Path, run: RunTimes) -> tuple[str, SoftwareProfile | None]:
    """(preset, software profile) of a result log: the systems file beside it names the
    accelerator and framework, else the log's submission_platform; a ValueError in one line
    where no preset has its accelerator or its GPUs a node differ from the preset's."""
    system, desc = system_description(path)
    desc = desc or {}
    accelerator = str(desc.get("accelerator_model_name") or run.platform)
    name = preset_for_system(system, accelerator, run.run_start_ms)
    if name is None:
        raise ValueError(
            f"{path}: accelerator {accelerator!r} of system {system!r} has no cluster preset "
            f"({', '.join(CLUSTERS)})"
        )
    if run.accelerators_per_node != CLUSTERS[name].ranks_per_node:
        raise ValueError(
            f"{path}: {run.accelerators_per_node} GPUs a node, preset {name} has "
            f"{CLUSTERS[name].ranks_per_node}"
        )
    software = software_for(str(desc.get("framework", "")), str(desc.get("submitter", run.org)))
    return name, software


def calibrate_mllog(
    path: Path, base: Workload, *, stragglers: Stragglers = GPU_STRAGGLERS
) -> RunCalibration:
    """The run of one result log (its median training epoch ÷ its steps, its median
    evaluation), on the preset and software its systems file names."""
    run = run_times(path, read_events(path))
    preset, software = mllog_preset(path, run)
    return calibrate_run(run, preset, software, base, stragglers=stragglers)


def calibrate_run(
    run: RunTimes,
    preset: str,
    software: SoftwareProfile | None,
    base: Workload,
    *,
    stragglers: Stragglers = GPU_STRAGGLERS,
) -> RunCalibration:
    """The layers' scale that makes the model's step the run's, and the evaluation step's, at
    the run's own scale (nodes, GPUs a node, batch)."""
    gpus = run.nodes * run.accelerators_per_node
    scale = 1.0
    # The exposed all-reduce depends on how long backward runs (DDP's overlap): a fixed point.
    for _ in range(4):
        t = _predict(base, run, preset, software, stragglers, layer_scale=scale)
        scale = layer_scale_for(run.step_s, t, stragglers, gpus, scale)
    t = _predict(base, run, preset, software, stragglers, layer_scale=scale)
    # Where a node's staged share outgrows its memory, only the first evaluation reads the
    # validation split from the page cache the model prices; the later ones from the drives.
    evaluation = run.eval_s[0] if _beyond_memory(run, preset) else run.median_eval_s
    eval_step = (evaluation - t.eval_reduce_s) / t.eval_steps
    return RunCalibration(
        source=str(run.path),
        preset=preset,
        software=None if software is None else software.name,
        nodes=run.nodes,
        ranks_per_node=run.accelerators_per_node,
        global_batch=run.global_batch,
        step_s=run.step_s,
        eval_step_s=eval_step,
        layer_scale=scale,
        eval_scale=max(eval_step, 1e-9) / t.eval_step_s,
        stragglers_cv=stragglers.cv,
    )


def _beyond_memory(run: RunTimes, preset: str) -> bool:
    dataset = dataclasses.replace(
        MLPERF_COSMOFLOW, train_samples=run.train_samples, val_samples=run.eval_samples
    )
    return staged_beyond_memory(CLUSTERS[preset], dataset, run.nodes)


def layer_scale_for(
    measured_step_s: float, t: TimeToTrain, stragglers: Stragglers, ranks: int, scale: float
) -> float:
    """The layers' scale that gives `measured_step_s`, from `t` priced at `scale`: the measured
    step less the exchange, over the straggler factor, is the rank's own step; less its parts
    other than the layers, the layers' time."""
    own = (measured_step_s - t.exchange_s - t.data_wait_s) / stragglers.factor(ranks)
    layers = own - (t.own_s - t.compute_s)
    if layers <= 0:
        raise ValueError(
            f"a measured step of {1e3 * measured_step_s:.3g} ms leaves nothing for the layers "
            f"(the model's exchange, host and update take {1e3 * (t.own_s - t.compute_s):.3g} ms)"
        )
    return scale * layers / t.compute_s


def _gpu_family_match(name: str) -> str | None:
    """The preset whose accelerator a driver's device name is (roofline and NCCL's nodes)."""
    upper = name.upper().replace(" ", "-")
    for family, key in (
        ("H100", "eos"),
        ("A100-SXM4-80GB", "selene"),
        ("A100-SXM4-40GB", "perlmutter"),
    ):
        if family in upper:
            return key
    return None


def _run_record(run_dir: Path) -> tuple[dict[str, Any], list[float]]:
    """(train_summary.json, the measured step's own compute of every epoch after the first:
    metrics.jsonl's time_compute_s, the step less its exchange and halo)."""
    summary_path = run_dir / "train_summary.json"
    if not summary_path.is_file():
        raise ValueError(f"{run_dir}: no train_summary.json (not a finished cosmocub run)")
    summary = json.loads(summary_path.read_text())
    missing = [k for k in ("accelerator", "nodes", "ranks_per_node") if k not in summary]
    if missing:
        raise ValueError(
            f"{summary_path}: no {', '.join(missing)} (a run from before they were recorded)"
        )
    metrics = run_dir / "metrics.jsonl"
    records = [r for r in read_jsonl(metrics) if "time_compute_s" in r] if metrics.is_file() else []
    if not records:
        raise ValueError(f"{metrics}: no epoch with time_compute_s")
    kept = records[1:] if len(records) > 1 else records  # the first epoch holds warm-up
    return summary, [r["time_compute_s"] for r in kept]


def calibrate_cpu_run(
    run_dir: Path, cfg: Config, calibration: Calibration, *, cores: int
) -> RunCalibration:
    """A cosmocub run on this machine's CPU (one rank a sample, no spatial split): its measured
    compute (forward, backward, update) ÷ what this CPU's calibration prices at the run's batch,
    threads and ranks, as `perf-model validate`'s correction fits it on its fit set; predict
    --accelerator cpu --calibration FILE scales the calibration by it.

    The run's fastest epoch after the first is its compute, as the calibration keeps each
    timing's fastest repeat: on a shared machine other work only adds time, and this VM's own
    speed drifts by up to a quarter over tens of seconds with its thread on a core
    (docs/explanation/cluster_model.md), so a median measures when the run was disturbed."""
    summary, epochs = _run_record(run_dir)
    compute = min(epochs)
    if cfg.parallel.spatial != 1:
        raise ValueError(
            f"{run_dir}: parallel.spatial {cfg.parallel.spatial}: calibrate on a run without a "
            "spatial split (its measured compute then holds no halo)"
        )
    ranks = int(summary["ranks_per_node"])
    device = this_cpu(
        threads_per_rank=cfg.train.threads_per_rank,
        ranks_per_node=ranks,
        cores=cores,
        calibration=calibration,
    )
    world = int(summary["world_size"])
    layers = device.layer_seconds(
        cfg.model, batch=cfg.train.local_batch_size, split=(1, 1, 1), synced_norm=world > 1
    )
    predicted = sum(layers.values()) + device.optimizer_seconds(cfg.model, cfg.optimizer)
    return RunCalibration(
        source=str(run_dir),
        preset=THIS_CPU,
        software=None,
        nodes=int(summary["nodes"]),
        ranks_per_node=ranks,
        global_batch=int(summary["global_batch_size"]),
        step_s=compute,
        eval_step_s=None,
        layer_scale=compute / predicted,
        eval_scale=1.0,
        stragglers_cv=0.0,
    )


def calibrate_run_folder(run_dir: Path, cfg: Config) -> RunCalibration:
    """A cosmocub run on GPUs (train_summary.json: accelerator, nodes, ranks per node, global
    batch; metrics.jsonl: the measured compute, timed with CUDA events): its layers' scale
    against the roofline of the preset with that accelerator. Not yet run on a GPU."""
    summary, epochs = _run_record(run_dir)
    step = statistics.median(epochs)  # a GPU's epochs: its own device, not a shared core
    summary_path = run_dir / "train_summary.json"
    accelerator = str(summary["accelerator"])
    preset = _gpu_family_match(accelerator)
    if preset is None:
        raise ValueError(f"{summary_path}: accelerator {accelerator!r} has no cluster preset")
    base = Workload.of(cfg)
    fake = RunTimes(
        path=summary_path,
        org="cosmocub",
        platform=accelerator,
        nodes=int(summary["nodes"]),
        accelerators_per_node=int(summary["ranks_per_node"]),
        global_batch=int(summary["global_batch_size"]),
        train_samples=int(summary["global_batch_size"]) * max(1, int(summary["steps"])),
        eval_samples=int(summary["global_batch_size"]),
        run_start_ms=0.0,
        run_s=float(summary["wall_time_s"]),
        train_epoch_s=(step * max(1, int(summary["steps"])),),
        eval_s=(0.0,),
        staging_s=None,
        staging_in_run=None,
    )
    software = profile("cosmocub_eager")
    # The measured compute is the rank's own (the wait for others falls in its exchange time):
    # less the model's other device work, the layers'.
    t = _predict(base, fake, preset, software, GPU_STRAGGLERS)
    other = t.own_s - t.host_s - t.compute_s
    if step <= other:
        raise ValueError(
            f"{run_dir}: a measured compute of {1e3 * step:.3g} ms leaves nothing for the layers"
        )
    scale = (step - other) / t.compute_s
    return RunCalibration(
        source=str(run_dir),
        preset=preset,
        software=software.name,
        nodes=fake.nodes,
        ranks_per_node=fake.accelerators_per_node,
        global_batch=fake.global_batch,
        step_s=step,
        eval_step_s=None,
        layer_scale=scale,
        eval_scale=1.0,
        stragglers_cv=GPU_STRAGGLERS.cv,
    )


def calibrate_from_run(
    path: Path, cfg: Config, *, cpu: Callable[[], tuple[Calibration, int]]
) -> RunCalibration:
    """A result log (a file) or a cosmocub run folder trained with `cfg` (a GPU run against its
    preset's roofline; a CPU run against this CPU's calibration, `cpu()` giving it and the
    cores); a one-line ValueError for anything else."""
    if path.is_dir():
        summary, _ = _run_record(path)
        if str(summary["accelerator"]).startswith("cpu"):
            calibration, cores = cpu()
            return calibrate_cpu_run(path, cfg, calibration, cores=cores)
        return calibrate_run_folder(path, cfg)
    if not path.is_file():
        raise ValueError(f"--from-run {path}: no such file or folder")
    return calibrate_mllog(path, Workload.of(cfg))
