"""Extrapolate the step model to accelerator clusters: a model config (the MLPerf CosmoFlow) at
several sample sizes on up to thousands of GPUs, per accelerator class and network bandwidth,
Lion against Lion Cub, every power-of-two spatial split that runs; one `predict` per row, with
the assumptions written out beside the table.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmocub.config import (
    Config,
    ExtrapolateConfig,
    ModelConfig,
    OptimizerKind,
    derive,
    optimizer_variant,
)
from cosmocub.models.parallelize import check_spatial_split
from cosmocub.perfmodel.cost_model.machines import (
    UPDATE_BYTES_PER_PARAM,
    Accelerator,
    assumed_network,
)
from cosmocub.perfmodel.cost_model.topology import Mesh
from cosmocub.perfmodel.uses.run_prediction import (
    STATE_BYTES_PER_PARAM,
    Prediction,
    Workload,
    predict_run,
)


def update_bytes_per_param(optimizer: str, entry: str) -> int:
    """UPDATE_BYTES_PER_PARAM of `optimizer`; a ValueError naming the entry for one it lacks."""
    if optimizer not in UPDATE_BYTES_PER_PARAM:
        raise ValueError(
            f"perf_model.extrapolate.optimizers.{entry}: no update cost for optimizer.name "
            f"{optimizer!r} (UPDATE_BYTES_PER_PARAM has {', '.join(UPDATE_BYTES_PER_PARAM)})"
        )
    return UPDATE_BYTES_PER_PARAM[optimizer]


COLUMNS = (
    "accelerator",
    "sample_size",
    "link_gbit",
    "gpus",
    "nodes",
    "data",
    "spatial",
    "split",
    "optimizer",
    "fits_memory",
    "memory_gb",
    "step_s",
    "compute_s",
    "halo_s",
    "exchange_s",
    "momentum_sync_s",
    "optimizer_s",
    "halo_share",
    "halo_share_of_compute",
    "exchange_share",
    "samples_per_s",
    "comm_bytes_per_step",
    "inter_node_bytes_per_step",
)


def balanced_split(spatial: int) -> tuple[int, int, int]:
    """A power-of-two spatial size spread over D, H, W as evenly as it goes (D first)."""
    split = [1, 1, 1]
    for i in range(int(math.log2(spatial))):
        split[i % 3] *= 2
    return split[0], split[1], split[2]


def optimizer_configs(base: Config, settings: ExtrapolateConfig) -> dict[str, Any]:
    """name -> OptimizerConfig: the base config's optimizer section replaced by each entry."""
    out = {}
    for name, section in settings.optimizers.items():
        replace = {"optimizer": optimizer_variant(base.values["optimizer"], section)}
        source = f"perf_model.extrapolate.optimizers.{name}"
        out[name] = derive(base, {}, replace=replace, source=source).optimizer
        update_bytes_per_param(out[name].name, name)
    return out


