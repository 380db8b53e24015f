"""The science point fed from device memory, and the reference CosmoFlow's step, on one GPU
(issue 37): what benchmarks/gpu_feed_point.sh runs; --device cpu --smoke checks it here.

    python benchmarks/gpu_feed_point.py --out OUT                    (a GPU, ~4 min on an H100)
    python benchmarks/gpu_feed_point.py --device cpu --smoke --out /tmp/feed-smoke

1. Synthetic universes of the config's size, preprocessed as the config says (random crops).
2. bench_loader's rows for the config's crop size: the worker path per core against the crops
   cut on the device; the config's step alone on a batch in memory (samples/s).
3. Short runs of the config (`train`, as the workflow trains) per variant: the H200 run's setup
   (3 workers, fp32, NCDHW), the resident shard in fp32, the new defaults (bf16, NDHWC, fused
   AdamW), the defaults without NDHWC, with torch.compile, and with the shard in pinned memory;
   each epoch's samples/s, data-wait and device-busy shares; on a GPU the host syncs the
   defaults' steps make (torch.cuda sync debug mode, counted).
4. The reference CosmoFlow (128³, 32 filters, 5 blocks) at batch 8, bf16, eager and compiled:
   samples/s and achieved TFLOP/s (3 × the analytic forward FLOPs) against the GPU's bf16 peak.
Writes OUT/feed_point.json and OUT/feed_point.md (also printed).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu":
    os.environ["CUDA_VISIBLE_DEVICES"] = ""  # before torch is imported

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_loader  # the loader rows and the step, shared with the CPU benchmark

from cosmocub.config import load_config
from cosmocub.models.summary import summarize
from cosmocub.parallel.parallel_dims import build_parallel_dims, close_parallel_dims
from cosmocub.train.step_settings import step_settings

# train.* over the config, per variant: the H200 run (gpu_universes_point.sh: 3 workers, amp off,
# NCDHW, foreach AdamW), then one change at a time from the new defaults.
VARIANTS = {
    "workers3_fp32": {
        "data_placement": "loader",
        "num_data_workers": 3,
        "amp": "off",
        "channels_last": False,
        "fused_optimizer": False,
    },
    "device_fp32": {
        "data_placement": "device",
        "amp": "off",
        "channels_last": False,
        "fused_optimizer": False,
    },
    "device_defaults": {"data_placement": "device"},
    "device_ncdhw": {"data_placement": "device", "channels_last": False},
    "device_compile": {"data_placement": "device", "compile": True},
    "pinned_defaults": {"data_placement": "pinned"},
}
REFERENCE = {
    "universes": {"size": 512},
    "preprocess": {"sample_size": 128},
    "model": {"input_size": 128, "base_filters": 32, "num_conv_blocks": 5, "head": "point"},
    "train": {"local_batch_size": 8, "amp": "bf16"},
}
# Dense bf16 tensor-core peaks (TFLOP/s) by the device name's words, from NVIDIA's data sheets.
PEAKS = {"H200": 989.4, "H100 PCIe": 756.0, "H100": 989.4, "A100": 312.0, "L40S": 362.1}


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAKS.items() if key in name), None)


def run_variant(
    config: str,
    shards: Path,
    run_dir: Path,
    train_over: dict,
    *,
    epochs: int,
    steps: int,
    count_syncs: bool,
) -> dict:
    """The config trained `epochs` × `steps` with `train_over`: its epochs and medians."""
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if count_syncs:
            torch.cuda.set_sync_debug_mode("warn")
        try:
            records = bench_loader.short_run(
                config, shards, run_dir, epochs=epochs, steps=steps, train_over=train_over
            )
        finally:
            if count_syncs:
                torch.cuda.set_sync_debug_mode("default")
    later = records[1:] or records  # the first epoch starts workers, compiles, tunes cuDNN
    out = {"wall_s": time.perf_counter() - start, "epochs": records}
    for key in ("samples_per_s", "data_wait_share", "device_busy_share"):
        out[key] = statistics.median(r[key] for r in later)
    if count_syncs:
        out["host_syncs"] = sum("synchroniz" in str(w.message) for w in caught)
        out["steps"] = epochs * steps
    return out


def reference_step(dims, *, smoke: bool, compile_too: bool) -> list[dict]:
    """The reference CosmoFlow's step: samples/s, TFLOP/s and its share of the peak."""
    over = json.loads(json.dumps(REFERENCE))
    if smoke:  # a CPU: the same code on a model it can step in seconds
        over["model"].update(input_size=32, base_filters=4, num_conv_blocks=3)
        over["preprocess"]["sample_size"] = 32
        over["train"]["local_batch_size"] = 2
    rows = []
    for compiled in (False, True) if compile_too else (False,):
        over["train"]["compile"] = compiled
        cfg = load_config(None, overrides=over)
        rate, fastest, words = bench_loader.step_rate(
            cfg, dims, seconds=0.5 if smoke else 3.0, warmup_s=0.5 if smoke else 3.0
        )
        flops = 3 * summarize(cfg.model)["flops_per_sample"] * rate
        peak = peak_tflops(dims.device)
        rows.append(
            {
                "model": f"reference {cfg.model.input_size}³ ×{cfg.model.base_filters} "
                f"{cfg.model.num_conv_blocks} blocks",
                "batch": cfg.train.local_batch_size,
                "settings": words,
                "samples_per_s": rate,  # the median step's
                "samples_per_s_fastest": fastest,
                "tflops": flops / 1e12,
                "peak_tflops": peak,
                "share_of_peak": flops / 1e12 / peak if peak else None,
            }
        )
    return rows


