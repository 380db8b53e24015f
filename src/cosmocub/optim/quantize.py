"""Lion Cub's quantizers of the pre-sign vector c = β1·m + (1−β1)·g, as pure functions.

`sign` sends sign(c) in one bit. `l1`, `linf`, `l0` scale c per parameter tensor by mean|c|,
max|c| or the geometric mean of the non-zero |c|, and round it to s integer levels, where s is
chosen from the data-group size N so that a sum of N quantized values fits in int8.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

QUANTIZERS = ("sign", "l1", "linf", "l0")
SCALED_QUANTIZERS = ("l1", "linf", "l0")
INT8_MAX = 127


class OverflowUnsafeError(ValueError):
    """No quantizer level ≥ 1 keeps a sum over the group inside int8."""


def quantizer_levels(quantizer: str, bits: int, group_size: int, *, collective: str) -> int:
    """s, the largest |q| a rank sends: q ∈ {−s, …, s}.

    Rule: s = min(2^(bits−1) − 1, ⌊127/N⌋). The first term lets q + s fit in `bits` bits, the
    second keeps |Σ_N q| ≤ N·s ≤ 127, so an int8 all-reduce cannot overflow. The same s is used
    by every collective so that all of them give the same update. `sign` has s = 1 and needs the
    int8 bound only where it is summed in int8 (the `allreduce` collective): N ≤ 127.
    """
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    if quantizer not in QUANTIZERS:
        raise ValueError(f"unknown quantizer {quantizer!r} ({', '.join(QUANTIZERS)})")
    if quantizer == "sign":
        if collective == "allreduce" and group_size > INT8_MAX:
            raise OverflowUnsafeError(
                f"quantizer 'sign' with collective 'allreduce': an int8 sum of {group_size} "
                f"signs can reach {group_size} > {INT8_MAX} (use alltoall or allgather)"
            )
        return 1
    if not 1 <= bits <= 8:
        raise ValueError(f"bits must be in 1..8, got {bits}")
    levels = min((1 << (bits - 1)) - 1, INT8_MAX // group_size)
    if levels < 1:
        raise OverflowUnsafeError(
            f"quantizer {quantizer!r} with bits={bits} at data-group size {group_size}: no level "
            f">= 1 (min(2^(bits-1)-1, floor(127/N)) = {levels}); use bits >= 2 and at most "
            f"{INT8_MAX} data ranks, or quantizer 'sign'"
        )
    return levels


def wire_bits(quantizer: str, levels: int) -> int:
    """Bits per value on the wire: 1 for sign, else enough for the codes q + s ∈ [0, 2s]."""
    return 1 if quantizer == "sign" else max(1, (2 * levels).bit_length())


def tensor_scales(c: torch.Tensor, segments: Sequence[int], quantizer: str) -> torch.Tensor:
    """One scale per parameter tensor (a segment of the flat c): mean|c|, max|c|, or the
    geometric mean of the non-zero |c| (0 for an all-zero or empty tensor)."""
    return _scales_of_abs(c.abs(), segments, quantizer)


def _scales_of_abs(a: torch.Tensor, segments: Sequence[int], quantizer: str) -> torch.Tensor:
    parts = torch.split(a, list(segments))
    empty = a.new_zeros(())  # an empty tensor has nothing to scale
    if quantizer == "l1":
        return torch.stack([p.mean() if p.numel() else empty for p in parts])
    if quantizer == "linf":
        return torch.stack([p.amax() if p.numel() else empty for p in parts])
    if quantizer == "l0":
        # exp(mean log|c|) over the non-zero |c|: zeros add log 1 = 0 to the sum, not to the count.
        nonzero = a > 0
        logs = torch.where(nonzero, a, 1.0).log_()
        sums = torch.stack([x.sum() for x in torch.split(logs, list(segments))])
        counts = torch.stack([x.sum() for x in torch.split(nonzero, list(segments))])
        return torch.where(counts > 0, (sums / counts.clamp(min=1)).exp(), 0.0)
    raise ValueError(f"unknown scaled quantizer {quantizer!r} ({', '.join(SCALED_QUANTIZERS)})")


def quantize(
    c: torch.Tensor,
    *,
    quantizer: str,
    levels: int,
    segments: Sequence[int] | None = None,
    out: torch.Tensor | None = None,
    work: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flat c (n,) → int8 q (n,) in {−levels, …, levels}, with sign(q) = sign(c) everywhere.

    Scaled: q = sign(c)·clamp(round(|c|/scale · s), 1, s). A non-zero c keeps at least level 1
    (it is never silenced by rounding), so with one rank sign(q) is exactly Lion's sign(c).
    `segments` are the sizes of the parameter tensors laid end to end in c (default: one).
    `out` (int8) and `work` (like c) are reused buffers, so that a step allocates (almost) no
    n-sized tensors; c is left unchanged.
    """
    out = torch.empty(c.shape, dtype=torch.int8, device=c.device) if out is None else out
    if quantizer == "sign":
        return out.copy_(torch.sign(c))
    segments = [c.numel()] if segments is None else list(segments)
    if sum(segments) != c.numel():
        raise ValueError(f"quantize: segments sum to {sum(segments)}, c has {c.numel()} values")
    a = torch.abs(c, out=torch.empty_like(c) if work is None else work)
    scale = _scales_of_abs(a, segments, quantizer)
    # levels/scale per tensor; a zero scale means an all-zero tensor, whose q stays 0.
    factor = torch.where(scale > 0, levels / torch.where(scale > 0, scale, 1.0), 0.0)
    offset = 0
    for i, size in enumerate(segments):
        a[offset : offset + size].mul_(factor[i])
        offset += size
    a.round_().clamp_(1, levels).mul_(torch.sign(c))  # sign(0) = 0 undoes the clamp's 1
    return out.copy_(a)