def extrapolate(base: Config, settings: ExtrapolateConfig) -> list[dict[str, Any]]:
    """One row per accelerator, sample size, link, GPU count, spatial split and optimizer: the
    base config with that optimizer, DDP overlapped (as a user runs it on GPUs), predicted."""
    base_work = dataclasses.replace(Workload.of(base), ddp_overlap=True)
    variants = {
        name: dataclasses.replace(base_work, optimizer=opt)
        for name, opt in optimizer_configs(base, settings).items()
    }
    rows = []
    for acc_name, acc in settings.accelerators.items():
        device = Accelerator(name=acc_name, spec=acc, bytes_per_value=settings.activation_bytes)
        for size, link in itertools.product(settings.sample_sizes, settings.link_gbit):
            sized = {name: work.at_sample_size(size) for name, work in variants.items()}
            model_cfg = next(iter(sized.values())).model
            network = assumed_network(
                settings, acc, rate_mbit=1e3 * link, ranks_per_node=settings.gpus_per_node
            )
            key = {"accelerator": acc_name, "sample_size": size, "link_gbit": link}
            for gpus in settings.gpus:
                for split in runnable_splits(model_cfg, size, gpus):
                    mesh = Mesh(data=gpus // math.prod(split), split=split)
                    rows += [
                        key | {"gpus": gpus} | _row(predict_run(work, mesh, network, device), name)
                        for name, work in sized.items()
                    ]
    return rows


def runnable_splits(model_cfg: ModelConfig, size: int, gpus: int) -> list[tuple[int, int, int]]:
    """The balanced power-of-two spatial splits of `gpus` that the model can run at `size`,
    from no split up to the first that cannot (larger splits only get narrower)."""
    splits = []
    spatial = 1
    while spatial <= gpus and gpus % spatial == 0:
        split = balanced_split(spatial)
        try:
            check_spatial_split(model_cfg, size, split)
        except ValueError:
            break
        splits.append(split)
        spatial *= 2
    return splits


def _row(p: Prediction, optimizer: str) -> dict[str, Any]:
    s = p.step
    return {
        "nodes": p.nodes,
        "data": p.mesh.data,
        "spatial": p.mesh.spatial,
        "split": "x".join(map(str, p.mesh.split)),
        "optimizer": optimizer,
        "fits_memory": p.fits_memory,
        "memory_gb": p.memory_bytes / 1e9,
        "step_s": s.step_s,
        "compute_s": s.compute_s,
        "halo_s": s.halo_s,
        "exchange_s": s.exchange_s,
        "momentum_sync_s": s.momentum_sync_s,
        "optimizer_s": s.optimizer_s,
        "halo_share": s.halo_s / s.step_s,
        "halo_share_of_compute": s.halo_s / (s.halo_s + s.compute_s),
        "exchange_share": (s.exchange_s + s.momentum_sync_s) / s.step_s,
        "samples_per_s": p.samples_per_s,
        "comm_bytes_per_step": s.comm_bytes_per_step,
        "inter_node_bytes_per_step": s.inter_node_bytes_per_step,
    }


def headline(
    rows: Sequence[Mapping[str, Any]],
    *,
    reference: str,
    candidate: str,
    halo_limit: float,
    others: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """Per accelerator, sample size, link and GPU count: the smallest spatial split that fits in
    memory, the candidate's speedup over the reference there, and the largest split whose halo
    time stays under the limit, as a share of the candidate's step and of its compute + halo;
    for each of `others`, its step and speedup on the same split (`<name>_step_s`,
    `<name>_speedup`)."""
    keys = sorted({(r["accelerator"], r["sample_size"], r["link_gbit"], r["gpus"]) for r in rows})
    out = []
    for acc, size, link, gpus in keys:
        here = [
            r
            for r in rows
            if (r["accelerator"], r["sample_size"], r["link_gbit"], r["gpus"])
            == (acc, size, link, gpus)
        ]
        fitting = sorted({r["spatial"] for r in here if r["fits_memory"]})
        mine = [r for r in here if r["optimizer"] == candidate and r["fits_memory"]]
        under = [r["spatial"] for r in mine if r["halo_share"] < halo_limit]
        under_compute = [r["spatial"] for r in mine if r["halo_share_of_compute"] < halo_limit]
        row: dict[str, Any] = {
            "accelerator": acc,
            "sample_size": size,
            "link_gbit": link,
            "gpus": gpus,
            "min_spatial": fitting[0] if fitting else None,
            "max_spatial_halo_of_step": max(under) if under else None,
            "max_spatial_halo_of_compute": max(under_compute) if under_compute else None,
        }
        if fitting:
            pick = {r["optimizer"]: r for r in here if r["spatial"] == fitting[0]}
            ref, cand = pick[reference], pick[candidate]
            row |= {
                f"{reference}_step_s": ref["step_s"],
                f"{candidate}_step_s": cand["step_s"],
                f"{reference}_exchange_share": ref["exchange_share"],
                "speedup": ref["step_s"] / cand["step_s"],
                "halo_share": cand["halo_share"],
            }
            for name in others:
                row |= {
                    f"{name}_step_s": pick[name]["step_s"],
                    f"{name}_speedup": ref["step_s"] / pick[name]["step_s"],
                }
        out.append(row)
    return out


def assumptions_text(base: Config, settings: ExtrapolateConfig, source: str) -> str:
    accs = "\n".join(
        f"- {Accelerator(name=name, spec=a, bytes_per_value=settings.activation_bytes).describe()}"
        for name, a in settings.accelerators.items()
    )
    optimizers = optimizer_configs(base, settings).values()
    lion_cub = next((o.lion_cub for o in optimizers if o.lion_cub is not None), None)
    if lion_cub is None:  # no Lion Cub among them: the text quotes the schema's default buckets
        replace = {"optimizer": optimizer_variant({}, {"name": OptimizerKind.LION_CUB.value})}
        lion_cub = derive(base, {}, replace=replace, source="lion_cub defaults").optimizer.lion_cub
    bucket_mb = lion_cub.bucket_mb
    return f"""# Assumptions of the extrapolation

Model: `{source}` (model section), local batch {base.train.local_batch_size} samples per data
rank, every sample size in {list(settings.sample_sizes)} with the same layers (so the first dense
layer grows with the sample: flatten of the last block's output).
Optimizers: {", ".join(f"{k} = {v}" for k, v in settings.optimizers.items())}.

Accelerators (forward + backward = 3 x the forward FLOPs of convs and dense layers at peak x
efficiency; the conv stack's work divides over the spatial ranks, the head is replicated; a
measured share is MLPerf Training unet3d's at batch 1, the whole step's, as the roofline's):
{accs}

Network: {settings.gpus_per_node} GPUs per node; between nodes {list(settings.link_gbit)} Gbit/s
per node and {settings.latency_us:g} us per message round; within a node the NVLink rate above and
{settings.intra_latency_us:g} us. Ranks are placed as the code places them (a sample's spatial
ranks consecutive, so on one node while spatial <= GPUs per node). Ring collectives send
2(P-1)/P (all-reduce) or (P-1)/P (all-gather) per rank through one link per node per group;
an all-to-all's ranks of a node share its link. Halo swaps: two faces per split dim, forward
and backward, at {settings.activation_bytes} bytes per value, plus the all-gather of the
features before the head. Lion Cub with `hierarchy: node` (the `_node` rows): the fp32
reduce-scatter of the pre-sign vector over a node's GPUs on the intra-node link, the compressed
vote over the nodes on 1/G of it per GPU (G rails sharing the node's link), the all-gather of the
voted bits inside the node; the 4-bit rows keep 7 levels at any data size (all-to-all).
DDP's all-reduce (the Lion rows) overlaps backward as torch runs it:
buckets in reverse parameter order (1 MiB the first, 25 MiB the rest), each all-reduced once
the backward of its layer (2/3 of the layer's forward + backward) is done, one at a time; the
step holds what is left after backward. Nothing else overlaps (Lion Cub's exchange follows
backward). `cosmocub perf-model predict --accelerator` prices the same entries with the
roofline and NCCL's collectives instead (docs/explanation/cluster_model.md); these rows keep the
above.
Message rounds: each of a ring's 2(P-1) or P-1 rounds (and an all-to-all's P-1) costs the full
alpha, with no tree or pipelining; at thousands of ranks this latency dominates, which is
pessimistic against NCCL's tree algorithms and penalises many small messages (Lion Cub's
{bucket_mb} MiB buckets, two phases each) more than few large ones (DDP's 25 MiB buckets).
Optimizer update: memory-bound, about 20 (Lion) to 28 (Lion Cub, AdamW) bytes per parameter at
the HBM bandwidth. Memory: activations saved for backward (bf16) + {STATE_BYTES_PER_PARAM} bytes
per parameter.
Speedups compare each optimizer with the first on the same mesh (the smallest spatial split
that fits);
the step model ignores data loading and convergence per step.
"""


def plot_extrapolation(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    """One panel per accelerator and sample size: step time against GPUs at the smallest split
    that fits, per optimizer (line style) and link (colour)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from cosmocub.io import atomic_path

    panels = sorted({(r["accelerator"], r["sample_size"]) for r in rows})
    fig = Figure(figsize=(5 * len(panels), 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    links = sorted({r["link_gbit"] for r in rows})
    optimizers = list(dict.fromkeys(r["optimizer"] for r in rows))
    for k, (acc, size) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), k + 1)
        for (c, link), (s, opt) in itertools.product(enumerate(links), enumerate(optimizers)):
            pts = _smallest_split_steps(rows, acc, size, link, opt)
            if pts:
                xs, ys = zip(*pts, strict=True)
                style = ("-", "--", ":")[s % 3]
                ax.plot(
                    xs, ys, style, color=f"C{c}", marker="o", ms=3, label=f"{opt} {link:g} Gb/s"
                )
        ax.set(xscale="log", yscale="log", title=f"{acc}, {size}³ samples")
        ax.set_xlabel("GPUs (smallest spatial split that fits)")
        ax.set_ylabel("predicted step (ms)")
        ax.grid(alpha=0.3)
    fig.axes[0].legend(fontsize=7)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")


def _smallest_split_steps(
    rows: Sequence[Mapping[str, Any]], acc: str, size: int, link: float, opt: str
) -> list[tuple[int, float]]:
    """(GPUs, step ms) of the smallest spatial split that fits in memory, per GPU count."""
    pts = []
    for gpus in sorted({r["gpus"] for r in rows}):
        key = (acc, size, link, gpus, opt)
        here = [
            r
            for r in rows
            if (r["accelerator"], r["sample_size"], r["link_gbit"], r["gpus"], r["optimizer"])
            == key
            and r["fits_memory"]
        ]
        if here:
            pts.append((gpus, 1e3 * min(here, key=lambda r: r["spatial"])["step_s"]))
    return pts
