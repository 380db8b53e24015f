"""What the workflow itself costs at the size of the public data: jobs, `snakemake -n` seconds,
and Snakemake's own CPU seconds beside the wall time of a real run.

Rows (each a fresh folder; Snakemake's own CPU is read from /proc/<pid>/stat of the snakemake
process, its children excluded, once it has exited and before it is reaped):
  dry public <N> <profile>     N placeholder univ_ics_*.hdf5 files (empty: a dry run opens none)
                               in universes.cosmoflow_dir, config/cosmoflow-mlperf.yaml
  dry mlperf <T>+<V> <profile> an MLPerf HPC TFRecord layout of placeholders (train/, validation/),
                               universes.source mlperf (where the checkout has that source)
  dry synthetic <N>            the default config at universes.count N
  run synthetic <N>            config/test.yaml at N universes of 16³ end to end (`all`, 1 epoch)

    python benchmarks/workflow_cost.py                       # the dry runs at full size
    python benchmarks/workflow_cost.py --run 1000 10000      # and end-to-end runs (minutes)
    python benchmarks/workflow_cost.py --repo ../old-checkout  # another checkout's workflow
    python benchmarks/workflow_cost.py --smoke               # seconds: the suite's check

Run it on a quiet machine (`uptime` before and after; python benchmarks/host_steal.py).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = Path(sys.executable).parent / "snakemake"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def run_snakemake(
    repo: Path, args: list[str], cwd: Path, timeout: float
) -> tuple[str, float, float]:
    """(stdout + stderr, wall seconds, Snakemake's own CPU seconds) of one invocation."""
    # The checkout's own package first (the venv's editable install may be another checkout's),
    # and no parent MLflow run of a workflow around this one.
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    env.pop("COSMOCUB_PARENT_RUN_ID", None)
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [str(SNAKEMAKE), "-s", str(repo / "Snakefile"), *args],
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
        )
        deadline = time.monotonic() + timeout
        while True:
            # WNOWAIT: the exited process stays a zombie, so its /proc/<pid>/stat still holds its
            # own CPU times (utime, stime), which exclude its children's.
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            if info is not None:
                break
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise TimeoutError(f"snakemake {' '.join(args)}: over {timeout:.0f} s")
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        own_cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        proc.wait()
        log.seek(0)
        out = log.read()
    if proc.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed:\n{out[-3000:]}")
    return out, wall, own_cpu


def job_counts(out: str) -> dict[str, int]:
    """The 'Job stats' table of a (dry) run, by rule."""
    table = out.split("Job stats:", 1)[1] if "Job stats:" in out else ""
    counts = {}
    for line in table.splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit() or parts[0] == "total":
            break
        counts[parts[0]] = int(parts[1])
    return counts


def public_layout(folder: Path, count: int) -> Path:
    """`count` empty placeholder universes named as the public set names them."""
    folder.mkdir(parents=True)
    for i in range(count):
        (folder / f"univ_ics_2019-03_a{10_000_000 + i}.hdf5").touch()
    return folder


def mlperf_layout(folder: Path, train: int, validation: int) -> Path:
    """Empty placeholder TFRecords in the MLPerf HPC layout (8 crops of each universe here)."""
    for split, count in (("train", train), ("validation", validation)):
        (folder / split).mkdir(parents=True)
        offset = 0 if split == "train" else train
        for i in range(offset, offset + count):
            name = f"univ_ics_2019-03_a{10_000_000 + i // 8}_{i % 8:03d}.tfrecord"
            (folder / split / name).touch()
    return folder


def has_mlperf_source(repo: Path) -> bool:
    schema = (repo / "src" / "cosmocub" / "schemas" / "config.schema.yaml").read_text()
    return "mlperf_dir" in schema


def dry_row(label: str, repo: Path, args: list[str], cwd: Path, timeout: float) -> dict:
    out, wall, cpu = run_snakemake(repo, ["-n", "--quiet", "rules", *args], cwd, timeout)
    counts = job_counts(out)
    return {
        "case": label,
        "jobs": sum(counts.values()),
        "largest": _largest(counts),
        "seconds": wall,
        "own_cpu": cpu,
        "wall": wall,
    }


