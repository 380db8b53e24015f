"""The config of the `snakemake unet` run: the base config with the `unet` section merged over it.

Like the sample-size study's per-size configs, the result is a whole resolved config, validated
as any other, that a job reads by path; the base run's CosmoFlow settings stay untouched.
"""

from __future__ import annotations

import copy
from typing import Any

from cosmocub.config import Config, deep_merge, from_values, resolve

UNET_SECTIONS = ("model", "parallel", "optimizer", "train")


def unet_config_values(cfg: Config) -> dict[str, Any]:
    """Resolved values of the U-Net run: `cfg.values` with `unet.<section>` merged over each
    section (an optimizer with a name replaces the section), model.name unet, model.in_channels
    the number of task.input_redshifts, and the data axis times the spatial ranks in
    train.nproc_per_node (one node, as `train`)."""
    values = copy.deepcopy(cfg.values)
    overrides = values["unet"]
    for section in UNET_SECTIONS:
        given = overrides.get(section, {})
        if section == "optimizer" and "name" in given:
            # Another optimizer's options (optimizer.lion_cub, …) must not come along: a named
            # optimizer replaces the section, the schema fills the rest.
            values[section] = copy.deepcopy(given)
        else:
            values[section] = deep_merge(values[section], given)
    values["model"]["name"] = "unet"
    values["model"]["in_channels"] = len(values["task"]["input_redshifts"])
    spatial = values["parallel"].get("spatial", 1)
    values["train"]["nproc_per_node"] = spatial * values["train"].get("nproc_per_node", 1)
    # The merged sections may name keys the base left to defaults: validate and fill again.
    values = resolve(values, source=f"{cfg.source} + unet")
    from_values(copy.deepcopy(values), source=f"{cfg.source} + unet")  # the dataclass checks
    return values


def unet_ranks(cfg: Config) -> int:
    """Ranks of the `snakemake unet` run, all on one node: its spatial ranks × nproc_per_node.

    A `unet` section that does not make a valid config raises its ConfigError (one line naming
    the key), here as in the unet_config job.
    """
    return unet_config_values(cfg)["train"]["nproc_per_node"]
