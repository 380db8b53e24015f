"""Seconds per synthetic universe (2LPT + PM) at this tree and at an earlier commit, side by side in
one run; how far the field moved between them; and a group of universes through
`cosmocub simulate-group` (process start included), extrapolated to 1,000 universes on 2 cores.

Run: python benchmarks/bench_simulate.py [--size 64] [--before c085b97] [--rounds 3]
     [--repeats 2] [--group 40] [--config F]
The "before" code is the package at --before, taken with `git archive` into a temporary folder at
run time. The two cannot share one import of cosmocub, so each round runs each in its own process,
alternately, so that both see the same load. FFTs are single-threaded, as in the workflow (one
job per core). Prints markdown tables and the load average at the start and the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[1]
PHASES = ("total", "initial_conditions", "pm", "fft")

# The `cosmocub` entry point, by the interpreter that runs this script.
CLI = "import sys; from cosmocub.cli import main; sys.exit(main())"
# Runs in a fresh interpreter whose PYTHONPATH picks the cosmocub to time; argv[1] is a JSON job.
WORKER = """
import json, sys
import numpy as np
from cosmocub.config import load_config
from cosmocub.data.simulate import simulate_universe
job = json.loads(sys.argv[1])
settings = load_config(job["config"]).simulate
simulate_universe(size=16, seed=0, settings=settings, progress=False)  # imports, colossus
rows = []
for seed in job["seeds"]:
    universe = simulate_universe(size=job["size"], seed=seed, settings=settings, progress=False)
    rows.append(universe.timings)
    if seed == job["seeds"][0] and job["save"]:
        np.save(job["save"], universe.counts_dhwc)
print(json.dumps(rows))
"""


def export_tree(commit: str, dest: Path) -> Path:
    """The `src` folder of `commit`, written under `dest`; returns the folder to put on the path."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "src"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "src"


def run_worker(src: Path, *, size: int, seeds: list[int], config: str | None, save: str) -> list:
    env = {**os.environ, "PYTHONPATH": str(src)}
    job = json.dumps({"size": size, "seeds": seeds, "config": config, "save": save})
    out = subprocess.run(
        [sys.executable, "-c", WORKER, job], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_group(tmp: Path, *, size: int, count: int, config: str | None, group: int = 0) -> float:
    """Wall seconds of one `cosmocub simulate-group` job of `count` universes, from the process
    start to its exit (tracking off; the workflow's jobs add a pending record of ~ms). A group
    the config does not have exits 2 once the config and the simulation's imports are loaded:
    the job's start-up alone."""
    values = yaml.safe_load(Path(config).read_text()) if config else {}
    values.update(
        results=str(tmp / "results"),
        tracking={"enabled": False},
        universes={**values.get("universes", {}), "count": count, "size": size},
    )
    values.setdefault("cluster", {})["simulate"] = {"universes_per_job": count}
    path = tmp / f"group_{count}.yaml"
    path.write_text(yaml.safe_dump(values))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    command = ["simulate-group", "--group", str(group), "--out", str(tmp / f"out_{count}")]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", CLI, *command, "--config", str(path)], env=env, capture_output=True
    )
    wall = time.perf_counter() - start
    if done.returncode != (0 if group == 0 else 2):
        raise SystemExit(f"bench_simulate: simulate-group failed:\n{done.stderr.decode()}")
    return wall


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--before", default="c085b97", help="commit whose simulate is 'before'")
    parser.add_argument("--rounds", type=int, default=3, help="alternations before/after")
    parser.add_argument("--repeats", type=int, default=2, help="universes per round (seeds 0..)")
    parser.add_argument("--group", type=int, default=40, help="universes in the grouped job")
    parser.add_argument("--per-job", type=int, default=16, help="universes per job, extrapolated")
    parser.add_argument("--config", default=None, help="YAML config (default: schema defaults)")
    args = parser.parse_args()

    print(f"load average at start (1, 5, 15 min): {load()}; {os.cpu_count()} cores\n")
    seeds = list(range(args.repeats))
    with tempfile.TemporaryDirectory(prefix="bench_simulate_") as tmp_name:
        tmp = Path(tmp_name)
        trees = {"before": export_tree(args.before, tmp / "before"), "after": REPO / "src"}
        rows: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, src in trees.items():
                save = str(tmp / f"{name}.npy")
                rows[name] += run_worker(
                    src, size=args.size, seeds=seeds, config=args.config, save=save
                )
        fields = {name: np.load(tmp / f"{name}.npy") for name in trees}
        start_ups = [
            time_group(tmp, size=args.size, count=1, config=args.config, group=1) for _ in range(3)
        ]
        group_wall = time_group(tmp, size=args.size, count=args.group, config=args.config)

    print(f"### One universe of {args.size}³ (median of {len(rows['after'])}, min in brackets)\n")
    print("| code | s / universe | initial conditions s | PM s | FFT s | FFT calls |")
    print("|---|---|---|---|---|---|")
    medians = {}
    for name, label in (("before", f"before ({args.before})"), ("after", "after (this tree)")):
        cells = []
        for key in PHASES:
            values = np.array([r[key] for r in rows[name]])
            cells.append(f"{np.median(values):.2f} ({values.min():.2f})")
        medians[name] = float(np.median([r["total"] for r in rows[name]]))
        print(f"| {label} | " + " | ".join(cells) + f" | {rows[name][0]['fft_calls']:.0f} |")
    print(f"\nspeed-up (medians): {medians['before'] / medians['after']:.2f}×\n")

    before, after = (fields[n].astype(np.int64) for n in ("before", "after"))
    print(f"### Seed 0, this tree against {args.before} (counts per voxel, per snapshot)\n")
    print("| channel | max abs difference | voxels that differ | std before | std after | rel. |")
    print("|---|---|---|---|---|---|")
    for c in range(before.shape[-1]):
        b, a = before[..., c], after[..., c]
        print(
            f"| {c} | {np.abs(a - b).max()} | {np.mean(a != b):.2%} | {b.std():.4f} "
            f"| {a.std():.4f} | {a.std() / b.std() - 1:+.2e} |"
        )

    start_up = float(np.median(start_ups))  # process start, imports, config
    marginal = (group_wall - start_up) / args.group  # seconds per universe inside a job
    jobs = math.ceil(1000 / args.per_job)
    core_s = jobs * start_up + 1000 * marginal
    print(f"\n### Grouped: `cosmocub simulate-group`, {args.size}³, one process per job\n")
    print("| job | wall s | s / universe |")
    print("|---|---|---|")
    print(f"| start-up only (median of 3) | {start_up:.2f} | |")
    print(f"| {args.group} universes | {group_wall:.1f} | {group_wall / args.group:.2f} |")
    print(
        f"\nper job: start-up {start_up:.1f} s + {marginal:.2f} s per universe. 1,000 universes "
        f"at {args.per_job} a job: {jobs} jobs, {core_s:.0f} core-s, {core_s / 2 / 60:.1f} min on "
        f"2 cores (two jobs at once, assumed to scale; Snakemake's own scheduling of the jobs and "
        f"links not included)"
    )
    print(f"\nload average at end (1, 5, 15 min): {load()}")


if __name__ == "__main__":
    main()
