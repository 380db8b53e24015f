"""The step's keys (train.data_placement, channels_last, compile, fused_optimizer): defaults that
keep a CPU's step as it was, "auto" made concrete per device, and clear refusals."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_random_crops import _dataset, shards  # noqa: F401  (fixture)
from test_spatial_layers import _single_dims

from cosmocub.config import ConfigError, load_config
from cosmocub.data.field_pairs import FieldPairs
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.parallel.parallel_dims import ParallelDims
from cosmocub.train import resident_loader
from cosmocub.train.resident_loader import PLACEMENTS, resolve_placement
from cosmocub.train.step_settings import step_settings


def _dims(spatial: int = 1, device: str = "cpu") -> ParallelDims:
    return dataclasses.replace(_single_dims(spatial), device=torch.device(device))


def test_defaults_keep_the_cpu_step_and_choose_the_gpu_one() -> None:
    cfg = load_config("config/science.yaml")
    tc = cfg.train
    assert (tc.data_placement, tc.channels_last, tc.compile, tc.fused_optimizer) == (
        "auto",
        "auto",
        False,
        "auto",
    )
    cpu = step_settings(cfg, _dims())
    assert cpu.autocast_dtype is None and cpu.memory_format == torch.channels_last_3d
    assert not cpu.compile and not cpu.fused_optimizer
    split = step_settings(cfg, _dims(spatial=2))
    assert split.memory_format == torch.contiguous_format  # as models/memory_layout.py
    # A GPU (only the device's type is read): bf16, NDHWC, the fused AdamW.
    gpu = step_settings(cfg, _dims(device="cuda"))
    assert gpu.autocast_dtype == torch.bfloat16 and gpu.memory_format == torch.channels_last_3d
    assert gpu.fused_optimizer and not gpu.compile
    off = load_config(None, overrides={"train": {"amp": "off"}})
    assert step_settings(off, _dims(device="cuda")).memory_format == torch.contiguous_format
    lion = load_config(None, overrides={"optimizer": {"name": "lion"}})
    assert not step_settings(lion, _dims(device="cuda")).fused_optimizer


@pytest.mark.parametrize(
    ("overrides", "spatial", "match"),
    [
        (
            {"train": {"channels_last": True}},
            2,
            r"'train.channels_last': true under a spatial "
            r"split \(parallel.spatial = 2\)",
        ),
        (
            {"train": {"compile": True}},
            2,
            r"'train.compile': true under a spatial split "
            r"\(parallel.spatial = 2\)",
        ),
        (
            {"train": {"fused_optimizer": True}, "optimizer": {"name": "lion"}},
            1,
            r"'train.fused_optimizer': true, but optimizer.name 'lion' has no fused kernel",
        ),
    ],
)
def test_combinations_that_cannot_run_are_refused(overrides, spatial, match) -> None:
    with pytest.raises(ConfigError, match=match):
        step_settings(load_config(None, overrides=overrides), _dims(spatial=spatial))


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("data_placement", "gpu", r"'train.data_placement': 'gpu' is not one of"),
        ("channels_last", "on", r"'train.channels_last': 'on' is not one of \['auto', True"),
        ("fused_optimizer", "yes", r"'train.fused_optimizer': 'yes' is not one of"),
        ("compile", "auto", r"'train.compile': 'auto' is not of type 'boolean'"),
    ],
)
def test_the_keys_values_are_checked_at_load(key, value, match) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides={"train": {key: value}})
    explicit = load_config(None, overrides={"train": {"channels_last": False}})
    assert step_settings(explicit, _dims()).memory_format == torch.contiguous_format


def test_fused_optimizer_is_torchs_fused_kernel() -> None:
    cfg = load_config(None)
    params = list(CosmoFlow(cfg.model).parameters())
    assert build_optimizer(params, cfg.optimizer, 8, fused=True).defaults["fused"] is True
    assert not build_optimizer(params, cfg.optimizer, 8).defaults["fused"]
    lion = load_config(None, overrides={"optimizer": {"name": "lion"}}).optimizer
    with pytest.raises(ValueError, match="optimizer 'lion' has no fused kernel"):
        build_optimizer(params, lion, 8, fused=True)


def _resolves(cases: list[tuple[str, object, str]]) -> None:
    """(asked, dataset, placement it resolves to, or the refusal's words) for each case."""
    for asked, dataset, expected in cases:
        if expected in PLACEMENTS:
            assert resolve_placement(asked, dataset, _dims()) == expected, asked
            continue
        with pytest.raises(ConfigError, match=r"^key 'train.data_placement': " + expected):
            resolve_placement(asked, dataset, _dims())


def test_data_placement_resolves_or_says_why_not(shards, monkeypatch) -> None:  # noqa: F811
    universes = _dataset(shards["random"])
    pairs = FieldPairs(universes, inputs=[3], target=0)  # a U-Net's: only the loader serves them
    _resolves(
        [
            ("auto", universes, "device"),
            ("loader", universes, "loader"),
            ("auto", pairs, "loader"),
            ("pinned", universes, "pinned copies batches to a GPU; this rank runs on cpu$"),
            ("device", pairs, "device serves a shard's samples or universes; FieldPairs"),
        ]
    )
    # A host with 64 KiB to spare: 3 universes of 4 × 16³ (96 KiB in float16 for pinned memory,
    # 192 KiB standardised in float32 on a CPU) fit in no half of it.
    monkeypatch.setattr(resident_loader, "host_memory_available", lambda: 64 << 10)
    too_big = (
        r"device: the training shard takes 0.19 MiB, more than 50% of cpu's free memory "
        r"\(0.03 MiB allowed\)"
    )
    _resolves([("auto", universes, "loader"), ("device", universes, too_big)])
