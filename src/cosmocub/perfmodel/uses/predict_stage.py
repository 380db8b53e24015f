"""`perf-model predict`: its flags resolved to the mesh, the device and one network per link
rate, the train split's size, and the step printed; a bad flag is a ValueError naming it and
the numbers. cosmocub.cli.perf_model_commands parses the flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config
from cosmocub.perfmodel.cost_model.cluster_presets import ClusterPreset, cluster, described_cluster
from cosmocub.perfmodel.cost_model.machines import (
    THIS_CPU,
    ThisCpu,
    accelerator_spec,
    fitted_network,
    this_cpu,
)
from cosmocub.perfmodel.cost_model.software import COSMOCUB_EAGER
from cosmocub.perfmodel.cost_model.spec_accelerator import SpecAccelerator
from cosmocub.perfmodel.cost_model.step_model import DDP_OPTIMIZERS
from cosmocub.perfmodel.cost_model.topology import Mesh, Network
from cosmocub.perfmodel.measure.calibration_cache import calibration_path, load_or_calibrate
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes
from cosmocub.perfmodel.measure.link_fits import LinkFits, read_fits
from cosmocub.perfmodel.uses.run_calibration import (
    GPU_STRAGGLERS,
    RunCalibration,
    is_run_calibration,
)
from cosmocub.perfmodel.uses.run_prediction import (
    Workload,
    format_table,
    lion_reference,
    predict_run,
    rate_label,
    train_samples,
)
from cosmocub.perfmodel.uses.time_to_train import TimeToTrain, config_dataset, predict_cluster


def mesh_from_flags(
    cfg: Config,
    data: int | None,
    spatial: int | None,
    split: tuple[int, int, int] | None,
    *,
    nodes: int,
    ranks_per_node: int,
) -> Mesh:
    """The mesh of --mesh / --data / --spatial / --split, checked against --nodes × --ranks-per-
    node; spatial defaults to the split's or parallel.spatial, data to what the ranks leave."""
    world = nodes * ranks_per_node
    if split is not None and spatial is not None and math.prod(split) != spatial:
        raise ValueError(
            f"--split {','.join(map(str, split))} multiplies to {math.prod(split)}, not the "
            f"mesh's spatial {spatial}"
        )
    if spatial is None:
        spatial = math.prod(split) if split is not None else cfg.parallel.spatial
    if data is None:
        if world % spatial:
            raise ValueError(
                f"spatial {spatial} does not divide --nodes {nodes} x --ranks-per-node "
                f"{ranks_per_node} = {world} ranks"
            )
        data = world // spatial
    if data * spatial != world:
        raise ValueError(
            f"--mesh {data}x{spatial} is {data * spatial} ranks, not --nodes {nodes} x "
            f"--ranks-per-node {ranks_per_node} = {world}"
        )
    if split is None:
        # As training splits it: the config's split at its spatial, else depth only.
        split = cfg.parallel.split_dhw if cfg.parallel.spatial == spatial else (spatial, 1, 1)
    return Mesh(data=data, split=split)


def machine_from_flags(
    cfg: Config,
    accelerator: str | None,
    fits: LinkFits | None,
    rates_mbit: Sequence[float] | None,
    *,
    nodes: int,
    ranks_per_node: int,
    calibration: Path | None = None,
) -> tuple[ThisCpu, list[Network], list[float]]:
    """(this CPU, one network per link rate, the rates) of --accelerator cpu, --fit (read:
    `fits`), --calibration (this CPU's: measured now where there is none) and --rate-mbit; a GPU
    is priced by described_presets."""
    known = ", ".join(cfg.perf_model.extrapolate.accelerators)
    name = accelerator or (THIS_CPU if fits is not None else None)
    if name is None:
        raise ValueError(
            f"--accelerator: none given; one of {known} (perf_model.extrapolate.accelerators), "
            f"or {THIS_CPU} (this machine) with --fit FILE"
        )
    if name != THIS_CPU:
        raise ValueError(
            f"--accelerator {name} with --fit: a GPU's links are NCCL's (leave --fit out); "
            f"--fit is this machine's, for --accelerator {THIS_CPU}"
        )
    if fits is None:
        raise ValueError(
            f"--accelerator {THIS_CPU}: needs --fit FILE (this machine's alpha-beta fit: "
            "cosmocub perf-model fit)"
        )
    cores = cfg.perf_model.cores or len(os.sched_getaffinity(0))
    # --calibration: this CPU's grid, or one run's (calibrate --from-run) over the default grid.
    run = (
        RunCalibration.read(calibration)
        if calibration and is_run_calibration(calibration)
        else None
    )
    path = calibration_path(cfg, None if run is not None else calibration)
    device = this_cpu(
        threads_per_rank=cfg.train.threads_per_rank,
        ranks_per_node=ranks_per_node,
        cores=cores,
        calibration=load_or_calibrate(path, cfg.perf_model.calibration, cores=cores),
    )
    if run is not None:
        if run.preset != THIS_CPU:
            raise ValueError(
                f"--calibration {calibration}: a run on {run.preset}, not this CPU (give it to "
                "--gpu-calibration with --cluster)"
            )
        device = dataclasses.replace(device, slowdown=device.slowdown * run.layer_scale)
    rates = [0.0] if rates_mbit is None else list(rates_mbit)
    if bad := [r for r in rates if r < 0]:
        raise ValueError(f"--rate-mbit {bad[0]:g}: a link rate must be >= 0 (0: the fitted link)")
    # One node: no link between nodes to take a rate of (loopback only is enough).
    networks = [
        fitted_network(fits, rate_mbit=r if nodes > 1 else None, ranks_per_node=ranks_per_node)
        for r in rates
    ]
    return device, networks, rates


