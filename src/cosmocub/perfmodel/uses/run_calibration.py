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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmocub.io import write_json
from cosmocub.perfmodel.cost_model.cluster_presets import (
    CLUSTERS,
    ClusterPreset,
    preset_for_system,
)
from cosmocub.perfmodel.cost_model.hardware_specs import AcceleratorSpec
from cosmocub.perfmodel.cost_model.machines import THIS_CPU
from cosmocub.perfmodel.cost_model.software import SoftwareProfile, profile, software_for
from cosmocub.perfmodel.cost_model.stragglers import Stragglers
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.mllog import (
    RunTimes,
    read_events,
    run_times,
    system_description,
    with_system,
)
from cosmocub.perfmodel.uses.run_prediction import Workload
from cosmocub.perfmodel.uses.time_to_train import (
    MLPERF_COSMOFLOW,
    Dataset,
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
    # The machine priced when it was made (machine_description): predict refuses another
    # accelerator or software (check_machine). None: a file from before it was recorded.
    machine: dict[str, Any] | None = None

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


@dataclass(frozen=True, kw_only=True)
class RunScale:
    """What a run was, as the model prices it: its nodes, ranks a node, global batch, dropout,
    epochs, splits and where its staging falls."""

    nodes: int
    ranks_per_node: int
    global_batch: int
    train_samples: int
    eval_samples: int
    epochs: int = 1
    dropout: float | None = None
    staging_in_run: bool | None = None

    @classmethod
    def of(cls, run: RunTimes) -> RunScale:
        return cls(
            nodes=run.nodes,
            ranks_per_node=run.accelerators_per_node,
            global_batch=run.global_batch,
            train_samples=run.train_samples,
            eval_samples=run.eval_samples,
            epochs=run.epochs,
            dropout=run.dropout,
            staging_in_run=run.staging_in_run,
        )

    @property
    def dataset(self) -> Dataset:
        return dataclasses.replace(
            MLPERF_COSMOFLOW, train_samples=self.train_samples, val_samples=self.eval_samples
        )


def predict_scale(
    base: Workload,
    run: RunScale,
    cluster: ClusterPreset,
    software: SoftwareProfile | None,
    stragglers: Stragglers,
    *,
    layers: GpuLayerTimes | None = None,
    layer_scale: float = 1.0,
    eval_scale: float = 1.0,
) -> TimeToTrain:
    """The model's times of `run` on `cluster` (its nodes, GPUs a node, batch, dropout,
    epochs)."""
    gpus = run.nodes * run.ranks_per_node
    model = (
        base.model if run.dropout is None else dataclasses.replace(base.model, dropout=run.dropout)
    )
    work = dataclasses.replace(base, model=model, local_batch=max(1, run.global_batch // gpus))
    _, t = predict_cluster(
        work,
        cluster,
        nodes=run.nodes,
        epochs=run.epochs,
        dataset=run.dataset,
        staging_in_run=run.staging_in_run,
        software=software,
        stragglers=stragglers,
        calibration=layers,
        layer_scale=layer_scale,
        eval_scale=eval_scale,
    )
    return t


def machine_description(accelerator: AcceleratorSpec | str, software: str | None) -> dict:
    """The machine a calibration is made against and applies to: the accelerator as the model
    prices it (its name, generation, peaks, memory, HBM, share of peak, links) and the software
    profile."""
    if isinstance(accelerator, str):  # this CPU: its own calibration grid prices it
        return {"accelerator": {"name": accelerator}, "software": software}
    spec = accelerator
    fields = ("name", "arch", "peak_tflops", "memory_gb", "hbm_gbyte_s", "conv3d_share")
    described = {f: getattr(spec, f) for f in fields}
    described["peak_tflops"] = dict(spec.peak_tflops)
    return {"accelerator": described, "software": software}


def check_machine(cal: RunCalibration, path: Path, asked: dict) -> None:
    """A one-line ValueError naming the file, the key and both values where `cal` was made
    against another accelerator or software than `asked` (machine_description)."""
    if cal.machine is None:
        raise ValueError(
            f"{path}: records no machine (made before calibrations did): --accept-calibration "
            "to apply it anyway, or make it again with calibrate --from-run"
        )
    for key in ("accelerator", "software"):
        made, want = cal.machine.get(key), asked.get(key)
        if made == want:
            continue
        if isinstance(made, dict) and isinstance(want, dict):
            key, made, want = next(
                (f"accelerator.{k}", made.get(k), want.get(k))
                for k in sorted(set(made) | set(want))
                if made.get(k) != want.get(k)
            )
        raise ValueError(
            f"{path}: made against {key} {made!r}, asked for {want!r} (--accept-calibration "
            "applies it anyway)"
        )


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
    run = with_system(run_times(path, read_events(path)), system_description(path)[1])
    preset, software = mllog_preset(path, run)
    return calibrate_run(run, preset, software, base, stragglers=stragglers)


def calibrate_run(
    run: RunTimes,
    preset: str,
    software: SoftwareProfile | None,
    base: Workload,
    *,
    stragglers: Stragglers = GPU_STRAGGLERS,
    cluster: ClusterPreset | None = None,
    first_eval_beyond_memory: bool = True,
) -> RunCalibration:
    """The layers' scale that makes the model's step the run's, and the evaluation step's, at
    the run's own scale (nodes, GPUs a node, batch); `cluster`: `preset`'s, or a variant of it
    (benchmarks/against_mlperf.py's strict table); first_eval_beyond_memory: where a node's
    staged share outgrows its memory, calibrate evaluation from the first (else the median)."""
    cluster = cluster or CLUSTERS[preset]
    scale_of = RunScale.of(run)
    gpus = run.nodes * run.accelerators_per_node
    scale = 1.0
    # The exposed all-reduce depends on how long backward runs (DDP's overlap): a fixed point.
    for _ in range(4):
        t = predict_scale(base, scale_of, cluster, software, stragglers, layer_scale=scale)
        scale = layer_scale_for(run.step_s, t, stragglers, gpus, scale)
    t = predict_scale(base, scale_of, cluster, software, stragglers, layer_scale=scale)
    # Where a node's staged share outgrows its memory, only the first evaluation reads the
    # validation split from the page cache the model prices; the later ones from the drives.
    beyond = staged_beyond_memory(cluster, scale_of.dataset, run.nodes)
    evaluation = run.eval_s[0] if beyond and first_eval_beyond_memory else run.median_eval_s
    eval_step = (evaluation - t.eval_reduce_s) / t.eval_steps
    return make_calibration(
        str(run.path),
        cluster,
        software,
        scale_of,
        (run.step_s, scale),
        eval_step_s=eval_step,
        eval_scale=max(eval_step, 1e-9) / t.eval_step_s,
        stragglers_cv=stragglers.cv,
    )


def make_calibration(
    source: str,
    cluster: ClusterPreset | None,
    software: SoftwareProfile | None,
    run: RunScale,
    step_and_scale: tuple[float, float],
    *,
    eval_step_s: float | None = None,
    eval_scale: float = 1.0,
    stragglers_cv: float = 0.0,
) -> RunCalibration:
    """One calibration record: the measured step and the layers' scale it gives, with the
    machine it was made against (`cluster` None: this CPU)."""
    name = None if software is None else software.name
    step_s, layer_scale = step_and_scale
    accelerator = THIS_CPU if cluster is None else cluster.spec
    return RunCalibration(
        source=source,
        preset=THIS_CPU if cluster is None else cluster.name,
        software=name,
        nodes=run.nodes,
        ranks_per_node=run.ranks_per_node,
        global_batch=run.global_batch,
        step_s=step_s,
        eval_step_s=eval_step_s,
        layer_scale=layer_scale,
        eval_scale=eval_scale,
        stragglers_cv=stragglers_cv,
        machine=machine_description(accelerator, name),
    )


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
