"""Lion Cub's vote of N data ranks simulated in one process, N up to 4,096: for every quantizer
and collective, the wire's own pure functions (quantize → encode → sum as the collective sums →
decode and vote) give the float64 reference vote exactly, ties included, and never overflow; the
levels each collective keeps (quantize.quantizer_levels) and the bytes it counts.

The simulated collectives are collectives.py's classes with the network taken out: the same
functions on every rank's buffers at once (encode packs each row of its leading dims on its own,
which the test checks against one rank's own call).
"""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from cosmocub.optim.collectives import vote_phase_bytes
from cosmocub.optim.packing import unpack_bits
from cosmocub.optim.quantize import (
    EXACT_SUM_LIMIT,
    LevelsError,
    max_levels,
    quantize,
    quantizer_levels,
    wire_bits,
)
from cosmocub.optim.vote import bits_to_signs, tie_pattern, vote
from cosmocub.optim.wire import (
    WireSpec,
    accumulator_dtype,
    allreduce_payload,
    chunk_vote_bits,
    decode_sum,
    encode,
    pad,
    ranks_view,
)

GROUP_SIZES = (2, 127, 128, 256, 512, 4096)
QUANTIZERS = (("sign", 1), ("l1", 4), ("linf", 8), ("l0", 2))
EXCHANGES = (("allgather", "int8"), ("alltoall", "int8"), ("allreduce", "int8"))
EXCHANGES += (("allreduce", "fp16"),)
N_VALUES = 44  # not a multiple of 8: every collective pads
SEGMENTS = (20, 24)  # two parameter tensors


@functools.cache
def _pre_sign(group_size: int) -> torch.Tensor:
    """(N, n) float32 c of N ranks: random values of varied size with zeros, and columns that
    reach the extremes: every rank at +s (the largest sum), at −s, signs alternating by rank (a
    tie at even N), half +1 and half −1 with an odd rank out at 0 (a tie at any N), all zero."""
    gen = torch.Generator().manual_seed(group_size)
    c = torch.randn(group_size, N_VALUES, generator=gen) ** 3
    c[:, ::5] = 0.0
    ranks = torch.arange(group_size)
    big = 10.0 * (1 + c.abs().amax())
    for col in (0, 20):  # one per tensor, so that each tensor's scale sees them
        c[:, col] = big
        c[:, col + 1] = -big
        c[:, col + 2] = torch.where(ranks % 2 == 0, big, -big)
        half = group_size // 2
        # Tiny against the tensor's scale: level 1 on every rank, so the halves cancel.
        tiny = torch.where(ranks < half, 1e-6, torch.where(ranks < 2 * half, -1e-6, 0.0))
        c[:, col + 3] = tiny
        c[:, col + 4] = 0.0
    return c


@functools.cache
def _quantized(quantizer: str, levels: int, group_size: int) -> torch.Tensor:
    """(N, n) int8 q: each rank's c quantized per tensor, as LionCub does (one call over all
    ranks: their tensors laid end to end are 2N segments). Shared by the exchanges that keep
    the same levels; nothing writes to it."""
    c = _pre_sign(group_size)
    flat = quantize(
        c.reshape(-1), quantizer=quantizer, levels=levels, segments=SEGMENTS * group_size
    )
    return flat.view(group_size, -1)


def _reference(q: torch.Tensor, tie: torch.Tensor, quantizer: str) -> tuple[torch.Tensor, ...]:
    """float64 sum over ranks of what each counts in the vote (sign: zeros as the tie pattern),
    and its vote with ties → the pattern."""
    values = q.double()
    if quantizer == "sign":
        values = torch.where(q == 0, tie.double(), values.sign())
    total = values.sum(0)
    update = torch.where(total > 0, 1, torch.where(total < 0, -1, tie.long())).to(torch.int8)
    return total, update, values


