"""Emulated cluster nodes on one Linux machine (network namespaces, a bridge, shaped links) and
the training launch over them; see docs/cluster/netemu.md."""

from cosmocub.netemu.namespaces import (
    DEFAULT_PREFIX,
    EmulatedNetwork,
    EmulatedNode,
    EmulationUnavailableError,
    emulated_nodes,
)

__all__ = [
    "DEFAULT_PREFIX",
    "EmulatedNetwork",
    "EmulatedNode",
    "EmulationUnavailableError",
    "emulated_nodes",
]