def samples_from_flags(
    cfg: Config, given: int | None, epochs: int | None
) -> tuple[int | None, str | None]:
    """(train samples, a note when they are unknown): --train-samples, else the config's dataset
    sizes; unknown is an error only when --epochs asks for the epochs' time."""
    if given is not None:
        return given, None
    try:
        return train_samples(cfg), None
    except ValueError as err:
        if epochs is not None:
            raise ValueError(
                f"--epochs {epochs}: needs the train split's size ({err}); give --train-samples"
            ) from None
        return None, f"epoch time: not predicted ({err}; give --train-samples N)"


def print_prediction(
    cfg: Config,
    *,
    data: int | None,
    spatial: int | None,
    split: tuple[int, int, int] | None,
    nodes: int,
    ranks_per_node: int,
    rates_mbit: Sequence[float] | None,
    accelerator: str | None,
    fit_path: Path | None,
    epochs: int | None,
    train_samples: int | None,
    as_json: bool,
    calibration: Path | None = None,
    gpu_calibration: Path | None = None,
) -> None:
    """Print the step of `cfg` on a data × spatial mesh of nodes × ranks_per_node, one column per
    link rate (a table, or JSON); the arguments are `perf-model predict`'s flags. A GPU (an
    --accelerator without --fit) is priced as a preset is (print_on_clusters)."""

    mesh = mesh_from_flags(cfg, data, spatial, split, nodes=nodes, ranks_per_node=ranks_per_node)
    if fit_path is None and accelerator not in (None, THIS_CPU):
        # A GPU described by flags: the same accelerator, NCCL and profiles as a preset.
        link_gbit = cfg.perf_model.extrapolate.link_gbit
        rates = [1e3 * g for g in link_gbit] if rates_mbit is None else list(rates_mbit)
        presets = described_presets(cfg, accelerator, rates, ranks_per_node=ranks_per_node)
        print_on_clusters(
            cfg,
            presets,
            nodes=nodes,
            mesh=mesh,
            epochs=epochs,
            train_samples=train_samples,
            gpu_calibration=gpu_calibration,
            as_json=as_json,
            rates_mbit=rates,
        )
        return
    fits = None if fit_path is None else read_fits(fit_path)
    device, networks, rates = machine_from_flags(
        cfg,
        accelerator,
        fits,
        rates_mbit,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        calibration=calibration,
    )
    samples, note = samples_from_flags(cfg, train_samples, epochs)
    work = Workload.of(cfg)
    if epochs is not None:
        work = dataclasses.replace(work, epochs=epochs)
    lion = lion_reference(cfg)
    predictions = [
        predict_run(work, mesh, network, device, lion=lion, train_samples=samples)
        for network in networks
    ]
    if as_json:
        out = [{"rate_mbit": r, **p.as_dict()} for r, p in zip(rates, predictions, strict=True)]
        print(json.dumps({"config": cfg.source, "note": note, "predictions": out}, indent=1))
        return
    p = predictions[0]
    links = (
        f"alpha-beta fitted in {fit_path} (between nodes: the fit's alpha, beta at the rate)"
        if fit_path
        else f"assumed: {cfg.perf_model.extrapolate.latency_us:g} us a message round between "
        f"nodes, {cfg.perf_model.extrapolate.intra_latency_us:g} us within one"
    )
    ddp = ""
    if cfg.optimizer.name in DDP_OPTIMIZERS:
        how = "overlapped with backward" if p.ddp_overlap else "blocking"
        ddp = f", DDP all-reduce {how} (train.ddp_exchange_timing)"
    print(
        f"{cfg.source}: {cfg.optimizer.name}{ddp}, {cfg.model.input_size}^3 samples, local "
        f"batch {cfg.train.local_batch_size}\n"
        f"mesh {mesh.data} data x {mesh.spatial} spatial (split "
        f"{'x'.join(map(str, mesh.split))}) = {mesh.world} ranks on {p.nodes} nodes x "
        f"{ranks_per_node}\n{device.describe()}\nlinks: {links}\n"
    )
    print(format_table([rate_label(r) for r in rates], predictions))
    if note:
        print(note)


