"""Rank program for tests/test_unet_spatial.py: under torchrun (gloo), 8 ranks, every case in one
spawn. The spatially split U-Net against the plain one on the same global batch: a training step
(forward, block-mean loss, backward, gradient sync over the mesh) and an eval forward. World rank
0 computes the reference and writes {case: errors} as JSON; errors as in spatial_ranks.py.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from spatial_ranks import gather_world, gen, rel

from cosmocub.config import ModelConfig, UNetShape
from cosmocub.models.parallelize import parallelize_unet, spatial_block
from cosmocub.models.unet import UNet3d
from cosmocub.parallel.layers import SpatialConv3d
from cosmocub.parallel.parallel_dims import ParallelDims, build_parallel_dims
from cosmocub.train.grad_sync import build_gradient_sync


def unet_cfg(size: int, *, filters: int, depth: int, convs: int, batch_norm: bool) -> ModelConfig:
    return ModelConfig(
        name="unet",
        unet=UNetShape(depth=depth, convs_per_level=convs),
        input_size=size,
        in_channels=1,
        base_filters=filters,
        num_conv_blocks=1,
        kernel_size=3,
        dense_sizes=(),
        num_outputs=4,
        dropout=0.0,
        batch_norm=batch_norm,
        leaky_relu_slope=0.1,
        output_scale=1.0,
    )


def assemble(blocks: list[torch.Tensor], split, dims: ParallelDims) -> torch.Tensor:
    """World-ordered per-rank output blocks → the global (data·B, C, D, H, W) batch."""
    s = dims.spatial
    rows = []
    for g in range(dims.data):
        parts = blocks[g * s : (g + 1) * s]
        b, c, d, h, w = parts[0].shape
        whole = parts[0].new_empty(b, c, d * split[0], h * split[1], w * split[2])
        for r, part in enumerate(parts):
            cd, ch, cw = (r // (split[1] * split[2]), (r // split[2]) % split[1], r % split[2])
            whole[:, :, cd * d : (cd + 1) * d, ch * h : (ch + 1) * h, cw * w : (cw + 1) * w] = part
        rows.append(whole)
    return torch.cat(rows)


def unet_case(
    dims: ParallelDims, cfg: ModelConfig, split, *, batch: int, seed: int
) -> dict[str, Any] | None:
    torch.manual_seed(seed)
    plain = UNet3d(cfg)
    reference = copy.deepcopy(plain) if dims.is_main else None
    model = parallelize_unet(plain, dims, split=split)
    n, size = dims.data * batch, cfg.input_size
    x_global = torch.randn(n, 1, size, size, size, generator=gen(seed + 1))
    y_global = torch.randn(n, 1, size, size, size, generator=gen(seed + 2))
    mine = slice(dims.axis_rank("data") * batch, (dims.axis_rank("data") + 1) * batch)
    block = spatial_block(dims, split, (size,) * 3)
    x = x_global[(mine, slice(None), *block)].contiguous()
    y = y_global[(mine, slice(None), *block)].contiguous()
    sync = build_gradient_sync(torch.optim.SGD(model.parameters(), lr=0.1), dims)
    wrapped = sync.wrap(model)
    pred = wrapped(x)
    loss = F.mse_loss(pred, y)  # the block's mean; the mesh average is the global mean
    loss.backward()
    sync.after_backward(model)
    loss_mean = loss.detach().clone()
    dist.all_reduce(loss_mean)
    loss_mean /= dims.world_size
    preds = gather_world(pred.detach())
    flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    flats = gather_world(flat)
    model.eval()
    with torch.no_grad():
        pred_eval = gather_world(model(x))
    num_halo_convs = sum(isinstance(m, SpatialConv3d) for m in model.modules())
    del wrapped
    if not dims.is_main:
        return None
    assert reference is not None
    out_ref = reference(x_global)
    loss_ref = F.mse_loss(out_ref, y_global)
    loss_ref.backward()
    exact = copy.deepcopy(reference).double()
    exact.zero_grad()
    F.mse_loss(exact(x_global.double()), y_global.double()).backward()
    names = [name for name, _ in model.named_parameters()]
    grad_errs = {
        name: (rel(p.grad, q.grad), rel(q.grad, e.grad))
        for name, p, q, e in zip(
            names, model.parameters(), reference.parameters(), exact.parameters(), strict=True
        )
    }
    worst = max(grad_errs, key=lambda name: grad_errs[name][0])
    reference.eval()
    with torch.no_grad():
        eval_ref = reference(x_global)
    return {
        "output": rel(assemble(preds, split, dims), out_ref),
        "eval_output": rel(assemble(pred_eval, split, dims), eval_ref),
        "loss": rel(loss_mean, loss_ref.detach()),
        "grad_all": rel(flat, torch.cat([q.grad.reshape(-1) for q in reference.parameters()])),
        "grad_max": grad_errs[worst][0],
        "grad_worst": worst,
        "grad_worst_plain_vs_f64": grad_errs[worst][1],
        "num_grads": len(grad_errs),
        "grads_identical_on_all_ranks": all(torch.equal(f, flats[0]) for f in flats),
        "state_dict_keys_plain": list(model.state_dict()) == list(reference.state_dict()),
        "num_halo_convs": num_halo_convs,
    }


# (split, input size, base filters, depth, convs per level, batch norm, batch per data rank)
CASES = [
    ((2, 1, 1), 16, 4, 2, 2, True, 1),
    ((2, 1, 1), 16, 4, 3, 2, True, 1),
    ((2, 1, 1), 16, 3, 3, 1, False, 1),
    ((2, 2, 1), 16, 4, 2, 2, True, 1),
    ((2, 2, 1), 16, 4, 3, 2, True, 1),
    ((2, 2, 2), 8, 4, 2, 2, True, 1),
    ((2, 2, 2), 16, 4, 3, 2, True, 1),
    ((2, 2, 2), 16, 3, 3, 1, False, 1),
]


def case_name(split, size, filters, depth, convs, bn) -> str:
    return (
        f"unet split={list(split)} input={size} filters={filters} depth={depth} "
        f"convs={convs} bn={bn}"
    )


def main() -> None:
    out_path = sys.argv[1]
    torch.set_num_threads(1)
    first = build_parallel_dims(spatial=1)
    meshes = {s: build_parallel_dims(spatial=s) for s in (2, 4, 8)}
    results: dict[str, dict[str, Any]] = {}
    for i, (split, size, filters, depth, convs, bn, batch) in enumerate(CASES):
        cfg = unet_cfg(size, filters=filters, depth=depth, convs=convs, batch_norm=bn)
        case = unet_case(meshes[math.prod(split)], cfg, split, batch=batch, seed=200 + i)
        if case is not None:
            results[case_name(split, size, filters, depth, convs, bn)] = case
    if first.is_main:
        Path(out_path).write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
