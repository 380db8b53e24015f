"""Distributed Lion and Lion Cub: the pure pieces (quantizers, packing, vote, schedules), the
optimizers at one data rank against Lion and lion-pytorch, config errors, and 4 gloo ranks."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from shard_fixtures import make_random_shards
from test_spatial_train import run_trainings
from test_train import TINY  # the plain tiny recipe the training tests share
from torch import nn

from cosmocub.config import ConfigError, load_config
from cosmocub.optim.collectives import COLLECTIVES
from cosmocub.optim.lion import Lion
from cosmocub.optim.lion_cub import LionCub, LionCubSettings
from cosmocub.optim.momentum_sync import (
    average_momenta,
    exponential_sync_steps,
    is_sync_step,
    matches,
)
from cosmocub.optim.optimizer_factory import build_optimizer, check_group_size
from cosmocub.optim.packing import pack_bits, pack_codes, unpack_bits, unpack_codes
from cosmocub.optim.quantize import quantize, tensor_scales
from cosmocub.optim.vote import sign_bits, tie_pattern, vote

QUANTIZERS = ("sign", "l1", "linf", "l0")

# --- packing ------------------------------------------------------------------------------------


def test_pack_bits_known_patterns() -> None:
    bits = torch.tensor(
        [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1], [1, 1, 0, 1, 0, 0, 0, 1]]
    )
    assert pack_bits(bits).flatten().tolist() == [1, 128, 1 + 2 + 8 + 128]
    assert unpack_bits(torch.tensor([5], dtype=torch.uint8)).tolist() == [1, 0, 1, 0, 0, 0, 0, 0]
    assert pack_bits(torch.ones(16, dtype=torch.bool)).tolist() == [255, 255]


def test_pack_round_trips_bits_and_codes() -> None:
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2, (3, 5, 1024), generator=gen, dtype=torch.uint8)
    packed = pack_bits(bits)
    assert packed.shape == (3, 5, 128) and packed.dtype == torch.uint8
    assert torch.equal(unpack_bits(packed), bits)
    for width in range(1, 9):
        codes = torch.randint(0, 2**width, (4, 64), generator=gen, dtype=torch.uint8)
        packed = pack_codes(codes, width)
        assert packed.shape == (4, width, 8)  # width bytes per 8 codes
        assert torch.equal(unpack_codes(packed, width), codes), width
    # 3-bit codes 0..7 in plane layout: plane j is bit j of each code.
    planes = pack_codes(torch.arange(8, dtype=torch.uint8), 3)
    assert planes.flatten().tolist() == [0b10101010, 0b11001100, 0b11110000]
    with pytest.raises(ValueError, match="not a multiple of 8"):
        pack_bits(torch.ones(12, dtype=torch.uint8))


# --- quantizers and levels ----------------------------------------------------------------------


def test_quantizers_on_known_values() -> None:
    c = torch.tensor([0.1, -0.2, 0.0, 0.4, -1.0, 0.5, 0.0, 0.0])
    assert quantize(c, quantizer="sign", levels=1).tolist() == [1, -1, 0, 1, -1, 1, 0, 0]
    # linf over two tensors [0.1,-0.2,0,0.4] (max 0.4) and [-1,0.5,0,0] (max 1), s = 3:
    # |c|/scale·3 = 0.75, 1.5, 0, 3 | 3, 1.5, 0, 0 → rounded (half to even), at least 1 if c ≠ 0.
    q = quantize(c, quantizer="linf", levels=3, segments=[4, 4])
    assert q.tolist() == [1, -2, 0, 3, -3, 2, 0, 0]
    scales = tensor_scales(c, [4, 4], "l1")
    assert scales.tolist() == pytest.approx([0.175, 0.375])
    l0 = tensor_scales(c, [4, 4], "l0")  # geometric mean of the non-zero |c|
    assert l0.tolist() == pytest.approx([(0.1 * 0.2 * 0.4) ** (1 / 3), (1.0 * 0.5) ** 0.5])
    # l1, s = 2: 0.1/0.175·2 = 1.14 → 1; 0.4/0.175·2 = 4.6 → clamped to 2.
    assert quantize(c, quantizer="l1", levels=2, segments=[4, 4]).tolist()[:4] == [1, -2, 0, 2]


@pytest.mark.parametrize("quantizer", QUANTIZERS[1:])
def test_scaled_quantizers_keep_the_sign_and_the_range(quantizer: str) -> None:
    c = torch.randn(1000, generator=torch.Generator().manual_seed(1)) ** 3  # wide range
    c[::7] = 0.0
    for levels in (1, 3, 127):
        q = quantize(c, quantizer=quantizer, levels=levels, segments=[600, 400])
        assert q.dtype == torch.int8
        assert torch.equal(torch.sign(q), torch.sign(c).to(torch.int8))
        assert int(q.abs().max()) == levels


# --- vote ---------------------------------------------------------------------------------------


def test_vote_breaks_ties_and_zeros_by_the_pattern() -> None:
    assert tie_pattern(6, step=0).tolist() == [1, -1, 1, -1, 1, -1]
    assert tie_pattern(4, step=1, offset=2).tolist() == [-1, 1, -1, 1]
    tie = torch.tensor([1, 1, -1, 1, -1], dtype=torch.int8)
    total = torch.tensor([3, -2, 0, 0, 0], dtype=torch.int16)
    assert vote(total, tie).tolist() == [1, -1, -1, 1, -1]
    q = torch.tensor([2, -1, 0, 0, 0], dtype=torch.int8)
    assert sign_bits(q, tie).tolist() == [1, 0, 0, 1, 0]


# --- momentum sync ------------------------------------------------------------------------------


def test_momentum_sync_schedules() -> None:
    assert exponential_sync_steps(1.0, 40) == [1, 3, 7, 15, 31]
    # k = 2: T = 1, 1+√2, +2, +2√2, +4, +4√2 = 1, 2.41, 4.41, 7.24, 11.24, 16.9
    assert exponential_sync_steps(2.0, 17) == [1, 2, 4, 7, 11, 16]
    exp = [s for s in range(1, 40) if is_sync_step(s, schedule="exponential", every=1, k=1.0)]
    assert exp == [1, 3, 7, 15, 31]
    every = [s for s in range(1, 13) if is_sync_step(s, schedule="every", every=4, k=1.0)]
    assert every == [4, 8, 12]
    assert not any(is_sync_step(s, schedule="never", every=1, k=1.0) for s in range(1, 50))
    assert matches("convs.0.weight", ["convs.*"]) and not matches("dense.0.bias", ["convs.*"])
    assert matches("anything", [])


def test_average_momenta_over_simulated_ranks() -> None:
    momenta = [[torch.full((2, 3), float(r)), torch.full((4,), 10.0 * r)] for r in range(4)]
    # An all-reduce's semantics: every rank's flat buffer becomes the sum over the ranks.
    group_sum = torch.stack([torch.cat([m.reshape(-1) for m in ms]) for ms in momenta]).sum(0)

    def all_reduce_sum(x: torch.Tensor) -> None:
        x.copy_(group_sum)

    for ms in momenta:
        assert average_momenta(ms, all_reduce_sum, 4) == 10 * 4  # fp32 payload bytes
    for ms in momenta:  # mean of 0..3 = 1.5, of 0, 10, 20, 30 = 15
        assert ms[0].tolist() == [[1.5] * 3] * 2 and ms[1].tolist() == [15.0] * 4
    assert average_momenta([], all_reduce_sum, 4) == 0


# --- optimizers at one data rank ----------------------------------------------------------------


def _tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 3))
    with torch.no_grad():
        model[0].weight[:4] = 0.0  # 4 dead units: gradients and momenta exactly zero, c = 0
        model[0].bias[:4] = -1.0
    return model


def _train_steps(model: nn.Module, opt: torch.optim.Optimizer, steps: int) -> list[torch.Tensor]:
    """Run `steps` steps on fixed random batches; the flat parameters after each."""
    gen = torch.Generator().manual_seed(7)
    seen = []
    for _ in range(steps):
        x, y = torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        seen.append(torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()]))
    return seen


HYPER = {"lr": 0.01, "betas": (0.9, 0.99), "weight_decay": 0.1}


def test_lion_equals_lion_pytorch_step_for_step() -> None:
    import lion_pytorch  # the test extra's reference implementation

    ours, theirs = _tiny_model(), _tiny_model()
    a = _train_steps(ours, Lion(ours.parameters(), **HYPER), 12)
    b = _train_steps(theirs, lion_pytorch.Lion(theirs.parameters(), **HYPER), 12)
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        assert torch.equal(x, y), step


VARIANTS = [
    {"quantizer": q, "bits": b, "collective": c, "overlap": o}
    for q, b in (("sign", 1), ("l1", 4), ("linf", 8), ("l0", 2))
    for c in COLLECTIVES
    for o in (False, True)
] + [{"quantizer": "l1", "bits": 4, "collective": "allreduce", "allreduce_dtype": "fp16"}]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v.values())))
def test_lion_cub_at_one_data_rank_equals_lion(variant: dict) -> None:
    reference, model = _tiny_model(), _tiny_model()
    lion = Lion(reference.parameters(), **HYPER)
    expected = _train_steps(reference, lion, 10)
    settings = LionCubSettings(
        momentum_sync="every",
        sync_every=2,
        bucket_mb=100 * 4 / 2**20,  # ~100 values: several buckets
        **variant,
        **HYPER,
    )
    opt = LionCub(model.named_parameters(), settings, group=None)
    assert len(opt.buckets) > 1
    got = _train_steps(model, opt, 10)
    for step, (x, y) in enumerate(zip(expected, got, strict=True)):
        assert torch.equal(x, y), step
    for p_ref, p in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], lion.state[p_ref]["exp_avg"])
    assert opt.comm_stats.bytes_sent == 0  # a group of one sends nothing


def test_lion_cub_refuses_what_its_collective_would_ignore() -> None:
    model = _tiny_model()
    refusal = r"^LionCub: only collective 'allreduce' sums on the wire; 'alltoall' sums on"
    with pytest.raises(ValueError, match=refusal):
        LionCub(
            model.named_parameters(),
            LionCubSettings(collective="alltoall", allreduce_dtype="fp16"),
            group=None,
        )
    opt = LionCub(
        model.named_parameters(),
        LionCubSettings(quantizer="l1", bits=4, collective="allreduce"),
        group=None,
    )
    assert opt.spec.allreduce_dtype == "int8" and opt.spec.levels == 7


def test_distributed_lion_from_config_at_one_rank_equals_lion() -> None:
    cfg = load_config(None, overrides={"optimizer": {"name": "distributed_lion", "lr": 0.01}})
    model, reference = _tiny_model(), _tiny_model()
    opt = build_optimizer(model.named_parameters(), cfg.optimizer, 64)
    assert isinstance(opt, LionCub) and opt.communicates_gradients
    assert opt.collective.name == "allgather" and opt.spec.quantizer == "sign"
    ref = Lion(reference.parameters(), lr=0.01, betas=(0.9, 0.99))
    for x, y in zip(_train_steps(model, opt, 5), _train_steps(reference, ref, 5), strict=True):
        assert torch.equal(x, y)


def test_lion_cub_state_dict_round_trip_at_one_rank() -> None:
    model = _tiny_model()
    opt = LionCub(
        model.named_parameters(), LionCubSettings(momentum_sync="exponential", **HYPER), group=None
    )
    _train_steps(model, opt, 3)
    saved = opt.state_dict()
    assert (saved["step_count"], saved["data_group_size"], saved["data_rank"]) == (3, 1, 0)
    first = saved["state"][0]["exp_avg"]
    assert first.shape == (16, 6)  # this rank's own momentum: no row of any other rank
    assert first.data_ptr() == opt.state[next(model.parameters())]["exp_avg"].data_ptr()  # no copy
    saved = copy.deepcopy(saved)
    fresh_model = _tiny_model()
    fresh = LionCub(fresh_model.named_parameters(), LionCubSettings(**HYPER), group=None)
    fresh.load_state_dict(saved)
    assert fresh.step_count == 3
    for p, q in zip(model.parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], fresh.state[q]["exp_avg"])
    # The loaded momentum lives in the bucket buffer that the step updates.
    (bucket,) = fresh.buckets
    for p, view in zip(bucket.params, bucket.views, strict=True):
        assert fresh.state[p]["exp_avg"] is view
    assert bucket.momentum.abs().sum() > 0
    with pytest.raises(ValueError, match="state of data rank 1 loaded on data rank 0 of 1"):
        fresh.load_state_dict({**saved, "data_rank": 1})  # another rank's own momentum
    saved["data_group_size"] = 4
    with pytest.raises(ValueError, match="4 data ranks' momenta, this run has 1"):
        fresh.load_state_dict(saved)


def test_lion_cub_loads_the_gathered_layout_written_before() -> None:
    """Checkpoints written before each rank saved its own: data rank 0's (D, *shape) rows."""
    model = _tiny_model()
    opt = LionCub(model.named_parameters(), LionCubSettings(**HYPER), group=None)
    _train_steps(model, opt, 3)
    own = opt.state_dict()
    state = {
        i: {"exp_avg_per_data_rank": e["exp_avg"][None].clone()} for i, e in own["state"].items()
    }
    old = {k: v for k, v in own.items() if k != "data_rank"} | {"state": state}
    fresh_model = _tiny_model()
    fresh = LionCub(fresh_model.named_parameters(), LionCubSettings(**HYPER), group=None)
    fresh.load_state_dict(old)
    fresh_model.load_state_dict(model.state_dict())
    for p, q in zip(model.parameters(), fresh_model.parameters(), strict=True):
        assert torch.equal(opt.state[p]["exp_avg"], fresh.state[q]["exp_avg"])
    assert _train_steps(model, opt, 2)[-1].equal(_train_steps(fresh_model, fresh, 2)[-1])
    rows = state[0]["exp_avg_per_data_rank"]
    state[0]["exp_avg_per_data_rank"] = torch.cat([rows, rows])  # not one row a rank
    with pytest.raises(ValueError, match=r"\[1, 2\] rows of momenta for 1 data ranks"):
        fresh.load_state_dict(old)


