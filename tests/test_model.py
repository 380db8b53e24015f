"""CosmoFlow model: shapes, reference layer sizes, initialisation, summary FLOPs, model files."""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from cosmocub.config import ModelConfig, load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.model_factory import load_model_file, save_model_file
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


# --- the pooled branch (model.pooled) -------------------------------------------------------------

# Recorded at commit 0508255, before model.pooled existed: the seed-0 state_dict of this small model
# (sha256 of every key and tensor's bytes) and its eval outputs on a fixed input. If torch ever
# changes its CPU generator, re-record from a checkout of that commit.
PLAIN_STATE_SHA256 = "3034c3257e8bc7ec3d3f132152098b919ab1890d5fe7246bb4edeea11e3dd373"
PLAIN_EVAL_OUTPUT = [
    [0.04838811233639717, -0.09410165995359421, 0.049462687224149704, 0.03624788671731949],
    [0.06373888999223709, -0.09033866226673126, 0.049923140555620193, 0.03835252299904823],
]


def small_cfg(**pooled) -> ModelConfig:
    changes = {"input_size": 16, "num_conv_blocks": 2, "base_filters": 4, "dense_sizes": [8]}
    return model_cfg(**changes, **({"pooled": pooled} if pooled else {}))


def test_pooled_branch_off_is_the_plain_model_byte_for_byte() -> None:
    cfg = small_cfg()
    assert not cfg.pooled.enabled
    torch.manual_seed(0)
    model = CosmoFlow(cfg)
    assert model.pooled is None
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        digest.update(key.encode())
        digest.update(value.numpy().tobytes())
    assert digest.hexdigest() == PLAIN_STATE_SHA256
    x = 0.02 * torch.randn(2, 4, 16, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model.eval()(x)
    torch.testing.assert_close(out, torch.tensor(PLAIN_EVAL_OUTPUT), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("pooled", "features", "widened"),
    [
        # input 4 channels + blocks 4 and 8: 16 means; with stds 32; the input's alone: 8.
        ({"stats": "mean"}, 16, ("dense0", 512 + 16)),
        ({"stats": "mean_std", "join": "last_hidden"}, 32, ("output", 8 + 32)),
        ({"stats": "mean_std", "taps": ["input"]}, 8, ("dense0", 512 + 8)),
        # and the input's spectrum in 3 bins per channel: 12 more.
        ({"stats": "mean_std", "taps": ["input"], "spectrum_bins": 3}, 20, ("dense0", 512 + 20)),
    ],
)
def test_pooled_branch_joins_the_head_and_summary_counts_it(
    pooled: dict, features: int, widened: tuple[str, int]
) -> None:
    cfg = small_cfg(**pooled)
    plain = summarize(small_cfg())
    torch.manual_seed(0)
    model = CosmoFlow(cfg)
    assert model.pooled is not None and model.pooled.num_features == features
    layer, in_features = widened
    assert getattr(model.head, layer).in_features == in_features
    summary = summarize(cfg)
    branch = summary["pooled_branch"]
    out_features = getattr(model.head, layer).out_features
    # The norm's weight and bias per statistic, and the weights that read the statistics.
    assert branch["params"] == 2 * features + features * out_features
    assert summary["total_params"] == plain["total_params"] + branch["params"]
    assert summary["total_params"] == sum(p.numel() for p in model.parameters())
    assert summary["flops_per_sample"] == plain["flops_per_sample"] + branch["flops"]
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        out = model.eval()(torch.randn(2, 4, 16, 16, 16))
    assert summary["flops_per_sample"] == counter.get_total_flops() // 2
    assert out.shape == (2, 4)
    assert "pooled branch:" in format_summary(summary)
    assert summarize(small_cfg())["pooled_branch"] is None


def test_pooled_moments_are_the_whole_samples_per_channel() -> None:
    model = CosmoFlow(small_cfg(stats="mean_std")).eval()
    x = torch.randn(3, 4, 16, 16, 16) * torch.arange(1.0, 5.0).view(1, 4, 1, 1, 1) + 2.0
    moments = model.pooled.moments["input"](x)  # (B, 2C): means, then stds
    flat = x.double().flatten(2)
    torch.testing.assert_close(moments[:, :4].double(), flat.mean(2), rtol=1e-5, atol=1e-5)
    std = (flat.var(2, unbiased=False) + 1e-5).sqrt()
    torch.testing.assert_close(moments[:, 4:].double(), std, rtol=1e-5, atol=1e-5)
    # The head reads them: shifting one sample's mean density moves only its prediction.
    shifted = x.clone()
    shifted[1] += 0.5
    with torch.no_grad():
        before, after = model(x), model(shifted)
    assert torch.equal(before[0], after[0]) and not torch.equal(before[1], after[1])


def test_pooled_model_file_round_trip_and_resume_identity(tmp_path: Path) -> None:
    from cosmocub.train.checkpoint import resume_values

    cfg = small_cfg(stats="mean_std", join="last_hidden", taps=["blocks"])
    assert cfg.pooled.taps == ("blocks",)
    model = CosmoFlow(cfg)
    model.train()
    model(torch.randn(4, 4, 16, 16, 16))  # move the norms' running statistics
    save_model_file(tmp_path / "model.pt", model.eval(), cfg)
    loaded = load_model_file(tmp_path / "model.pt")
    assert loaded.config == cfg
    x = torch.randn(2, 4, 16, 16, 16)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    # Off, the branch is not part of a run's identity (checkpoints from before it resume); on,
    # it is.
    off = load_config(None)
    on = load_config(None, overrides={"model": {"pooled": {"stats": "mean"}}})
    assert "pooled" not in resume_values(off)["model"]
    assert resume_values(on)["model"]["pooled"] == {
        "stats": "mean",
        "taps": ["input", "blocks"],
        "join": "head_input",
    }


def test_pooled_moments_to_order_are_the_standardised_central_moments() -> None:
    # stats moments, order 6: per channel the mean, sqrt(var + eps), then E[((x − m)/sd)^p]
    # less the Gaussian's 0, 3, 0, 15 for p = 3 … 6; blocks of C, as the branch lays them out.
    model = CosmoFlow(small_cfg(stats="moments", order=6)).eval()
    assert model.pooled is not None and model.pooled.num_features == 6 * (4 + 4 + 8)
    gamma = torch.distributions.Gamma(torch.tensor([0.5, 1.0, 2.0, 8.0]), 1.0)
    x = gamma.sample((3, 16, 16, 16)).permute(0, 4, 1, 2, 3)  # skewed, one shape a channel
    got = model.pooled.moments["input"](x).double()
    flat = x.double().flatten(2)
    mean = flat.mean(2)
    dev = flat - mean[..., None]
    sd = ((dev**2).mean(2) + 1e-5).sqrt()
    gaussian = {3: 0, 4: 3, 5: 0, 6: 15}
    expected = [mean, sd] + [(dev**p).mean(2) / sd**p - gaussian[p] for p in range(3, 7)]
    torch.testing.assert_close(got, torch.cat(expected, 1), rtol=2e-4, atol=2e-4)
    # A gamma(k)'s skewness is 2/sqrt(k): the statistic is the distribution's, not a proxy.
    skew = got[:, 8:12].mean(0)
    torch.testing.assert_close(
        skew, 2 / torch.tensor([0.5, 1.0, 2.0, 8.0]).double().sqrt(), rtol=0.1, atol=0.0
    )


def test_whitening_estimates_are_the_exact_moments_of_every_sample_seen() -> None:
    # The default cumulative average: after batches of one size, the running mean and
    # covariance are those of all their samples pooled (population covariance), to rounding.
    from cosmocub.models.statistics_branch import GroupWhitening

    torch.manual_seed(1)
    index = torch.tensor([[0, 2, 4], [1, 3, 5]])
    whiten = GroupWhitening(index).train()
    batches = [
        torch.randn(8, 6) * torch.tensor([1.0, 2.0, 3.0, 0.1, 5.0, 1e-3]) + i for i in range(30)
    ]
    for b in batches:
        whiten(b)
    seen = torch.cat(batches).double()
    for g, cols in enumerate(index):
        x = seen[:, cols]
        torch.testing.assert_close(whiten.running_mean[g], x.mean(0), rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(
            whiten.running_cov[g], torch.cov(x.T, correction=0), rtol=1e-9, atol=1e-12
        )
    # An exponential average is not the pooled estimate: it weighs the late batches (here the
    # means climb by 1 a batch) more than the early ones.
    ema = GroupWhitening(index, momentum=0.05).train()
    for b in batches:
        ema(b)
    assert (ema.running_mean - whiten.running_mean).abs().min() > 0.1


def test_whitening_decorrelates_the_input_taps_statistics_and_stays_linear() -> None:
    from cosmocub.models.statistics_branch import GroupWhitening

    torch.manual_seed(0)
    # Two groups of three features, the second's first two nearly collinear (their correlation's
    # eigenvalues 2 : 5e-4, as a lognormal field's moments are: docs/explanation/known_answer.md),
    # interleaved as the branch lays them out (feature j of group g at column j·2 + g).
    mix = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    skew = torch.tensor([[100.0, 0.0, 0.0], [99.9, 3.0, 0.0], [50.0, 0.0, 1.0]])
    index = torch.tensor([[0, 2, 4], [1, 3, 5]])
    whiten = GroupWhitening(index, momentum=0.05)

    def batch(n: int) -> torch.Tensor:
        a, b = torch.randn(n, 3) @ mix.T + 5.0, torch.randn(n, 3) @ skew.T - 2.0
        return torch.stack([a, b], dim=2).flatten(1)  # (n, 6): a0 b0 a1 b1 a2 b2

    whiten.train()
    for _ in range(400):
        whiten(batch(16))
    whiten.eval()
    out = whiten(batch(20000)).double()
    for group in index:
        cov = torch.cov(out[:, group].T)
        torch.testing.assert_close(cov, torch.eye(3, dtype=cov.dtype), rtol=0, atol=0.12)
    # Eval mode tracks nothing; the map is affine in its input, the same one for every sample.
    before = whiten.num_batches_tracked.clone()
    x = batch(4).requires_grad_()
    y = whiten(x)
    assert torch.equal(whiten.num_batches_tracked, before)
    torch.testing.assert_close(
        whiten(2 * x) - whiten(x), y - whiten(torch.zeros_like(x)), rtol=1e-4, atol=1e-3
    )
    y.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_pooled_whiten_config_errors_name_the_key() -> None:
    from cosmocub.config import ConfigError

    with pytest.raises(ConfigError, match=r"pooled\.order': 9 is greater than the maximum"):
        small_cfg(stats="moments", order=9)
    with pytest.raises(ConfigError, match=r"model\.pooled\.norm': 'whiten'.*no 'input'"):
        small_cfg(stats="moments", norm="whiten", taps=["blocks"])
    cfg = small_cfg(stats="moments", order=5, norm="whiten", join="last_hidden")
    model = CosmoFlow(cfg)
    # The input tap's 4 channels × 5 statistics whitened, the blocks' 12 × 5 batch-normalised.
    assert model.pooled.whitened == 20
    assert model.pooled.norm.num_features == 60
    model.train()
    out = model(torch.randn(4, 4, 16, 16, 16))
    assert out.shape == (4, 4) and torch.isfinite(out).all()


def test_pooled_convs_tap_reads_each_blocks_conv_before_its_norm_and_activation() -> None:
    # taps [input, convs, blocks]: per block its conv output (a learned filter of the map below,
    # before the norm, LeakyReLU and the max-pool), then its output, in the order the model runs.
    cfg = small_cfg(stats="moments", order=3, taps=["input", "convs", "blocks"])
    torch.manual_seed(0)
    model = CosmoFlow(cfg).eval()
    assert list(model.pooled.moments) == ["input", "conv0", "block0", "conv1", "block1"]
    assert model.pooled.num_features == 3 * (4 + 4 + 4 + 8 + 8)
    x = torch.randn(2, 4, 16, 16, 16)
    captured = []
    model.pooled.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    model(x)
    stats = captured[0]
    block0 = model.conv_blocks.block0
    conv = block0.conv(x)
    expected = model.pooled.moments["conv0"](conv)
    torch.testing.assert_close(stats[1], expected, rtol=0, atol=0)
    # The skewness is the normalised map's too (an affine map per channel), not the activation's:
    # LeakyReLU skews the map, so the third moment moves.
    normed = block0.norm(conv)
    tap = model.pooled.moments["conv0"]
    torch.testing.assert_close(tap(normed)[:, 8:], expected[:, 8:], rtol=1e-4, atol=1e-4)
    assert (tap(block0.act(normed))[:, 8:] - expected[:, 8:]).abs().max() > 0.1
    torch.testing.assert_close(stats[2], model.pooled.moments["block0"](block0(x)))
    with pytest.raises(Exception, match=r"model\.pooled\.taps"):
        small_cfg(stats="mean", taps=["input", "pools"])


def test_pooled_spectrum_is_the_log_density_pk_of_the_features() -> None:
    # model.pooled.spectrum_bins: the input tap's moments, then per channel the log of its power
    # spectrum in the bins of the P(k) features: the network's fixed statistic is the classical
    # baseline's log_pk (data.features), up to log10 against log.
    from cosmocub.config import ConfigError
    from cosmocub.config.model_split import check_spatial_split
    from cosmocub.data.features import log_power_spectrum

    cfg = small_cfg(stats="moments", order=3, norm="whiten", spectrum_bins=5)
    torch.manual_seed(0)
    model = CosmoFlow(cfg).eval()
    assert model.pooled.num_features == 3 * (4 + 4 + 8) + 5 * 4
    assert model.pooled.whitened == (3 + 5) * 4
    x = torch.randn(2, 4, 16, 16, 16, generator=torch.Generator().manual_seed(3))
    x[1, 2] = 3.0 * x[1, 2] + 1.0  # a channel with 9x the power: its log spectrum + log 9
    captured = []
    model.pooled.register_forward_pre_hook(lambda _m, args: captured.append(args[0]))
    model(x)
    tap = captured[0][0].double()  # the input tap: (B, 3·4 moments, then 5·4 spectrum)
    assert tap.shape == (2, 3 * 4 + 5 * 4)
    spectrum = tap[:, 12:].reshape(2, 5, 4)  # (B, bins, C)
    for b, c in ((0, 0), (1, 2), (1, 3)):
        expected = np.log(log_power_spectrum(x[b, c].double().numpy(), num_bins=5))
        np.testing.assert_allclose(spectrum[b, :, c].numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(
        (spectrum[1, :, 2] - spectrum[0, :, 2]).mean().item(), np.log(9.0), atol=0.3
    )
    with pytest.raises(ConfigError, match=r"pooled\.spectrum_bins': 4 is the input tap's"):
        small_cfg(stats="mean", taps=["blocks"], spectrum_bins=4)
    with pytest.raises(ConfigError, match=r"spectrum_bins': 33 is greater than the maximum of 32"):
        small_cfg(stats="mean", spectrum_bins=33)
    with pytest.raises(ValueError, match=r"spectrum_bins 5.*split \[2, 1, 1\] divides it"):
        check_spatial_split(cfg, 16, [2, 1, 1])
    check_spatial_split(cfg, 16, [1, 1, 1])
    assert cfg.pooled.identity()["spectrum_bins"] == 5
    assert "spectrum_bins" not in small_cfg(stats="mean").pooled.identity()


def test_pooled_head_without_flatten_reads_the_statistics_alone() -> None:
    # model.pooled.flatten false: the head takes the pooled statistics only, so on a periodic
    # box (circular padding) a shift by the stack's total stride leaves the output unchanged;
    # with the flattened map beside them it does not.
    from cosmocub.config import ConfigError

    x = torch.randn(2, 4, 16, 16, 16, generator=torch.Generator().manual_seed(7))
    shifted = torch.roll(x, shifts=(4, 8, 12), dims=(2, 3, 4))  # multiples of 2² = 4
    outputs = {}
    for flatten in (True, False):
        torch.manual_seed(0)
        model = CosmoFlow(small_cfg(stats="moments", order=4, flatten=flatten)).eval()
        for block in model.conv_blocks:
            block.conv.padding_mode = "circular"
        with torch.no_grad():
            outputs[flatten] = (model(x), model(shifted))
    assert model.head.dense0.in_features == model.pooled.num_features == 4 * (4 + 4 + 8)
    torch.testing.assert_close(outputs[False][0], outputs[False][1], rtol=1e-4, atol=1e-5)
    assert (outputs[True][0] - outputs[True][1]).abs().max() > 1e-3
    for bad in ({"join": "last_hidden"}, {"taps": ["input"]}):
        with pytest.raises(ConfigError, match=r"model\.pooled\.flatten': false"):
            small_cfg(stats="mean", flatten=False, **bad)
    assert small_cfg(stats="mean", flatten=False).pooled.identity()["flatten"] is False
    assert "flatten" not in small_cfg(stats="mean").pooled.identity()
    summary = summarize(small_cfg(stats="moments", order=4, flatten=False))
    assert summary["total_params"] == sum(p.numel() for p in model.parameters())
