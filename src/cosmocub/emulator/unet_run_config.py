"""The config of the `snakemake unet` run: the base config with the `unet` section merged over it.

Like the sample-size study's per-size configs, the result is a whole resolved config, validated
as any other, that a job reads by path; the base run's CosmoFlow settings stay untouched.
"""

from __future__ import annotations

from typing import Any

from cosmocub.config import Config, ConfigError, derive, optimizer_variant


def unet_config(cfg: Config) -> Config:
    """The U-Net run's config: `cfg` with `unet.<section>` merged over each section (an optimizer
    with a name replaces the section), model.name unet and model.in_channels the number of
    task.input_redshifts. train.ranks_per_node is its ranks on its one node, as in `train`:
    parallel.spatial of them share a sample."""
    unet = cfg.unet
    model = {**unet.model, "name": "unet", "in_channels": len(cfg.task.input_redshifts)}
    overrides: dict[str, Any] = {
        "model": model,
        "parallel": unet.parallel,
        "train": unet.train,
        # Its one node: the world its config names is the world `cosmocub launch` starts.
        "cluster": {"train": {"nodes": 1}},
    }
    replace = {}
    if "name" in unet.optimizer:
        # Another optimizer's options (optimizer.lion_cub, …) must not come along: a named
        # optimizer replaces the section, the schema fills the rest.
        replace["optimizer"] = optimizer_variant({}, unet.optimizer)
    else:
        overrides["optimizer"] = unet.optimizer
    source = f"{cfg.source} + unet"
    out = derive(cfg, overrides, replace=replace, source=source)
    ranks, spatial = out.train.ranks_per_node, out.parallel.spatial
    if ranks % spatial:
        # It once counted data ranks (the run started it × spatial): say what to write for those.
        key = f"{'unet.' if 'ranks_per_node' in unet.train else ''}train.ranks_per_node"
        raise ConfigError(
            f"{source}: key '{key}': {ranks} ranks per node is not a multiple of "
            f"parallel.spatial {spatial} (it counts all the U-Net's ranks, data × spatial, not "
            f"its data ranks: for {ranks} data ranks write {ranks * spatial})"
        )
    return out


def unet_config_values(cfg: Config) -> dict[str, Any]:
    """Resolved values of the U-Net run (`unet_config`), for writing its config file."""
    return unet_config(cfg).values


def unet_world_size(cfg: Config) -> int:
    """Ranks of the `snakemake unet` run, all on one node; a bad `unet` section is a ConfigError."""
    return unet_config(cfg).train.ranks_per_node
