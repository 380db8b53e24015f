"""The model of a config by model.name, and its parallel form: the one place that knows both."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn

from cosmocub.config import ModelConfig


def build_model(model_cfg: ModelConfig) -> nn.Module:
    """A plain CosmoFlow or 3D U-Net (model.name), freshly initialised."""
    if model_cfg.name == "unet":
        from cosmocub.models.unet import UNet3d

        return UNet3d(model_cfg)
    from cosmocub.models.cosmoflow import CosmoFlow

    return CosmoFlow(model_cfg)


def check_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """ValueError with the numbers if `split` cannot run this model on `input_size`³ samples."""
    from cosmocub.parallel.spatial import check_spatial_split, check_unet_split

    check = check_unet_split if model_cfg.name == "unet" else check_spatial_split
    check(model_cfg, input_size, split)


def parallelize(model: nn.Module, dims, *, split: Sequence[int], periodic: bool) -> nn.Module:
    """`parallelize_unet` or `parallelize_cosmoflow`, whichever fits the model."""
    from cosmocub.models.unet import UNet3d
    from cosmocub.parallel.spatial import parallelize_cosmoflow, parallelize_unet

    if isinstance(model, UNet3d):
        return parallelize_unet(model, dims, split=split, periodic=periodic)
    return parallelize_cosmoflow(model, dims, split=split, periodic=periodic)
