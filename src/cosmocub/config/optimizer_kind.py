"""The optimizers a run may name, and what each one is: the one registry the tree asks instead of
comparing `optimizer.name` strings. It lives in config (the bottom layer) because the config
parses the name into a kind once; optim, train and the performance model all sit above it.
"""

from __future__ import annotations

from enum import StrEnum


class OptimizerKind(StrEnum):
    """optimizer.name, parsed. A StrEnum, so a kind still serialises (JSON, hashes) as its name."""

    SGD = "sgd"
    ADAMW = "adamw"
    LION = "lion"
    DISTRIBUTED_LION = "distributed_lion"
    LION_CUB = "lion_cub"

    @classmethod
    def parse(cls, name: str) -> OptimizerKind:
        """The kind named `name`; ValueError naming the kinds there are."""
        try:
            return cls(name)
        except ValueError:
            known = ", ".join(k.value for k in cls)
            raise ValueError(f"unknown optimizer {name!r} ({known})") from None

    @property
    def averages_gradients(self) -> bool:
        """Its gradients are averaged by DDP's fp32 all-reduce before the step (train.grad_sync);
        the others exchange compressed updates themselves."""
        return self in (OptimizerKind.SGD, OptimizerKind.ADAMW, OptimizerKind.LION)

    @property
    def votes_updates(self) -> bool:
        """It votes a compressed update over the data group (optim.lion_cub.LionCub)."""
        return not self.averages_gradients

    @property
    def takes_lion_cub_options(self) -> bool:
        """optimizer.lion_cub configures it (distributed_lion's settings are fixed)."""
        return self is OptimizerKind.LION_CUB

    @property
    def is_lion(self) -> bool:
        """Lion's update, sign(c): betas default to (0.9, 0.99) instead of Adam's."""
        return self in (OptimizerKind.LION, OptimizerKind.DISTRIBUTED_LION, OptimizerKind.LION_CUB)

    @property
    def has_fused_kernel(self) -> bool:
        """torch ships a fused kernel for it (train.fused_optimizer)."""
        return self in (OptimizerKind.SGD, OptimizerKind.ADAMW)
