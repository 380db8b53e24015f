"""Extrapolate the step model to accelerator clusters: a model config (the MLPerf CosmoFlow) at
several sample sizes on up to thousands of GPUs, per accelerator class and network bandwidth,
Lion against Lion Cub, every power-of-two spatial split that runs; with the assumptions written
out beside the table.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from cosmocub.config import Config, ExtrapolateConfig, ModelConfig, derive, optimizer_variant
from cosmocub.perfmodel.compute import accelerator_seconds
from cosmocub.perfmodel.costs import AlphaBeta
from cosmocub.perfmodel.model import Mesh, Network, parameter_sizes, predict_step

# The optimizer's update reads and writes parameters, gradients and its state in fp32: about
# 16 bytes per parameter for Lion (p, g, m read; p, m written), 24 for AdamW; Lion Cub adds its
# quantize / pack / vote / unpack passes, about 8 more.
UPDATE_BYTES_PER_PARAM = {
    "lion": 20,
    "adamw": 28,
    "sgd": 20,
    "distributed_lion": 28,
    "lion_cub": 28,
}


def update_bytes_per_param(optimizer: str, entry: str) -> int:
    """UPDATE_BYTES_PER_PARAM of `optimizer`; a ValueError naming the entry for one it lacks."""
    if optimizer not in UPDATE_BYTES_PER_PARAM:
        raise ValueError(
            f"perf_model.extrapolate.optimizers.{entry}: no update cost for optimizer.name "
            f"{optimizer!r} (UPDATE_BYTES_PER_PARAM has {', '.join(UPDATE_BYTES_PER_PARAM)})"
        )
    return UPDATE_BYTES_PER_PARAM[optimizer]


# Memory per GPU besides activations: parameters, gradients and two optimizer states, fp32.
STATE_BYTES_PER_PARAM = 16
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
    return out


@functools.cache
def _activation_bytes(model_cfg: ModelConfig, split: tuple[int, int, int], batch: int) -> int:
    from cosmocub.models.summary import activation_bytes

    return activation_bytes(model_cfg, split, batch=batch)["total"]


def extrapolate(base: Config, settings: ExtrapolateConfig) -> list[dict[str, Any]]:
    from cosmocub.models.parallelize import check_spatial_split

    optimizers = optimizer_configs(base, settings)
    batch = base.train.local_batch_size
    rows = []
    for acc_name, acc in settings.accelerators.items():
        intra = AlphaBeta(
            alpha_s=settings.intra_latency_us * 1e-6,
            beta_s_per_byte=8 / (acc.intra_node_gbit * 1e9),
        )
        for size in settings.sample_sizes:
            model_cfg = dataclasses.replace(base.model, input_size=size)
            params = sum(parameter_sizes(model_cfg))
            for link in settings.link_gbit:
                inter = AlphaBeta(
                    alpha_s=settings.latency_us * 1e-6, beta_s_per_byte=8 / (link * 1e9)
                )
                network = Network.uniform(inter, intra, ranks_per_node=settings.gpus_per_node)
                for gpus in settings.gpus:
                    spatial = 1
                    while spatial <= gpus and gpus % spatial == 0:
                        split = balanced_split(spatial)
                        try:
                            check_spatial_split(model_cfg, size, split)
                        except ValueError:
                            break  # larger splits only get narrower
                        act = _activation_bytes(model_cfg, split, batch)
                        memory = (
                            act * settings.activation_bytes / 4 + STATE_BYTES_PER_PARAM * params
                        )
                        layers = accelerator_seconds(
                            model_cfg,
                            batch=batch,
                            spatial=spatial,
                            peak_flops=acc.peak_tflops * 1e12,
                            efficiency=acc.efficiency,
                        )
                        for opt_name, opt_cfg in optimizers.items():
                            update = update_bytes_per_param(opt_cfg.name, opt_name) * params
                            p = predict_step(
                                model_cfg=model_cfg,
                                optimizer_cfg=opt_cfg,
                                local_batch=batch,
                                mesh=Mesh(data=gpus // spatial, split=split),
                                network=network,
                                layer_seconds=layers,
                                optimizer_s=update / (acc.memory_gbyte_s * 1e9),
                                bytes_per_value=settings.activation_bytes,
                            )
                            rows.append(
                                {
                                    "accelerator": acc_name,
                                    "sample_size": size,
                                    "link_gbit": link,
                                    "gpus": gpus,
                                    "nodes": math.ceil(gpus / settings.gpus_per_node),
                                    "data": gpus // spatial,
                                    "spatial": spatial,
                                    "split": "x".join(map(str, split)),
                                    "optimizer": opt_name,
                                    "fits_memory": memory <= acc.memory_gb * 1e9,
                                    "memory_gb": memory / 1e9,
                                    "step_s": p.step_s,
                                    "compute_s": p.compute_s,
                                    "halo_s": p.halo_s,
                                    "exchange_s": p.exchange_s,
                                    "momentum_sync_s": p.momentum_sync_s,
                                    "optimizer_s": p.optimizer_s,
                                    "halo_share": p.halo_s / p.step_s,
                                    "halo_share_of_compute": p.halo_s / (p.halo_s + p.compute_s),
                                    "exchange_share": (p.exchange_s + p.momentum_sync_s) / p.step_s,
                                    "samples_per_s": batch * (gpus // spatial) / p.step_s,
                                    "comm_bytes_per_step": p.comm_bytes_per_step,
                                }
                            )
                        spatial *= 2
    return rows


def headline(
    rows: Sequence[Mapping[str, Any]], *, reference: str, candidate: str, halo_limit: float
) -> list[dict[str, Any]]:
    """Per accelerator, sample size, link and GPU count: the smallest spatial split that fits in
    memory, the candidate's speedup over the reference there, and the largest split whose halo
    time stays under the limit, as a share of the candidate's step and of its compute + halo."""
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
        out.append(row)
    return out


