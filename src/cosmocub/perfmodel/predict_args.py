"""What `perf-model predict`'s flags resolve to: the mesh, the device and one network per link
rate, the train split's size; a bad flag is a ValueError naming it and the numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

from cosmocub.config import Config
from cosmocub.perfmodel.links import LinkFits
from cosmocub.perfmodel.machines import (
    THIS_CPU,
    Accelerator,
    ThisCpu,
    assumed_network,
    fitted_network,
    this_cpu,
)
from cosmocub.perfmodel.mesh import Mesh, Network
from cosmocub.perfmodel.predict import train_samples


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
) -> tuple[Accelerator | ThisCpu, list[Network], list[float]]:
    """(device, one network per link rate, the rates) of --accelerator, --fit (read: `fits`),
    --calibration (this CPU's: measured now where there is none) and --rate-mbit."""
    settings = cfg.perf_model.extrapolate
    known = ", ".join(settings.accelerators)
    name = accelerator or (THIS_CPU if fits is not None else None)
    if name is None:
        raise ValueError(
            f"--accelerator: none given; one of {known} (perf_model.extrapolate.accelerators), "
            f"or {THIS_CPU} (this machine) with --fit FILE"
        )
    if name == THIS_CPU:
        if fits is None:
            raise ValueError(
                f"--accelerator {THIS_CPU}: needs --fit FILE (this machine's alpha-beta fit: "
                "cosmocub perf-model fit)"
            )
        from cosmocub.perfmodel.cpu_model import calibration_path, load_or_calibrate

        cores = cfg.perf_model.cores or len(os.sched_getaffinity(0))
        path = calibration_path(cfg, calibration)
        device = this_cpu(
            threads_per_rank=cfg.train.threads_per_rank,
            ranks_per_node=ranks_per_node,
            cores=cores,
            calibration=load_or_calibrate(path, cfg.perf_model.calibration, cores=cores),
        )
    elif name in settings.accelerators:
        device = Accelerator(
            name=name, spec=settings.accelerators[name], bytes_per_value=settings.activation_bytes
        )
    else:
        raise ValueError(
            f"--accelerator {name}: not one of {known} (perf_model.extrapolate.accelerators) "
            f"nor {THIS_CPU} (this machine)"
        )
    if rates_mbit is None:
        rates = [0.0] if fits is not None else [1e3 * g for g in settings.link_gbit]
    else:
        rates = list(rates_mbit)
    if bad := [r for r in rates if r < 0 or (r == 0 and fits is None)]:
        need = ">= 0 (0: the fitted link)" if fits is not None else "> 0 (no --fit to take it from)"
        raise ValueError(f"--rate-mbit {bad[0]:g}: a link rate must be {need}")
    if fits is not None:
        # One node: no link between nodes to take a rate of (loopback only is enough).
        networks = [
            fitted_network(fits, rate_mbit=r if nodes > 1 else None, ranks_per_node=ranks_per_node)
            for r in rates
        ]
    else:
        spec = settings.accelerators[name]
        networks = [
            assumed_network(settings, spec, rate_mbit=r, ranks_per_node=ranks_per_node)
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
