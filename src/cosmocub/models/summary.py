"""Layer table, parameter count, FLOPs per sample and activation memory per rank of a CosmoFlow
config, without running it.

The model is built on PyTorch's meta device (no memory, no compute), so even the 512³ reference
summarises instantly; FLOPs are counted analytically as 2 × multiply-accumulates of convs and
dense layers (what `torch.utils.flop_counter.FlopCounterMode` reports for them too). Activation
memory is what autograd saves for backward in a training forward, counted on the meta device for
one rank's block of a spatial split (halo planes included).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cosmocub.config import Config, ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.statistics_branch import LogPowerSpectrum, TapRidge

FLOPS_METHOD = "analytic: 2 x MACs of Conv3d and Linear (bias, activations, pooling not counted)"


def _layer_flops(module: nn.Module, out_shape: tuple[int, ...]) -> int:
    # out_shape excludes the batch dim.
    if isinstance(module, nn.Conv3d):
        macs_per_output = (module.in_channels // module.groups) * math.prod(module.kernel_size)
        return 2 * math.prod(out_shape) * macs_per_output
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * module.out_features
    if isinstance(module, LogPowerSpectrum):
        # The binning matmul, (C, modes) @ (modes, bins); the FFT is not counted.
        return 2 * (out_shape[0] // module.bins) * module.num_modes * module.bins
    if isinstance(module, TapRidge):
        return 2 * module.weight.numel()
    return 0


def activation_bytes(
    model_cfg: ModelConfig, split: tuple[int, int, int] = (1, 1, 1), *, batch: int = 1
) -> dict[str, int]:
    """Bytes autograd saves for backward on one rank in a training forward of `batch` samples
    split over `split` = (ranks along D, H, W): {"conv_stack", "head", "total"}.

    Mirrors the spatial layers: each conv saves its input padded with halos along the split
    dims; the head is replicated and saves the gathered (whole) features. Distinct storages are
    counted once; parameters are not activations and are left out.
    """
    # Imported here: the split rules live with the parallel layers, which build on this package.
    from cosmocub.models.parallelize import check_spatial_split

    check_spatial_split(model_cfg, model_cfg.input_size, split)
    halo = model_cfg.kernel_size // 2
    with torch.device("meta"):
        model = CosmoFlow(model_cfg).train()
        x_bcdhw = torch.empty(
            batch, model_cfg.in_channels, *(model_cfg.input_size // s for s in split)
        )
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage._cdata not in params:
            saved[storage._cdata] = storage.nbytes()
        return t

    # F.pad takes (W_lo, W_hi, H_lo, H_hi, D_lo, D_hi); split dims get a halo, others the conv's.
    halo_pad = [halo if s > 1 else 0 for s in reversed(split) for _ in range(2)]
    conv_pad = tuple(0 if s > 1 else halo for s in split)
    # The pooled branch's moments save what the block-merged ones save: the block they pool.
    taps = model.pooled.moments if model.pooled is not None else {}
    if model.pooled is not None:
        # A plain BatchNorm1d refuses one sample in training; what it saves is (B, features)
        # either way, next to nothing beside the blocks.
        model.pooled.norm.eval()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        h = x_bcdhw
        # The input needs no gradient: its spectrum (model.pooled.spectrum_bins) saves nothing.
        stats = [model.pooled.input_statistics(h)] if "input" in taps else []
        for i, block in enumerate(model.conv_blocks.children()):
            # Unsplit, the conv saves the block itself, as a pooled branch's moments of it do.
            padded = F.pad(h, halo_pad) if any(halo_pad) else h
            h = F.conv3d(padded, block.conv.weight, block.conv.bias, padding=conv_pad)
            if f"conv{i}" in taps:
                stats.append(taps[f"conv{i}"](h))
            for name, layer in block.named_children():
                if name != "conv":
                    h = layer(h)
            if f"block{i}" in taps:
                stats.append(taps[f"block{i}"](h))
        conv_stack = sum(saved.values())
        whole_shape = (*h.shape[:2], *(n * s for n, s in zip(h.shape[2:], split, strict=True)))
        # What the gather hands the head; unsplit, the last block itself (a moment may save it).
        whole = h if math.prod(split) == 1 else torch.empty(whole_shape, device="meta")
        model.head_output(model.flatten(whole), stats)
    total = sum(saved.values())
    return {"conv_stack": conv_stack, "head": total - conv_stack, "total": total}


def summarize(model_cfg: ModelConfig, split: tuple[int, int, int] = (1, 1, 1)) -> dict[str, Any]:
    """Describe every leaf layer: {name, type, output_shape, params, flops}, the totals, and the
    activation memory per sample on one rank of `split` (and unsplit, to compare)."""
    with torch.device("meta"):
        model = CosmoFlow(model_cfg).eval()
        x_bcdhw = torch.empty(1, model_cfg.in_channels, *(model_cfg.input_size,) * 3)
    layers: list[dict[str, Any]] = []

    def record(name: str):
        def hook(module: nn.Module, _inputs: Any, output: torch.Tensor) -> None:
            out_shape = tuple(output.shape[1:])
            layers.append(
                {
                    "name": name,
                    "type": type(module).__name__,
                    "output_shape": list(out_shape),
                    "params": sum(p.numel() for p in module.parameters(recurse=False)),
                    "flops": _layer_flops(module, out_shape),
                }
            )

        return hook

    handles = [
        module.register_forward_hook(record(name))
        for name, module in model.named_modules()
        if name and not list(module.children())
    ]
    try:
        with torch.no_grad():
            model(x_bcdhw)
    finally:
        for handle in handles:
            handle.remove()
    return {
        "input_shape": [model_cfg.in_channels, *(model_cfg.input_size,) * 3],
        "layers": layers,
        "pooled_branch": pooled_branch_counts(model),
        "total_params": sum(p.numel() for p in model.parameters()),
        "flops_per_sample": sum(layer["flops"] for layer in layers),
        "flops_method": FLOPS_METHOD,
        "split": list(split),
        "activation_bytes_per_rank": activation_bytes(model_cfg, split),
        "activation_bytes_unsplit": activation_bytes(model_cfg),
    }


def pooled_branch_counts(model: CosmoFlow) -> dict[str, Any] | None:
    """What model.pooled adds to the plain CosmoFlow (None when off): its statistics per sample,
    its parameters (the norm's, and the weights that read the statistics where they join the
    head) and its FLOPs (those weights' 2 × MACs, the spectrum's binning matmul and the tap
    ridge's; its reductions, like pooling, and the FFT not counted)."""
    if model.pooled is None:
        return None
    branch = model.pooled.num_features
    joined = getattr(model.head, model.join_at)
    weights = branch * joined.out_features
    spectrum = model.pooled.spectrum
    width = 0 if spectrum is None else spectrum.bins * model.config.in_channels
    # With counts_spectrum the same binning runs twice: the log1p counts' and the counts'.
    spectra = 1 + (model.pooled.counts_spectrum is not None)
    binning = 0 if spectrum is None else spectra * _layer_flops(spectrum, (width,))
    ridge = 0 if model.pooled.ridge is None else _layer_flops(model.pooled.ridge, ())
    return {
        "features": branch,
        "taps": list(model.pooled.moments),
        "join": model.join_at,
        "params": sum(p.numel() for p in model.pooled.parameters()) + weights,
        "flops": 2 * weights + binning + ridge,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """A fixed-width text table of `summarize`'s result."""
    rows = [("layer", "type", "output shape", "params", "GFLOPs")]
    for layer in summary["layers"]:
        shape = "x".join(str(n) for n in layer["output_shape"])
        gflops = f"{layer['flops'] / 1e9:.4f}" if layer["flops"] else ""
        rows.append((layer["name"], layer["type"], shape, f"{layer['params']:,}", gflops))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for j, row in enumerate(rows):
        cells = [
            c.ljust(w) if i < 3 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if j == 0:
            lines.append("  ".join("-" * w for w in widths))
    shape = "x".join(str(n) for n in summary["input_shape"])
    lines += [
        "",
        f"input (C, D, H, W):   {shape}",
        f"total parameters:     {summary['total_params']:,}",
        f"FLOPs per sample:     {summary['flops_per_sample'] / 1e9:.3f} GFLOP forward "
        f"(~{3 * summary['flops_per_sample'] / 1e9:.3f} forward+backward)",
        f"FLOP count:           {summary['flops_method']}",
    ]
    branch = summary.get("pooled_branch")
    if branch:
        lines.append(
            f"pooled branch:        {branch['features']} statistics of {', '.join(branch['taps'])} "
            f"into head.{branch['join']}: {branch['params']:,} parameters, "
            f"{branch['flops'] / 1e6:.4f} MFLOP (in the totals above)"
        )
    per_rank, whole = summary["activation_bytes_per_rank"], summary["activation_bytes_unsplit"]
    mib = 2**20
    lines.append(
        f"activations per rank: {per_rank['total'] / mib:,.1f} MiB per sample saved for backward "
        f"at split {summary['split']} (conv stack {per_rank['conv_stack'] / mib:,.1f}, head "
        f"{per_rank['head'] / mib:,.1f}); unsplit {whole['total'] / mib:,.1f} MiB, "
        f"{whole['total'] / per_rank['total']:.2f}x more"
    )
    return "\n".join(lines)


def config_summary_text(cfg: Config, *, split: tuple[int, int, int] | None = None) -> str:
    """`cosmocub model-summary`'s table for the config's CosmoFlow, split along D,H,W as `split`
    says (default: the config's parallel.split)."""
    if cfg.model.name != "cosmoflow":
        raise ValueError(f"{cfg.source}: model-summary describes CosmoFlow, not {cfg.model.name}")
    return format_summary(summarize(cfg.model, split=split or cfg.parallel.split_dhw))
