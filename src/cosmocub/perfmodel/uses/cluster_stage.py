"""`perf-model predict` on GPU clusters: a preset (--cluster NAME) or a machine described by
flags (--accelerator NAME --rate-mbit R), each priced the same way: the roofline or a GPU
calibration, NCCL's collectives, the software profile and the wait for the slowest rank, then
the time to train.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config
from cosmocub.perfmodel.cost_model.cluster_presets import ClusterPreset, cluster, described_cluster
from cosmocub.perfmodel.cost_model.machines import THIS_CPU, accelerator_spec
from cosmocub.perfmodel.cost_model.software import COSMOCUB_EAGER, profile
from cosmocub.perfmodel.cost_model.spec_accelerator import SpecAccelerator
from cosmocub.perfmodel.cost_model.topology import Mesh
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.uses.predict_flags import MeshFlags, PricingFlags
from cosmocub.perfmodel.uses.run_calibration import (
    GPU_STRAGGLERS,
    RunCalibration,
    check_machine,
    is_run_calibration,
    machine_description,
)
from cosmocub.perfmodel.uses.run_prediction import (
    Workload,
    format_table,
    lion_reference,
    rate_label,
)
from cosmocub.perfmodel.uses.time_to_train import TimeToTrain, config_dataset, predict_cluster
from cosmocub.perfmodel.uses.uncalibrated_spread import Spread, ranges, read_spread, spread_text


def print_cluster_prediction(
    cfg: Config, cluster_name: str, flags: MeshFlags, pricing: PricingFlags
) -> None:
    """`perf-model predict --cluster NAME --nodes N`: the preset's nodes, accelerator (roofline,
    --gpu-calibration's layer times, or one measured run's device time) and NCCL's collectives;
    the step's parts and the time to train over the config's own samples and splits
    (time_to_train.config_dataset; --train-samples in place of its train split's) for --epochs
    (or train.epochs)."""
    preset = cluster(cluster_name)
    if flags.ranks_per_node not in (None, preset.ranks_per_node):
        raise ValueError(
            f"--ranks-per-node {flags.ranks_per_node}: --cluster {preset.name} has "
            f"{preset.ranks_per_node} a node (leave the flag out)"
        )
    mesh = flags.mesh(cfg, preset.ranks_per_node)
    print_on_clusters(cfg, [(preset.name, preset)], nodes=flags.nodes, mesh=mesh, pricing=pricing)


def described_presets(
    cfg: Config, accelerator: str, rates_mbit: Sequence[float], *, ranks_per_node: int
) -> list[tuple[str, ClusterPreset]]:
    """One preset per --rate-mbit for a machine described by flags: --accelerator's entry of
    perf_model.extrapolate.accelerators priced by the roofline (machines.accelerator_spec),
    --ranks-per-node GPUs a node, each with a NIC of its own (rails) sharing the node's rate,
    NVLink within at the entry's intra_node_gbit."""
    settings = cfg.perf_model.extrapolate
    if accelerator not in settings.accelerators:
        raise ValueError(
            f"--accelerator {accelerator}: not one of {', '.join(settings.accelerators)} "
            f"(perf_model.extrapolate.accelerators) nor {THIS_CPU} (this machine)"
        )
    spec = accelerator_spec(accelerator, settings.accelerators[accelerator])
    if bad := [r for r in rates_mbit if r <= 0]:
        raise ValueError(
            f"--rate-mbit {bad[0]:g}: a link rate must be > 0 (no --fit to take it from)"
        )
    return [
        (
            rate_label(r),
            described_cluster(spec, ranks_per_node=ranks_per_node, node_gbit_s=r / 1e3),
        )
        for r in rates_mbit
    ]


def print_on_clusters(
    cfg: Config,
    presets: Sequence[tuple[str, ClusterPreset]],
    *,
    nodes: int,
    mesh: Mesh,
    pricing: PricingFlags,
    rates_mbit: Sequence[float] | None = None,
) -> None:
    """The step and time to train on each preset (a column each): cosmocub's own step
    (software profile cosmocub_eager), the GPU ranks' spread (run_calibration.GPU_STRAGGLERS),
    and --gpu-calibration's layer times or one run's device time where given."""
    dataset = config_dataset(cfg, train_samples=pricing.train_samples)
    work = Workload.of(cfg)
    work = dataclasses.replace(work, epochs=pricing.epochs or work.epochs)
    layers, run = _gpu_calibration(pricing.gpu_calibration)
    # The stack asked for: --software, else the calibration's own (the run it reproduces at
    # another scale), else cosmocub's eager step.
    if pricing.software is not None:
        try:
            software = profile(pricing.software)
        except ValueError as err:
            raise ValueError(f"--software: {err}") from None
    else:
        software = COSMOCUB_EAGER if run is None else run.software_profile
    if run is not None and not pricing.accept_calibration:
        assert pricing.gpu_calibration is not None
        asked_software = run.software if pricing.software is None else pricing.software
        for _, preset in presets:
            asked = machine_description(preset.spec, asked_software)
            check_machine(run, pricing.gpu_calibration, asked)
    results = [
        predict_cluster(
            work,
            preset,
            nodes=nodes,
            epochs=work.epochs,
            dataset=dataset,
            calibration=layers,
            mesh=mesh,
            lion=lion_reference(cfg),
            software=software,
            stragglers=GPU_STRAGGLERS,
            layer_scale=1.0 if run is None else run.layer_scale,
            eval_scale=1.0 if run is None else run.eval_scale,
        )
        for _, preset in presets
    ]
    # With nothing measured, the answer carries how far such answers have been from published
    # runs of its GPU family (uncalibrated_spread).
    spread = read_spread() if pricing.gpu_calibration is None else None
    if pricing.as_json:
        out = [
            {"cluster": preset.name, **_parts(ttt), **p.as_dict()}
            | ({} if rates_mbit is None else {"rate_mbit": rates_mbit[i]})
            | ({} if spread is None else _ranges(spread, preset, ttt))
            for i, ((_, preset), (p, ttt)) in enumerate(zip(presets, results, strict=True))
        ]
        print(json.dumps({"config": cfg.source, "predictions": out}, indent=1))
        return
    preset = presets[0][1]
    node = preset.nccl_node()
    scale = 1.0 if run is None else run.layer_scale
    device = SpecAccelerator(spec=preset.spec, calibration=layers, layer_scale=scale)
    print(
        f"{cfg.source}: {cfg.optimizer.name}, {cfg.model.input_size}^3 samples, local batch "
        f"{work.local_batch}\n{preset.system}: {nodes} nodes x {preset.ranks_per_node} = "
        f"{mesh.world} ranks, mesh {mesh.data} data x {mesh.spatial} spatial\n"
        f"{device.describe()}\nlinks: NCCL's model ({node.nics} NICs x {node.nic_gbyte_s:g} GB/s "
        f"a node, {node.intra_gbyte_s:g} GB/s within, LL128 {'on' if node.ll128 else 'off'}); "
        f"data: {dataset.train_samples} train / {dataset.val_samples} validation samples of "
        f"{dataset.sample_bytes / 1e6:.3g} MB\n"
    )
    print(format_table([label for label, _ in presets], [p for p, _ in results]))
    for (label, each), (_, ttt) in zip(presets, results, strict=True):
        staging = "not known" if ttt.staging_s is None else f"{ttt.staging_s:.3g} s"
        where = "inside" if ttt.staging_in_run else "outside"
        later = (
            ""
            if ttt.later_eval_step_s is None
            else f", the later ones {ttt.later_eval_s:.3g} s (read from the node's drives: its "
            "staged share outgrows its memory)"
        )
        print(
            f"\n{label}: host {1e3 * ttt.host_s:.3g} ms and the wait for the slowest of "
            f"{mesh.world} ranks {1e3 * ttt.straggler_s:.3g} ms a step (cv "
            f"{GPU_STRAGGLERS.cv:g}), data wait {1e3 * ttt.data_wait_s:.3g} ms: "
            f"{1e3 * ttt.full_step_s:.4g} ms a step; training epoch {ttt.train_epoch_s:.3g} s "
            f"({ttt.steps_per_epoch} steps); evaluation {ttt.eval_s:.3g} s ({ttt.eval_steps} "
            f"forward steps){later}; staging {staging} ({where} the timed run)\ntime to train: "
            f"{ttt.total_s:.4g} s for {ttt.epochs} epochs"
        )
        if spread is not None:
            own = software is COSMOCUB_EAGER
            print(
                spread_text(
                    spread, each.spec.name, ttt.full_step_s, ttt.train_epoch_s, own_step=own
                )
            )


def _ranges(spread: Spread, preset: ClusterPreset, ttt: TimeToTrain) -> dict[str, object]:
    """step_s_range and training_epoch_s_range ([low, high] seconds; None: no published run of
    the GPU family), and where they come from."""
    found = ranges(spread.of_gpu(preset.spec.name), ttt.full_step_s, ttt.train_epoch_s)
    step, epoch = (None, None) if found is None else found
    source = f"{spread.source}, {spread.date}"
    return {"step_s_range": step, "training_epoch_s_range": epoch, "range_source": source}


def _parts(ttt: TimeToTrain) -> dict[str, object]:
    return {
        "step_s": ttt.step_s,
        "host_s": ttt.host_s,
        "straggler_s": ttt.straggler_s,
        "data_wait_s": ttt.data_wait_s,
        "full_step_s": ttt.full_step_s,
        "training_epoch_s": ttt.train_epoch_s,
        "evaluation_s": ttt.eval_s,
        "later_evaluation_s": ttt.later_eval_s,
        "staging_s": ttt.staging_s,
        "staging_in_run": ttt.staging_in_run,
        "epochs": ttt.epochs,
        "time_to_train_s": ttt.total_s,
    }


def _gpu_calibration(path: Path | None) -> tuple[GpuLayerTimes | None, RunCalibration | None]:
    """--gpu-calibration: layer times (calibrate --device cuda) or a run (--from-run)."""
    if path is None:
        return None, None
    if is_run_calibration(path):
        run = RunCalibration.read(path)
        if run.preset == THIS_CPU:
            raise ValueError(
                f"--gpu-calibration {path}: a run on this CPU (give it to --calibration with "
                "--accelerator cpu --fit)"
            )
        return None, run
    return GpuLayerTimes.read(path), None
