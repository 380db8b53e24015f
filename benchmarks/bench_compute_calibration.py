"""How well the compute calibration predicts layers it never timed: calibrate this CPU (or read a
cached calibration), then time a few models' conv blocks and heads directly
(`perfmodel.measure.compute.measure_layers`, at the memory format training uses) and print predicted
against measured per layer, with the relative error. Prints `uptime` before and after (the load
the figures were taken at) and the calibration's own wall time.

    python benchmarks/bench_compute_calibration.py --threads 1 --out /tmp/calibration.json
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import subprocess
import time
from pathlib import Path

import torch

from cosmocub.config import load_config
from cosmocub.perfmodel.cost_model.machines import training_memory_format
from cosmocub.perfmodel.measure import calibration_cache, cpu_model
from cosmocub.perfmodel.measure.compute import measure_layers, torch_threads

# (label, model overrides, local batch, split): the test model, the network study's, the default.
NETWORK = {"base_filters": 16, "dense_sizes": (128,), "batch_norm": False}
DEFAULT = {"input_size": 32, "base_filters": 16, "num_conv_blocks": 4, "dense_sizes": (128, 64)}
POINTS = [
    ("test.yaml", {}, 4, (1, 1, 1)),
    ("test.yaml split 2", {}, 4, (2, 1, 1)),
    ("network study", NETWORK, 4, (1, 1, 1)),
    ("network study", NETWORK, 2, (1, 1, 1)),
    ("config.yaml 32^3", DEFAULT, 4, (1, 1, 1)),
]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config/test.yaml")
    parser.add_argument("--threads", type=int, nargs="+", help="default: calibration.threads")
    parser.add_argument("--out", default="/tmp/cosmocub-calibration.json")
    parser.add_argument("--repeats", type=int, default=5, help="direct timings per layer")
    parser.add_argument("--calibration-repeats", type=int, help="default: calibration.repeats")
    args = parser.parse_args()
    settings = {"threads": args.threads, "repeats": args.calibration_repeats}
    settings = {k: v for k, v in settings.items() if v is not None}
    overrides = {"perf_model": {"calibration": settings}}
    cfg = load_config(args.config, overrides=overrides)
    cores = cfg.perf_model.cores or torch.get_num_threads()
    print(f"before: {uptime()}")
    start = time.perf_counter()
    cal = calibration_cache.load_or_calibrate(
        Path(args.out), cfg.perf_model.calibration, cores=cores
    )
    print(f"calibration ready in {time.perf_counter() - start:.1f} s ({args.out})")
    print(cpu_model.describe(cal))
    print("\n| point | threads | layer | predicted ms | measured ms | error |")
    print("|---|---|---|---|---|---|")
    errors: dict[str, list[float]] = {}
    for label, changes, batch, split in POINTS:
        model = dataclasses.replace(cfg.model, **changes)
        fmt = training_memory_format(split)
        layout = torch.channels_last_3d if fmt == "channels_last_3d" else torch.contiguous_format
        for threads in cal.threads:
            predicted = cal.layer_seconds(
                model, batch=batch, split=split, threads=threads, memory_format=fmt
            )
            with torch_threads(threads):
                measured = measure_layers(
                    model, batch=batch, split=split, repeats=args.repeats, memory_format=layout
                )
            rows = [(layer, predicted[layer], measured[layer]) for layer in measured]
            if "overhead" in measured:  # unsplit: the whole step, glue included
                rows.append(("step", sum(predicted.values()), sum(measured.values())))
            for layer, guess, seconds in rows:
                if layer == "overhead":
                    continue
                error = (guess - seconds) / seconds
                errors.setdefault("step" if layer == "step" else "layer", []).append(abs(error))
                print(
                    f"| {label} (batch {batch}) | {threads} | {layer} | "
                    f"{1e3 * guess:.3f} | {1e3 * seconds:.3f} | {100 * error:+.0f} % |"
                )
    for what, values in errors.items():
        print(
            f"\n|error| over {len(values)} {what}s: median {100 * statistics.median(values):.0f} "
            f"%, worst {100 * max(values):.0f} %"
        )
    print(f"after: {uptime()}")


if __name__ == "__main__":
    main()
