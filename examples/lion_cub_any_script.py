"""Lion Cub in a plain PyTorch script: no cosmocub trainer, no DDP, only torch.distributed.

    torchrun --nproc_per_node 2 examples/lion_cub_any_script.py                    # CPUs, gloo
    torchrun --nproc_per_node 4 examples/lion_cub_any_script.py --backend nccl     # a GPU a rank

Each rank trains the same small MLP on its own random batches; LionCub votes every update over
the group (each rank keeps its own momentum), so the parameters stay identical on every rank.
Halfway, the script saves the model (rank 0) and the optimizer (every rank its own momentum, a
file of its own), builds both afresh from the files as a restarted job would, and checks that
the resumed run continues bit for bit like the one that went on.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
from torch import nn

from cosmocub.optim import LionCub, LionCubSettings

W_TRUE = torch.linspace(-1.0, 1.0, 32)  # the target the model learns: y = x · W_TRUE + noise


def build(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, LionCub]:
    torch.manual_seed(0)  # the same initial parameters on every rank
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    settings = LionCubSettings(
        lr=args.lr,
        weight_decay=0.01,
        quantizer=args.quantizer,
        bits=args.bits,
        collective=args.collective,
        allreduce_dtype=args.allreduce_dtype,
        momentum_sync="every",
        sync_every=15,  # the checkpoint at step 20 falls between syncs: momenta differ
    )
    opt = LionCub(
        model.named_parameters(),  # names: momentum_sync patterns match them
        settings,
        group=dist.group.WORLD,  # the data-parallel ranks (any process group)
    )
    return model, opt


def train(model: nn.Module, opt: LionCub, steps: range, device: torch.device) -> float:
    """Steps on this rank's own random batches; the last step's loss, averaged over ranks."""
    loss = torch.zeros((), device=device)
    for step in steps:
        gen = torch.Generator().manual_seed(1000 * dist.get_rank() + step)
        x = torch.randn(16, 32, generator=gen)
        y = (x @ W_TRUE + 0.1 * torch.randn(16, generator=gen)).to(device)
        x = x.to(device)
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x).squeeze(1), y)
        loss.backward()  # this rank's gradient only: LionCub exchanges the update itself
        opt.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    return float(mean) / dist.get_world_size()


def flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--backend",
        default="gloo",
        choices=["gloo", "nccl"],
        help="nccl: one GPU a rank, cuda:LOCAL_RANK (default: gloo, CPUs)",
    )
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--quantizer", default="l1", choices=["sign", "l1", "linf", "l0"])
    parser.add_argument("--bits", type=int, default=4)
    parser.add_argument("--collective", default="alltoall")
    parser.add_argument("--allreduce-dtype", choices=["int8", "fp16"], help="allreduce only")
    parser.add_argument("--checkpoint", help="file to save to and resume from (default: temp)")
    return parser.parse_args(argv)


def device_for(backend: str) -> torch.device:
    """cuda:LOCAL_RANK under nccl (SystemExit in one line without CUDA), else the CPU."""
    if backend == "gloo":
        return torch.device("cpu")
    local_rank, gpus = int(os.environ.get("LOCAL_RANK", "0")), torch.cuda.device_count()
    if local_rank >= gpus:  # none at all on a CPU build of torch
        raise SystemExit(
            f"--backend nccl needs one CUDA GPU a rank: LOCAL_RANK {local_rank}, torch sees "
            f"{gpus} GPU{'s' if gpus != 1 else ''} (use --backend gloo, or fewer ranks a node)"
        )
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)  # before the process group: NCCL binds each rank to its GPU
    return device


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = device_for(args.backend)
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    where = [args.checkpoint]
    if rank == 0 and args.checkpoint is None:
        where = [os.path.join(tempfile.mkdtemp(), "ckpt.pt")]
    dist.broadcast_object_list(where)  # every rank reads the file rank 0 writes
    path = where[0]
    own_path = f"{path}.rank{rank}"  # this rank's optimizer state: its own momentum

    model, opt = build(args, device)
    half = args.steps // 2
    first_loss = train(model, opt, range(0, 1), device)
    train(model, opt, range(1, half), device)
    torch.save(opt.state_dict(), own_path)  # every rank its own: no rank holds another's
    if rank == 0:
        tmp = f"{path}.tmp"
        torch.save(model.state_dict(), tmp)  # the parameters: the same on every rank
        os.replace(tmp, path)  # a reader never sees half a file
    dist.barrier()
    last_loss = train(model, opt, range(half, args.steps), device)  # the run that goes on

    resumed_model, resumed_opt = build(args, device)  # as a restarted job: fresh, then loaded
    resumed_model.load_state_dict(torch.load(path, map_location=device, weights_only=True))
    # Its own file (another rank's is refused); the momentum goes back to this rank's device.
    resumed_opt.load_state_dict(torch.load(own_path, weights_only=True))
    resumed_loss = train(resumed_model, resumed_opt, range(half, args.steps), device)
    if not (torch.equal(flat(model), flat(resumed_model)) and resumed_loss == last_loss):
        raise SystemExit(f"rank {rank}: the resumed run departs from the one that went on")
    everyone = [torch.empty_like(flat(model)) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, flat(model))
    if not all(torch.equal(everyone[0], x) for x in everyone):
        raise SystemExit(f"rank {rank}: parameters differ between ranks")
    if rank == 0:
        sent = opt.comm_stats.bytes_sent / args.steps  # Lion Cub's exchange and momentum syncs
        fp32 = 2 * (dist.get_world_size() - 1) / dist.get_world_size() * 4 * flat(model).numel()
        momentum = torch.load(own_path, weights_only=True)["state"][0]["exp_avg"]
        print(f"loss {first_loss:.4f} -> {last_loss:.4f} over {args.steps} steps")
        print(
            f"bytes sent per step by rank 0: {sent:.0f} (an fp32 gradient all-reduce: {fp32:.0f})"
        )
        print(f"checkpoint: one momentum per rank file, e.g. {tuple(momentum.shape)}")
        print("resumed from the checkpoint: bit-identical")
    dist.barrier()  # every rank has read its file
    if args.checkpoint is None and rank == 0:
        shutil.rmtree(os.path.dirname(path))  # the model's file and every rank's own
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
