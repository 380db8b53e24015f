"""LionCub used from any script: what `params` may be (parameters(), named_parameters(), parameter
groups), the options it refuses in one line, and the levels it keeps (a warning where an
all-reduce keeps fewer than `bits` ask for, `levels_in_use` for the run's parameters)."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from cosmocub.optim import Lion, LionCub, LionCubSettings, quantizer_levels
from cosmocub.optim.quantize import levels_shrunk

HYPER = {"lr": 0.01, "betas": (0.9, 0.99), "weight_decay": 0.1}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


def _train(model: nn.Module, opt: torch.optim.Optimizer, steps: int = 8) -> list[float]:
    """Losses of `steps` steps on fixed random batches."""
    gen = torch.Generator().manual_seed(3)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, 6, generator=gen)
        y = torch.stack([x[:, 0], x[:, 1] - x[:, 2], x.sum(1)], dim=1)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _same_parameters(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_parameters_train_as_lion_and_are_named_by_position() -> None:
    reference, model = _model(), _model()
    lion_losses = _train(reference, Lion(reference.parameters(), **HYPER))
    opt = LionCub(
        model.parameters(),
        LionCubSettings(momentum_sync="every", sync_patterns=["param_2"]),
        group=None,
    )
    for group in opt.param_groups:  # the defaults were the class's: set Lion's hyperparameters
        group.update(lr=HYPER["lr"], betas=HYPER["betas"], weight_decay=HYPER["weight_decay"])
    losses = _train(model, opt)
    assert _same_parameters(reference, model) and losses == lion_losses
    assert losses[-1] < 0.8 * losses[0]
    # Plain tensors are named param_<i> by position: the pattern picks the second weight.
    assert opt.sync_params == {id(model[2].weight)}


def test_named_parameters_and_groups_keep_their_own_hyperparameters() -> None:
    groups_of = {
        "plain": lambda m: [
            {"params": m[0].parameters(), "lr": 0.02, "weight_decay": 0.0},
            {"params": m[2].parameters(), "betas": (0.8, 0.9)},
        ],
        "named": lambda m: [
            {"params": list(m[0].named_parameters()), "lr": 0.02, "weight_decay": 0.0},
            {"params": list(m[2].named_parameters()), "betas": (0.8, 0.9)},
        ],
    }
    reference = _model()
    lion_losses = _train(reference, Lion(groups_of["plain"](reference), **HYPER))
    for kind, groups in groups_of.items():
        model = _model()
        # Buckets of ~40 values: several per group, none across groups.
        opt = LionCub(groups(model), LionCubSettings(bucket_mb=40 * 4 / 2**20, **HYPER), group=None)
        assert len(opt.buckets) > 2
        for b in opt.buckets:  # each bucket's parameters are its group's
            assert {id(p) for p in b.params} <= {id(p) for p in b.group["params"]}
        assert {id(b.group) for b in opt.buckets} == {id(g) for g in opt.param_groups}
        assert _train(model, opt) == lion_losses, kind
        assert _same_parameters(reference, model), kind
        assert [g["lr"] for g in opt.param_groups] == [0.02, 0.01]


@pytest.mark.parametrize(
    ("params_of", "message"),
    [
        (
            lambda m: [{"params": m[0].parameters()}, {"params": m[2].parameters(), "bits": 2}],
            r"^LionCub: parameter group 1 sets bits: a group may set only lr, betas, "
            r"weight_decay; pass the others to LionCub, for all groups$",
        ),
        (lambda m: [{"lr": 0.1}], r"^LionCub: parameter group 0 is not a dict with 'params'$"),
        (lambda m: [{"params": m.parameters(), "lr": -1.0}], r"^LionCub: lr must be > 0, got -1"),
    ],
)
def test_group_options_it_cannot_hold_are_refused_in_one_line(params_of, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LionCub(params_of(_model()), group=None)


def test_sign_with_more_bits_is_refused_as_the_config_refuses_it() -> None:
    with pytest.raises(ValueError, match=r"^LionCub: quantizer 'sign' sends 1 bit, got bits=4 "):
        LionCub(_model().parameters(), LionCubSettings(quantizer="sign", bits=4), group=None)
    for bits in (2, 8):  # the other direction is quantizer_levels' own refusal
        assert LionCub(
            _model().parameters(), LionCubSettings(quantizer="l1", bits=bits), group=None
        )
    with pytest.raises(ValueError, match=r"^LionCub: quantizer 'l1' needs >= 2 bits \(1 bit"):
        LionCub(_model().parameters(), LionCubSettings(quantizer="l1", bits=1), group=None)


def test_levels_shrunk_names_what_is_asked_kept_and_what_keeps_them() -> None:
    # The case: an 8-bit l1 quantizer over an fp16 all-reduce at 1,024 data ranks.
    kept = quantizer_levels("l1", 8, 1024, collective="allreduce", allreduce_dtype="fp16")
    assert kept == 2  # floor(2048 / 1024)
    message = levels_shrunk("l1", 8, kept, "1024 data ranks", "fp16")
    assert message is not None and "\n" not in message
    for words in (
        "'l1' 8-bit asks for 127 levels, keeps 2",
        "fp16 all-reduce over 1024 data ranks",
        "still sends 2 bytes a value",
        "collective alltoall or allgather keeps all 127 levels",
    ):
        assert words in message, message
    int8 = levels_shrunk("linf", 4, 3, "32 data ranks", "int8")  # floor(127/32) = 3 < 7
    assert int8 is not None and "keeps 3" in int8 and "1 byte a value" in int8
    assert levels_shrunk("l1", 4, 7, "1024 data ranks", "fp16") is None  # kept them all
    assert levels_shrunk("sign", 1, 1, "4096 data ranks", "int8") is None


def test_no_warning_where_the_levels_are_kept_and_levels_in_use() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        opt = LionCub(
            _model().parameters(),
            LionCubSettings(quantizer="l1", bits=8, collective="allreduce"),
            group=None,
        )
    assert opt.levels_in_use == 127  # one rank: floor(127/1)
    assert LionCub(_model().parameters(), group=None).levels_in_use == 1  # sign


def test_topology_is_lion_cubs_and_settings_refuse_what_they_do_not_hold() -> None:
    """The data ranks of a node are topology (LionCub's keyword, beside the group); the
    settings are the wire and the schedule, and refuse any other key."""
    model = _model()
    with pytest.raises(TypeError, match="ranks_per_node"):
        LionCub(model.parameters(), group=None, ranks_per_node=2)
    with pytest.raises(TypeError, match="data_ranks_per_node"):
        LionCubSettings(data_ranks_per_node=2)
    with pytest.raises(ValueError, match=r"unknown hierarchy 'rack' \(flat, node\)"):
        LionCubSettings(hierarchy="rack")
    # A group of one: whatever the node size, the flat exchange over one rank.
    opt = LionCub(
        model.parameters(), LionCubSettings(hierarchy="node"), group=None, data_ranks_per_node=4
    )
    assert not opt.two_level and opt.collective.size == 1
