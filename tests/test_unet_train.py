"""The U-Net trains through the same launcher, loop, checkpointing and resume as CosmoFlow
(gloo, real processes): a sample split in two follows the unsplit run step by step, and a split
run killed mid-way resumes to the same weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from shard_fixtures import make_random_shards
from test_spatial_train import epoch_records, run_trainings, step_losses, tiny

from cosmocub.models.model_factory import load_model_file
from cosmocub.models.unet import UNet3d

pytestmark = pytest.mark.slow

UNET: dict[str, Any] = {
    "model": {
        "name": "unet",
        "in_channels": 1,
        "batch_norm": True,
        "unet": {"depth": 2, "convs_per_level": 1},
    },
    "task": {"input_redshifts": [3.0], "target_redshift": 0.0},
    "train": {"local_batch_size": 4},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("unet_train")
    shards = make_random_shards(
        tmp / "shards", counts={"train": 16, "val": 8}, size=8, slab_depth=2
    )
    split = tiny(**UNET, parallel={"spatial": 2})
    return {
        **run_trainings(tmp, shards, {"s1": tiny(**UNET)}, nproc=1),
        # Rank 1 dies at step 5 of 8 of s2_broken, after the checkpoint at step 3; torchrun
        # restarts both ranks, which resume it (s2 trained before, in the first attempt).
        **run_trainings(
            tmp, shards, {"s2": split, "s2_broken": split}, nproc=2, die_at={"s2_broken": 5}
        ),
    }


def test_split_unet_trains_like_the_unsplit_one(runs: dict[str, Path]) -> None:
    s1, s2 = runs["s1"], runs["s2"]
    summary = json.loads((s2 / "train_summary.json").read_text())
    assert (summary["world_size"], summary["spatial_parallel"], summary["steps"]) == (2, 2, 8)
    one, two = step_losses(s1), step_losses(s2)
    assert sorted(one) == sorted(two) == list(range(1, 9))
    for step, loss in one.items():  # the whole-sample mean loss, printed to 5 decimals
        assert two[step] == pytest.approx(loss, rel=1e-4, abs=2e-5), step
    records = epoch_records(s1)
    for a, b in zip(records, epoch_records(s2), strict=True):
        assert set(a) == {"epoch", "step", "train_loss", "lr", "val_loss", "val_mae"}
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    a, b = load_model_file(s1 / "model.pt"), load_model_file(s2 / "model.pt")
    assert type(b) is UNet3d  # the saved model is the plain U-Net, loadable on one process
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5, msg=name)


def test_split_unet_resumes_exactly(runs: dict[str, Path]) -> None:
    whole, broken = runs["s2"], runs["s2_broken"]
    summary = json.loads((broken / "train_summary.json").read_text())
    assert summary["resumed_from"].endswith("step_00000003.pt") and summary["steps"] == 8
    a = torch.load(whole / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(broken / "model.pt", weights_only=True)["state_dict"]
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert epoch_records(whole) == epoch_records(broken)
