"""`perf-model predict`: its flags resolved to the mesh, the device and one network per link
rate, the train split's size, and the step printed; a bad flag is a ValueError naming it and
the numbers. cosmocub.cli.perf_model_commands parses the flags.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config
from cosmocub.perfmodel.cost_model.machines import (
    THIS_CPU,
    ThisCpu,
    fitted_network,
    this_cpu,
)
from cosmocub.perfmodel.cost_model.topology import Network
from cosmocub.perfmodel.measure.calibration_cache import calibration_path, load_or_calibrate
from cosmocub.perfmodel.measure.link_fits import LinkFits, read_fits
from cosmocub.perfmodel.uses.cluster_stage import described_presets, print_on_clusters
from cosmocub.perfmodel.uses.predict_flags import MeshFlags, PricingFlags
from cosmocub.perfmodel.uses.run_calibration import (
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
    flags: MeshFlags,
    pricing: PricingFlags,
    *,
    rates_mbit: Sequence[float] | None,
    accelerator: str | None,
    fit_path: Path | None,
    calibration: Path | None = None,
) -> None:
    """Print the step of `cfg` on a data × spatial mesh of nodes × ranks_per_node, one column per
    link rate (a table, or JSON); the arguments are `perf-model predict`'s flags. A GPU (an
    --accelerator without --fit) is priced as a preset is (print_on_clusters)."""
    mesh = flags.mesh(cfg)  # refuses a missing --ranks-per-node
    nodes, ranks_per_node = flags.nodes, mesh.world // flags.nodes
    if fit_path is None and accelerator not in (None, THIS_CPU):
        # A GPU described by flags: the same accelerator, NCCL and profiles as a preset.
        link_gbit = cfg.perf_model.extrapolate.link_gbit
        rates = [1e3 * g for g in link_gbit] if rates_mbit is None else list(rates_mbit)
        presets = described_presets(cfg, accelerator, rates, ranks_per_node=ranks_per_node)
        print_on_clusters(cfg, presets, nodes=nodes, mesh=mesh, pricing=pricing, rates_mbit=rates)
        return
    if pricing.software is not None:
        raise ValueError(
            f"--software {pricing.software}: a GPU's stack, priced with --cluster or a GPU "
            "--accelerator (this CPU's step is measured, not profiled)"
        )
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
    samples, note = samples_from_flags(cfg, pricing.train_samples, pricing.epochs)
    work = Workload.of(cfg)
    if pricing.epochs is not None:
        work = dataclasses.replace(work, epochs=pricing.epochs)
    lion = lion_reference(cfg)
    predictions = [
        predict_run(work, mesh, network, device, lion=lion, train_samples=samples)
        for network in networks
    ]
    if pricing.as_json:
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
    if cfg.optimizer.name.averages_gradients:
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
