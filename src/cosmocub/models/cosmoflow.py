"""The CosmoFlow 3D CNN in plain PyTorch, built from `ModelConfig`, plus save/load of final models.

It knows nothing of parallelism: the conv stack (`conv_blocks`), the dense head (`head`) and the
optional pooled branch (`pooled`, model.pooled) are named submodules so that
`parallelize_cosmoflow(model, mesh)` can swap layers from outside.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.heads import outputs_per_parameter
from cosmocub.models.statistics_branch import PooledBranch


def conv_block(
    in_channels: int, out_channels: int, *, kernel_size: int, batch_norm: bool, slope: float
) -> nn.Sequential:
    """Conv3d(k, same padding) → (BatchNorm3d) → LeakyReLU → MaxPool3d(2): halves D, H and W."""
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    # A conv followed by batch norm does not need a bias (the norm's shift replaces it).
    layers["conv"] = nn.Conv3d(
        in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=not batch_norm
    )
    if batch_norm:
        layers["norm"] = nn.BatchNorm3d(out_channels)
    layers["act"] = nn.LeakyReLU(slope)
    layers["pool"] = nn.MaxPool3d(2)
    return nn.Sequential(layers)


class CosmoFlow(nn.Module):
    """CosmoFlow: `num_conv_blocks` conv blocks, then a dense head, then tanh · output_scale.

    forward(x_bcdhw: (B, C, S, S, S)) → (B, num_outputs); with `head: gaussian`
    (B, 2·num_outputs): the means, then the log-variances (models/heads.py reads them).
    With model.pooled on, `pooled` (models/statistics_branch.py) takes whole-sample moments of
    the input, of every block's convolution and/or of every block's output, and they join the
    head's input or its last hidden layer; off, `pooled` is None and the model is the plain
    CosmoFlow, parameter for parameter.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.config = cfg
        blocks: OrderedDict[str, nn.Module] = OrderedDict()
        channels = cfg.in_channels
        for i in range(cfg.num_conv_blocks):
            filters = cfg.base_filters * 2**i
            blocks[f"block{i}"] = conv_block(
                channels,
                filters,
                kernel_size=cfg.kernel_size,
                batch_norm=cfg.batch_norm,
                slope=cfg.leaky_relu_slope,
            )
            channels = filters
        self.conv_blocks = nn.Sequential(blocks)
        self.flatten = nn.Flatten()
        final_size = cfg.input_size // 2**cfg.num_conv_blocks
        self.flat_features = channels * final_size**3

        # Built after the conv stack and before the head: with the branch off no module and no
        # random draw is added, so parameters and their initial values stay the plain model's.
        self.pooled = PooledBranch(cfg) if cfg.pooled.enabled else None
        extra = self.pooled.num_features if self.pooled is not None else 0
        joins_first = cfg.pooled.join == "head_input" or not cfg.dense_sizes

        # model.pooled.flatten false: the head reads the pooled statistics alone.
        self.flattened = self.pooled is None or cfg.pooled.flatten
        head: OrderedDict[str, nn.Module] = OrderedDict()
        width = (self.flat_features if self.flattened else 0) + (extra if joins_first else 0)
        for i, size in enumerate(cfg.dense_sizes):
            head[f"dense{i}"] = nn.Linear(width, size)
            head[f"act{i}"] = nn.LeakyReLU(cfg.leaky_relu_slope)
            head[f"dropout{i}"] = nn.Dropout(cfg.dropout)
            width = size
        width += 0 if joins_first else extra
        # The gaussian head's second half of outputs is the log-variance of each parameter.
        head["output"] = nn.Linear(width, cfg.num_outputs * outputs_per_parameter(cfg))
        self.head = nn.Sequential(head)
        self.join_at = "dense0" if joins_first and cfg.dense_sizes else "output"
        self.output_scale = cfg.output_scale
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights and zero biases, as the reference (Keras defaults); with
        model.pooled.tap_ridge the output layer's weights start at zero, so that the model starts
        as the ridge (the means its prediction, the log-variances its residual's, which the fit
        sets in the output's bias) and the network's share grows from nothing."""
        for module in self.modules():
            if isinstance(module, nn.Conv3d | nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        if self.pooled is not None and self.pooled.ridge is not None:
            nn.init.zeros_(self.head.output.weight)

    def forward(self, x_bcdhw: torch.Tensor) -> torch.Tensor:
        taps = self.pooled.moments if self.pooled is not None else {}
        # [(B, k·C)], with model.pooled.spectrum_bins the input's spectrum after its moments.
        stats = [self.pooled.input_statistics(x_bcdhw)] if "input" in taps else []
        h = x_bcdhw
        for i, block in enumerate(self.conv_blocks.children()):
            for layer_name, layer in block.named_children():
                h = layer(h)
                if layer_name == "conv" and f"conv{i}" in taps:
                    # Before the norm: a moment from the 3rd on is the same of the normalised
                    # map (an affine map per channel), and its gradient does not reach the
                    # norm's weight as a sum that cancels (ill-conditioned in fp32).
                    stats.append(taps[f"conv{i}"](h))
            if f"block{i}" in taps:
                stats.append(taps[f"block{i}"](h))
        # h: (B, F, s, s, s), s = S / 2**num_conv_blocks; flattened (B, F·s³) unless the head
        # reads the pooled statistics alone (then no gather of it under a spatial split either).
        return self.head_output(self.flatten(h) if self.flattened else h, stats)

    def head_output(self, flat: torch.Tensor, stats: list[torch.Tensor]) -> torch.Tensor:
        """The dense head on the flattened features and the taps' moments (none without the
        branch), then tanh · output_scale of the means: the model's output."""
        if self.pooled is None:
            out = self.head(flat)
        else:
            pooled = self.pooled(stats)  # (B, num_features)
            h = flat
            for name, layer in self.head.named_children():
                if name == self.join_at:
                    h = torch.cat([h, pooled], dim=1) if self.flattened else pooled
                h = layer(h)
            out = h
            if self.pooled.ridge is not None:
                # model.pooled.tap_ridge: the means are the fixed ridge on the input tap's
                # statistics (stats[0]) plus what the network learns beside it.
                p = self.config.num_outputs
                ridge = self.pooled.ridge(stats[0]).to(out.dtype)
                out = torch.cat([out[:, :p] + ridge, out[:, p:]], dim=1)
        # out: (B, num_outputs · outputs_per_parameter)
        if not self.config.gaussian:
            return torch.tanh(out) * self.output_scale  # (B, num_outputs)
        mean, log_var = out.chunk(2, dim=1)
        return torch.cat([torch.tanh(mean) * self.output_scale, log_var], dim=1)  # (B, 2·P)