# --- config errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("optimizer", "message"),
    [
        ({"name": "lion_cub", "lion_cub": {"quantizer": "l2"}}, "optimizer.lion_cub.quantizer"),
        ({"name": "lion_cub", "lion_cub": {"collective": "ring"}}, "optimizer.lion_cub.collective"),
        ({"name": "lion_cub", "lion_cub": {"quantizer": "l1", "bits": 9}}, "lion_cub.bits"),
        ({"name": "lion_cub", "lion_cub": {"quantizer": "l1", "bits": 1}}, "needs >= 2 bits"),
        ({"name": "lion_cub", "lion_cub": {"bits": 4}}, "'sign' sends 1 bit, got bits=4"),
        (
            {"name": "lion_cub", "lion_cub": {"allreduce_dtype": "fp16"}},
            r"allreduce_dtype': only collective 'allreduce' sums on the wire; 'alltoall'",
        ),
        (
            {
                "name": "lion_cub",
                "lion_cub": {"collective": "allreduce", "allreduce_dtype": "int16"},
            },
            "optimizer.lion_cub.allreduce_dtype",
        ),
        (
            {"name": "lion", "lion_cub": {"quantizer": "l1"}},
            "options given for optimizer.name 'lion'",
        ),
        ({"name": "distributed_lion", "lion_cub": {}}, "key 'optimizer.lion_cub'"),
        (
            {"name": "lion_cub", "lion_cub": {"momentum_sync": {"schedule": "sometimes"}}},
            "optimizer.lion_cub.momentum_sync.schedule",
        ),
    ],
)
def test_bad_lion_cub_options_name_the_key(optimizer: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides={"optimizer": optimizer})