def _largest(counts: dict[str, int]) -> str:
    rule, n = max(counts.items(), key=lambda kv: kv[1]) if counts else ("-", 0)
    return f"{rule} × {n}"


def run_row(repo: Path, count: int, cwd: Path, timeout: float) -> dict:
    """config/test.yaml at `count` universes of 16³, the default target, one training epoch."""
    config = yaml.safe_load((repo / "config" / "test.yaml").read_text())
    config["results"] = str(cwd / "results")
    config["universes"] = {**config["universes"], "count": count, "size": 16}
    config["train"] = {**config["train"], "epochs": 1}
    path = cwd / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    args = ["--cores", "all", "--configfile", str(path)]
    dry, _, _ = run_snakemake(repo, ["-n", "--quiet", "rules", *args], cwd, timeout)
    counts = job_counts(dry)
    _, wall, cpu = run_snakemake(repo, args, cwd, timeout)
    return {
        "case": f"run synthetic {count:,} (16³)",
        "jobs": sum(counts.values()),
        "largest": _largest(counts),
        "seconds": float("nan"),
        "own_cpu": cpu,
        "wall": wall,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--repo", type=Path, default=REPO, help="the checkout whose workflow to time")
    p.add_argument("--public", type=int, default=10_017, help="public universes (placeholders)")
    p.add_argument("--synthetic", type=int, default=10_000, help="synthetic universes, dry run")
    p.add_argument("--mlperf", default="524288,65536", help="MLPerf train,validation files")
    p.add_argument("--run", type=int, nargs="*", default=[], help="end-to-end runs at N universes")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: seconds")
    p.add_argument("--timeout", type=float, default=7200)
    args = p.parse_args()
    repo = args.repo.resolve()
    if args.smoke:
        args.public, args.synthetic, args.mlperf, args.run = 30, 30, "40,16", []
    train, validation = (int(v) for v in args.mlperf.split(","))
    mlperf_config = str(repo / "config" / "cosmoflow-mlperf.yaml")
    rows = []
    with tempfile.TemporaryDirectory(prefix="workflow-cost-") as tmp:
        root = Path(tmp)
        public = public_layout(root / "public", args.public)
        layouts = {f"public {args.public:,}": f"{{source: cosmoflow, cosmoflow_dir: {public}}}"}
        if has_mlperf_source(repo):
            folder = mlperf_layout(root / "mlperf", train, validation)
            layouts[f"mlperf {train:,}+{validation:,}"] = (
                f"{{source: mlperf, mlperf_dir: {folder}}}"
            )
        for name, universes in layouts.items():
            for profile in ("default", "slurm"):
                cwd = root / f"{name.split()[0]}-{profile}"
                cwd.mkdir()
                profile_dir = str(repo / "profiles" / profile)
                args_ = ["--profile", profile_dir, "--configfile", mlperf_config]
                rows.append(
                    dry_row(
                        f"dry {name} ({profile})",
                        repo,
                        [*args_, "--config", f"universes={universes}"],
                        cwd,
                        args.timeout,
                    )
                )
        cwd = root / "synthetic"
        cwd.mkdir()
        rows.append(
            dry_row(
                f"dry synthetic {args.synthetic:,}",
                repo,
                [
                    "--configfile",
                    str(repo / "config" / "config.yaml"),
                    "--config",
                    f"universes={{count: {args.synthetic}}}",
                ],
                cwd,
                args.timeout,
            )
        )
        for count in args.run:
            cwd = root / f"run-{count}"
            cwd.mkdir()
            rows.append(run_row(repo, count, cwd, args.timeout))
    commit = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(f"workflow cost, checkout {repo} at {commit}; load {os.getloadavg()[0]:.2f} after")
    print(
        f"{'case':<38} {'jobs':>7} {'largest rule':<26} {'dry run s':>9} "
        f"{'snakemake CPU s':>15} {'wall s':>8} {'CPU share':>9}"
    )
    for r in rows:
        share = r["own_cpu"] / r["wall"]
        print(
            f"{r['case']:<38} {r['jobs']:>7,} {r['largest']:<26} {r['seconds']:>9.1f} "
            f"{r['own_cpu']:>15.1f} {r['wall']:>8.1f} {share:>9.1%}"
        )


if __name__ == "__main__":
    main()
