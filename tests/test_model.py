"""CosmoFlow model: shapes, reference layer sizes, initialisation, summary FLOPs, model files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cosmocub.config import ModelConfig, load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.factory import load_model_file, save_model_file
from cosmocub.models.summary import format_summary, summarize

torch.set_num_threads(1)


def model_cfg(**changes) -> ModelConfig:
    size = changes.get("input_size", 32)
    cfg = load_config(None, overrides={"preprocess": {"sample_size": size}, "model": changes})
    return cfg.model


def test_default_model_maps_batch_to_bounded_outputs() -> None:
    cfg = model_cfg()
    model = CosmoFlow(cfg).eval()
    x_bcdhw = torch.randn(3, cfg.in_channels, 32, 32, 32)
    out = model(x_bcdhw)
    assert out.shape == (3, 4)
    assert out.abs().max().item() <= cfg.output_scale
    # 4 blocks halve 32 → 2: 128 filters · 2³ features reach the head.
    assert model.head.dense0.in_features == 128 * 8


def test_mlperf_reference_layer_sizes(mlperf_model_cfg: ModelConfig) -> None:
    with torch.device("meta"):
        model = CosmoFlow(mlperf_model_cfg)
    convs = [m for m in model.conv_blocks.modules() if isinstance(m, nn.Conv3d)]
    assert [c.out_channels for c in convs] == [32, 64, 128, 256, 512]
    assert all(c.kernel_size == (3, 3, 3) and c.padding == (1, 1, 1) for c in convs)
    assert model.flat_features == 512 * 4**3 == 32768
    dense = [m for m in model.head.modules() if isinstance(m, nn.Linear)]
    assert [(d.in_features, d.out_features) for d in dense] == [(32768, 128), (128, 64), (64, 4)]
    expected = sum(
        (cin * 27 + 1) * cout
        for cin, cout in [(4, 32), (32, 64), (64, 128), (128, 256), (256, 512)]
    )
    expected += 32768 * 128 + 128 + 128 * 64 + 64 + 64 * 4 + 4
    assert sum(p.numel() for p in model.parameters()) == expected == 8_907_556


def test_xavier_uniform_weights_and_zero_biases() -> None:
    torch.manual_seed(0)
    model = CosmoFlow(model_cfg(base_filters=8, batch_norm=False))
    for module in model.modules():
        if isinstance(module, nn.Conv3d | nn.Linear):
            fan_out, fan_in = module.weight.shape[0], module.weight.shape[1]
            receptive = module.weight[0, 0].numel()
            bound = math.sqrt(6.0 / (fan_in * receptive + fan_out * receptive))
            assert module.weight.abs().max().item() <= bound
            # A uniform(-b, b) sample of this size reaches well past half the bound.
            assert module.weight.abs().max().item() > 0.5 * bound
            assert torch.count_nonzero(module.bias) == 0


def test_batch_norm_kernel_and_leaky_slope_are_configurable() -> None:
    cfg = model_cfg(
        batch_norm=True,
        kernel_size=5,
        leaky_relu_slope=0.1,
        input_size=16,
        num_conv_blocks=2,
        base_filters=4,
    )
    model = CosmoFlow(cfg)
    block = model.conv_blocks.block0
    assert isinstance(block.norm, nn.BatchNorm3d)
    assert block.conv.bias is None  # the norm's shift replaces it
    assert block.conv.padding == (2, 2, 2)
    assert block.act.negative_slope == 0.1
    assert model(torch.randn(2, 4, 16, 16, 16)).shape == (2, 4)


def test_summary_flops_match_torch_flop_counter() -> None:
    cfg = model_cfg(input_size=16, num_conv_blocks=2, base_filters=4, dense_sizes=[8])
    summary = summarize(cfg)
    model = CosmoFlow(cfg).eval()
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, 4, 16, 16, 16))
    assert summary["flops_per_sample"] == counter.get_total_flops()
    # conv0 by hand: 2 · (4·16³ outputs) · (4 in · 27) MACs.
    conv0 = next(layer for layer in summary["layers"] if layer["name"] == "conv_blocks.block0.conv")
    assert conv0["flops"] == 2 * 4 * 16**3 * 4 * 27
    assert conv0["output_shape"] == [4, 16, 16, 16]
    assert summary["total_params"] == sum(p.numel() for p in model.parameters())


def test_format_summary_of_reference_model(mlperf_model_cfg: ModelConfig) -> None:
    text = format_summary(summarize(mlperf_model_cfg))
    assert "8,907,556" in text
    assert "512x4x4x4" in text  # last pooled feature map
    assert "head.dense0" in text and "4,194,432" in text


def test_model_file_round_trip(tmp_path: Path) -> None:
    cfg = model_cfg(input_size=16, num_conv_blocks=2, base_filters=4, batch_norm=True)
    model = CosmoFlow(cfg)
    model.train()
    model(torch.randn(4, 4, 16, 16, 16))  # move batch-norm running stats off their defaults
    model.eval()
    path = tmp_path / "model.pt"
    save_model_file(path, model, cfg)
    loaded = load_model_file(path)
    assert loaded.config == cfg and not loaded.training
    x = torch.randn(2, 4, 16, 16, 16)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert not list(tmp_path.glob(".*tmp*"))


def test_load_model_file_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"missing\.pt: model file not found"):
        load_model_file(tmp_path / "missing.pt")
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"other\.pt: not a cosmocub model file"):
        load_model_file(tmp_path / "other.pt")