def _allgather(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> tuple[torch.Tensor, ...]:
    size, n = q.shape
    payloads = encode(_pad_to(q, n + -n % 8), pad(tie, 8), spec)  # (N, [bits,] n/8): each rank's
    assert torch.equal(payloads[-1], encode(pad(q[-1], 8), pad(tie, 8), spec))
    gathered = payloads.reshape(-1)  # what all_gather_flat fills on every rank
    total = decode_sum(ranks_view(gathered, size, spec), spec)[:n]
    return total, vote(total, tie)


def _alltoall(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> tuple[torch.Tensor, ...]:
    """Rank r sends its chunk j to rank j, which votes on it; the 1-bit votes are gathered.
    Only the receivers whose chunk holds values are simulated: the others vote on padding,
    which every rank cuts off (at N = 4096 each rank's 44 values pad to 8·4096)."""
    size, n = q.shape
    tie_pad = pad(tie, 8 * size)
    chunk = tie_pad.numel() // size
    used = math.ceil(n / chunk)
    sends = _pad_to(q, used * chunk).view(size, used, chunk)  # (sender, receiver, chunk)
    ties = tie_pad.view(size, chunk)[:used]
    packed = encode(sends, ties, spec)  # (N, used, [bits,] chunk/8)
    mine = encode(pad(q[0], 8 * size).view(size, chunk), tie_pad.view(size, chunk), spec)[:used]
    assert torch.equal(packed[0], mine)  # what rank 0's own call sends
    totals, results = [], []
    for j in range(used):
        recv = packed[:, j]  # receiver j's buffer: every rank's chunk j, in rank order
        totals.append(decode_sum(recv, spec))
        results.append(chunk_vote_bits(recv, ties[j], spec))
    gathered = torch.cat(results)  # the all-gather of the 1-bit results (the rest: padding)
    return torch.cat(totals)[:n], bits_to_signs(unpack_bits(gathered))[:n]


def _allreduce(q: torch.Tensor, tie: torch.Tensor, spec: WireSpec) -> tuple[torch.Tensor, ...]:
    """The sum on the wire, one rank's buffer added at a time in the payload's own dtype, as a
    ring adds them (int8 wraps and fp16 rounds: either would show in the total)."""
    payloads = allreduce_payload(q, tie, spec)  # (N, n) in int8 or fp16
    total = payloads[0].clone()
    for row in payloads[1:]:
        total += row
    return total, vote(total, tie)


def _pad_to(x: torch.Tensor, length: int) -> torch.Tensor:
    """Every row of (N, n) x zero-padded to `length` values, as `pad` pads one rank's."""
    return torch.nn.functional.pad(x, (0, length - x.shape[-1]))


SIMULATE = {"allgather": _allgather, "alltoall": _alltoall, "allreduce": _allreduce}


@pytest.mark.parametrize(("quantizer", "bits"), QUANTIZERS, ids=lambda x: str(x))
@pytest.mark.parametrize(("collective", "dtype"), EXCHANGES, ids=lambda x: str(x))
def test_simulated_vote_of_n_ranks_is_the_float64_vote(
    quantizer: str, bits: int, collective: str, dtype: str
) -> None:
    simulated = 0
    for size, step in zip(GROUP_SIZES, itertools.cycle((0, 1)), strict=False):
        try:
            levels = quantizer_levels(
                quantizer, bits, size, collective=collective, allreduce_dtype=dtype
            )
        except LevelsError:
            limit = EXACT_SUM_LIMIT[dtype]
            assert collective == "allreduce" and limit // size < min(2, max_levels(quantizer, bits))
            continue
        if collective != "allreduce":
            assert levels == max_levels(quantizer, bits)  # wide sums: no bound from N
        spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), dtype)
        tie = tie_pattern(N_VALUES, step=step)
        q = _quantized(quantizer, levels, size)
        assert int(q.abs().max()) == levels  # the extreme columns reach ±s
        expected_total, expected, values = _reference(q, tie, quantizer)
        total, update = SIMULATE[collective](q, tie, spec)
        where = f"{quantizer} {collective} {dtype} N={size} s={levels}"
        assert torch.equal(total.double(), expected_total), where
        assert update.dtype == torch.int8 and torch.equal(update, expected), where
        assert expected_total.abs().max() == size * levels, where  # the largest sum was made
        if not (quantizer == "sign" and size % 2):  # an odd number of ±1 never ties
            assert (expected_total == 0).sum() >= 2, where  # the tie rule was exercised
        if collective == "allreduce":  # every partial sum exact, in this order or any other
            assert values.cumsum(0).abs().amax() <= size * levels <= EXACT_SUM_LIMIT[dtype]
        else:
            assert total.dtype == accumulator_dtype(levels, size)
            assert size * levels <= torch.iinfo(total.dtype).max, where
        simulated += 1
    assert simulated >= 1 if collective == "allreduce" else simulated == len(GROUP_SIZES)


