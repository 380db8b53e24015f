"""The random generators' states a resumed run restores to continue bit for bit: torch (CPU and
CUDA), numpy and python's, as tensors and plain types (a checkpoint loads with weights_only)."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def capture_rng_state() -> dict[str, Any]:
    """torch (CPU and CUDA), numpy and python generator states, as tensors and plain types."""
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "numpy": (
            np_name,
            torch.from_numpy(np_keys.astype(np.int64)),
            np_pos,
            np_has_gauss,
            np_gauss,
        ),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state(
        (np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss)
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
