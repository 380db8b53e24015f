"""Whether a spatial split (ranks along D, H, W) can run a model: every level's extent divides
into the split's blocks, no block is thinner than the halo, and no block is odd before a pooling.

Pure arithmetic on the model section, so the config checks it at load (a split too fine for the
model fails before anything runs) and the parallel layers check it again where they are built.
"""

from __future__ import annotations

from collections.abc import Sequence

from cosmocub.config.sections import ModelConfig

SPATIAL_DIMS = ("depth", "height", "width")
Split = tuple[int, int, int]


def as_split(split: Sequence[int]) -> Split:
    """`split` as a checked triple of positive rank counts (ValueError otherwise)."""
    values = tuple(int(s) for s in split)
    if len(values) != 3 or any(s < 1 for s in values):
        raise ValueError(f"split {list(split)}: need three positive ranks counts [sd, sh, sw]")
    return values[0], values[1], values[2]


def _check_levels(
    split: Split,
    levels: Sequence[tuple[int, str, str | None]],
    *,
    halo: int,
    kernel_size: int,
    numbers: str,
    thin: str,
) -> None:
    """Per level (extent, where its convs are, where it is pooled or None), per dim: the extent
    divides into the split's blocks, a split block is at least the halo wide, and a block about
    to be pooled is even. Errors name the place and end with `numbers`."""
    for extent, conv, pool in levels:
        for dim, s in zip(SPATIAL_DIMS, split, strict=True):
            if extent % s:
                raise ValueError(
                    f"{conv}: {dim} extent {extent} does not divide into {s} blocks ({numbers})"
                )
            local = extent // s
            if s > 1 and local < halo:
                raise ValueError(
                    f"{conv}: local {dim} extent {local} is {thin} than the halo {halo} "
                    f"(kernel {kernel_size}, {numbers})"
                )
            if pool is not None and local % 2:
                raise ValueError(
                    f"{pool}: odd local {dim} extent {local} before pooling ({numbers})"
                )


def check_spatial_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """Raise ValueError, naming the layer and the numbers, if `split` cannot run the CosmoFlow
    on `input_size`³ samples: an extent that does not divide, a local extent narrower than the
    halo, or an odd local extent before a pooling layer (a pool window would straddle two
    ranks)."""
    split = as_split(split)
    if model_cfg.pooled.spectrum_bins and any(n > 1 for n in split):
        raise ValueError(
            f"model.pooled.spectrum_bins {model_cfg.pooled.spectrum_bins}: the input's power "
            f"spectrum needs each sample whole on one rank, and split {list(split)} divides it "
            "(set spectrum_bins 0, or split [1, 1, 1])"
        )
    if model_cfg.pooled.tap_ridge and any(n > 1 for n in split):
        raise ValueError(
            f"model.pooled.tap_ridge: its fit reads each training sample whole, and split "
            f"{list(split)} divides them (set tap_ridge false, or split [1, 1, 1])"
        )
    blocks = [f"conv_blocks.block{i}" for i in range(model_cfg.num_conv_blocks)]
    _check_levels(
        split,
        [(input_size // 2**i, f"{b}.conv", f"{b}.pool") for i, b in enumerate(blocks)],
        halo=model_cfg.kernel_size // 2,
        kernel_size=model_cfg.kernel_size,
        numbers=f"split {list(split)}, input {input_size}",
        thin="narrower",
    )


def check_unet_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """Raise ValueError, naming the level and the numbers, if `split` cannot run the U-Net on
    `input_size`³ samples: at some level an extent does not divide, a block is thinner than the
    halo (its convs would need planes from beyond the next rank), or a block is odd before a
    pooling. Such levels are refused rather than gathered: pick a smaller split or depth."""
    split = as_split(split)
    assert model_cfg.unet is not None, "model.name unet comes with model.unet (config.sections)"
    depth = model_cfg.unet.depth
    levels = []
    for level in range(depth):
        extent = input_size // 2**level
        where = f"U-Net level {level} ({extent}³ voxels)"
        levels.append((extent, where, where if level < depth - 1 else None))
    _check_levels(
        split,
        levels,
        halo=model_cfg.kernel_size // 2,
        kernel_size=model_cfg.kernel_size,
        numbers=f"split {list(split)}, input {input_size}, depth {depth}",
        thin="thinner",
    )


def check_model_split(model_cfg: ModelConfig, input_size: int, split: Sequence[int]) -> None:
    """ValueError with the numbers if `split` cannot run this model (model.name) on
    `input_size`³ samples."""
    check = check_unet_split if model_cfg.name == "unet" else check_spatial_split
    check(model_cfg, input_size, split)
