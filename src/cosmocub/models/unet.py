"""A plain 3D U-Net (Çiçek et al. 2016) built from `ModelConfig` (model.name unet): a field in,
a field of the same size out.

Per level `convs_per_level` × [Conv3d(k, same padding) → (BatchNorm3d) → LeakyReLU]; 2× max-pool
down, 2× transposed conv (kernel 2, stride 2) up, skips by concatenation, a 1×1×1 conv to the
output channels. Level l has base_filters·2^l channels at input_size/2^l voxels per side.
It knows nothing of parallelism: `parallelize_unet` swaps its convs and norms from outside.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from cosmocub.config import ModelConfig


def level_block(
    in_channels: int, out_channels: int, *, cfg: ModelConfig, num_convs: int
) -> nn.Sequential:
    """`num_convs` × [Conv3d(k, same) → (BatchNorm3d) → LeakyReLU]; keeps D, H and W."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    channels = in_channels
    for i in range(num_convs):
        # Batch norm's shift replaces the conv's bias.
        layers[f"conv{i}"] = nn.Conv3d(
            channels,
            out_channels,
            cfg.kernel_size,
            padding=cfg.kernel_size // 2,
            bias=not cfg.batch_norm,
        )
        if cfg.batch_norm:
            layers[f"norm{i}"] = nn.BatchNorm3d(out_channels)
        layers[f"act{i}"] = nn.LeakyReLU(cfg.leaky_relu_slope)
        channels = out_channels
    return nn.Sequential(layers)


class UNet3d(nn.Module):
    """forward(x_bcdhw: (B, in_channels, S, S, S)) → (B, out_channels, S, S, S)."""

    def __init__(self, cfg: ModelConfig, *, out_channels: int = 1) -> None:
        super().__init__()
        if cfg.name != "unet" or cfg.unet is None:
            raise ValueError(f"UNet3d needs model.name 'unet' with model.unet, got {cfg.name!r}")
        self.config = cfg
        depth, convs = cfg.unet.depth, cfg.unet.convs_per_level
        widths = [cfg.base_filters * 2**level for level in range(depth)]
        self.encoders = nn.ModuleList()
        channels = cfg.in_channels
        for width in widths:
            self.encoders.append(level_block(channels, width, cfg=cfg, num_convs=convs))
            channels = width
        self.pool = nn.MaxPool3d(2)
        self.upsamplers = nn.ModuleList()
        self.decoders = nn.ModuleList()
        for level in reversed(range(depth - 1)):  # from the second-deepest level up to the top
            self.upsamplers.append(
                nn.ConvTranspose3d(widths[level + 1], widths[level], kernel_size=2, stride=2)
            )
            self.decoders.append(
                level_block(2 * widths[level], widths[level], cfg=cfg, num_convs=convs)
            )
        self.output = nn.Conv3d(widths[0], out_channels, kernel_size=1)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Kaiming-normal conv weights (ReLU-like activations), zero biases."""
        slope = self.config.leaky_relu_slope
        for module in self.modules():
            if isinstance(module, nn.Conv3d | nn.ConvTranspose3d):
                nn.init.kaiming_normal_(module.weight, a=slope, nonlinearity="leaky_relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        skips: list[torch.Tensor] = []
        h = x_bcdhw
        for level, encoder in enumerate(self.encoders):
            if level:
                h = self.pool(h)  # (B, C_l-1, S/2^l, …)
            h = encoder(h)  # (B, C_l, S/2^l, S/2^l, S/2^l)
            skips.append(h)
        skips.pop()  # the deepest level feeds the way up directly
        for upsample, decoder in zip(self.upsamplers, self.decoders, strict=True):
            h = upsample(h)  # (B, C_l, S/2^l, …): twice the extent, half the channels
            h = decoder(torch.cat([skips.pop(), h], dim=1))  # skip first: (B, 2·C_l, …)
        return self.output(h)  # (B, out_channels, S, S, S)
