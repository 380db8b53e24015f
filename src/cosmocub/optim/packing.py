"""Bit packing for the wire: 8 one-bit values per byte, p-bit codes as p packed bit planes.

Vectorized torch ops only (no Python loop over elements), along the last dimension, so a
(ranks, chunk) array packs into (ranks, bits, chunk/8) bytes whose rows stay contiguous.
"""

from __future__ import annotations

import torch

# Everything works on int64 words of 8 values (one byte each), 8× fewer elements than bytes.
# Pack: (v · MAGIC) >> 56 gathers the low bit of each of v's 8 little-endian bytes into one
# byte, bit k from byte k: the products 2^(8k) · 2^(56−7k') land on distinct bit positions and
# only k = k' reaches the top byte, so nothing carries. int64 multiplication wraps, as wanted.
_PACK_MAGIC = 0x0102040810204080
# Unpack: b · LOW copies a byte into all 8; & SELECT keeps bit k in byte k; + 0x7F per byte sets
# a byte's top bit iff it is non-zero (no carry: each byte ≤ 0x80); >> 7 & LOW brings it to bit 0.
_LOW = 0x0101010101010101
_SELECT = 0x8040201008040201 - 2**64  # as a signed int64
_ROUND_UP = 0x7F7F7F7F7F7F7F7F


def _check_last_dim(x: torch.Tensor, multiple: int, what: str) -> None:
    if x.shape[-1] % multiple:
        raise ValueError(f"{what}: last dimension {x.shape[-1]} is not a multiple of {multiple}")


def _words(b: torch.Tensor) -> torch.Tensor:
    """(…, n) uint8 → (…, n/8) int64 sharing memory."""
    return b.contiguous().view(torch.int64)


def _pack_words(words: torch.Tensor) -> torch.Tensor:
    """int64 words whose bytes are 0/1 → one uint8 per word (in place on `words`)."""
    return words.mul_(_PACK_MAGIC).bitwise_right_shift_(56).bitwise_and_(0xFF).to(torch.uint8)


def _spread(packed: torch.Tensor) -> torch.Tensor:
    """(…, m) uint8 → (…, m) int64 whose byte k is bit k of the packed byte (0/1)."""
    w = packed.to(torch.int64).mul_(_LOW).bitwise_and_(_SELECT)
    return w.add_(_ROUND_UP).bitwise_right_shift_(7).bitwise_and_(_LOW)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """(…, n) of 0/1 (bool or uint8), n a multiple of 8 → (…, n/8) uint8; element k → bit k%8."""
    _check_last_dim(bits, 8, "pack_bits")
    return _pack_words(_words(bits.to(torch.uint8, copy=True)))


def unpack_bits(packed: torch.Tensor) -> torch.Tensor:
    """(…, m) uint8 → (…, 8m) uint8 of 0/1: the inverse of `pack_bits`."""
    if packed.dtype != torch.uint8:
        raise ValueError(f"unpack_bits: expected uint8, got {packed.dtype}")
    return _spread(packed).view(torch.uint8)


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """(…, n) uint8 codes < 2^bits → (…, bits, n/8) uint8: bit plane j holds bit j of each code.

    Planes work for any width 1–8 (3, 5, 7 bits do not tile a byte); 1 bit is `pack_bits`.
    """
    if not 1 <= bits <= 8:
        raise ValueError(f"pack_codes: bits must be in 1..8, got {bits}")
    _check_last_dim(codes, 8, "pack_codes")
    codes = codes.to(torch.uint8)
    if bits == 8:  # the codes are the bytes: only the shape follows the planes' convention
        return codes.reshape(*codes.shape[:-1], 8, -1).contiguous()
    words = _words(codes)  # (…, n/8)
    out = torch.empty(
        *words.shape[:-1], bits, words.shape[-1], dtype=torch.uint8, device=words.device
    )
    plane = torch.empty_like(words)
    for j in range(bits):
        torch.bitwise_right_shift(words, j, out=plane)
        out[..., j, :] = _pack_words(plane.bitwise_and_(_LOW))
    return out


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """(…, bits, m) uint8 → (…, 8m) uint8 codes: the inverse of `pack_codes`."""
    if packed.shape[-2] != bits:
        raise ValueError(f"unpack_codes: {packed.shape[-2]} bit planes, expected {bits}")
    if bits == 8:
        return packed.reshape(*packed.shape[:-2], -1)
    words = _spread(packed[..., 0, :])
    for j in range(1, bits):
        words.bitwise_or_(_spread(packed[..., j, :]).bitwise_left_shift_(j))
    return words.view(torch.uint8)
