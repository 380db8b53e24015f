"""Compute per layer: measured directly here (forward + backward of each conv block and the dense
head on this CPU, at one rank's block of a split sample: what the calibration's fits are checked
against), or, for an accelerator, FLOPs at a peak rate × an efficiency (cost_model.machines').
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator

import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.summary import summarize

# Forward + backward ≈ 3 × the forward's FLOPs (the backward computes input and weight gradients).
TRAIN_FLOPS_FACTOR = 3


def call_times(fn: Callable[[], None], repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn` (no warm-up: the caller's)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def fastest_time(fn: Callable[[], None], repeats: int) -> float:
    """The fastest of `repeats` calls after a warm-up (allocations, oneDNN's kernel choice):
    other processes on the cores only ever add time, so the fastest is the work's own."""
    fn()
    return min(call_times(fn, repeats))


def local_shape(model_cfg: ModelConfig, split: tuple[int, int, int]) -> tuple[int, int, int]:
    return tuple(model_cfg.input_size // s for s in split)  # type: ignore[return-value]


def measure_layers(
    model_cfg: ModelConfig,
    *,
    batch: int,
    split: tuple[int, int, int] = (1, 1, 1),
    repeats: int = 3,
    memory_format: torch.memory_format = torch.contiguous_format,
) -> dict[str, float]:
    """Seconds of forward + backward of each conv block (on one rank's block: a spatial layer
    convolves the same output voxels, its halo planes in place of zero padding) and of the head
    (on the gathered features), in this process's torch threads; unsplit, also "overhead": the
    whole model's training forward + backward less the layers' sum (loss, autograd glue)."""
    if model_cfg.pooled.enabled:
        raise ValueError(
            f"key 'model.pooled.stats': {model_cfg.pooled.stats!r}; the per-layer timing knows "
            "the plain CosmoFlow (blocks, then the head on the flattened features) only"
        )
    model = CosmoFlow(model_cfg).train().to(memory_format=memory_format)
    x = torch.randn(batch, model_cfg.in_channels, *local_shape(model_cfg, split))
    x = x.to(memory_format=memory_format)
    out: dict[str, float] = {}
    for name, block in model.conv_blocks.named_children():
        x_in = x.detach().requires_grad_(True)

        def run(block: nn.Module = block, x_in: torch.Tensor = x_in) -> None:
            block.zero_grad(set_to_none=True)
            block(x_in).sum().backward()

        out[name] = fastest_time(run, repeats)
        with torch.no_grad():
            x = block(x)
    final = model_cfg.input_size // 2**model_cfg.num_conv_blocks
    whole = model.flatten(torch.randn(batch, x.shape[1], final, final, final))

    def run_head() -> None:
        model.head.zero_grad(set_to_none=True)
        model.head(whole).sum().backward()

    out["head"] = fastest_time(run_head, repeats)
    if split == (1, 1, 1):
        # What the layers leave out of a training step: the loss, zero_grad, autograd's glue
        # between the layers; measured as the whole model's forward + backward less their sum.
        x0 = torch.randn(batch, model_cfg.in_channels, *local_shape(model_cfg, split))
        x0 = x0.to(memory_format=memory_format)
        y0 = torch.zeros(batch, model_cfg.num_outputs)

        def run_model() -> None:
            model.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(x0), y0).backward()

        out["overhead"] = max(0.0, fastest_time(run_model, repeats) - sum(out.values()))
    return out


@functools.cache
def layer_flops(model_cfg: ModelConfig) -> dict[str, float]:
    """Forward FLOPs per sample of each conv block and of the head (models.summary's count)."""
    flops: dict[str, float] = {}
    for layer in summarize(model_cfg)["layers"]:
        name = layer["name"]
        key = name.split(".")[1] if name.startswith("conv_blocks.") else "head"
        flops[key] = flops.get(key, 0.0) + layer["flops"]
    return flops


def accelerator_seconds(
    model_cfg: ModelConfig, *, batch: int, spatial: int, peak_flops: float, efficiency: float
) -> dict[str, float]:
    """Forward + backward seconds per layer at peak × efficiency: the conv stack's FLOPs split
    over the spatial ranks, the head's replicated on each."""
    rate = peak_flops * efficiency
    return {
        name: TRAIN_FLOPS_FACTOR * batch * f / (1 if name == "head" else spatial) / rate
        for name, f in layer_flops(model_cfg).items()
    }


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` inside, restored after."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
