"""Per-layer times of CosmoFlow on a CUDA device, timed with CUDA events (forward + backward
under AMP, and forward alone as evaluation runs it), written as a calibration that the
accelerator model uses in place of its roofline (`perf-model calibrate --device cuda`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.models.cosmoflow import CosmoFlow

FORMAT = "cosmocub.gpu_layers/1"


@dataclass(frozen=True, kw_only=True)
class GpuLayerTimes:
    """Seconds per layer (conv blocks by name, "head") of one training step's forward +
    backward and of an evaluation forward, at `batch` on `device`, in `dtype`."""

    device: str
    batch: int
    dtype: str
    train_s: dict[str, float]
    forward_s: dict[str, float]
    torch_version: str

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"format": FORMAT, **asdict(self)}, indent=1) + "\n")

    @classmethod
    def read(cls, path: Path) -> GpuLayerTimes:
        data = json.loads(path.read_text())
        if data.pop("format", None) != FORMAT:
            raise ValueError(
                f"{path}: not a GPU layer calibration ({FORMAT}); see perf-model "
                "calibrate --device cuda"
            )
        return cls(**data)


def require_cuda() -> torch.device:
    """The CUDA device, or a ValueError saying there is none (no silent CPU timing)."""
    if not torch.cuda.is_available():
        raise ValueError(
            "perf-model calibrate --device cuda: torch.cuda.is_available() is False on this "
            f"machine (torch {torch.__version__}, CUDA build {torch.version.cuda}); run it on "
            "a machine with a GPU, then pass the file to perf-model predict --gpu-calibration"
        )
    return torch.device("cuda")


def cuda_timer(fn: Callable[[], None], repeats: int) -> float:
    """Median seconds of `fn` between CUDA events, after two warm-up calls (cuDNN's choice)."""
    fn()
    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return sorted(times)[len(times) // 2]


def time_layers(
    model_cfg: ModelConfig,
    *,
    batch: int,
    device: torch.device,
    dtype: torch.dtype,
    timer: Callable[[Callable[[], None], int], float],
    repeats: int = 20,
) -> tuple[dict[str, float], dict[str, float]]:
    """(forward + backward, forward) seconds of each conv block and of the head at `batch`,
    in channels-last layout under autocast to `dtype` (as the MLPerf runs train), timed by
    `timer` (cuda_timer on a GPU; a test passes a CPU clock)."""
    model = CosmoFlow(model_cfg).to(device).to(memory_format=torch.channels_last_3d)
    side, channels = model_cfg.input_size, model_cfg.in_channels
    x = torch.randn(batch, channels, side, side, side, device=device)
    x = x.to(memory_format=torch.channels_last_3d)
    train: dict[str, float] = {}
    forward: dict[str, float] = {}
    amp = torch.autocast(device.type, dtype=dtype)
    for name, block in [*model.conv_blocks.named_children(), ("head", None)]:
        layer: nn.Module = block if block is not None else nn.Sequential(model.flatten, model.head)
        x_in = x.detach().requires_grad_(name != "block0")

        def step(layer: nn.Module = layer, x_in: torch.Tensor = x_in) -> None:
            layer.zero_grad(set_to_none=True)
            with amp:
                out = layer(x_in)
            out.float().sum().backward()

        def infer(layer: nn.Module = layer, x_in: torch.Tensor = x_in) -> None:
            with torch.no_grad(), amp:
                layer(x_in)

        train[name] = timer(step, repeats)
        forward[name] = timer(infer, repeats)
        if block is not None:
            with torch.no_grad(), amp:
                x = block(x).float()
    return train, forward


def calibrate_cuda(model_cfg: ModelConfig, *, batch: int, out: Path) -> GpuLayerTimes:
    """Time the layers on this machine's GPU in fp16 and write the calibration to `out`."""
    device = require_cuda()
    torch.backends.cudnn.benchmark = True
    train, forward = time_layers(
        model_cfg, batch=batch, device=device, dtype=torch.float16, timer=cuda_timer
    )
    times = GpuLayerTimes(
        device=torch.cuda.get_device_name(device),
        batch=batch,
        dtype="fp16",
        train_s=train,
        forward_s=forward,
        torch_version=torch.__version__,
    )
    times.write(out)
    return times
