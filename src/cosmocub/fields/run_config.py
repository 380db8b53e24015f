"""The config of the `snakemake unet` run: the base config with the `unet` section merged over it.

Like the sample-size study's per-size configs, the result is a whole resolved config, validated
as any other, that a job reads by path; the base run's CosmoFlow settings stay untouched.
"""

from __future__ import annotations

from typing import Any

from cosmocub.config import Config, derive, optimizer_variant

UNET_SECTIONS = ("model", "parallel", "optimizer", "train")


def unet_config(cfg: Config) -> Config:
    """The U-Net run's config: `cfg` with `unet.<section>` merged over each section (an optimizer
    with a name replaces the section), model.name unet, model.in_channels the number of
    task.input_redshifts, and the data axis times the spatial ranks in train.nproc_per_node (one
    node, as `train`)."""
    unet = cfg.values["unet"]
    overrides: dict[str, Any] = {section: unet[section] for section in UNET_SECTIONS}
    overrides["model"] = {
        **unet["model"],
        "name": "unet",
        "in_channels": len(cfg.task.input_redshifts),
    }
    replace = {}
    if "name" in unet["optimizer"]:
        # Another optimizer's options (optimizer.lion_cub, …) must not come along: a named
        # optimizer replaces the section, the schema fills the rest.
        replace["optimizer"] = optimizer_variant({}, unet["optimizer"])
        del overrides["optimizer"]
    spatial = unet["parallel"].get("spatial", cfg.parallel.spatial)
    nproc = unet["train"].get("nproc_per_node", cfg.train.nproc_per_node)
    overrides["train"] = {**unet["train"], "nproc_per_node": spatial * nproc}
    return derive(cfg, overrides, replace=replace, source=f"{cfg.source} + unet")


def unet_config_values(cfg: Config) -> dict[str, Any]:
    """Resolved values of the U-Net run (`unet_config`), for writing its config file."""
    return unet_config(cfg).values