def report(results: dict) -> str:
    lines = [f"# Feeding the accelerator: {results['config']} on {results['device_name']}", ""]
    lines += [
        f"- load before {results['load_before']}, after {results['load_after']}; "
        f"shards made in {results['shards_s']:.0f} s",
        "",
    ]
    lines += [
        "| crops | size | symmetries | batch | workers samples/s/core | "
        "resident samples/s | resident load s |",
        "|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['crops']} | {r['size']}³ | {r['symmetries']} | {r['batch']} | "
        f"{r['workers']:.0f} | {r['resident']:.0f} | {r['load_s']:.2f} |"
        for r in results["loader_rows"]
    ]
    lines += [
        "",
        f"step alone ({results['step_settings']}): {results['step_samples_per_s']:.0f} samples/s",
        "",
    ]
    lines += [
        "| variant | samples/s | data wait | device busy | host syncs / step | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for name, v in results["variants"].items():
        if "error" in v:
            lines.append(f"| {name} | {v['error']} | | | | |")
            continue
        syncs = f"{v['host_syncs'] / v['steps']:.2f}" if "host_syncs" in v else ""
        lines.append(
            f"| {name} | {v['samples_per_s']:.0f} | {100 * v['data_wait_share']:.1f} % "
            f"| {100 * v['device_busy_share']:.1f} % | {syncs} | {v['wall_s']:.0f} |"
        )
    lines += [
        "",
        "| model | batch | settings | samples/s | TFLOP/s | peak | share |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results["reference"]:
        share = f"{100 * r['share_of_peak']:.1f} %" if r["share_of_peak"] else "n/a"
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['settings']} | "
            f"{r['samples_per_s']:.1f} | {r['tflops']:.2f} | {r['peak_tflops']} | "
            f"{share} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", default="config/science.yaml")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the code")
    parser.add_argument("--universes", type=int, default=130, help="64³ universes made")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="per epoch of each variant")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    if args.smoke:
        args.universes, args.epochs, args.steps = 6, 2, 3
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"config": args.config, "load_before": bench_loader.load_avg()}
    cfg = load_config(args.config)
    dims = build_parallel_dims(backend=cfg.train.backend)
    device = dims.device
    if args.device == "cuda" and device.type != "cuda":
        raise SystemExit("--device cuda: no GPU here (use --device cpu --smoke for the check)")
    cuda = device.type == "cuda"
    results["device_name"] = torch.cuda.get_device_name(device) if cuda else "cpu"
    try:
        with tempfile.TemporaryDirectory(prefix="feed_point_") as tmp:
            start = time.perf_counter()
            shards = bench_loader.make_shards(
                cfg,
                Path(tmp),
                size=cfg.universes.size,
                crop=cfg.model.input_size,
                universes=args.universes,
                workers=os.cpu_count() or 1,
            )
            results["shards_s"] = time.perf_counter() - start
            layout = step_settings(cfg, dims).memory_format
            results["loader_rows"] = bench_loader.measure_loaders(
                cfg,
                {cfg.model.input_size: shards},
                seconds=0.5 if args.smoke else 2.0,
                device=device,
                layout=layout,
            )
            rate, fastest, words = bench_loader.step_rate(
                cfg, dims, seconds=0.5 if args.smoke else 3.0, warmup_s=0.5 if args.smoke else 3.0
            )
            results.update(
                step_samples_per_s=rate,
                step_samples_per_s_fastest=fastest,
                step_settings=words,
                variants={},
            )
            for name in args.variants.split(","):
                over = VARIANTS[name]
                if not cuda and (over["data_placement"] == "pinned" or over.get("compile")):
                    results["variants"][name] = {"error": "skipped on a CPU"}
                    continue
                try:
                    results["variants"][name] = run_variant(
                        args.config,
                        shards["random"],
                        Path(tmp) / "results" / name,
                        over,
                        epochs=args.epochs,
                        steps=args.steps,
                        count_syncs=cuda and name == "device_defaults",
                    )
                except Exception as err:
                    results["variants"][name] = {"error": f"{type(err).__name__}: {err}"[:300]}
                v = results["variants"][name]
                said = {k: v[k] for k in v if k != "epochs"}  # the epochs are in the JSON
                print(f"# {name}: {said}", flush=True)
            results["reference"] = reference_step(dims, smoke=args.smoke, compile_too=cuda)
    finally:
        close_parallel_dims(dims)
    results["load_after"] = bench_loader.load_avg()
    (args.out / "feed_point.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = report(results)
    (args.out / "feed_point.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
