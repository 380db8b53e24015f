"""The model of a config by model.name, its parallel form, and its file: the one place that
knows every model."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cosmocub.config import ModelConfig
from cosmocub.io import atomic_path
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.parallelize import parallelize_cosmoflow, parallelize_unet
from cosmocub.models.unet import UNet3d

MODEL_FILE_FORMAT = "cosmocub.model/1"


def build_model(model_cfg: ModelConfig) -> nn.Module:
    """A plain CosmoFlow or 3D U-Net (model.name), freshly initialised."""
    if model_cfg.name == "unet":
        return UNet3d(model_cfg)
    return CosmoFlow(model_cfg)


def parallelize(model: nn.Module, dims, *, split: Sequence[int], periodic: bool) -> nn.Module:
    """`parallelize_unet` or `parallelize_cosmoflow`, whichever fits the model."""
    if isinstance(model, UNet3d):
        return parallelize_unet(model, dims, split=split, periodic=periodic)
    return parallelize_cosmoflow(model, dims, split=split, periodic=periodic)


def model_config_dict(cfg: ModelConfig) -> dict[str, Any]:
    """A plain dict (lists, no tuples) of a model config, for files and MLflow."""
    values = dataclasses.asdict(cfg)
    values["dense_sizes"] = list(values["dense_sizes"])
    values["pooled"]["taps"] = list(values["pooled"]["taps"])
    return values


def save_model_file(path: str | os.PathLike, model: nn.Module, model_cfg: ModelConfig) -> None:
    """Write `{format, model_config, state_dict}` atomically: what `load_model_file` rebuilds."""
    module = getattr(model, "module", model)  # unwrap DDP and the like
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    payload = {
        "format": MODEL_FILE_FORMAT,
        "model_config": model_config_dict(model_cfg),
        "state_dict": state,
    }
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_model_file(path: str | os.PathLike, *, map_location: str = "cpu") -> nn.Module:
    """Rebuild the model (a CosmoFlow, or the U-Net of model.name unet) from a file written by
    `save_model_file` (in eval mode)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: model file not found")
    payload = torch.load(path, map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != MODEL_FILE_FORMAT:
        found = payload.get("format") if isinstance(payload, dict) else type(payload).__name__
        raise ValueError(
            f"{path}: not a cosmocub model file (format {found!r}, expected {MODEL_FILE_FORMAT!r})"
        )
    values = dict(payload["model_config"])
    values["dense_sizes"] = tuple(values["dense_sizes"])
    # Files written before the gaussian head existed hold point-head models (and those written
    # before model.pooled, plain CosmoFlows: ModelConfig's default, the branch off).
    values.setdefault("head", "point")
    values.setdefault("nll_beta", 0.0)
    model = build_model(ModelConfig(**values))
    model.load_state_dict(payload["state_dict"])
    return model.eval()
