"""Bit packing for the wire: 8 one-bit values per byte, p-bit codes as p packed bit planes.

Vectorized torch ops only (no Python loop over elements), along the last dimension, so a
(ranks, chunk) array packs into (ranks, bits, chunk/8) bytes whose rows stay contiguous.
"""

from __future__ import annotations

import torch

# (v · MAGIC) >> 56 gathers the low bit of each of v's 8 little-endian bytes into one byte, bit k
# from byte k: the products 2^(8k) · 2^(56−7k') land on distinct bit positions, and only k = k'
# reaches the top byte, so nothing carries. int64 multiplication wraps, which is what we want.
_PACK_MAGIC = 0x0102040810204080


def _check_last_dim(x: torch.Tensor, multiple: int, what: str) -> None:
    if x.shape[-1] % multiple:
        raise ValueError(f"{what}: last dimension {x.shape[-1]} is not a multiple of {multiple}")


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """(…, n) of 0/1 (bool or uint8), n a multiple of 8 → (…, n/8) uint8; element k → bit k%8."""
    _check_last_dim(bits, 8, "pack_bits")
    b = bits.to(torch.uint8).contiguous()
    words = b.view(*b.shape[:-1], -1, 8).view(torch.int64).squeeze(-1)  # (…, n/8)
    return ((words * _PACK_MAGIC) >> 56).bitwise_and_(0xFF).to(torch.uint8)


_SHIFTS: dict[torch.device, torch.Tensor] = {}


def unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """(…, m) uint8 → (…, 8m) uint8 of 0/1: the inverse of `pack_bits`."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_bits: expected uint8, got {packed.dtype}")
    shifts = _SHIFTS.get(packed.device)
    if shifts is None:
        shifts = _SHIFTS[packed.device] = torch.arange(8, dtype=torch.uint8, device=packed.device)
    out = (packed.unsqueeze(-1) >> shifts).bitwise_and_(1)
    return out.view(*packed.shape[:-1], packed.shape[-1] * 8)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(…, n) uint8 codes < 2^bits → (…, bits, n/8) uint8: bit plane j holds bit j of each code.

    Planes work for any width 1–8 (3, 5, 7 bits do not tile a byte); 1 bit is `pack_bits`.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"pack_codes: bits must be in 1..8, got {bits}")
    _check_last_dim(codes, 8, "pack_codes")
    if bits == 8:  # the codes are the bytes: only the shape follows the planes' convention
        return codes.to(torch.uint8).reshape(*codes.shape[:-1], 8, -1).contiguous()
    planes = torch.arange(bits, dtype=torch.uint8, device=codes.device).unsqueeze(-1)
    return pack_bits((codes.to(torch.uint8).unsqueeze(-2) >> planes).bitwise_and_(1))


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """(…, bits, m) uint8 → (…, 8m) uint8 codes: the inverse of `pack_codes`."""
    if packed.shape[-2] != bits:
        raise ValueError(f"unpack_codes: {packed.shape[-2]} bit planes, expected {bits}")
    if bits == 8:
        return packed.reshape(*packed.shape[:-2], -1)
    planes = unpack_bits(packed)  # (…, bits, 8m)
    weights = (1 << torch.arange(bits, device=packed.device, dtype=torch.uint8)).unsqueeze(-1)
    return (planes * weights).sum(-2, dtype=torch.uint8)


def packed_numel(n: int, bits: int) -> int:
    """Bytes that `pack_codes` makes of n codes (n a multiple of 8)."""
    return bits * n // 8
