"""Lion Cub's quantizers of the pre-sign vector c = β1·m + (1−β1)·g, as pure functions.

`sign` sends sign(c) in one bit. `l1`, `linf`, `l0` scale c per parameter tensor by mean|c|,
max|c| or the geometric mean of the non-zero |c|, and round it to s integer levels; s depends on
where the N ranks' values are summed (see `quantizer_levels`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from cosmocub.optim.wire import allreduce_bytes_per_value

QUANTIZERS = ("sign", "l1", "linf", "l0")
SCALED_QUANTIZERS = ("l1", "linf", "l0")
# The allreduce collective's element types and the largest |integer| each sums exactly at every
# partial sum: int8 up to 127; fp16 (11-bit significand) every integer up to 2048. Both are
# reductions NCCL and gloo run (NCCL has no int16).
ALLREDUCE_DTYPES = ("int8", "fp16")
EXACT_SUM_LIMIT = {"int8": 127, "fp16": 2048}
SUMMED_ON_THE_RANK = ("allgather", "alltoall")  # the collectives (optim.collectives) but allreduce


class LevelsError(ValueError):
    """The quantizer keeps no level it was asked for at this group size (its sum would not be
    exact, or a p-bit quantizer would send only a sign)."""


def max_levels(quantizer: str, bits: int) -> int:
    """s with nothing summed: 1 for sign, 2^(bits−1) − 1 for a scaled quantizer (q + s fits in
    `bits` bits)."""
    return 1 if quantizer == "sign" else (1 << (bits - 1)) - 1


def quantizer_levels(
    quantizer: str, bits: int, group_size: int, *, collective: str, allreduce_dtype: str = "int8"
) -> int:
    """s, the largest |q| a rank sends: q ∈ {−s, …, s}, for a vote over N = `group_size` ranks.

    `alltoall` and `allgather` sum what a rank receives on the rank, in an accumulator wide
    enough for N·s (cosmocub.optim.wire.accumulator_dtype), so s = 2^(bits−1) − 1 at any N.
    `allreduce` sums on the wire in `allreduce_dtype`, so every partial sum must stay exact:
    s = min(2^(bits−1) − 1, ⌊L/N⌋) with L = 127 (int8) or 2048 (fp16). LevelsError when that
    leaves no level (s = 0), or one level where `bits` asked for more (a p-bit quantizer that
    sends only a sign); the message names N, the levels and what to choose instead.
    """
    if group_size < 1:
        raise ValueError(f"group size must be >= 1, got {group_size}")
    if quantizer not in QUANTIZERS:
        raise ValueError(f"unknown quantizer {quantizer!r} ({', '.join(QUANTIZERS)})")
    if quantizer != "sign" and not 2 <= bits <= 8:
        raise ValueError(f"a scaled quantizer's bits must be in 2..8, got {bits}")
    if allreduce_dtype not in EXACT_SUM_LIMIT:
        raise ValueError(
            f"unknown allreduce dtype {allreduce_dtype!r} ({', '.join(ALLREDUCE_DTYPES)})"
        )
    top = max_levels(quantizer, bits)
    if collective in SUMMED_ON_THE_RANK:
        return top
    if collective != "allreduce":
        raise ValueError(f"unknown collective {collective!r} (allgather, alltoall, allreduce)")
    limit = EXACT_SUM_LIMIT[allreduce_dtype]
    levels = min(top, limit // group_size)
    if levels >= 1 and (levels > 1 or top == 1):
        return levels
    what = "signs" if quantizer == "sign" else f"{quantizer!r} {bits}-bit values"
    if levels < 1:
        lost = f"no level: {group_size} ranks at s = 1 already sum to {group_size} > {limit}"
    else:
        lost = f"one level: the {bits}-bit quantizer sends only a sign"
    raise LevelsError(
        f"{what} summed by an {allreduce_dtype} all-reduce over {group_size} data ranks: "
        f"s = min({top}, floor({limit}/{group_size})) = {levels} ({lost}); choose "
        f"{_alternatives(quantizer, bits, group_size, allreduce_dtype)}"
    )


def _alternatives(quantizer: str, bits: int, group_size: int, allreduce_dtype: str) -> str:
    top = max_levels(quantizer, bits)
    if quantizer == "sign":
        out = ["collective alltoall (any number of ranks)"]
        if allreduce_dtype == "int8" and group_size <= EXACT_SUM_LIMIT["fp16"]:
            out.append(f"allreduce_dtype fp16 (up to {EXACT_SUM_LIMIT['fp16']} ranks)")
        return " or ".join(out)
    out = [f"collective alltoall ({top} levels at any number of ranks)"]
    fp16 = min(top, EXACT_SUM_LIMIT["fp16"] // group_size)
    if allreduce_dtype == "int8" and fp16 > 1:
        out.append(f"allreduce_dtype fp16 ({fp16} levels)")
    if min(top, EXACT_SUM_LIMIT[allreduce_dtype] // group_size) == 1:
        out.append("bits 2 (q in {-1, 0, 1}: this very update, asked for)")
    return " or ".join(out)


def levels_shrunk(
    quantizer: str, bits: int, levels: int, voters: str, allreduce_dtype: str
) -> str | None:
    """What a quantizer that keeps fewer levels than its `bits` ask for loses, and what keeps
    them (None where it keeps them all); `voters` names the N the levels came from ("1024 data
    ranks"). Only an all-reduce's sum bounds the levels; it sends its dtype's bytes anyway."""
    top = max_levels(quantizer, bits)
    if levels >= top:
        return None
    width = allreduce_bytes_per_value(allreduce_dtype)
    return (
        f"{quantizer!r} {bits}-bit asks for {top} levels, keeps {levels}: an {allreduce_dtype} "
        f"all-reduce over {voters} sums exactly only up to {EXACT_SUM_LIMIT[allreduce_dtype]}, "
        f"and still sends {width} byte{'s' if width > 1 else ''} a value; collective alltoall "
        f"or allgather keeps all {top} levels at any number of ranks"
    )


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
    scales: torch.Tensor | None = None,
) -> torch.Tensor:
    """Flat c (n,) → int8 q (n,) in {−levels, …, levels}, with sign(q) = sign(c) everywhere.

    Scaled: q = sign(c)·clamp(round(|c|/scale · s), 1, s). A non-zero c keeps at least level 1
    (it is never silenced by rounding), so with one rank sign(q) is exactly Lion's sign(c).
    `segments` are the sizes of the parameter tensors laid end to end in c (default: one).
    `out` (int8) and `work` (like c) are reused buffers, so that a step allocates (almost) no
    n-sized tensors; c is left unchanged. `scales` (one per segment) replaces the segments' own
    (a slice of c whose tensors' scales were taken over the whole of them: optim.hierarchy).
    """
    out = torch.empty(c.shape, dtype=torch.int8, device=c.device) if out is None else out
    if quantizer == "sign":
        return out.copy_(torch.sign(c))
    segments = [c.numel()] if segments is None else list(segments)
    if sum(segments) != c.numel():
        raise ValueError(f"quantize: segments sum to {sum(segments)}, c has {c.numel()} values")
    a = torch.abs(c, out=torch.empty_like(c) if work is None else work)
    scale = _scales_of_abs(a, segments, quantizer) if scales is None else scales
    # levels/scale per tensor; a zero scale means an all-zero tensor, whose q stays 0.
    factor = torch.where(scale > 0, levels / torch.where(scale > 0, scale, 1.0), 0.0)
    offset = 0
    for i, size in enumerate(segments):
        a[offset : offset + size].mul_(factor[i])
        offset += size
    a.round_().clamp_(1, levels).mul_(torch.sign(c))  # sign(0) = 0 undoes the clamp's 1
    return out.copy_(a)
