"""Step time of cosmocub's training loop against a bare PyTorch loop, same model and batches.

Both loops read the same shard through the same DataLoader settings and run the same optimizer;
repetitions alternate (cosmocub, bare, bare, cosmocub, …) so drift on a busy machine hits both.
Goal: cosmocub's overhead (checks, schedule, logging, sampler, grad-sync object) ≤ 5 %.

    python benchmarks/bench_train_loop.py --size 32 --samples 64 --batch 4 --reps 6
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from cosmocub.config import load_config
from cosmocub.data.dataset import open_split
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
from cosmocub.train.build import build_trainer
from cosmocub.train.loop import train_one_epoch

# Random shards in the documented layout: the tests' fixture (tests/shard_fixtures.py), not the
# package's business.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from shard_fixtures import make_random_shards


def bare_epoch(
    model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader, device: torch.device
) -> int:
    model.train()
    steps = 0
    for x_bcdhw, y_bp in loader:
        x_bcdhw, y_bp = x_bcdhw.to(device), y_bp.to(device)
        loss = nn.functional.mse_loss(model(x_bcdhw), y_bp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        steps += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=32, help="sample voxels per side")
    parser.add_argument("--base-filters", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=64, help="training samples in the shard")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--reps", type=int, default=6, help="epochs per loop (alternating)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        shards = make_random_shards(
            Path(tmp) / "shards", counts={"train": args.samples, "val": args.batch}, size=args.size
        )
        cfg = load_config(
            None,
            overrides={
                "universes": {"size": max(64, args.size)},
                "preprocess": {"sample_size": args.size},
                "model": {
                    "input_size": args.size,
                    "base_filters": args.base_filters,
                    "num_conv_blocks": args.blocks,
                },
                "train": {
                    "local_batch_size": args.batch,
                    "checkpoint_every_steps": 10**9,
                    "log_every_steps": 10**9,
                    "threads_per_rank": args.threads,
                },
                "tracking": {"enabled": False},
            },
        )
        dims = build_parallel_dims()
        try:
            trainer, state, _ = build_trainer(
                cfg, dims, shards_dir=shards, run_dir=Path(tmp) / "run"
            )
            model = CosmoFlow(cfg.model).to(dims.device)
            model.load_state_dict(trainer.model.state_dict())
            opt = build_optimizer(model.parameters(), cfg.optimizer, trainer.global_batch)
            loader = DataLoader(
                open_split(shards, "train", cfg.model),
                batch_size=args.batch,
                shuffle=True,
                drop_last=True,
            )
            steps = trainer.train_loader.sampler.batches_per_epoch

            def run_cosmocub() -> float:
                state.batch_in_epoch = 0
                start = time.perf_counter()
                train_one_epoch(trainer, state)
                return (time.perf_counter() - start) / steps

            def run_bare() -> float:
                start = time.perf_counter()
                bare_epoch(model, opt, loader, dims.device)
                return (time.perf_counter() - start) / steps

            run_cosmocub(), run_bare()  # warm-up: allocator, page cache, thread pools
            times: dict[str, list[float]] = {"cosmocub": [], "bare": []}
            for rep in range(args.reps):
                order = [("cosmocub", run_cosmocub), ("bare", run_bare)]
                for name, fn in order if rep % 2 == 0 else order[::-1]:
                    times[name].append(fn())
        finally:
            close_parallel_dims(dims)

    print(
        f"model {args.size}³ base {args.base_filters} blocks {args.blocks}, batch {args.batch}, "
        f"{steps} steps/epoch, {args.reps} epochs each, {args.threads} thread(s), {dims.device}"
    )
    print(f"{'loop':<10} {'median ms/step':>15} {'min ms/step':>12} {'max ms/step':>12}")
    for name, values in times.items():
        print(
            f"{name:<10} {1e3 * statistics.median(values):>15.2f} {1e3 * min(values):>12.2f} "
            f"{1e3 * max(values):>12.2f}"
        )
    overhead = statistics.median(times["cosmocub"]) / statistics.median(times["bare"]) - 1
    print(f"overhead of cosmocub's loop: {100 * overhead:+.1f} % (goal <= 5 %)")


if __name__ == "__main__":
    main()