def print_cluster_prediction(
    cfg: Config,
    *,
    cluster_name: str,
    nodes: int,
    ranks_per_node: int | None,
    data: int | None,
    spatial: int | None,
    split: tuple[int, int, int] | None,
    epochs: int | None,
    train_samples: int | None,
    gpu_calibration: Path | None,
    as_json: bool,
) -> None:
    """`perf-model predict --cluster NAME --nodes N`: the preset's nodes, accelerator (roofline,
    --gpu-calibration's layer times, or one measured run's device time) and NCCL's collectives;
    the step's parts and the time to train over the config's own samples and splits
    (time_to_train.config_dataset; --train-samples in place of its train split's) for --epochs
    (or train.epochs)."""
    preset = cluster(cluster_name)
    if ranks_per_node is not None and ranks_per_node != preset.ranks_per_node:
        raise ValueError(
            f"--ranks-per-node {ranks_per_node}: --cluster {preset.name} has "
            f"{preset.ranks_per_node} a node (leave the flag out)"
        )
    mesh = mesh_from_flags(
        cfg, data, spatial, split, nodes=nodes, ranks_per_node=preset.ranks_per_node
    )
    print_on_clusters(
        cfg,
        [(preset.name, preset)],
        nodes=nodes,
        mesh=mesh,
        epochs=epochs,
        train_samples=train_samples,
        gpu_calibration=gpu_calibration,
        as_json=as_json,
    )


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
    epochs: int | None,
    train_samples: int | None,
    gpu_calibration: Path | None,
    as_json: bool,
    rates_mbit: Sequence[float] | None = None,
) -> None:
    """The step and time to train on each preset (a column each): cosmocub's own step
    (software profile cosmocub_eager), the GPU ranks' spread (run_calibration.GPU_STRAGGLERS),
    and --gpu-calibration's layer times or one run's device time where given."""
    dataset = config_dataset(cfg, train_samples=train_samples)
    work = Workload.of(cfg)
    work = dataclasses.replace(work, epochs=epochs or work.epochs)
    layers, run = _gpu_calibration(gpu_calibration)
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
            software=COSMOCUB_EAGER if run is None else run.software_profile,
            stragglers=GPU_STRAGGLERS,
            layer_scale=1.0 if run is None else run.layer_scale,
            eval_scale=1.0 if run is None else run.eval_scale,
        )
        for _, preset in presets
    ]
    if as_json:
        out = [
            {"cluster": preset.name, **_parts(ttt), **p.as_dict()}
            | ({} if rates_mbit is None else {"rate_mbit": rates_mbit[i]})
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
    for (label, _), (_, ttt) in zip(presets, results, strict=True):
        staging = "not known" if ttt.staging_s is None else f"{ttt.staging_s:.3g} s"
        where = "inside" if ttt.staging_in_run else "outside"
        print(
            f"\n{label}: host {1e3 * ttt.host_s:.3g} ms and the wait for the slowest of "
            f"{mesh.world} ranks {1e3 * ttt.straggler_s:.3g} ms a step (cv "
            f"{GPU_STRAGGLERS.cv:g}), data wait {1e3 * ttt.data_wait_s:.3g} ms: "
            f"{1e3 * ttt.full_step_s:.4g} ms a step; training epoch {ttt.train_epoch_s:.3g} s "
            f"({ttt.steps_per_epoch} steps); evaluation {ttt.eval_s:.3g} s ({ttt.eval_steps} "
            f"forward steps); staging {staging} ({where} the timed run)\ntime to train: "
            f"{ttt.total_s:.4g} s for {ttt.epochs} epochs"
        )


def _parts(ttt: TimeToTrain) -> dict[str, object]:
    return {
        "step_s": ttt.step_s,
        "host_s": ttt.host_s,
        "straggler_s": ttt.straggler_s,
        "data_wait_s": ttt.data_wait_s,
        "full_step_s": ttt.full_step_s,
        "training_epoch_s": ttt.train_epoch_s,
        "evaluation_s": ttt.eval_s,
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
