"""Spatial parallelism: activation memory per rank against S, the halo exchange's share of the
step time, and a sample size that a per-rank memory cap stops at S = 1 but not at S = 4.

Each configuration runs in fresh processes (torchrun, gloo on CPU), so one run's memory high
water cannot leak into the next. The model is config/config.yaml's (batch norm on) at --size³:
CosmoFlow, or with --model unet the U-Net of its `unet` section (`snakemake unet`), whose loss is
the mean over each rank's output block (outputs stay split).

Memory is measured two ways, per rank, over one training step:
- saved activations: the bytes of every distinct storage autograd keeps for backward
  (torch.autograd.graph.saved_tensors_hooks), parameters excluded. Exact and independent of the
  allocator and of other processes on the machine: what "activations ~ 1/S" is about.
- peak RSS above the step's start: the kernel's resident high-water mark (VmHWM, reset before
  the step) over a step after a warm-up one, with glibc told to return large buffers to the OS
  at once (a fixed MALLOC_MMAP_THRESHOLD_): what the step really needed, temporaries (halo
  copies, conv workspaces, gradients, communication buffers) included.
At batch 1 PyTorch's CPU conv3d takes its im2col path (slow_conv3d, a workspace of
C_in·k³·voxels) instead of oneDNN when N·C·D·H ≤ 20480 (a heuristic made for 2D inputs), which
thin blocks of a split hit: their peak RSS then stops shrinking with S. Use --batch 2 or more
(training batches are) to compare like with like.
Halo share: `halo._pad_dim` / `_unpad_dim` timed (forward and backward exchange: slab copies,
concatenation, transfer and the wait for the neighbours) against the whole step, median over
--steps steps after the warm-up; "of it p2p" is the part inside the point-to-point transfer
(`halo._swap`), the most that overlapping the exchange with interior compute could hide.
Overlap: the first conv's forward on a depth slab, exchange-then-conv against an exchange
started before the interior conv (which needs no halo) and two one-plane boundary convs after it
(implemented here only, to measure whether the option would pay).
Memory cap: RLIMIT_DATA set in each rank to its data size after setup plus --cap-mib, then two
training steps; an allocation over the cap fails as it would on a full device.

    python benchmarks/bench_spatial.py                       # all tables at 64³
    python benchmarks/bench_spatial.py --tables cap --cap-size 128 --cap-mib 600
    python benchmarks/bench_spatial.py --model unet --size 64 --tables memory,cap --cap-size 128
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from cosmocub.launch import multirank
from cosmocub.launch.torchrun import torchrun_argv

ROOT = Path(__file__).resolve().parents[1]


# --- rank side -----------------------------------------------------------------------------------


def _vm_data_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmData in /proc/self/status")


def _rank_main(args: argparse.Namespace) -> None:
    from cosmocub.models.model_factory import build_model, parallelize
    from cosmocub.models.parallelize import spatial_block
    from cosmocub.parallel import halo
    from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
    from cosmocub.train.grad_sync import build_gradient_sync

    torch.set_num_threads(args.threads)
    split = tuple(int(s) for s in args.split.split(","))
    dims = build_parallel_dims(spatial=split[0] * split[1] * split[2])
    if args.mode == "overlap":
        _overlap_main(args, dims, split)
        return
    cfg = dataclasses.replace(bench_model_config(args.model), input_size=args.size)
    torch.manual_seed(0)
    model = parallelize(build_model(cfg), dims, split=split, periodic=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    sync = build_gradient_sync(optimizer, dims)
    wrapped = sync.wrap(model)
    block = spatial_block(dims, split, (args.size,) * 3)
    x = torch.randn(args.batch, cfg.in_channels, args.size, args.size, args.size)[
        (slice(None), slice(None), *block)
    ]
    x = x.contiguous()  # (B, C, D/sd, H/sh, W/sw)
    if cfg.name == "unet":  # the target field's block: (B, 1, D/sd, H/sh, W/sw)
        y = torch.randn(args.batch, 1, *x.shape[2:])
    else:
        y = torch.rand(args.batch, 4) - 0.5
    param_storages = {p.untyped_storage().data_ptr() for p in model.parameters()}

    # [halo exchange in all, of which point-to-point transfer and wait] seconds in this step
    halo_seconds = [0.0, 0.0]

    def timed(fn, slot: int):
        def wrapper(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                halo_seconds[slot] += time.perf_counter() - start

        return wrapper

    halo._pad_dim = timed(halo._pad_dim, 0)  # type: ignore[attr-defined]
    halo._unpad_dim = timed(halo._unpad_dim, 0)  # type: ignore[attr-defined]
    halo._swap = timed(halo._swap, 1)  # type: ignore[attr-defined]

    def step(saved: dict[int, int] | None = None) -> float:
        def pack(t: torch.Tensor) -> torch.Tensor:
            if saved is not None:
                storage = t.untyped_storage()
                if storage.data_ptr() not in param_storages:
                    saved[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = F.mse_loss(wrapped(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        sync.after_backward(model)
        optimizer.step()
        return loss.item()

    result: dict[str, Any] = {"rank": dims.rank, "split": list(split), "size": args.size}
    if args.mode == "cap":
        budget = args.cap_mib * 2**20
        limit = _vm_data_bytes() + budget
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        code = 0
        try:
            losses = [step() for _ in range(2)]
            result["outcome"] = f"trained 2 steps, loss {losses[-1]:.4f}"
        except (RuntimeError, MemoryError) as err:
            asked = re.search(r"allocate (\d+) bytes", str(err))
            what = f" (an allocation of {mib(int(asked.group(1)))} MiB)" if asked else ""
            result["outcome"] = f"out of memory{what}: {type(err).__name__}"
            if not asked:
                result["outcome"] += ": " + str(err).splitlines()[0][:80]
            code = 3  # its peers wait in a collective: a failed rank makes torchrun stop them
        Path(f"{args.out}.rank{dims.rank}").write_text(json.dumps(result))
        sys.stdout.flush()
        os._exit(code)
    saved: dict[int, int] = {}
    step(saved)  # also the warm-up: lazy initialisation stays out of the RSS figure below
    result["saved_bytes"] = sum(saved.values())
    dist_barrier(dims)
    with RssPeak() as rss:
        step()
    result["rss_delta_bytes"] = rss.peak - rss.start
    times, halos, swaps = [], [], []
    for _ in range(args.steps):
        dist_barrier(dims)
        halo_seconds[:] = [0.0, 0.0]
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
        halos.append(halo_seconds[0])
        swaps.append(halo_seconds[1])
    result["step_s"] = statistics.median(times)
    result["halo_s"] = statistics.median(halos)
    result["halo_share"] = statistics.median(h / t for h, t in zip(halos, times, strict=True))
    result["swap_share"] = statistics.median(h / t for h, t in zip(swaps, times, strict=True))
    Path(f"{args.out}.rank{dims.rank}").write_text(json.dumps(result))
    close_parallel_dims(dims)


def _overlap_main(args: argparse.Namespace, dims: Any, split: tuple[int, ...]) -> None:
    """Forward of the first conv on this rank's depth slab, exchange then conv ("blocking")
    against exchange started, interior conv, wait, two boundary convs ("overlapped")."""
    import torch.distributed as dist

    from cosmocub.parallel.halo import HaloPlan, halo_exchange, spatial_coords

    assert split[1] == split[2] == 1, "the overlap table splits depth only"
    group_rank = dims.axis_rank("spatial")
    plan = HaloPlan(
        dims.group("spatial"), split, spatial_coords(group_rank, split), (1, 0, 0), False
    )  # type: ignore[arg-type]
    n = args.size // split[0]
    gen = torch.Generator().manual_seed(group_rank)
    x = torch.randn(args.batch, 4, n, args.size, args.size, generator=gen)
    w = torch.randn(16, 4, 3, 3, 3, generator=torch.Generator().manual_seed(1))
    pad = (0, 1, 1)

    def blocking() -> torch.Tensor:
        return F.conv3d(halo_exchange(x, plan), w, None, padding=pad)

    def overlapped() -> torch.Tensor:
        low, high = plan.peers(0)
        first, last = x[:, :, :1].contiguous(), x[:, :, -1:].contiguous()
        from_low = torch.zeros_like(last)
        from_high = torch.zeros_like(first)
        ops = []
        if low is not None:
            ops.append(dist.P2POp(dist.isend, first, group=plan.group, group_peer=low, tag=1))
        if high is not None:
            ops.append(dist.P2POp(dist.irecv, from_high, group=plan.group, group_peer=high, tag=1))
            ops.append(dist.P2POp(dist.isend, last, group=plan.group, group_peer=high, tag=2))
        if low is not None:
            ops.append(dist.P2POp(dist.irecv, from_low, group=plan.group, group_peer=low, tag=2))
        works = dist.batch_isend_irecv(ops)
        interior = F.conv3d(x, w, None, padding=pad)  # (B, 16, n - 2, H, W): needs no halo
        for work in works:
            work.wait()
        out_low = F.conv3d(torch.cat([from_low, x[:, :, :2]], 2), w, None, padding=pad)
        out_high = F.conv3d(torch.cat([x[:, :, -2:], from_high], 2), w, None, padding=pad)
        return torch.cat([out_low, interior, out_high], 2)

    with torch.no_grad():
        diff = (blocking() - overlapped()).abs().max().item()
        times: dict[str, list[float]] = {"blocking": [], "overlapped": []}
        for _ in range(args.steps):
            for name, fn in (("blocking", blocking), ("overlapped", overlapped)):
                dist.barrier()
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    result = {name: statistics.median(t) for name, t in times.items()}
    result["max_abs_diff"] = diff
    Path(f"{args.out}.rank{dims.rank}").write_text(json.dumps(result))


class RssPeak:
    """The kernel's resident high-water mark over a block: VmHWM reset on entry (writing 5 to
    /proc/self/clear_refs, Linux ≥ 4.0), read on exit; exact, no sampling."""

    @staticmethod
    def _status_bytes(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
        raise RuntimeError(f"no {key} in /proc/self/status")

    def __enter__(self) -> RssPeak:
        Path("/proc/self/clear_refs").write_text("5")
        self.start = self._status_bytes("VmRSS")
        return self

    def __exit__(self, *exc: object) -> None:
        self.peak = self._status_bytes("VmHWM")


def bench_model_config(name: str):
    """config/config.yaml's CosmoFlow, or the U-Net of its `unet` section."""
    from cosmocub.config import from_values, load_config

    cfg = load_config(ROOT / "config/config.yaml")
    if name == "unet":
        from cosmocub.emulator.unet_run_config import unet_config_values

        cfg = from_values(unet_config_values(cfg))
    return cfg.model


