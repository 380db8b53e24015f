"""Samples/s the training loader delivers per core with nothing training, beside the samples/s
the config's training step consumes on the same machine (issue 37, "Feed the accelerator").

    python benchmarks/bench_loader.py --config config/science.yaml
    python benchmarks/bench_loader.py --config config/science.yaml --shards results-science/shards
    python benchmarks/bench_loader.py --device cuda --json out.json     (a GPU: resident = on it)

Loader rows: fixed crops (ShardDataset) and random periodic crops of whole universes
(UniverseCropDataset), 32³ of 64³ universes and 128³ of 128³ universes, fp16 on disk, without and
with the 48 symmetries; each read by the worker path (what one DataLoader worker does: HDF5 read,
standardise, turn) and cut from the resident shard (train.data_placement device: one gather a
batch), both on one core (torch threads 1). The universes are random Poisson counts written and
preprocessed by the package's own writer and `preprocess` in a temp dir (--shards: the config's
size from that folder's train.h5 instead). The step: the config's model, batch, optimizer and
step settings (train/step_settings.py) on a batch in memory, at the config's threads and (a CPU)
on one core, after a warm-up; the ratios take the fastest step of either, so they err low. Then a
short training run of the config on the synthetic 32³ shards gives each epoch's data-wait and
device-busy shares. The last line is `loader ÷ step: X.X×`: the config's own loader path (what
train.data_placement resolves to here) per core over its step.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from cosmocub.config import Config, SplitRatios, load_config
from cosmocub.cosmology.parameters import phys_from_unit
from cosmocub.data.dataset import open_split
from cosmocub.data.preprocess import preprocess
from cosmocub.data.resident_crops import load_resident
from cosmocub.data.universe import write_universe
from cosmocub.models.model_factory import build_model
from cosmocub.optim.optimizer_factory import build_optimizer
from cosmocub.parallel.parallel_dims import ParallelDims, build_parallel_dims, close_parallel_dims
from cosmocub.train.loaders import ResumableSampler
from cosmocub.train.main import train
from cosmocub.train.resident_loader import ResidentLoader, resolve_placement
from cosmocub.train.step_settings import step_settings
from cosmocub.train.tasks import build_task

REDSHIFTS = np.array([0.0, 0.5, 1.5, 3.0], np.float32)


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def make_shards(
    cfg: Config, root: Path, *, size: int, crop: int, universes: int, workers: int = 1
) -> dict:
    """{"fixed": folder, "random": folder}: `universes` random universes of side `size`
    preprocessed with the config's settings into crops of `crop`, fixed and random."""
    paths = []
    for i in range(universes):
        rng = np.random.default_rng(1000 * size + i)
        unit_par = rng.uniform(-1, 1, size=4).astype(np.float32)
        paths.append(root / f"u{size}" / f"univ_{i}.hdf5")
        paths[-1].parent.mkdir(parents=True, exist_ok=True)
        write_universe(
            paths[-1],
            rng.poisson(2.0, size=(size, size, size, 4)).astype(np.int16),
            unit_par=unit_par,
            phys_par=phys_from_unit(unit_par),
            redshifts=REDSHIFTS,
        )
    out = {}
    for mode in ("fixed", "random"):
        settings = dataclasses.replace(
            cfg.preprocess,
            sample_size=crop,
            train_crops=mode,
            splits=SplitRatios(train=universes - 2, val=1, test=1),
            num_workers=workers,  # Dask threads
        )
        out[mode] = root / f"shards{crop}_{mode}"
        preprocess(
            paths,
            out[mode],
            settings=settings,
            seed=0,
            config_hash="bench",
            universes_per_job=universes,
        )
    return out


def loader_rate(
    dataset,
    *,
    resident: bool,
    symmetries: bool,
    batch: int,
    seconds: float,
    device: torch.device,
    layout: torch.memory_format,
) -> tuple[float, float]:
    """(samples/s, seconds to load the resident shard) on the current torch threads."""
    sampler = ResumableSampler(
        dataset,
        num_replicas=1,
        rank=0,
        seed=0,
        batch_size=batch,
        symmetries=tuple(range(48)) if symmetries else None,
        random_origins=dataset.random_origins,
    )
    load_s = 0.0
    if resident:
        start = time.perf_counter()
        shard = load_resident(dataset, device)
        load_s = time.perf_counter() - start
        loader = ResidentLoader(
            shard, sampler, batch_size=batch, device=device, memory_format=layout
        )
    else:
        loader = DataLoader(dataset, batch_size=batch, sampler=sampler, drop_last=True)
    next(iter(loader))  # warm-up: file handles, page cache, allocator
    samples, epoch = 0, 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        sampler.set_position(epoch)
        for x, _ in loader:
            samples += x.shape[0]
            if time.perf_counter() - start >= seconds:
                break
        epoch += 1
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return samples / (time.perf_counter() - start), load_s


