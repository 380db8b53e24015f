"""Optimizers: Lion against its formula by hand, the MLPerf lr schedule, the factory."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from cosmocub.config import ConfigError, OptimizerConfig, OptimizerKind, load_config, load_schema
from cosmocub.optim.lion import Lion, lion_update
from cosmocub.optim.optimizer_factory import build_optimizer, build_schedule
from cosmocub.optim.schedule import lr_at, peak_lr


def opt_cfg(**changes) -> OptimizerConfig:
    return load_config(None, overrides={"optimizer": changes}).optimizer


def test_lion_update_matches_formula_by_hand() -> None:
    param = torch.tensor([1.0, -2.0, 0.5, 0.0])
    grad = torch.tensor([0.3, 0.1, -4.0, 0.0])
    exp_avg = torch.tensor([-1.0, 0.2, 0.1, 0.0])
    lion_update(param, grad, exp_avg, lr=0.1, weight_decay=0.5, beta1=0.9, beta2=0.99)
    # c = 0.9·m + 0.1·g = [-0.87, 0.19, -0.31, 0] → sign [-1, 1, -1, 0]
    # θ·(1 − 0.05) − 0.1·sign(c)
    expected_param = torch.tensor([0.95 + 0.1, -1.9 - 0.1, 0.475 + 0.1, 0.0])
    # m ← 0.99·m + 0.01·g
    expected_avg = torch.tensor([-0.99 + 0.003, 0.198 + 0.001, 0.099 - 0.04, 0.0])
    torch.testing.assert_close(param, expected_param)
    torch.testing.assert_close(exp_avg, expected_avg)


def test_lion_optimizer_two_steps_follow_the_formula() -> None:
    torch.manual_seed(0)
    w = torch.randn(5, requires_grad=True)
    w0 = w.detach().clone()
    opt = Lion([w], lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)
    grads = [torch.randn(5), torch.randn(5)]
    theta, m = w0.clone(), torch.zeros(5)
    for g in grads:
        w.grad = g.clone()
        opt.step()
        c = 0.8 * m + 0.2 * g
        theta = theta * (1 - 0.01 * 0.1) - 0.01 * torch.sign(c)
        m = 0.95 * m + 0.05 * g
    torch.testing.assert_close(w.detach(), theta)
    torch.testing.assert_close(opt.state[w]["exp_avg"], m)


def test_lion_rejects_bad_hyperparameters() -> None:
    with pytest.raises(ValueError, match="lr must be > 0, got 0"):
        Lion([torch.zeros(1, requires_grad=True)], lr=0.0)
    with pytest.raises(ValueError, match=r"betas must lie in \[0, 1\), got \(0.9, 1.0\)"):
        Lion([torch.zeros(1, requires_grad=True)], betas=(0.9, 1.0))


def test_mlperf_schedule_warmup_and_step_decays() -> None:
    cfg = opt_cfg(
        lr=0.001,
        base_batch_size=64,
        warmup_epochs=4,
        decay_epochs=[32, 64],
        decay_factors=[0.25, 0.125],
    )
    assert peak_lr(cfg, 128) == pytest.approx(0.002)
    assert lr_at(0.0, cfg, 128) == pytest.approx(0.001)  # warm-up starts at the unscaled lr
    assert lr_at(2.0, cfg, 128) == pytest.approx(0.0015)
    assert lr_at(3.5, cfg, 128) == pytest.approx(0.001 + 0.001 * 3.5 / 4)
    assert lr_at(4.0, cfg, 128) == pytest.approx(0.002)
    assert lr_at(31.99, cfg, 128) == pytest.approx(0.002)
    assert lr_at(32.0, cfg, 128) == pytest.approx(0.0005)  # 0.25 × peak
    assert lr_at(64.0, cfg, 128) == pytest.approx(0.00025)  # 0.125 × peak, not cumulative
    assert lr_at(500.0, cfg, 128) == pytest.approx(0.00025)
    with pytest.raises(ValueError, match="epoch must be >= 0, got -1"):
        lr_at(-1.0, cfg, 128)


def test_warmup_ramps_down_when_global_batch_is_below_base() -> None:
    cfg = opt_cfg(lr=0.001, base_batch_size=64, warmup_epochs=4)
    assert lr_at(0.0, cfg, 16) == pytest.approx(0.001)
    assert lr_at(2.0, cfg, 16) == pytest.approx((0.001 + 0.00025) / 2)
    assert lr_at(4.0, cfg, 16) == pytest.approx(0.00025)


def test_schedule_without_warmup_and_small_batch() -> None:
    cfg = opt_cfg(
        lr=0.01, base_batch_size=64, warmup_epochs=0, decay_epochs=[2], decay_factors=[0.5]
    )
    assert lr_at(0.0, cfg, 4) == pytest.approx(0.01 * 4 / 64)
    assert lr_at(2.0, cfg, 4) == pytest.approx(0.01 * 4 / 64 / 2)


def test_epoch_schedule_steps_and_resumes() -> None:
    cfg = opt_cfg(lr=0.001, base_batch_size=64, warmup_epochs=2)
    params = [torch.zeros(2, requires_grad=True)]
    opt = build_optimizer(params, cfg, global_batch=256)
    sched = build_schedule(opt, cfg, global_batch=256, steps_per_epoch=10)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001)
    for _ in range(15):
        sched.step()
    # epoch 1.5 of a 2-epoch ramp from 0.001 to 0.004
    assert opt.param_groups[0]["lr"] == pytest.approx(0.001 + 0.003 * 0.75)
    other = build_schedule(
        build_optimizer(params, cfg, 256), cfg, global_batch=256, steps_per_epoch=10
    )
    other.load_state_dict(sched.state_dict())
    assert other.optimizer.param_groups[0]["lr"] == opt.param_groups[0]["lr"]


@pytest.mark.parametrize(
    ("name", "cls"), [("sgd", torch.optim.SGD), ("adamw", torch.optim.AdamW), ("lion", Lion)]
)
def test_build_optimizer_kinds(name: str, cls: type) -> None:
    cfg = opt_cfg(name=name, lr=0.002, weight_decay=0.01)
    opt = build_optimizer([torch.zeros(3, requires_grad=True)], cfg, global_batch=32)
    assert isinstance(opt, cls)
    group = opt.param_groups[0]
    assert group["lr"] == pytest.approx(0.002)  # warm-up starts at the unscaled lr
    assert group["weight_decay"] == 0.01
    if name == "sgd":
        assert group["momentum"] == 0.9
    if name == "lion":
        assert group["betas"] == (0.9, 0.99)
    if name == "adamw":
        assert group["betas"] == (0.9, 0.999)


def test_optimizer_kinds_are_the_schemas_names_parsed_once() -> None:
    schema_names = load_schema()["properties"]["optimizer"]["properties"]["name"]["enum"]
    assert schema_names == [kind.value for kind in OptimizerKind]
    cfg = opt_cfg(name="distributed_lion")
    assert cfg.name is OptimizerKind.DISTRIBUTED_LION  # parsed, not a string
    # DDP averages the gradients of exactly the kinds that vote no update.
    assert {k for k in OptimizerKind if k.averages_gradients} == {"sgd", "adamw", "lion"}
    assert all(k.averages_gradients != k.votes_updates for k in OptimizerKind)
    assert opt_cfg(name="lion_cub").resolved_betas == (0.9, 0.99)
    assert opt_cfg(name="sgd").resolved_betas == (0.9, 0.999)
    with pytest.raises(ConfigError, match=r"optimizer.name': unknown optimizer 'lamb' \(sgd, "):
        dataclasses.replace(cfg, name="lamb")