def dist_barrier(dims: Any) -> None:
    import torch.distributed as dist

    if dims.world_size > 1:
        dist.barrier()


# --- driver side ---------------------------------------------------------------------------------


def run_config(
    split: tuple[int, int, int], args: argparse.Namespace, mode: str, size: int, workdir: Path
) -> list[dict[str, Any]]:
    nproc = split[0] * split[1] * split[2]
    out = workdir / f"{mode}_{size}_{'x'.join(map(str, split))}"
    cmd = torchrun_argv(
        nproc,
        __file__,
        "--rank-mode",
        mode,
        "--out",
        str(out),
        "--split",
        ",".join(map(str, split)),
        "--size",
        str(size),
        "--batch",
        str(args.batch),
        "--steps",
        str(args.steps),
        "--threads",
        str(args.threads),
        "--cap-mib",
        str(args.cap_mib),
        "--model",
        args.model,
    )
    # A fixed mmap threshold makes glibc return every large buffer to the OS when it is freed, so
    # the sampled RSS follows the live tensors instead of malloc's retained heap.
    env = multirank.rank_env(
        {"OMP_NUM_THREADS": str(args.threads), "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    )
    try:
        proc = multirank.run_ranks(cmd, timeout=args.timeout, env=env)
    except subprocess.TimeoutExpired:
        raise SystemExit(
            f"split {list(split)} at {size}³: no result within {args.timeout} s"
        ) from None
    log = proc.stdout + proc.stderr
    files = sorted(out.parent.glob(out.name + ".rank*"))
    if not files or (mode != "cap" and len(files) != nproc):
        raise SystemExit(f"split {list(split)} at {size}³ failed:\n{log[-3000:]}")
    return [json.loads(f.read_text()) for f in files]


def mib(n: float) -> str:
    return f"{n / 2**20:,.1f}"


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--tables", default="memory,cap,overlap", help="memory (with halo share), cap, overlap"
    )
    parser.add_argument("--size", type=int, default=64, help="sample voxels per side")
    parser.add_argument("--batch", type=int, default=1, help="samples per data rank")
    parser.add_argument("--steps", type=int, default=3, help="timed steps after the first")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--splits", default="1,1,1;2,1,1;4,1,1;2,2,1")
    parser.add_argument("--cap-size", type=int, default=128, help="sample side for the cap table")
    parser.add_argument("--cap-mib", type=int, default=600, help="per-rank budget above setup")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--model", choices=["cosmoflow", "unet"], default="cosmoflow")
    # Rank side (set by the driver).
    parser.add_argument(
        "--rank-mode", choices=["measure", "cap", "overlap"], help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--split", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank_mode:
        args.mode = args.rank_mode
        _rank_main(args)
        return
    splits = [tuple(int(v) for v in s.split(",")) for s in args.splits.split(";")]
    tables = set(args.tables.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        if "memory" in tables:
            rows = [
                (
                    "split",
                    "S",
                    "saved activations MiB/rank",
                    "x lower",
                    "peak RSS delta MiB/rank",
                    "x lower",
                    "step s",
                    "halo s",
                    "halo share",
                    "of it p2p",
                )
            ]
            base: dict[str, float] = {}
            for split in splits:
                ranks = run_config(split, args, "measure", args.size, workdir)
                saved = max(r["saved_bytes"] for r in ranks)
                rss = max(r["rss_delta_bytes"] for r in ranks)
                step_s = max(r["step_s"] for r in ranks)
                halo_s = max(r["halo_s"] for r in ranks)
                share = max(r["halo_share"] for r in ranks)
                swap_share = max(r["swap_share"] for r in ranks)
                base.setdefault("saved", saved)
                base.setdefault("rss", rss)
                rows.append(
                    (
                        "x".join(map(str, split)),
                        str(len(ranks)),
                        mib(saved),
                        f"{base['saved'] / saved:.2f}",
                        mib(rss),
                        f"{base['rss'] / rss:.2f}",
                        f"{step_s:.3f}",
                        f"{halo_s:.3f}",
                        f"{100 * share:.1f}%",
                        f"{100 * swap_share:.1f}%",
                    )
                )
                print(f"  done {split}", file=sys.stderr, flush=True)
            print(
                f"\nMemory and halo share per rank, {args.size}³ x batch {args.batch}, "
                f"config/config.yaml {args.model}, {args.threads} thread(s)/rank "
                f"(max over ranks)"
            )
            print(table(rows))
        if "overlap" in tables:
            rows = [
                ("split", "block D x H x W", "blocking s", "overlapped s", "ratio", "max |diff|")
            ]
            for split in ((2, 1, 1), (4, 1, 1)):
                ranks = run_config(split, args, "overlap", args.size, workdir)
                block = f"{args.size // split[0]}x{args.size}x{args.size}"
                slow = max(r["blocking"] for r in ranks)
                fast = max(r["overlapped"] for r in ranks)
                diff = max(r["max_abs_diff"] for r in ranks)
                rows.append(
                    ("x".join(map(str, split)), block, f"{slow:.4f}", f"{fast:.4f}",
                     f"{fast / slow:.2f}", f"{diff:.1e}")
                )  # fmt: skip
            print(
                f"\nFirst conv's forward (4 -> 16 channels, k = 3), batch {args.batch}: halo "
                f"exchange then conv, against the interior conv overlapping the exchange "
                f"(median of "
                f"{args.steps}, slowest rank)"
            )
            print(table(rows))
        if "cap" in tables:
            rows = [("split", "S", "per-rank budget MiB", "outcome (every rank)")]
            for split in ((1, 1, 1), (4, 1, 1)):
                ranks = run_config(split, args, "cap", args.cap_size, workdir)
                outcomes = sorted({r["outcome"] for r in ranks})
                rows.append(
                    (
                        "x".join(map(str, split)),
                        str(len(ranks)),
                        str(args.cap_mib),
                        "; ".join(outcomes),
                    )
                )
            print(
                f"\nMemory cap (RLIMIT_DATA = data size after setup + budget), "
                f"{args.cap_size}³ x batch {args.batch}, {args.model}"
            )
            print(table(rows))


if __name__ == "__main__":
    main()