def step_rate(
    cfg: Config, dims: ParallelDims, *, seconds: float, warmup_s: float = 3.0
) -> tuple[float, float, str]:
    """(median and fastest samples/s of the config's training step on a batch in memory, its
    settings in words): steps for `warmup_s` first (a CPU's first steps at 2 threads here took
    ~1 s against ~0.1 s later; a GPU compiles and tunes), then timed for `seconds` (≥ 5)."""
    settings = step_settings(cfg, dims)
    device, batch = dims.device, cfg.train.local_batch_size
    torch.manual_seed(0)
    model = settings.compiled(
        build_model(cfg.model).to(device, memory_format=settings.memory_format).train()
    )
    opt = build_optimizer(model.parameters(), cfg.optimizer, batch, fused=settings.fused_optimizer)
    task = build_task(cfg)
    size, channels = cfg.model.input_size, cfg.model.in_channels
    x = torch.randn(batch, channels, size, size, size, device=device)
    x = x.contiguous(memory_format=settings.memory_format)
    y = torch.rand(batch, cfg.model.num_outputs, device=device) * 2 - 1

    def step() -> None:
        with torch.autocast(
            device.type,
            dtype=settings.autocast_dtype or torch.float32,
            enabled=settings.autocast_dtype is not None,
        ):
            out = model(x)
        loss = task.loss(out, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    def timed() -> float:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    warm = [timed() for _ in range(2)]
    while sum(warm) < warmup_s:
        warm.append(timed())
    times = [timed() for _ in range(5)]
    while sum(times) < seconds:
        times.append(timed())
    words = (
        f"{settings.autocast_dtype or 'fp32'}, "
        f"{'NDHWC' if settings.memory_format == torch.channels_last_3d else 'NCDHW'}, "
        f"compile {settings.compile}, fused {settings.fused_optimizer}, "
        f"{torch.get_num_threads()} threads"
    )
    return batch / statistics.median(times), batch / min(times), words


def short_run(
    cfg_path: str,
    shards: Path,
    run_dir: Path,
    *,
    epochs: int,
    steps: int,
    train_over: dict | None = None,
) -> list:
    """The config (with `train_over` over its train section) trained for `epochs` × `steps` on
    `shards`, as the workflow trains it: its metrics.jsonl records."""
    cfg = load_config(
        cfg_path,
        overrides={
            "results": str(run_dir.parent),
            "train": {
                "epochs": epochs,
                "max_steps_per_epoch": steps,
                "universes": None,
                "checkpoint_every_steps": 10**9,
                "log_every_steps": 10**9,
                **(train_over or {}),
            },
            "optimizer": {"warmup_epochs": 0, "decay_epochs": [], "decay_factors": []},
            "tracking": {"enabled": False},
        },
    )
    train(cfg, shards_dir=shards, run_dir=run_dir)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _loader_row(dataset, crop, batch, symmetries, seconds, device, layout) -> dict:
    """Both paths' samples/s on one (crop size, crops, symmetries)."""
    row = {
        "crops": "random" if dataset.random_origins else "fixed",
        "size": crop,
        "symmetries": 48 if symmetries else 1,
        "batch": batch,
    }
    for path in ("workers", "resident"):
        row[path], load_s = loader_rate(
            dataset,
            resident=path == "resident",
            symmetries=symmetries,
            batch=batch,
            seconds=seconds,
            device=device,
            layout=layout,
        )
        row["load_s"] = row.get("load_s", 0.0) + load_s
    return row


def measure_loaders(
    cfg: Config, sets: dict, *, seconds: float, device: torch.device, layout: torch.memory_format
) -> list[dict]:
    """One row per (crop size, crops, symmetries): both paths' samples/s on one core."""
    rows = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # per core
    try:
        for crop, folders in sets.items():
            for folder in folders.values():
                model_cfg = dataclasses.replace(cfg.model, input_size=crop)
                dataset = open_split(folder, "train", model_cfg)
                batch = min(cfg.train.local_batch_size, len(dataset))
                for symmetries in (False, True):
                    row = _loader_row(dataset, crop, batch, symmetries, seconds, device, layout)
                    print(f"# {row}", flush=True)
                    rows.append(row)
    finally:
        torch.set_num_threads(threads)
    return rows


def print_table(rows: list[dict], steps: list, records: list[dict], cfg: Config) -> None:
    print(
        "\n| crops | size | symmetries | batch | workers path samples/s/core | "
        "resident path samples/s/core | resident load s |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['crops']} | {r['size']}³ | {r['symmetries']} | {r['batch']} | "
            f"{r['workers']:.1f} | {r['resident']:.1f} | {r['load_s']:.2f} |"
        )
    print()
    for median, fastest, words in steps:
        print(
            f"step (the config's model, batch {cfg.train.local_batch_size}, {words}): "
            f"{median:.1f} samples/s median, {fastest:.1f} fastest"
        )
    for r in records:
        print(
            f"short run epoch {r['epoch']} ({r['step']} steps): {r['samples_per_s']:.1f} "
            f"samples/s, data wait {100 * r['data_wait_share']:.1f} %, device busy "
            f"{100 * r['device_busy_share']:.1f} %"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/science.yaml")
    parser.add_argument("--shards", type=Path, help="a shard folder for the config's own size")
    parser.add_argument("--seconds", type=float, default=2.0, help="per loader measurement")
    parser.add_argument("--step-seconds", type=float, default=4.0, help="step timed for")
    parser.add_argument(
        "--universes", type=int, default=24, help="synthetic universes, config size"
    )
    parser.add_argument("--run-epochs", type=int, default=3, help="short run; 0: none")
    parser.add_argument("--run-steps", type=int, default=20, help="steps per epoch of it")
    parser.add_argument("--no-128", action="store_true", help="skip the 128³ rows")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    before = load_avg()
    cfg = load_config(args.config)
    crop = cfg.model.input_size
    dims = build_parallel_dims(backend=cfg.train.backend)
    records: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench_loader_") as tmp:
            root = Path(tmp)
            start = time.perf_counter()
            size = cfg.universes.size
            sets = {crop: make_shards(cfg, root, size=size, crop=crop, universes=args.universes)}
            if not args.no_128:
                sets[128] = make_shards(cfg, root, size=128, crop=128, universes=6)
            print(f"# shards made in {time.perf_counter() - start:.1f} s", flush=True)
            if args.shards is not None:  # the config's size from real shards
                sets[crop] = {"given": args.shards}
            layout = step_settings(cfg, dims).memory_format
            rows = measure_loaders(
                cfg, sets, seconds=args.seconds, device=dims.device, layout=layout
            )
            steps = [step_rate(cfg, dims, seconds=args.step_seconds)]
            threads = torch.get_num_threads()
            if dims.device.type == "cpu" and threads > 1:
                # Also on one core: on a shared machine a 2-thread step can wait ~10× longer
                # for a busy core than it computes; the ratio takes the faster of the two.
                torch.set_num_threads(1)
                steps.append(step_rate(cfg, dims, seconds=args.step_seconds))
                torch.set_num_threads(threads)
            step = max(fastest for _, fastest, _ in steps)
            folder = sets[crop].get("given", sets[crop]["random"])
            train_set = open_split(folder, "train", cfg.model)
            placement = resolve_placement(cfg.train.data_placement, train_set, dims)
            if args.run_epochs:
                run_dir = root / "results" / "run"
                records = short_run(
                    args.config, folder, run_dir, epochs=args.run_epochs, steps=args.run_steps
                )
    finally:
        close_parallel_dims(dims)
    after = load_avg()
    print(
        f"\nbench_loader: {args.config} on {dims.device}, {os.cpu_count()} cores, torch "
        f"{torch.__version__}; load (1, 5, 15 min) before {before}"
    )
    print_table(rows, steps, records, cfg)
    symmetries = 48 if cfg.train.augment else 1
    crops = "random" if cfg.preprocess.train_crops == "random" else "fixed"
    own = next(
        r for r in rows if (r["size"], r["symmetries"], r["crops"]) == (crop, symmetries, crops)
    )
    path = "workers" if placement == "loader" else "resident"
    print(
        f"the config's path: {crops} {crop}³ crops, {symmetries} symmetries, "
        f"train.data_placement {cfg.train.data_placement} → {placement} ({path} row); "
        f"step {step:.1f} samples/s (the fastest above); workers ÷ step "
        f"{own['workers'] / step:.1f}×, resident ÷ step "
        f"{own['resident'] / step:.1f}×"
    )
    print(f"load after {after}")
    if args.json:
        results = {
            "config": args.config,
            "device": str(dims.device),
            "load_before": before,
            "load_after": after,
            "rows": rows,
            "step_samples_per_s": step,  # the fastest step of any thread count
            "steps": [{"median": m, "fastest": f, "settings": w} for m, f, w in steps],
            "placement": placement,
            "short_run": records,
            "ratio": own[path] / step,
        }
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(f"loader ÷ step: {own[path] / step:.1f}×")


if __name__ == "__main__":
    main()
