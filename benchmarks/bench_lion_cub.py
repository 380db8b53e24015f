"""Lion Cub's costs: bytes per step against DDP's fp32 all-reduce, step and exchange times,
overlap against none, optimizer step time against lion-pytorch, pack/unpack throughput.

Bytes are counted from the tensors each collective really sends (ring algorithms: what one rank
puts on the wire); DDP's are the bucket buffers its comm hook all-reduces, times 2(P−1)/P. The
model is the default config's CosmoFlow unless --config names another. Ranks are gloo processes
on this machine (loopback): times show compute overheads, not a slow network.
Goal: 1-bit alltoall ≤ 1/25 of DDP's bytes, measured.

    python benchmarks/bench_lion_cub.py --ranks 4 --steps 5
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from cosmocub.config import load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.collectives import ring_allreduce_bytes
from cosmocub.optim.lion import Lion
from cosmocub.optim.lion_cub import LionCub, LionCubSettings
from cosmocub.optim.packing import pack_bits, pack_codes, unpack_bits, unpack_codes

# (label, LionCub options); distributed_lion is sign + allgather.
VARIANTS = [
    ("distributed_lion", {"quantizer": "sign", "collective": "allgather"}),
    ("lion_cub sign alltoall", {"quantizer": "sign", "collective": "alltoall"}),
    ("lion_cub sign allreduce", {"quantizer": "sign", "collective": "allreduce"}),
    ("lion_cub l1-4 allgather", {"quantizer": "l1", "bits": 4, "collective": "allgather"}),
    ("lion_cub l1-4 alltoall", {"quantizer": "l1", "bits": 4, "collective": "alltoall"}),
    ("lion_cub l1-4 allreduce", {"quantizer": "l1", "bits": 4, "collective": "allreduce"}),
    (
        "lion_cub l1-4 allreduce fp16",
        {"quantizer": "l1", "bits": 4, "collective": "allreduce", "allreduce_dtype": "fp16"},
    ),
    ("lion_cub linf-8 alltoall", {"quantizer": "linf", "bits": 8, "collective": "alltoall"}),
    ("lion_cub l0-2 alltoall", {"quantizer": "l0", "bits": 2, "collective": "alltoall"}),
]


def theoretical_ratio(collective: str, wire_bits: int, ranks: int, dtype: str | None) -> float:
    """Bytes against fp32 ring all-reduce 2(P−1)/P·4n, per value."""
    if collective == "allgather":
        return ranks * wire_bits / 64
    if collective == "alltoall":
        return (wire_bits + 1) / 64
    return 2 / 4 if dtype == "fp16" else 1 / 4  # an int8 or fp16 ring all-reduce


def _model(args: argparse.Namespace) -> nn.Module:
    torch.manual_seed(0)
    return CosmoFlow(load_config(args.config).model)


def _random_grads(model: nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=gen)


def _ddp_bytes(model: nn.Module, ranks: int, input_size: int) -> float:
    """One backward through DDP; its comm hook adds up the bucket buffers it all-reduces."""
    payload = [0]

    def counting_allreduce(state, bucket):
        buffer = bucket.buffer()
        payload[0] += buffer.numel() * buffer.element_size()
        fut = dist.all_reduce(buffer, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0].div_(ranks))

    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(None, counting_allreduce)
    x = torch.randn(1, 4, input_size, input_size, input_size)
    ddp(x).square().mean().backward()
    return ring_allreduce_bytes(payload[0], ranks)


def _rank_main(rank: int, args: argparse.Namespace, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=args.ranks)
    group = dist.new_group(list(range(args.ranks)))
    cfg = load_config(args.config)
    rows = []
    ddp_bytes = _ddp_bytes(_model(args), args.ranks, cfg.model.input_size)
    # Reference exchange: the fp32 all-reduce of every gradient (what DDP sends), timed alone.
    model = _model(args)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    times = []
    for _ in range(args.steps):
        dist.barrier(group)
        t0 = time.perf_counter()
        dist.all_reduce(flat, group=group)
        times.append(time.perf_counter() - t0)
    rows.append(("ddp fp32 all-reduce (lion)", 32, ddp_bytes, 1.0, None, statistics.median(times)))
    for label, options in VARIANTS:
        model = _model(args)
        opt = LionCub(model.named_parameters(), LionCubSettings(lr=1e-4, **options), group=group)
        step_times, exchange = [], []
        for step in range(args.steps):
            _random_grads(model, 1000 * rank + step)
            dist.barrier(group)
            before = opt.comm_stats.exchange_s
            t0 = time.perf_counter()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            exchange.append(opt.comm_stats.exchange_s - before)
        bytes_per_step = opt.comm_stats.bytes_sent / args.steps
        theory = theoretical_ratio(
            options["collective"], opt.spec.bits, args.ranks, options.get("allreduce_dtype")
        )
        rows.append(
            (
                label,
                opt.spec.bits,
                bytes_per_step,
                theory,
                statistics.median(step_times),
                statistics.median(exchange),
            )
        )
    overlap_rows = _overlap(args, group, cfg.model.input_size, rank)
    if rank == 0:
        queue.put((rows, overlap_rows))
    dist.barrier(group)
    dist.destroy_process_group()


def _overlap(args: argparse.Namespace, group, input_size: int, rank: int) -> list[tuple]:
    """Forward + backward + step, the exchange started in backward or after it; alternated."""
    out = []
    for label, options in (VARIANTS[1], VARIANTS[4]):
        times: dict[bool, list[float]] = {False: [], True: []}
        models = {o: _model(args) for o in (False, True)}
        opts = {
            o: LionCub(
                models[o].named_parameters(),
                LionCubSettings(lr=1e-4, overlap=o, bucket_mb=0.25, **options),
                group=group,
            )
            for o in (False, True)
        }
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(args.batch, 4, input_size, input_size, input_size, generator=gen)
        for rep in range(2 * args.steps + 2):
            o = rep % 2 == 1
            dist.barrier(group)
            t0 = time.perf_counter()
            opts[o].zero_grad(set_to_none=True)
            models[o](x).square().mean().backward()
            opts[o].step()
            if rep >= 2:  # the first of each is warm-up
                times[o].append(time.perf_counter() - t0)
        out.append((label, statistics.median(times[False]), statistics.median(times[True])))
    return out


def _single_process_steps(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    import lion_pytorch

    builders = {
        "cosmocub Lion": lambda m: Lion(m.parameters(), lr=1e-4, weight_decay=0.1),
        "lion-pytorch Lion": lambda m: lion_pytorch.Lion(m.parameters(), lr=1e-4, weight_decay=0.1),
        "lion_cub sign (1 rank)": lambda m: LionCub(
            m.named_parameters(), LionCubSettings(lr=1e-4, weight_decay=0.1), group=None
        ),
        "lion_cub l1-8 (1 rank)": lambda m: LionCub(
            m.named_parameters(),
            LionCubSettings(lr=1e-4, weight_decay=0.1, quantizer="l1", bits=8),
            group=None,
        ),
        "lion_cub l0-8 (1 rank)": lambda m: LionCub(
            m.named_parameters(),
            LionCubSettings(lr=1e-4, weight_decay=0.1, quantizer="l0", bits=8),
            group=None,
        ),
    }
    models = {name: _model(args) for name in builders}
    opts = {name: build(models[name]) for name, build in builders.items()}
    times: dict[str, list[float]] = {name: [] for name in builders}
    for rep in range(args.reps + 1):
        for name in builders:  # interleaved, so machine load hits all alike
            _random_grads(models[name], rep)
            t0 = time.perf_counter()
            opts[name].step()
            if rep:
                times[name].append(time.perf_counter() - t0)
    return [(name, min(t), statistics.median(t)) for name, t in times.items()]


def _throughput(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """(operation, GB/s of the unpacked side at the min and at the median time); the copy
    moves the same bytes. Every operation allocates its output, as the optimizer's do."""
    n = args.pack_mb * 2**20
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(0, 2, (n,), generator=gen, dtype=torch.uint8)
    codes = torch.randint(0, 16, (n,), generator=gen, dtype=torch.uint8)
    packed1, packed4 = pack_bits(bits), pack_codes(codes, 4)
    ops = {
        "memory copy (clone)": lambda: bits.clone(),
        "pack_bits (1 bit)": lambda: pack_bits(bits),
        "unpack_bits (1 bit)": lambda: unpack_bits(packed1),
        "pack_codes (4 bits)": lambda: pack_codes(codes, 4),
        "unpack_codes (4 bits)": lambda: unpack_codes(packed4, 4),
    }
    rows = []
    for name, fn in ops.items():
        fn()
        times = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        t_min, t_med = min(times), statistics.median(times)
        rows.append((name, n / t_min / 1e9, n / t_med / 1e9))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--config", default=None, help="config whose model to use (default: defaults)"
    )
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=2, help="samples per rank (overlap table)")
    parser.add_argument("--pack-mb", type=int, default=64, help="values per pack test, in Mi")
    parser.add_argument(
        "--local-only", action="store_true", help="only the one-process tables (step, packing)"
    )
    args = parser.parse_args()
    n_params = sum(p.numel() for p in _model(args).parameters())
    print(
        f"model: CosmoFlow, {n_params} parameters; {args.ranks} gloo ranks; "
        f"torch {torch.__version__}"
    )
    if not args.local_only:
        _distributed_tables(args)
    _local_tables(args)


