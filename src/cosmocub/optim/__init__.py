"""Optimizers for any PyTorch script: `LionCub` (Lion voted over a process group with compressed
updates, each rank its own momentum) and `Lion` (one process); they need torch alone.

    from cosmocub.optim import LionCub, LionCubSettings
    settings = LionCubSettings(lr=1e-4, quantizer="l1", bits=4, collective="alltoall")
    opt = LionCub(model.named_parameters(), settings, group=dist.group.WORLD)

No DDP: each rank steps on its own gradients. `quantizer_levels` says how many levels a p-bit
quantizer keeps at a group size (LevelsError where none useful is left); `world_node_groups` the
groups of hierarchy="node" when the world is the data group. docs/lion-cub.md ("Lion Cub in
your script") and examples/lion_cub_any_script.py show a whole run, checkpoint included.
"""

from cosmocub.optim.hierarchy import world_node_groups
from cosmocub.optim.lion import Lion
from cosmocub.optim.lion_cub import LionCub
from cosmocub.optim.lion_cub_settings import LionCubSettings
from cosmocub.optim.quantize import LevelsError, quantizer_levels

__all__ = [
    "LevelsError",
    "Lion",
    "LionCub",
    "LionCubSettings",
    "quantizer_levels",
    "world_node_groups",
]
