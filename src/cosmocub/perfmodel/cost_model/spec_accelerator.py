"""An accelerator from its public specification (hardware_specs) as the step model's device:
layers and the update from the roofline of their kernels (roofline), or from per-layer times
measured on such a GPU (measure.gpu_layers) where a calibration is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cosmocub.config import ModelConfig, OptimizerConfig
from cosmocub.perfmodel.cost_model.hardware_specs import AcceleratorSpec
from cosmocub.perfmodel.cost_model.machines import update_bytes_per_param
from cosmocub.perfmodel.cost_model.roofline import (
    Kernel,
    kernel_seconds,
    step_kernels,
    update_kernels,
)
from cosmocub.perfmodel.cost_model.step_model import parameter_sizes
from cosmocub.perfmodel.measure.gpu_layers import GpuLayerTimes

AMP_DTYPES = {"fp16": 2, "bf16": 2, "fp32": 4}


@dataclass(frozen=True, kw_only=True)
class SpecAccelerator:
    """One rank on `spec` training in `dtype` (AMP: fp16 activations, fp32 master weights)."""

    spec: AcceleratorSpec
    dtype: str = "fp16"
    calibration: GpuLayerTimes | None = None
    # The layers' time ÷ the roofline's (or the layer calibration's), from one measured run of
    # this accelerator and software (perfmodel.uses.run_calibration); 1: as priced.
    layer_scale: float = 1.0
    # The vote's host passes are in the update's memory-bound cost; NCCL spins on the device.
    vote_host = None
    collective_wake_s = 0.0

    def __post_init__(self) -> None:
        if self.dtype not in AMP_DTYPES:
            raise ValueError(f"accelerator dtype {self.dtype!r}: one of {', '.join(AMP_DTYPES)}")

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def bytes_per_value(self) -> int:
        return AMP_DTYPES[self.dtype]

    @property
    def memory_bytes(self) -> float:
        return self.spec.memory_gb * 1e9

    def seconds(self, kernels: list[Kernel]) -> float:
        """The kernels one after another on this device (roofline.kernel_seconds each)."""
        spec = self.spec
        rates = {
            "conv3d_flops": spec.rate_conv3d(self.dtype),
            "matrix_flops": spec.rate_flops(self.dtype),
            "vector_flops": spec.rate_flops("fp32"),
            "hbm": spec.rate_bytes,
            "floor_s": spec.kernel_floor_us * 1e-6,
        }
        return math.fsum(kernel_seconds(k, **rates) for k in kernels)

    def _layers(
        self, model_cfg: ModelConfig, batch: int, split: tuple[int, int, int], train: bool
    ) -> dict[str, float]:
        cal = self.calibration
        if cal is not None:
            if cal.batch != batch or math.prod(split) != 1:
                raise ValueError(
                    f"GPU calibration ({cal.device}) was timed at batch {cal.batch}, unsplit; "
                    f"asked for batch {batch}, split {'x'.join(map(str, split))}"
                )
            times = cal.train_s if train else cal.forward_s
            return {name: self.layer_scale * t for name, t in times.items()}
        layers = step_kernels(
            model_cfg,
            batch=batch,
            spatial=math.prod(split),
            act=self.bytes_per_value,
            train=train,
        )
        return {name: self.layer_scale * self.seconds(ks) for name, ks in layers.items()}

    def layer_seconds(
        self,
        model_cfg: ModelConfig,
        *,
        batch: int,
        split: tuple[int, int, int],
        synced_norm: bool = False,
    ) -> dict[str, float]:
        """Forward + backward per layer (a synced norm's collectives are the network's)."""
        del synced_norm
        return self._layers(model_cfg, batch, split, train=True)

    def forward_seconds(
        self, model_cfg: ModelConfig, *, batch: int, split: tuple[int, int, int]
    ) -> dict[str, float]:
        """Forward only per layer, as evaluation runs it (no indices kept, no gradients)."""
        return self._layers(model_cfg, batch, split, train=False)

    def norm_collectives_in_layers(self, split: tuple[int, int, int]) -> bool:
        del split
        return False

    def optimizer_seconds(self, model_cfg: ModelConfig, optimizer_cfg: OptimizerConfig) -> float:
        params = sum(parameter_sizes(model_cfg))
        return self.seconds(update_kernels(params, update_bytes_per_param(optimizer_cfg)))

    def describe(self) -> str:
        s = self.spec
        how = (
            f"layers timed on {self.calibration.device} (GPU calibration)"
            if self.calibration
            else f"roofline: {s.conv3d_share:g} (3D conv), {s.flops_share:g} (GEMM) x "
            f"{s.peak_tflops[self.dtype]:g} TFLOP/s {self.dtype}, "
            f"{s.hbm_share:g} x {s.hbm_gbyte_s:g} GB/s HBM, "
            f"{s.kernel_floor_us:g} us a kernel"
        )
        if self.layer_scale != 1.0:
            how += f", x {self.layer_scale:.3g} as one measured run's device time"
        return f"{s.name}: {how}, {s.memory_gb:g} GB, {self.bytes_per_value} bytes an activation"
