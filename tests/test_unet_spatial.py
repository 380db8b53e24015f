"""The 3D U-Net: its shape, and its spatially split form against the plain one.

The multi-rank cases run in ONE torchrun spawn of 8 gloo ranks (tests/unet_ranks.py); every
test reads its case from that run's JSON. Errors are relative, normwise per tensor, in fp32.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from cosmocub.config import ConfigError, ModelConfig, UNetShape, load_config
from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv
from cosmocub.models.parallelize import check_unet_split
from cosmocub.models.unet import UNet3d

RANKS_SCRIPT = Path(__file__).with_name("unet_ranks.py")
TOLERANCE = 1e-5
sys.path.insert(0, str(Path(__file__).parent))
from unet_ranks import CASES, case_name, unet_cfg  # noqa: E402


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("unet") / "results.json"
    try:
        proc = multirank.run_ranks(torchrun_argv(8, str(RANKS_SCRIPT), str(out)), timeout=300)
    except subprocess.TimeoutExpired:
        pytest.fail("unet ranks did not finish within 300 s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("case", [case_name(*c[:6]) for c in CASES])
def test_split_unet_equals_plain(ranks: dict[str, dict[str, Any]], case: str) -> None:
    r = ranks[case]
    assert r["output"] < TOLERANCE and r["eval_output"] < TOLERANCE
    assert r["loss"] < TOLERANCE
    # Every parameter's gradient, each tensor on its own, not only the whole vector.
    assert r["grad_max"] < TOLERANCE, (r["grad_worst"], r["grad_max"])
    assert r["grad_all"] < TOLERANCE
    assert r["grads_identical_on_all_ranks"] and r["state_dict_keys_plain"]
    depth, convs = int(case.split("depth=")[1][0]), int(case.split("convs=")[1][0])
    # Halo convs down and up the U (2·depth − 1 levels), never the 1×1×1 output conv.
    assert r["num_halo_convs"] == (2 * depth - 1) * convs


def test_cases_cover_the_splits_and_depths() -> None:
    splits = {c[0] for c in CASES}
    assert {(2, 1, 1), (2, 2, 1), (2, 2, 2)} <= splits
    for split in splits:
        assert len({c[3] for c in CASES if c[0] == split}) >= 2  # two depths per split


def test_unet_shapes_and_skips() -> None:
    cfg = unet_cfg(16, filters=2, depth=3, convs=2, batch_norm=True)
    model = UNet3d(cfg)
    x = torch.randn(2, 1, 16, 16, 16)
    assert model(x).shape == (2, 1, 16, 16, 16)
    assert [m.out_channels for m in model.upsamplers] == [4, 2]
    # The top decoder reads the skip and the upsampled map: 2 × base filters.
    assert model.decoders[-1].conv0.in_channels == 4


def test_thin_levels_are_refused_with_the_numbers() -> None:
    cfg = unet_cfg(16, filters=2, depth=4, convs=1, batch_norm=False)
    # Level 2 is 4³; split 4 along depth leaves 1 plane, which the next pooling would straddle.
    with pytest.raises(ValueError, match=r"level 2 \(4³ voxels\): odd local depth extent 1"):
        check_unet_split(cfg, 16, (4, 1, 1))
    with pytest.raises(ValueError, match=r"level 0 \(16³ voxels\): width extent 16 does not"):
        check_unet_split(cfg, 16, (1, 1, 3))
    # Kernel 5 (halo 2) at level 2 (4³) split in 4: blocks of 1 plane, thinner than the halo.
    wide = unet_cfg(16, filters=2, depth=3, convs=1, batch_norm=False)
    wide = ModelConfig(**{**wide.__dict__, "kernel_size": 5})
    with pytest.raises(ValueError, match=r"local height extent 1 is thinner than the halo 2"):
        check_unet_split(wide, 16, (1, 4, 1))
    # Odd blocks before a pooling: 24 over 4 ranks gives 6, then 3 at level 1 → pool straddles.
    with pytest.raises(ValueError, match=r"level 1 .* odd local width extent 3 before pooling"):
        check_unet_split(unet_cfg(24, filters=2, depth=3, convs=1, batch_norm=False), 24, (1, 1, 4))
    check_unet_split(cfg, 16, (2, 2, 2))  # level 3: blocks of 1 ≥ halo 1: fine


def test_config_picks_the_unet(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {name: unet, in_channels: 2, unet: {depth: 2}}\n"
        "task: {input_redshifts: [3.0, 1.5], target_redshift: 0.0}\n"
    )
    cfg = load_config(path)
    assert cfg.model.unet == UNetShape(depth=2, convs_per_level=2)
    assert cfg.task.channel_indices() == ([3, 2], 0)
    path.write_text("model: {name: unet, unet: {depth: 2}}\n")
    with pytest.raises(ConfigError, match=r"model.in_channels': 4, but the U-Net reads 1"):
        load_config(path)
    path.write_text("model: {name: unet, in_channels: 1, input_size: 32, unet: {depth: 7}}\n")
    with pytest.raises(ConfigError, match=r"32 is not divisible by 2\*\*\(model.unet.depth - 1\)"):
        load_config(path)


def test_a_split_too_fine_for_the_unet_is_refused_at_load(tmp_path: Path) -> None:
    # Depth 3 on 32³: levels of 32, 16 and 8 voxels; 16 ranks along depth leave level 1 blocks
    # of 1 plane before its pooling. Refused when the config loads (`snakemake -n`), not after
    # simulate and preprocess at the first training step.
    from cosmocub.emulator.unet_run_config import unet_config

    path = tmp_path / "c.yaml"
    path.write_text(
        "model: {name: unet, in_channels: 1, unet: {depth: 3}}\nparallel: {spatial: 16}\n"
    )
    message = (
        f"{path}: key 'parallel.spatial': model.name unet cannot run on this split: U-Net level 1 "
        "(16³ voxels): odd local depth extent 1 before pooling (split [16, 1, 1], input 32, "
        "depth 3)"
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == message
    # The `unet` section merged over a CosmoFlow config: refused where its config is made (the
    # unet rules' threads ask for it at `snakemake -n unet`), the explicit split named.
    path.write_text(
        "unet: {parallel: {spatial: 16, split: [1, 1, 16]}, train: {ranks_per_node: 16}}\n"
    )
    base = load_config(path)  # a CosmoFlow config: the U-Net's split is not its own
    match = (
        r"c.yaml \+ unet: key 'parallel.split': model.name unet cannot run on this split: "
        r"U-Net level 1 \(16³ voxels\): odd local width extent 1 before pooling"
    )
    with pytest.raises(ConfigError, match=match):
        unet_config(base)
    path.write_text("unet: {parallel: {spatial: 8}, train: {ranks_per_node: 8}}\n")
    # Level 2 (8³) in 8 leaves 1 plane, as wide as the halo: it runs.
    assert unet_config(load_config(path)).parallel.split_dhw == (8, 1, 1)