def _distributed_tables(args: argparse.Namespace) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(
        _rank_main, args=(args, port, queue), nprocs=args.ranks, start_method="spawn"
    )
    rows, overlap_rows = queue.get()

    ddp = rows[0][2]
    print(f"\nBytes sent per step by one rank (P = {args.ranks}), against DDP's fp32 all-reduce")
    print(
        f"{'optimizer':28} {'wire bits':>9} {'bytes/step':>12} {'measured':>9} {'theory':>9}"
        f" {'step ms':>8} {'exchange ms':>11}"
    )
    for label, wire, b, theory, step_s, exch_s in rows:
        step = f"{1e3 * step_s:8.1f}" if step_s is not None else f"{'-':>8}"
        print(
            f"{label:28} {wire:9d} {b:12.0f} {b / ddp:9.4f} {theory:9.4f} {step}"
            f" {1e3 * exch_s:11.1f}"
        )
    print(f"goal: 1-bit alltoall <= 1/25 = 0.0400 measured; got {rows[2][2] / ddp:.4f}")

    print(f"\nOverlap: forward+backward+step per iteration, batch {args.batch}/rank, ms (median)")
    print(f"{'variant':28} {'after backward':>15} {'overlapped':>11} {'ratio':>6}")
    for label, plain, over in overlap_rows:
        print(f"{label:28} {1e3 * plain:15.1f} {1e3 * over:11.1f} {over / plain:6.2f}")


def _local_tables(args: argparse.Namespace) -> None:
    print("\nOptimizer step, one process, same parameters and gradients (ms; min is the")
    print("robust figure on a shared machine, the median shows allocation and preemption)")
    single = _single_process_steps(args)
    base_min, base_median = single[1][1], single[1][2]
    print(f"{'optimizer':28} {'min':>8} {'vs':>6} {'median':>8} {'vs':>6}")
    for name, t_min, t_med in single:
        print(
            f"{name:28} {1e3 * t_min:8.2f} {t_min / base_min:5.2f}x {1e3 * t_med:8.2f}"
            f" {t_med / base_median:5.2f}x"
        )

    print(f"\nPacking throughput, {args.pack_mb} Mi values (GB/s of unpacked values)")
    print(f"{'operation':28} {'GB/s (min time)':>16} {'GB/s (median)':>14}")
    for name, gbs_best, gbs_median in _throughput(args):
        print(f"{name:28} {gbs_best:16.2f} {gbs_median:14.2f}")


if __name__ == "__main__":
    main()
