"""What the software profiles' host costs are on this machine's device (cost_model.software
takes them from public measurements where none is measured): an eager kernel launch issued back
to back, a host sync's round trip beyond the work it waits for, and a CUDA graph's replay.

    python -m cosmocub.perfmodel.measure.host_costs --out host_costs.json [--device cuda]

On a CPU the same loop times torch's dispatch of a tiny op (no launch, no sync to wait on): a
smoke check of the code, not a GPU's figures.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from cosmocub.io import write_json

OPS = 200  # launches a timing issues: long enough to amortise the clock, short to stay hot


def _median_s(run: Callable[[], None], repeats: int) -> float:
    run()  # warm-up: allocator, kernels loaded, graph instantiated
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_host_costs(device: torch.device, *, repeats: int = 20) -> dict[str, float | str]:
    """Seconds per eager launch (OPS tiny adds back to back, one sync at the end), per launch
    with a host sync after each (.item(), as GradScaler's), and per graph replay of one tiny
    kernel (CUDA only)."""
    x = torch.zeros(16, device=device)

    def launches() -> None:
        for _ in range(OPS):
            x.add_(1.0)
        _sync(device)

    def synced() -> None:
        for _ in range(OPS):
            x.add_(1.0)
            x[0].item()

    launch_s = _median_s(launches, repeats) / OPS
    synced_s = _median_s(synced, repeats) / OPS
    out: dict[str, float | str] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "launch_s": launch_s,
        "sync_s": max(0.0, synced_s - launch_s),
        "ops_per_timing": OPS,
    }
    if device.type == "cuda":
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream(device)
        with torch.cuda.stream(stream):
            x.add_(1.0)  # warm-up on the capture stream
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph):
            x.add_(1.0)

        def replays() -> None:
            for _ in range(OPS):
                graph.replay()
            _sync(device)

        out["graph_launch_s"] = _median_s(replays, repeats) / OPS
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    costs = measure_host_costs(torch.device(args.device), repeats=args.repeats)
    write_json(args.out, costs)
    print(
        " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in costs.items())
    )


if __name__ == "__main__":
    main()