def test_lion_cub_defaults_and_group_size_check() -> None:
    cfg = load_config(None, overrides={"optimizer": {"name": "lion_cub"}})
    lc = cfg.optimizer.lion_cub
    assert lc is not None and (lc.quantizer, lc.resolved_bits, lc.collective) == (
        "sign",
        1,
        "alltoall",
    )
    assert cfg.optimizer.resolved_betas == (0.9, 0.99)
    assert cfg.values["optimizer"]["lion_cub"]["momentum_sync"]["schedule"] == "never"
    assert load_config(None).optimizer.lion_cub is None
    assert lc.resolved_allreduce_dtype == "int8"

    def lion_cub(**options: object):
        values = {"optimizer": {"name": "lion_cub", "lion_cub": options}}
        return load_config(None, overrides=values).optimizer.lion_cub

    # Summed on the rank: 7 levels beyond 127 data ranks; on the wire: the dtype's bound.
    assert check_group_size(lion_cub(quantizer="l1", bits=4, collective="alltoall"), 256) == 7
    allreduce = lion_cub(quantizer="l1", bits=4, collective="allreduce")
    assert check_group_size(allreduce, 32) == 3
    with pytest.raises(
        ConfigError,
        match=r"^key 'optimizer.lion_cub.allreduce_dtype': .*over 64 data ranks: s = min\(7, "
        r"floor\(127/64\)\) = 1 \(one level.*choose collective alltoall.*fp16 \(7 levels\)",
    ):
        check_group_size(allreduce, 64)
    fp16 = lion_cub(quantizer="l1", bits=4, collective="allreduce", allreduce_dtype="fp16")
    assert check_group_size(fp16, 512) == 4
    with pytest.raises(ConfigError, match=r"over 4096 data ranks.*= 0 \(no level"):
        check_group_size(fp16, 4096)


