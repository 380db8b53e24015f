"""Lion (Chen et al. 2023) for one process: the update is one pure function, the class walks state.

Distributed and compressed Lions (Lion Cub) run the same two halves (`lion_interpolation`, then
`lion_apply` with the voted update) around their own communication; they live beside this file.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch.optim import Optimizer


@torch.no_grad()
def lion_interpolation(
    exp_avg: torch.Tensor,
    grad: torch.Tensor | None,
    *,
    beta1: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """c = β1·m + (1−β1)·g, whose sign is Lion's update (β1·m for a parameter without gradient);
    into `out` when given (Lion Cub reuses one buffer per bucket)."""
    c = exp_avg.mul(beta1) if out is None else torch.mul(exp_avg, beta1, out=out)
    if grad is not None:
        c.add_(grad, alpha=1.0 - beta1)
    return c


@torch.no_grad()
def lion_apply(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    update: torch.Tensor,
    *,
    lr: float,
    weight_decay: float,
    beta2: float,
) -> None:
    """θ ← θ·(1 − lr·λ) − lr·update;  m ← β2·m + (1−β2)·g, in place. `update` is sign(c) for
    Lion, the data ranks' vote on it for Lion Cub."""
    param.mul_(1.0 - lr * weight_decay)
    param.add_(update, alpha=-lr)
    exp_avg.mul_(beta2).add_(grad, alpha=1.0 - beta2)


@torch.no_grad()
def lion_update(
    param: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    *,
    lr: float,
    weight_decay: float,
    beta1: float,
    beta2: float,
) -> None:
    """One Lion step, in place on `param` and `exp_avg` (the momentum m).

    c = β1·m + (1−β1)·g;  θ ← θ·(1 − lr·λ) − lr·sign(c);  m ← β2·m + (1−β2)·g.
    """
    update = lion_interpolation(exp_avg, grad, beta1=beta1).sign_()
    lion_apply(param, grad, exp_avg, update, lr=lr, weight_decay=weight_decay, beta2=beta2)


def check_lion_hyperparameters(owner: str, *, lr: float, betas: tuple[float, float]) -> None:
    """The ValueErrors every Lion variant raises for an lr ≤ 0 or a β outside [0, 1)."""
    if lr <= 0:
        raise ValueError(f"{owner}: lr must be > 0, got {lr}")
    if not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"{owner}: betas must lie in [0, 1), got {betas}")


class Lion(Optimizer):
    """Single-process Lion; gradients arrive already averaged (by DDP or a GradientSync)."""

    # A distributed Lion that exchanges signs itself will set this True (see train.grad_sync).
    communicates_gradients = False

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        *,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 0.0,
    ) -> None:
        check_lion_hyperparameters("Lion", lr=lr, betas=betas)
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                lion_update(
                    p,
                    p.grad,
                    state["exp_avg"],
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    beta1=beta1,
                    beta2=beta2,
                )
        return loss
