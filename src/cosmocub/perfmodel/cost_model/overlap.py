"""DDP's gradient buckets and their overlap with backward: which layer's backward completes each
bucket, and how much of the bucketed all-reduce is left once backward ends (the exposed part).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow

# torch DDP's bucket caps: dist._DEFAULT_FIRST_BUCKET_BYTES for the first bucket (so that the
# all-reduce starts early in backward), bucket_cap_mb's default for the rest.
DDP_FIRST_BUCKET_BYTES = 2**20
DDP_BUCKET_BYTES = 25 * 2**20
# A layer's backward computes the input's and the weights' gradients, about twice its forward:
# 2/3 of its forward + backward (compute.TRAIN_FLOPS_FACTOR = 3).
BACKWARD_SHARE = 2 / 3


@functools.cache
def parameter_layers(model_cfg: ModelConfig) -> tuple[tuple[str, int], ...]:
    """(layer, elements) of every trainable parameter in registration order, the layer named as
    compute's layer times name it: a conv block's index, or "head" (meta device: no memory)."""
    import torch

    with torch.device("meta"):
        model = CosmoFlow(model_cfg)
    out = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            parts = name.split(".")
            out.append((parts[1] if parts[0] == "conv_blocks" else parts[0], p.numel()))
    return tuple(out)


def ddp_buckets(model_cfg: ModelConfig, *, bytes_per_element: int = 4) -> list[tuple[str, int]]:
    """DDP's buckets in the order backward fills them, as torch assigns them: the parameters in
    reverse, a bucket closed once it holds its cap; each as (the layer whose backward completes
    it, bytes)."""
    buckets: list[tuple[str, int]] = []
    size, cap, layer = 0, DDP_FIRST_BUCKET_BYTES, ""
    for layer, n in reversed(parameter_layers(model_cfg)):
        size += n * bytes_per_element
        if size >= cap:
            buckets.append((layer, size))
            size, cap = 0, DDP_BUCKET_BYTES
    if size:
        buckets.append((layer, size))
    return buckets


def exposed_allreduce(
    bucket_seconds: Sequence[tuple[str, float]],
    layer_seconds: Mapping[str, float],
    layers_in_forward_order: Sequence[str],
) -> float:
    """Seconds of the buckets' all-reduces left after backward ends. Backward runs the layers in
    reverse, each for BACKWARD_SHARE of its forward + backward; a bucket's all-reduce starts once
    the backward of its layer is done and the previous bucket's has finished (one stream)."""
    done, clock = {}, 0.0
    for name in reversed(layers_in_forward_order):
        clock += BACKWARD_SHARE * layer_seconds.get(name, 0.0)
        done[name] = clock
    backward_s, end = clock, 0.0
    for layer, seconds in bucket_seconds:
        end = max(end, done[layer]) + seconds
    return max(0.0, end - backward_s)