# --- four gloo ranks ----------------------------------------------------------------------------


@pytest.mark.slow
def test_four_gloo_ranks_collectives_agree(four_gloo_ranks: subprocess.CompletedProcess) -> None:
    # The program is tests/four_gloo_ranks.py's COLLECTIVES_AGREE, in a spawn shared with
    # tests/test_lion_cub_hierarchy.py's 2 nodes × 2.
    proc = four_gloo_ranks
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("cases OK") == 4, proc.stdout


# --- training through the loop, several gloo ranks ----------------------------------------------

# Plain, as these tests were written against (the schema's defaults are now the laptop recipe:
# batch norm, augmentation, a decay schedule).
LION_TINY = {
    **TINY,
    "optimizer": {**TINY["optimizer"], "name": "lion", "lr": 0.0005, "base_batch_size": 8},
    "train": {**TINY["train"], "epochs": 6, "local_batch_size": 2, "deterministic": True},
}


def _values(optimizer: dict, **train: Any) -> dict[str, Any]:
    """LION_TINY with `optimizer` and `train` updated."""
    values = json.loads(json.dumps(LION_TINY))
    values["optimizer"].update(optimizer)
    values["train"].update(train)
    return values


def _records(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def shards32(tmp_path: Path) -> Path:
    return make_random_shards(tmp_path / "shards", counts={"train": 32, "val": 8}, size=8)


@pytest.mark.slow
def test_four_rank_lion_cub_trains_as_well_as_lion(tmp_path: Path, shards32: Path) -> None:
    cub_options = {"quantizer": "l1", "bits": 4, "collective": "alltoall"}
    runs = {"lion": _values({}), "cub": _values({"name": "lion_cub", "lion_cub": cub_options})}
    lion, cub = map(_records, run_trainings(tmp_path, shards32, runs, nproc=4).values())
    print([r["val_loss"] for r in lion], [r["val_loss"] for r in cub])
    assert cub[-1]["val_loss"] < 1.5 * lion[-1]["val_loss"]
    assert cub[-1]["val_loss"] < 0.7 * cub[0]["val_loss"]
    # DDP's fp32 ring all-reduce vs 4-bit codes in alltoall + a 1-bit allgather (plus padding).
    ratio = cub[-1]["comm_bytes_per_step"] / lion[-1]["comm_bytes_per_step"]
    assert 5 / 64 < ratio < 5 / 64 * 1.2, ratio
    # Both timed: Lion Cub's own collectives, DDP's bucket all-reduces (ddp_exchange_timing).
    assert cub[-1]["time_exchange_s"] > 0 and lion[-1]["time_exchange_s"] > 0


@pytest.mark.slow
def test_two_rank_lion_cub_resumes_exactly(tmp_path: Path, shards32: Path) -> None:
    options = {
        "name": "lion_cub",
        "lion_cub": {"quantizer": "sign", "momentum_sync": {"schedule": "every", "every_steps": 3}},
    }
    short = {"epochs": 2, "local_batch_size": 4}  # 4 steps per epoch
    # Rank 1 dies at step 7 of `broken`; torchrun restarts both ranks, which resume it (`whole`
    # trained before, in the first attempt).
    runs = {"whole": _values(options, **short), "broken": _values(options, **short)}
    whole, broken = run_trainings(tmp_path, shards32, runs, nproc=2, die_at={"broken": 7}).values()
    summary = json.loads((broken / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("step_00000005.pt")
    a = torch.load(whole / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(broken / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    (ca,), (cb,) = ((r / "checkpoints").iterdir() for r in (whole, broken))
    sa, sb = (momenta_per_data_rank(c / "step_00000008.pt") for c in (ca, cb))
    for i, m in sa.items():
        assert m.shape[0] == 2 and torch.equal(m, sb[i])
    # Step 8 is not a sync step (3, 6): the two ranks' momenta differ, and both were kept.
    assert not torch.equal(m[0], m[1])
    # The checkpoint itself holds no momentum: each data rank's file its own.
    assert "optimizer" not in torch.load(ca / "step_00000008.pt", weights_only=True)


def momenta_per_data_rank(checkpoint: Path) -> dict[int, torch.Tensor]:
    """{parameter index: (D, *shape)}: every data rank's LionCub momentum beside `checkpoint`
    (step_<n>.pt), stacked in data rank order; each file's step_count must be the step's."""
    files = sorted(checkpoint.parent.glob(checkpoint.name.replace(".pt", ".data_rank_*.pt")))
    states = [torch.load(f, weights_only=True)["optimizer"] for f in files]
    assert [s["data_rank"] for s in states] == list(range(len(files))), files
    step = int(checkpoint.name[5:13])
    assert {(s["step_count"], s["data_group_size"]) for s in states} == {(step, len(files))}
    return {i: torch.stack([s["state"][i]["exp_avg"] for s in states]) for i in states[0]["state"]}


def test_build_refuses_unsafe_group_size_and_spatial_overlap() -> None:
    from types import SimpleNamespace

    model = _tiny_model()
    options = {"quantizer": "l0", "collective": "allreduce"}
    cfg = load_config(None, overrides={"optimizer": {"name": "lion_cub", "lion_cub": options}})
    # The checks run before any group is asked for: a stand-in for ParallelDims is enough.
    dims = SimpleNamespace(data=128, spatial=1)
    with pytest.raises(ConfigError, match=r"lion_cub.allreduce_dtype.*over 128 data.*no level"):
        build_optimizer(model.named_parameters(), cfg.optimizer, 64, dims=dims)  # type: ignore[arg-type]
    cfg = load_config(
        None, overrides={"optimizer": {"name": "lion_cub", "lion_cub": {"overlap": True}}}
    )
    with pytest.raises(ConfigError, match=r"optimizer.lion_cub.overlap.*spatial = 2"):
        build_optimizer(
            model.named_parameters(), cfg.optimizer, 64, dims=SimpleNamespace(data=1, spatial=2)
        )  # type: ignore[arg-type]


def test_one_process_training_with_lion_cub_is_lion(tmp_path: Path) -> None:
    from cosmocub.train.main import train

    shards = make_random_shards(tmp_path / "s", counts={"train": 8, "val": 4}, size=8)
    runs = {}
    for name, optimizer in {
        "lion": {"name": "lion"},
        "cub": {"name": "lion_cub", "lion_cub": {"quantizer": "linf", "bits": 3}},
    }.items():
        values = json.loads(json.dumps(LION_TINY))
        values["optimizer"].update(optimizer)
        values["train"].update(epochs=2, local_batch_size=4, deterministic=False)
        cfg = load_config(None, overrides=values)
        train(cfg, shards_dir=shards, run_dir=tmp_path / name)
        runs[name] = _records(tmp_path / name)
    a = torch.load(tmp_path / "lion/model.pt", weights_only=True)["state_dict"]
    b = torch.load(tmp_path / "cub/model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["val_loss"] for r in runs["lion"]] == [r["val_loss"] for r in runs["cub"]]
    assert runs["lion"][-1]["comm_bytes_per_step"] == runs["cub"][-1]["comm_bytes_per_step"] == 0
