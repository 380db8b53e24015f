"""The vote that turns N ranks' quantized values into one update, and its deterministic tie rule.

Tie rule (one rule for "no information", used in two places):
  t(i, step) = +1 if (i + step) is even else −1, for value i of a bucket at optimizer step `step`.
  * A tie in the vote (Σ q = 0, possible for even N or for zeros) becomes t(i, step).
  * With the 1-bit `sign` quantizer a zero c (1 bit cannot say 0) is sent as t(i, step).
Why: the vote result must fit one bit for the two-phase all-to-all + all-gather to cost 1/32 of
fp32, so "tie → no update" is not available; a fixed +1 would push every parameter whose gradient
and momentum are exactly zero (dead units) by −lr at every step. With t, such a parameter moves
±lr on alternate steps (no drift), every rank computes the same t, and the three collectives
agree. With one rank there is no vote: the update is sign(q) = sign(c), Lion's own.
"""

from __future__ import annotations

import torch


def tie_pattern(n: int, *, step: int, offset: int = 0, device: torch.device | None = None):
    """t(i, step) for i = offset … offset + n − 1, as int8 ±1."""
    i = torch.arange(offset, offset + n, device=device)
    return torch.where((i + step) % 2 == 0, 1, -1).to(torch.int8)


def sign_bits(q: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """int8 q → uint8 0/1 to send in one bit: 1 for q > 0, 0 for q < 0, t's bit for q = 0."""
    return ((q > 0) | ((q == 0) & (tie > 0))).to(torch.uint8)


def bits_to_signs(bits: torch.Tensor) -> torch.Tensor:
    """uint8 0/1 → int8 −1/+1."""
    return bits.to(torch.int8).mul_(2).sub_(1)


def to_codes(q: torch.Tensor, levels: int) -> torch.Tensor:
    """int8 q ∈ [−s, s] → uint8 code q + s ∈ [0, 2s] (unsigned, for bit planes)."""
    return (q.to(torch.int16) + levels).to(torch.uint8)


def from_codes(codes: torch.Tensor, levels: int) -> torch.Tensor:
    """uint8 code → int16 q (int16 so that sums over ranks need no care)."""
    return codes.to(torch.int16) - levels


def vote(total: torch.Tensor, tie: torch.Tensor) -> torch.Tensor:
    """Σ over ranks of q (any integer dtype) → int8 update sign, ties → t."""
    return torch.where(total > 0, 1, torch.where(total < 0, -1, tie.to(total.dtype))).to(torch.int8)
