"""What the output of a CosmoFlow means and how it is trained: the point head (a value per
parameter, MSE) and the gaussian head (a mean and a log-variance per parameter, β-NLL).

Pure tensor functions of the model's output, shared by training, validation and evaluation.
"""

from __future__ import annotations

import torch
from torch import nn

from cosmocub.config import ModelConfig

# Bounds of the predicted log-variance: σ from ~0.002 to ~20 in unitPar space (u in [-1, 1)).
# Wide enough never to bind on a trained net; they keep an untrained one's exp() finite.
LOG_VAR_MIN, LOG_VAR_MAX = -12.0, 6.0


def outputs_per_parameter(cfg: ModelConfig) -> int:
    return 2 if cfg.gaussian else 1


def split_output(
    out_bk: torch.Tensor, cfg: ModelConfig
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean (…, P), log-variance (…, P) or None for the point head) of a model output (…, K)."""
    p = cfg.num_outputs
    if not cfg.gaussian:
        return out_bk, None
    return out_bk[..., :p], out_bk[..., p:]


def gaussian_nll(
    mean_bp: torch.Tensor, log_var_bp: torch.Tensor, y_bp: torch.Tensor, *, beta: float
) -> torch.Tensor:
    """Mean over samples and parameters of the β-NLL ½(log σ² + (y − μ)²/σ²)·stop_grad(σ²)^β.

    β = 0 is the Gaussian NLL (without its constant ½ log 2π); β = 1 gives the mean the MSE's
    gradient. The weight is detached, so it rescales gradients but is not itself minimised.
    """
    nll = gaussian_nll_terms(mean_bp, log_var_bp, y_bp)
    if beta > 0:
        nll = nll * torch.exp(beta * log_var_bp.clamp(LOG_VAR_MIN, LOG_VAR_MAX)).detach()
    return nll.mean()


def gaussian_nll_terms(
    mean_bp: torch.Tensor, log_var_bp: torch.Tensor, y_bp: torch.Tensor
) -> torch.Tensor:
    """Per element ½(log σ² + (y − μ)²/σ²), with log σ² within the bounds the loss trains it in
    (the Gaussian NLL without its constant ½ log 2π)."""
    log_var = log_var_bp.clamp(LOG_VAR_MIN, LOG_VAR_MAX)
    return 0.5 * (log_var + (y_bp - mean_bp).square() * torch.exp(-log_var))


def regression_loss(out_bk: torch.Tensor, y_bp: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """The training loss of a model output: MSE (point head) or β-NLL (gaussian head)."""
    mean_bp, log_var_bp = split_output(out_bk, cfg)
    if log_var_bp is None:
        return nn.functional.mse_loss(mean_bp, y_bp)
    return gaussian_nll(mean_bp, log_var_bp, y_bp, beta=cfg.nll_beta)


def variance(log_var_bp: torch.Tensor) -> torch.Tensor:
    """σ² of a predicted log-variance, within the bounds the loss trains it in."""
    return torch.exp(log_var_bp.clamp(LOG_VAR_MIN, LOG_VAR_MAX))
