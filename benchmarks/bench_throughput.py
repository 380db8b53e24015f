"""Training throughput (samples/s) of CosmoFlow at the laptop default and the MLPerf 128³ reference.

Times full steps (forward, MSE, backward, optimizer) on random in-memory batches, so it measures
compute, not I/O; achieved GFLOP/s uses the analytic count of `cosmocub model-summary` (×3 for
forward + backward).

    python benchmarks/bench_throughput.py --models default,reference --steps 3 --batch 4
    python benchmarks/bench_throughput.py --device cuda --amp bf16 --batch 8 --steps 20
    python benchmarks/bench_throughput.py --models universes --batch 8 --steps 20
"""

from __future__ import annotations

import argparse
import contextlib
import time
from pathlib import Path

import torch
import yaml
from torch import nn

from cosmocub.config import ModelConfig, load_config
from cosmocub.models.cosmoflow import CosmoFlow
from cosmocub.models.summary import summarize
from cosmocub.optim.optimizer_factory import build_optimizer

REPO = Path(__file__).resolve().parents[1]

MODELS = {
    "default": {},
    "reference": {
        "universes": {"size": 512},
        "preprocess": {"sample_size": 128},
        "model": {"input_size": 128, "base_filters": 32, "num_conv_blocks": 5},
    },
    # The universes study's recipe (gaussian head, 16 base filters, 4 blocks, 32³ crops).
    "universes": {"model": yaml.safe_load((REPO / "config/universes.yaml").read_text())["model"]},
}


def measure(
    model_cfg: ModelConfig, *, batch: int, steps: int, device: torch.device, amp: bool
) -> dict[str, float]:
    cfg = load_config(None)
    torch.manual_seed(0)
    model = CosmoFlow(model_cfg).to(device).train()
    opt = build_optimizer(model.parameters(), cfg.optimizer, global_batch=batch)
    size = model_cfg.input_size
    x_bcdhw = torch.randn(batch, model_cfg.in_channels, size, size, size, device=device)
    with torch.no_grad():  # the head's width: parameters, or means and variances (gaussian)
        width = model(x_bcdhw).shape[1]
    y_bp = torch.rand(batch, width, device=device) * 2 - 1
    autocast = (
        torch.autocast(device.type, dtype=torch.bfloat16) if amp else contextlib.nullcontext()
    )

    def step() -> None:
        with autocast:
            pred = model(x_bcdhw)
        loss = nn.functional.mse_loss(pred.float(), y_bp)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()  # warm-up: allocations, kernel selection
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elapsed = (time.perf_counter() - start) / steps
    flops = 3 * summarize(model_cfg)["flops_per_sample"] * batch
    return {
        "ms_per_step": 1e3 * elapsed,
        "samples_per_s": batch / elapsed,
        "gflops_per_s": flops / elapsed / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--models", default="default,reference", help="comma list: " + ", ".join(MODELS)
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (CPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", choices=["off", "bf16"], default="off")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(
        f"device {device}, batch {args.batch}, {args.steps} timed steps, amp {args.amp}, "
        f"{torch.get_num_threads()} CPU thread(s)"
    )
    print(
        f"{'model':<10} {'input':>6} {'params':>11} {'ms/step':>10} {'samples/s':>10} "
        f"{'GFLOP/s':>9}"
    )
    for name in args.models.split(","):
        model_cfg = load_config(None, overrides=MODELS[name]).model
        result = measure(
            model_cfg, batch=args.batch, steps=args.steps, device=device, amp=args.amp == "bf16"
        )
        params = sum(p.numel() for p in CosmoFlow(model_cfg).parameters())
        print(
            f"{name:<10} {model_cfg.input_size:>5}³ {params:>11,} "
            f"{result['ms_per_step']:>10.1f} {result['samples_per_s']:>10.2f} "
            f"{result['gflops_per_s']:>9.1f}"
        )


if __name__ == "__main__":
    main()
