"""Layer table, parameter count and FLOPs per sample of a CosmoFlow config, without running it.

The model is built on PyTorch's meta device (no memory, no compute), so even the 512³ reference
summarises instantly; FLOPs are counted analytically as 2 × multiply-accumulates of convs and
dense layers (what `torch.utils.flop_counter.FlopCounterMode` reports for them too).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow

FLOPS_METHOD = "analytic: 2 x MACs of Conv3d and Linear (bias, activations, pooling not counted)"


def _layer_flops(module: nn.Module, out_shape: tuple[int, ...]) -> int:
    # out_shape excludes the batch dim.
    if isinstance(module, nn.Conv3d):
        macs_per_output = (module.in_channels // module.groups) * math.prod(module.kernel_size)
        return 2 * math.prod(out_shape) * macs_per_output
    if isinstance(module, nn.Linear):
        return 2 * module.in_features * module.out_features
    return 0


def summarize(model_cfg: ModelConfig) -> dict[str, Any]:
    """Describe every leaf layer: {name, type, output_shape, params, flops}, and the totals."""
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
        "total_params": sum(p.numel() for p in model.parameters()),
        "flops_per_sample": sum(layer["flops"] for layer in layers),
        "flops_method": FLOPS_METHOD,
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
    return "\n".join(lines)
