"""What a rank's quantized q becomes on the wire and how received values are summed: pure
functions, shared by the collectives (optim.collectives) and the tests that simulate N ranks.

A received sum is taken on the rank in an integer accumulator wide enough for N·s
(`accumulator_dtype`); the allreduce collective instead sums on the wire, in the element type of
`allreduce_dtype` (int8 or fp16), whose exact range `quantize.quantizer_levels` keeps N·s within.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from cosmocub.optim.packing import pack_bits, pack_codes, unpack_bits, unpack_codes
from cosmocub.optim.vote import bits_to_signs, from_codes, sign_bits, to_codes, vote

ALLREDUCE_TORCH_DTYPE = {"int8": torch.int8, "fp16": torch.float16}
INT16_MAX = 32767


@dataclass(frozen=True)
class WireSpec:
    quantizer: str  # "sign" or a scaled quantizer
    levels: int  # s: q ∈ [−s, s]
    bits: int  # bits per value on the wire (see quantize.wire_bits)
    allreduce_dtype: str = "int8"  # the allreduce collective's element type (int8 or fp16)


def allreduce_bytes_per_value(allreduce_dtype: str) -> int:
    """Bytes per value of the allreduce collective's payload: int8 1, fp16 2."""
    return ALLREDUCE_TORCH_DTYPE[allreduce_dtype].itemsize


def accumulator_dtype(levels: int, group_size: int) -> torch.dtype:
    """The integer type a rank sums `group_size` received values of |q| ≤ `levels` in: int16
    while N·s fits it (N ≤ 258 at s = 127), int32 beyond (N·s < 2^31 for any N a job has)."""
    return torch.int16 if group_size * levels <= INT16_MAX else torch.int32


def wire_values(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
    """What a rank's q counts as in the vote: ±1 for `sign` (zeros sent as the tie pattern, as
    one bit must), q itself otherwise. Every collective sums these, so all three agree."""
    if spec.quantizer == "sign":
        return bits_to_signs(sign_bits(q, tie))
    return q


def allreduce_payload(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
    """(n,) int8 q → the (n,) buffer the allreduce collective sums: wire values in its dtype."""
    dtype = ALLREDUCE_TORCH_DTYPE[spec.allreduce_dtype]
    return wire_values(q, tie, spec).to(dtype).contiguous()


def encode(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
    """(…, n) int8 → packed uint8: (…, n/8) for 1-bit signs, (…, bits, n/8) for codes. Each row
    of the leading dims is packed on its own (an all-to-all's rows are its ranks' chunks)."""
    if spec.quantizer == "sign":
        return pack_bits(sign_bits(q, tie))
    return pack_codes(to_codes(q, spec.levels), spec.bits)


def decode_sum(packed: torch.Tensor, spec: WireSpec) -> torch.Tensor:
    """(P, …) packed values of P ranks → their sum, in `accumulator_dtype(s, P)`."""
    if spec.quantizer == "sign":
        values = bits_to_signs(unpack_bits(packed))
    else:
        values = from_codes(unpack_codes(packed, spec.bits), spec.levels)
    return values.sum(0, dtype=accumulator_dtype(spec.levels, packed.shape[0]))


def ranks_view(gathered: torch.Tensor, group_size: int, spec: WireSpec) -> torch.Tensor:
    """A flat all-gathered buffer of `encode`d payloads → (P, …) rows for `decode_sum`."""
    planes = () if spec.quantizer == "sign" else (spec.bits,)
    return gathered.view(group_size, *planes, -1)


def chunk_vote_bits(recv: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> torch.Tensor:
    """An all-to-all's (P, …) received chunk of every rank → this rank's vote on its chunk,
    packed one bit per value (the vote is never 0)."""
    return pack_bits(vote(decode_sum(recv, spec), tie) > 0)


def pad(x: torch.Tensor, multiple: int) -> torch.Tensor:
    """The flat x, zero-padded to a multiple of `multiple` values."""
    extra = -x.numel() % multiple
    return F.pad(x, (0, extra)) if extra else x