def assumptions_text(base: Config, settings: ExtrapolateConfig, source: str) -> str:
    accs = "\n".join(
        f"- {name}: {a.peak_tflops:g} TFLOP/s peak x {a.efficiency:g} efficiency, "
        f"{a.memory_gb:g} GB at {a.memory_gbyte_s:g} GB/s, {a.intra_node_gbit:g} Gbit/s between "
        "GPUs of a node"
        for name, a in settings.accelerators.items()
    )
    optimizers = optimizer_configs(base, settings).values()
    lion_cub = next((o.lion_cub for o in optimizers if o.lion_cub is not None), None)
    if lion_cub is None:  # no Lion Cub among them: the text quotes the schema's default buckets
        replace = {"optimizer": optimizer_variant({}, {"name": "lion_cub"})}
        lion_cub = derive(base, {}, replace=replace, source="lion_cub defaults").optimizer.lion_cub
    bucket_mb = lion_cub.bucket_mb
    return f"""# Assumptions of the extrapolation

Model: `{source}` (model section), local batch {base.train.local_batch_size} samples per data
rank, every sample size in {list(settings.sample_sizes)} with the same layers (so the first dense
layer grows with the sample: flatten of the last block's output).
Optimizers: {", ".join(f"{k} = {v}" for k, v in settings.optimizers.items())}.

Accelerators (forward + backward = 3 x the forward FLOPs of convs and dense layers at peak x
efficiency; the conv stack's work divides over the spatial ranks, the head is replicated):
{accs}

Network: {settings.gpus_per_node} GPUs per node; between nodes {list(settings.link_gbit)} Gbit/s
per node and {settings.latency_us:g} us per message round; within a node the NVLink rate above and
{settings.intra_latency_us:g} us. Ranks are placed as the code places them (a sample's spatial
ranks consecutive, so on one node while spatial <= GPUs per node). Ring collectives send
2(P-1)/P (all-reduce) or (P-1)/P (all-gather) per rank through one link per node per group;
an all-to-all's ranks of a node share its link. Halo swaps: two faces per split dim, forward
and backward, at {settings.activation_bytes} bytes per value, plus the all-gather of the
features before the head. Nothing overlaps (DDP's overlap with backward would hide up to the
backward's length of its all-reduce: the Lion rows are an upper bound there).
Message rounds: each of a ring's 2(P-1) or P-1 rounds (and an all-to-all's P-1) costs the full
alpha, with no tree or pipelining; at thousands of ranks this latency dominates, which is
pessimistic against NCCL's tree algorithms and penalises many small messages (Lion Cub's
{bucket_mb} MiB buckets, two phases each) more than few large ones (DDP's 25 MiB buckets).
Optimizer update: memory-bound, about 20 (Lion) to 28 (Lion Cub, AdamW) bytes per parameter at
the HBM bandwidth. Memory: activations saved for backward (bf16) + 16 bytes per parameter.
Speedups compare the two optimizers on the same mesh (the smallest spatial split that fits);
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
        for c, link in enumerate(links):
            for s, opt in enumerate(optimizers):
                pts = []
                for gpus in sorted({r["gpus"] for r in rows}):
                    here = [
                        r
                        for r in rows
                        if (r["accelerator"], r["sample_size"], r["link_gbit"], r["gpus"])
                        == (acc, size, link, gpus)
                        and r["optimizer"] == opt
                        and r["fits_memory"]
                    ]
                    if here:
                        best = min(here, key=lambda r: r["spatial"])
                        pts.append((gpus, 1e3 * best["step_s"]))
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