def test_levels_per_collective_and_dtype() -> None:
    edges = {k * m + d for k in (2048, 1024, 512, 256, 128) for m in (1, 2) for d in (-1, 0, 1)}
    for size, bits in itertools.product(sorted(set(range(1, 300)) | edges), range(2, 9)):
        top = 2 ** (bits - 1) - 1
        for collective in ("alltoall", "allgather"):
            assert quantizer_levels("l1", bits, size, collective=collective) == top
        for dtype, limit in (("int8", 127), ("fp16", 2048)):
            expected = min(top, limit // size)
            if expected < 1 or (expected == 1 < top):
                with pytest.raises(LevelsError, match=f"over {size} data ranks"):
                    quantizer_levels(
                        "linf", bits, size, collective="allreduce", allreduce_dtype=dtype
                    )
                continue
            s = quantizer_levels("l0", bits, size, collective="allreduce", allreduce_dtype=dtype)
            assert s == expected and s * size <= limit
            assert 2 * s < 2 ** wire_bits("l0", s) <= 2**bits  # codes fit the wire width
    assert quantizer_levels("l1", 4, 256, collective="alltoall") == 7
    assert quantizer_levels("l1", 4, 512, collective="allreduce", allreduce_dtype="fp16") == 4
    assert quantizer_levels("sign", 1, 2048, collective="allreduce", allreduce_dtype="fp16") == 1
    assert quantizer_levels("sign", 1, 10**6, collective="alltoall") == 1
    with pytest.raises(LevelsError, match=r"over 128 data ranks.*128 > 127.*fp16 \(up to 2048"):
        quantizer_levels("sign", 1, 128, collective="allreduce")
    with pytest.raises(
        LevelsError, match=r"= 1 \(one level.*alltoall \(7 levels.*fp16 \(7.*bits 2"
    ):
        quantizer_levels("l1", 4, 64, collective="allreduce")
    with pytest.raises(ValueError, match=r"bits must be in 2\.\.8"):
        quantizer_levels("l1", 1, 2, collective="alltoall")
    with pytest.raises(ValueError, match="unknown collective 'ring'"):
        quantizer_levels("sign", 1, 2, collective="ring")


def test_accumulator_is_wide_enough_and_wire_bytes_do_not_grow() -> None:
    assert accumulator_dtype(127, 258) == torch.int16
    assert accumulator_dtype(127, 259) == torch.int32
    assert accumulator_dtype(1, 32767) == torch.int16
    # The wide sum is on the rank: at 4096 ranks a 4-bit alltoall still sends 4-bit codes and a
    # 1-bit result per value, (P−1)/P of the padded vector each, as at 4 ranks.
    n, p = 8 * 4096 * 10, 4096
    phases = vote_phase_bytes("alltoall", n, 4, p)
    assert phases == {"alltoall": (p - 1) / p * n * 4 / 8, "allgather": (p - 1) * n / p / 8}
    # allreduce: one element per value, 1 byte in int8, 2 in fp16 (2(P−1)/P of it).
    for dtype, size in (("int8", 1), ("fp16", 2)):
        got = vote_phase_bytes("allreduce", 1000, 4, 8, allreduce_dtype=dtype)
        assert got == {"allreduce": 2 * 7 / 8 * 1000 * size}
    q = torch.tensor([3, -3, 0, 1], dtype=torch.int8)
    tie = tie_pattern(4, step=0)
    fp16 = allreduce_payload(q, tie, WireSpec("l1", 3, 3, "fp16"))
    assert fp16.dtype == torch.float16 and fp16.tolist() == [3.0, -3.0, 0.0, 1.0]
    signs = allreduce_payload(q, tie, WireSpec("sign", 1, 1, "int8"))
    assert signs.dtype == torch.int8 and signs.tolist() == [1, -1, 1, 1]  # the zero sends t = +1


@pytest.mark.parametrize(("quantizer", "bits"), QUANTIZERS[:2], ids=lambda x: str(x))
@pytest.mark.parametrize("collective", ("allgather", "alltoall", "allreduce"))
def test_host_work_is_the_collectives_own_vote_of_two_equal_ranks(
    quantizer: str, bits: int, collective: str
) -> None:
    """What the performance model's calibration times (collectives.host_work: encode, vote,
    unpack, the wire's arrivals stood in by this rank's own sends) is the real vote: two ranks
    that send the same q vote as the float64 reference of two equal rows."""
    from cosmocub.optim.collectives import host_collective

    levels = quantizer_levels(quantizer, bits, 2, collective=collective)
    spec = WireSpec(quantizer, levels, wire_bits(quantizer, levels), "int8")
    q = _quantized(quantizer, levels, 2)[0]
    tie = tie_pattern(N_VALUES, step=1)
    update = host_collective(collective, 2).host_work(q, tie, spec)
    _, expected, _ = _reference(torch.stack([q, q]), tie, quantizer)
    # An all-to-all rank votes on its chunk only (rank 0: the first of two, 24 of the 48
    # padded values); the others' votes are stood in by its own.
    n = 24 if collective == "alltoall" else N_VALUES
    assert update.dtype == torch.int8 and torch.equal(update[:n], expected[:n])
    assert update.numel() == N_VALUES
