"""The gaussian head: its loss against the Gaussian likelihood, a fit of a problem with known
noise whose intervals cover as they should, the model's output layout, and the per-universe
combination and calibration of `uncertainty`."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from cosmocub.evaluation import uncertainty as unc
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.heads import gaussian_nll, regression_loss, split_output


def test_gaussian_nll_is_the_negative_log_likelihood():
    mean = torch.tensor([[0.1, -0.2]])
    log_var = torch.tensor([[-1.0, 0.5]])
    y = torch.tensor([[0.3, 0.4]])
    dist = torch.distributions.Normal(mean, torch.exp(0.5 * log_var))
    expected = -(dist.log_prob(y) + 0.5 * np.log(2 * np.pi)).mean()
    assert gaussian_nll(mean, log_var, y, beta=0.0).item() == pytest.approx(expected.item())
    # β-NLL weights each term by the (detached) variance^β.
    weighted = (-(dist.log_prob(y) + 0.5 * np.log(2 * np.pi)) * torch.exp(0.5 * log_var)).mean()
    assert gaussian_nll(mean, log_var, y, beta=0.5).item() == pytest.approx(weighted.item())


@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_gaussian_head_learns_known_noise_and_covers(beta):
    """y = 0.6·x + σ(x)·ε with σ(x) = 0.05 + 0.25·|x|: the fitted variance must follow σ(x)²."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)

    def sample(n):
        x = torch.rand(n, 1, generator=gen) * 2 - 1
        sigma = 0.05 + 0.25 * x.abs()
        return x, 0.6 * x + sigma * torch.randn(n, 1, generator=gen), sigma

    net = torch.nn.Sequential(torch.nn.Linear(1, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(net.parameters(), lr=0.03)
    x, y, _ = sample(2000)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a net this small only loses to thread hand-offs
    try:
        for _ in range(300):
            out = net(x)
            loss = gaussian_nll(out[:, :1], out[:, 1:], y, beta=beta)
            opt.zero_grad()
            loss.backward()
            opt.step()
    finally:
        torch.set_num_threads(threads)
    x, y, sigma = sample(20000)
    with torch.no_grad():
        out = net(x)
    mean, var = out[:, :1].numpy(), torch.exp(out[:, 1:]).numpy()
    true_nll = unc.gaussian_nll((0.6 * x).numpy(), sigma.numpy() ** 2, y.numpy())
    assert unc.gaussian_nll(mean, var, y.numpy()) == pytest.approx(true_nll, abs=0.05)
    # The predicted σ(x) follows the true one (0.05 at x = 0 to 0.3 at |x| = 1).
    assert np.abs(np.sqrt(var) - sigma.numpy()).mean() < 0.015
    observed = unc.coverage(mean, var, y.numpy())
    np.testing.assert_allclose(observed[:, 0], [0.68, 0.95], atol=0.03)


def test_cosmoflow_gaussian_head_layout(mlperf_model_cfg):
    cfg = dataclasses.replace(
        mlperf_model_cfg, input_size=16, num_conv_blocks=2, base_filters=2, head="gaussian"
    )
    point = CosmoFlow(dataclasses.replace(cfg, head="point"))
    model = CosmoFlow(cfg)
    # The point head is the plain CosmoFlow: only the output layer differs.
    assert model.head.output.out_features == 2 * point.head.output.out_features
    out = model.eval()(torch.randn(3, cfg.in_channels, 16, 16, 16))
    mean, log_var = split_output(out, cfg)
    assert mean.shape == log_var.shape == (3, 4)
    assert mean.abs().max() <= cfg.output_scale
    loss = regression_loss(out, torch.zeros(3, 4), cfg)
    assert loss.item() == pytest.approx(
        gaussian_nll(mean, log_var, torch.zeros(3, 4), beta=cfg.nll_beta).item()
    )
    y = torch.zeros(3, 4)
    pred = point.eval()(torch.randn(3, cfg.in_channels, 16, 16, 16))
    assert regression_loss(pred, y, point.config).item() == pytest.approx(
        pred.square().mean().item()
    )


def _correlated_crops(rng, universes, crops, shared, own):
    """Crops whose errors share a per-universe part (std `shared`) besides their own (`own`)."""
    true_u = rng.uniform(-1, 1, size=(universes, 1))
    offset = rng.normal(0, shared, size=(universes, 1))
    index = np.repeat(np.arange(universes), crops)
    mean = true_u[index] + offset[index] + rng.normal(0, own, size=(universes * crops, 1))
    var = np.full_like(mean, own**2)  # what a per-crop head sees: its own noise only
    return mean, var, true_u[index], index


def test_combination_with_inflation_fitted_on_validation_covers():
    rng = np.random.default_rng(0)
    val = _correlated_crops(rng, 400, 8, shared=0.1, own=0.2)
    test = _correlated_crops(rng, 400, 8, shared=0.1, own=0.2)
    mean_u, var_u = unc.combine_crops(test[0], test[1], test[3])
    true_u = unc.mean_per_universe(test[2], test[3])
    # Independent crops would give σ_u = 0.2/√8 = 0.07 against a true scatter √(0.01 + 0.005).
    assert unc.coverage(mean_u, var_u, true_u)[0, 0] < 0.5
    val_mean_u, val_var_u = unc.combine_crops(val[0], val[1], val[3])
    inflation = unc.variance_scale(val_mean_u, val_var_u, unc.mean_per_universe(val[2], val[3]))
    assert inflation[0] == pytest.approx((0.01 + 0.04 / 8) / (0.04 / 8), rel=0.2)
    observed = unc.coverage(mean_u, var_u * inflation, true_u)
    assert not unc.miscalibrated(observed)
    np.testing.assert_allclose(observed[:, 0], [0.68, 0.95], atol=0.05)


def test_combine_crops_is_inverse_variance_weighting():
    mean = np.array([[1.0], [3.0], [5.0]])
    var = np.array([[1.0], [3.0], [2.0]])
    m, v = unc.combine_crops(mean, var, np.array([7, 7, 2]))
    # Sorted universes: 2 (one crop), then 7: (1/1 + 3/3) / (1 + 1/3) = 1.5, var 1/(4/3) = 0.75.
    np.testing.assert_allclose(m[:, 0], [5.0, 1.5])
    np.testing.assert_allclose(v[:, 0], [2.0, 0.75])
    with pytest.raises(ValueError, match="must match"):
        unc.combine_crops(mean, np.zeros_like(var), np.array([0, 0, 1]))


def test_coverage_scale_calibrates_a_barely_learnt_parameter_where_the_likelihood_cannot():
    # A parameter the net has not learnt: predictions near 0 of values uniform on [-1, 1], so
    # the errors are uniform (bounded), not Gaussian.
    rng = np.random.default_rng(3)

    def rows(n):
        true = rng.uniform(-1, 1, size=(n, 2))
        mean = np.stack([rng.normal(0, 0.02, n), true[:, 1] + rng.normal(0, 0.3, n)], axis=1)
        return mean, np.full_like(mean, 0.05), true

    val, test = rows(400), rows(4000)
    likelihood = unc.variance_scale(*val)
    by_coverage = unc.coverage_scale(*val)
    # Uniform errors: the RMS interval covers 58 % at 68 % and everything at 95 %.
    fitted_on_likelihood = unc.coverage(test[0], test[1] * likelihood, test[2])
    assert fitted_on_likelihood[0, 0] == pytest.approx(0.58, abs=0.03)
    observed = unc.coverage(test[0], test[1] * by_coverage, test[2])
    np.testing.assert_allclose(observed[:, 0], [0.68, 1.0], atol=0.03)
    assert not unc.miscalibrated(observed)
    # Gaussian errors (the second parameter): both fits agree, to within what 400 validation
    # rows can tell (a coverage fraction's binomial σ there is 2.3 points; 0.05 is about 2σ).
    assert by_coverage[1] == pytest.approx(likelihood[1], rel=0.15)
    np.testing.assert_allclose(observed[:, 1], [0.68, 0.95], atol=0.05)


def test_coverage_scale_of_exact_rows_keeps_the_likelihood_scale():
    mean = np.zeros((5, 1))
    np.testing.assert_array_equal(unc.coverage_scale(mean, np.ones_like(mean), mean), [0.0])


def test_held_out_coverage_checks_the_scale_on_rows_it_was_not_fitted_on():
    rng = np.random.default_rng(4)
    n = 1000
    true = rng.uniform(-1, 1, size=(n, 2))
    spread = np.array([0.2, 0.1])  # the errors' σ; the head says 0.1 for both
    mean = true + rng.normal(0, spread, size=(n, 2))
    var = np.full_like(mean, 0.01)
    assert unc.coverage(mean, var, true)[0, 0] < 0.45  # twice too narrow: ~38 % at 68 %
    held_out = unc.held_out_coverage(mean, var, true, folds=5)
    # 1,000 rows: a 68 % fraction has a binomial σ of 1.5 points; 0.035 is over 2σ.
    np.testing.assert_allclose(held_out, [[0.68, 0.68], [0.95, 0.95]], atol=0.035)
    scale = unc.coverage_scale(mean, var, true)
    np.testing.assert_allclose(unc.error_rms(mean, var * scale, true), [1, 1], atol=0.06)
    # Test universes whose errors are half validation's: over-covered, with an error RMS of ½,
    # while the check on validation alone says the calibration holds.
    test_mean = true + rng.normal(0, spread / 2, size=(n, 2))
    assert np.all(unc.coverage(test_mean, var * scale, true)[0] > 0.9)
    np.testing.assert_allclose(unc.error_rms(test_mean, var * scale, true), [0.5, 0.5], atol=0.04)
    # Each row scaled by the others' factor, not its own: rows 0, 2, 4, … (fold 0 of 2) with
    # errors four times the rest's under-cover at the odd rows' scale.
    mean[::2] = true[::2] + 4 * (mean[::2] - true[::2])
    even, odd = slice(0, None, 2), slice(1, None, 2)
    expected = (
        np.concatenate(
            [
                unc.coverage(
                    mean[even],
                    var[even] * unc.coverage_scale(mean[odd], var[odd], true[odd]),
                    true[even],
                ),
                unc.coverage(
                    mean[odd],
                    var[odd] * unc.coverage_scale(mean[even], var[even], true[even]),
                    true[odd],
                ),
            ],
            axis=0,
        )
        .reshape(2, 2, 2)
        .mean(axis=0)
    )
    np.testing.assert_allclose(unc.held_out_coverage(mean, var, true, folds=2), expected)
    assert unc.held_out_coverage(mean, var, true, folds=2)[0, 0] < 0.6
    with pytest.raises(ValueError, match="6 folds for 5 rows"):
        unc.held_out_coverage(mean[:5], var[:5], true[:5], folds=6)
