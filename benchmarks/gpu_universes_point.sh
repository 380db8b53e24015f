#!/usr/bin/env bash
# The universes study's largest point on one GPU, and how far its learning curve goes with GPU time.
#
# Runs in the repo root with the package from src/ (not pip-installed) and the missing pure/binary
# dependencies from .whl/ (jsonschema & co., dask & co., colossus, google-crc32c); no Snakemake,
# no MLflow (tracking: {enabled: false}). Every stage is the `cosmocub` subcommand the workflow's
# rule runs (workflow/rules/{data,train,studies}.smk), by hand:
#   1. simulate   JOBS `simulate-group` jobs in parallel (cluster.simulate.universes_per_job =
#                 ceil(count / JOBS)), each universe hard-linked to universes/ as rule `simulate`
#   2. preprocess `preprocess-plan`, JOBS `preprocess-group --threads 1` in parallel,
#                 `preprocess-gather` (shards do not depend on the grouping: shard_jobs.py)
#   3. train      the point's config from `study-point-config --study universes` (the study's
#                 stretched schedule), trained by `launch --ranks-per-node 1 -- train` (what
#                 `study-point` runs locally, without its rerun-if-contended), then `evaluate`:
#                 u<N_MAIN> at EPOCHS x STEPS_PER_EPOCH (25 x 30 = 750 steps, the study), then
#                 u<N_MAIN> and every N of EXTRA_N at STEPS_LONG steps, side by side on the GPU
#   4. summary    $OUT/summary.md (also printed), summary.tsv, points.json, logs.tgz
#
# Batch 8 (train.local_batch_size) everywhere, as the study. amp off (fp32; the study ran fp32 on
# CPU, and bf16 autocast only adds casts to this launch-bound net); AMP=auto gives the package's
# GPU default (bf16). Env (defaults): UNIVERSES (config's count, 1400 since 03c396f), SPLITS
# ("train,val,test"; config's 1000,200,200; UNIVERSES=1260 SPLITS=1000,60,200 is the setup of
# docs/explanation/universes_study.md), SIZE (64), JOBS (16), N_MAIN (1000), LR (0.001), EPOCHS (25), STEPS_PER_EPOCH (30),
# STEPS_LONG (auto: the most multiples of 750, up to STEPS_LONG_MAX (45000), at which every long
# point is predicted to fit in the time left, from the repro run's step and validation times;
# the smallest extra N is dropped while keeping it would give fewer than LONG_MIN (6000) steps;
# with a number, extra points predicted not to fit are skipped),
# EXTRA_N ("30 100 300"; "" = none), WORKERS (train.num_data_workers, 3), CPUS_PER_RANK (2),
# AMP (off), TOTAL_S (470: wall deadline from start), SLOWDOWN (0.6 x the long points, at least
# 1.2: assumed step-time factor with the long points side by side on the GPU, for STEPS_LONG
# auto), LONG_MIN, STEPS_LONG_MAX (see STEPS_LONG), PYTHON (python3), WHEELS (.whl), SITE (/tmp/site),
# RESULTS_DIR (results-gpu-universes), OUT ($OUT or ./gpu-out), WATCHDOG_S ("45 45": the waits
# before each stack dump of the preprocessing groups still running).
#
# Measured once on a lent H200 machine (16 cores, 2026-12-04, TOTAL_S=470, config/universes.yaml's
# 1,400 universes): simulate 104.9 s; the 16 preprocess groups did not finish inside their 200 s
# timeout, with empty logs, so the run stopped there (exit 1) with no training. A group of 88
# takes 3 s on this 2-core machine since cdf2d85 (one chunk writer per shard; 6 s before): if that
# machine's h5py has no chunk_iter (HDF5 < 1.12.3), every universe's writer had read the shard's
# chunk table by get_chunk_info(i), n² steps, ~10 s a universe. The script now prints h5py's HDF5
# and dumps the groups' stacks into their logs if they run long. A second run (TOTAL_S=520) had
# the 16 groups done in 9-12 s each, and then the gather ran past its 200 s: the shards'
# features at 16 Dask threads, GIL-bound (since the next commit: numpy moments, processes).
# A third (TOTAL_S=420, 33251e8): simulate 121.7 s, preprocess 80.6 s, the 750-step point trained
# in 61 s (11.4 ms a step, loader-bound: GPU 4 % busy) and evaluated in 30.6 s; the long point
# had 55 s left and was stopped (docs/explanation/universes_study.md, "On a GPU").
set -euo pipefail
PY=${PYTHON:-python3}; SITE=${SITE:-/tmp/site}; WHEELS=${WHEELS:-.whl}; T_START=$(date +%s.%N)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl || "$PY" -c 'import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in glob.glob(sys.argv[2] + "/*.whl")]' "$SITE" "$WHEELS" && export PYTHONPATH=$PWD/src:$SITE${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache} NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba-cache}
# Nothing here needs HDF5's advisory locks (readers only, and the shards' chunks are written by
# offset), and the machine's sandbox (gVisor) is one more place for them to misbehave.
export HDF5_USE_FILE_LOCKING=FALSE
# `kill -USR1` makes any of these Python processes print every thread's stack to its log: the
# watchdog below does it to preprocessing jobs (groups, gather) still running after 45 and 90 s.
printf 'import faulthandler, signal\nfaulthandler.register(signal.SIGUSR1, all_threads=True)\n' \
  > "$SITE/sitecustomize.py"

JOBS=${JOBS:-16}; N_MAIN=${N_MAIN:-1000}; LR=${LR:-0.001}; EPOCHS=${EPOCHS:-25}
STEPS_PER_EPOCH=${STEPS_PER_EPOCH:-30}; STEPS_LONG=${STEPS_LONG:-auto}; EXTRA_N=${EXTRA_N-30 100 300}
WORKERS=${WORKERS:-3}; CPUS_PER_RANK=${CPUS_PER_RANK:-2}; AMP=${AMP:-off}; TOTAL_S=${TOTAL_S:-470}
SLOWDOWN=${SLOWDOWN:-}
R=${RESULTS_DIR:-results-gpu-universes}; OUT=${OUT:-$PWD/gpu-out}
case "$(basename "$R")" in results-gpu*) rm -rf -- "$R" ;; *) echo "RESULTS_DIR must be named results-gpu*" >&2; exit 2 ;; esac
mkdir -p "$R/logs" "$R/cfg" "$R/points" "$R/universes" "$OUT"
R=$(cd "$R" && pwd); LOGS=$R/logs; export GPU_R=$R
export UNIVERSES=${UNIVERSES:-} SPLITS=${SPLITS:-} SIZE=${SIZE:-} JOBS N_MAIN LR EPOCHS STEPS_PER_EPOCH
export WORKERS AMP STEPS_LONG_MAX=${STEPS_LONG_MAX:-} LONG_MIN=${LONG_MIN:-}
cc() { "$PY" -m cosmocub.cli "$@"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }
left() { awk -v a="$T_START" -v b="$(now)" -v t="$TOTAL_S" 'BEGIN{printf "%d", t-(b-a)}'; }
# A phase's timeout: at most $1 s, and at most the time left before the deadline less $2 s.
budget() { local l; l=$(( $(left) - $2 )); (( l > $1 )) && l=$1; (( l < 10 )) && l=10; echo "$l"; }
phase() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$R/phases.tsv"; echo "=== phase $1: $2 s ($3)"; }
printf 'phase\twall_s\tstatus\n' > "$R/phases.tsv"
phase pip_install "$(since "$T_START")" ok

GPU_MON=""
finish() {
  rc=$?
  set +eu
  [[ -n "$GPU_MON" ]] && kill "$GPU_MON" 2>/dev/null
  for p in $(jobs -p); do pkill -TERM -P "$p"; kill "$p"; done 2>/dev/null  # early exit only
  phase total "$(since "$T_START")" "exit $rc"
  "$PY" "$R/helper.py" summary > "$R/summary.md" 2> "$LOGS/summary.err"
  cat "$R/summary.md"; tail -5 "$LOGS/summary.err"
  cp "$R/summary.md" "$R/summary.tsv" "$R/points.json" "$OUT/" 2>/dev/null
  tar -czf "$OUT/logs.tgz" -C "$R" logs phases.tsv cfg gpu.csv 2>/dev/null
  ls -la "$OUT"
  if (( rc == 0 )) && ! [[ -f "$R/points/$REPRO/eval/metrics.json" && -f "$R/points/$MAIN_LONG/eval/metrics.json" ]]; then
    echo "the repro point or the long N = $N_MAIN point has no evaluation" >&2; rc=3
  fi
  exit "$rc"
}
trap finish EXIT

# ---------------------------------------------------------------- helper (configs, summary)
cat > "$R/helper.py" <<'PYEOF'
import json, math, os, statistics, subprocess, sys
from pathlib import Path
import yaml

R = Path(os.environ["GPU_R"])
env = os.environ.get


def merge(a, b):
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def write(path, values):
    Path(path).write_text(yaml.safe_dump(values, sort_keys=False))


def base_cmd():
    """results/cfg/base.yaml: config/universes.yaml with this run's overrides (also written alone)."""
    cfg = yaml.safe_load(open("config/universes.yaml"))
    count = int(env("UNIVERSES") or cfg["universes"]["count"])
    jobs = int(env("JOBS"))
    per_job = -(-count // jobs)
    over = {
        "results": str(R),
        "universes": {"count": count, "size": int(env("SIZE") or cfg["universes"]["size"])},
        "train": {"num_data_workers": int(env("WORKERS")), "amp": env("AMP"),
                  "max_restarts": 0},
        "tracking": {"enabled": False},
        "cluster": {"simulate": {"universes_per_job": per_job},
                    "preprocess": {"universes_per_job": per_job, "threads": 1}},
    }
    if env("SPLITS"):
        t, v, s = (int(x) for x in env("SPLITS").split(","))
        over["preprocess"] = {"splits": {"train": t, "val": v, "test": s}}
    write(R / "cfg/overrides.yaml", over)
    write(R / "cfg/base.yaml", merge(cfg, over))
    print(-(-count // per_job))  # the number of groups


def crops_per_universe(cfg):
    return (cfg["universes"]["size"] // cfg["preprocess"]["sample_size"]) ** 3


def schedule(cfg, n, steps):
    """(epochs, steps per epoch) of a long point: the study's EPOCHS where an epoch can hold
    steps / EPOCHS batches (N x crops per universe / batch), else more epochs of fewer batches
    (the largest divisor of steps that fits, so every N takes exactly `steps`)."""
    epochs0 = int(env("EPOCHS"))
    cap = n * crops_per_universe(cfg) // cfg["train"]["local_batch_size"]
    target = min(cap, max(1, steps // epochs0))
    per_epoch = max(d for d in range(1, target + 1) if steps % d == 0)
    if per_epoch < target / 2:  # steps with few divisors: nearly `steps`
        per_epoch = target
    return max(1, round(steps / per_epoch)), per_epoch


def point_cmd(name, n, steps):
    """cfg/<name>.yaml: base + universes_study {train_universes: [n], lrs: [LR], epochs, steps per
    epoch} for `study-point-config` (which stretches the recipe's schedule to the epochs); prints
    'study_point_name epochs steps_per_epoch'."""
    cfg = yaml.safe_load(open(R / "cfg/base.yaml"))
    n, steps = int(n), int(steps)
    if name.endswith("_study"):
        epochs, per_epoch = int(env("EPOCHS")), int(env("STEPS_PER_EPOCH"))
    else:
        epochs, per_epoch = schedule(cfg, n, steps)
    lr = float(env("LR"))
    study = {"train_universes": [n], "lrs": [lr], "epochs": epochs,
             "max_steps_per_epoch": per_epoch}
    write(R / f"cfg/{name}.yaml", merge(cfg, {"universes_study": study}))
    print(f"u{n}_lr{lr:g} {epochs} {per_epoch}")


def epoch_times(run):
    """(train step s, validation + epoch overhead s) medians from a run's metrics.jsonl."""
    rows = [json.loads(l) for l in open(run / "metrics.jsonl") if l.strip()]
    batch = json.load(open(run / "train_summary.json"))["global_batch_size"]
    step_s, over = [], []
    prev_t, prev_step = 0.0, 0
    for r in rows:
        k = r["step"] - prev_step
        s = batch / r["samples_per_s"] if r.get("samples_per_s") else math.nan
        step_s.append(s)
        over.append((r["elapsed_s"] - prev_t) - k * s)
        prev_t, prev_step = r["elapsed_s"], r["step"]
    tail = slice(1, None) if len(rows) > 2 else slice(None)  # the first epoch starts workers
    return statistics.median(step_s[tail]), statistics.median(over[tail]), rows


def auto_steps_cmd(run, budget_s, slowdown, steps_long, *ns):
    """Which long points to run side by side, at how many steps. A point's predicted wall is
    epochs x (steps per epoch x the repro run's step time + its validation time per epoch),
    x slowdown (the points share the GPU and the cores), + 25 s start-up; a small N validates
    more often (an epoch holds at most N x 8 crops / batch 8 batches, and every epoch validates
    all 200 validation universes), so N = 30 is the slowest point by far. steps_long "auto": the
    largest multiple of EPOCHS x STEPS_PER_EPOCH (750) up to STEPS_LONG_MAX at which every point
    fits in budget_s, dropping the smallest extra N while that gives fewer than LONG_MIN steps;
    a number: those steps, and the points (the first, N_MAIN, always) that fit at them.
    Prints the steps, then the Ns."""
    cfg = yaml.safe_load(open(R / "cfg/base.yaml"))
    step_s, over_s, _ = epoch_times(Path(run))
    budget_s, ns = float(budget_s), [int(n) for n in ns]
    unit = int(env("EPOCHS")) * int(env("STEPS_PER_EPOCH"))
    top = int(env("STEPS_LONG_MAX") or 60 * unit) // unit
    floor = int(env("LONG_MIN") or 8 * unit)

    def factor(points):
        return float(slowdown) if slowdown else max(1.2, 0.6 * len(points))

    def wall(points, steps, n):
        e, s = schedule(cfg, n, steps)
        return 25.0 + factor(points) * e * (s * step_s + max(over_s, 0.0))

    def largest(points):
        for k in range(top, 0, -1):
            if all(wall(points, k * unit, n) <= budget_s for n in points):
                return k * unit
        return unit

    if steps_long == "auto":
        points = list(ns)
        steps = largest(points)
        while steps < floor and len(points) > 1:
            points.remove(min(points[1:]))  # the smallest extra N: the slowest point
            steps = largest(points)
    else:
        steps = int(steps_long)
        points = [n for i, n in enumerate(ns) if i == 0 or wall(ns, steps, n) <= budget_s]
    print(steps)
    print(" ".join(map(str, points)))
    skipped = [n for n in ns if n not in points]
    print(f"STEPS_LONG {steps} ({steps_long}): repro step {1e3 * step_s:.2f} ms, validation "
          f"{over_s:.2f} s/epoch; N = {' '.join(map(str, points))} side by side, slowdown "
          f"x{factor(points):.2f}, predicted "
          + ", ".join(f"N={n} {wall(points, steps, n):.0f} s" for n in points)
          + f" of {budget_s:.0f} s left"
          + (f"; skipped N = {' '.join(map(str, skipped))} (predicted "
             + ", ".join(f"{wall(ns, steps, n):.0f} s" for n in skipped) + ")" if skipped else ""),
          file=sys.stderr)


# Per-universe test MAE at N = 1,000, lr 0.001, 750 steps, CPU (docs/explanation/universes_study.md).
REFERENCE = {
    "Omega_m": (0.452, 0.448, 0.377, 0.481, 1.01), "sigma_8": (0.332, 0.295, 0.287, 0.463, 1.13),
    "N_spec": (0.328, 0.322, 0.297, 0.470, 1.02), "H_0": (0.524, 0.508, 0.507, 0.527, 1.03),
    "mean": (0.409, 0.393, 0.367, 0.485, 1.04),
}


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as err:  # noqa: BLE001
        return f"({err})"


def summary_cmd():
    from cosmocub.studies.accuracy import level_rows

    lines, tsv, points = [], [], {}
    lines.append("# The universes study's largest point on a GPU\n")
    gpu = sh("nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader")
    cpu = sh("lscpu | grep -m1 'Model name'").split(":")[-1].strip()
    import torch
    lines.append(f"- GPU: `{gpu or 'no nvidia-smi'}`")
    lines.append(f"- CPU: {os.cpu_count()} cores, `{cpu}`; torch {torch.__version__}, "
                 f"CUDA available {torch.cuda.is_available()}")
    auto = R / "logs/auto_steps.log"
    if auto.is_file() and auto.read_text().strip():
        lines.append(f"- {auto.read_text().strip().splitlines()[-1]}")
    gpu_csv = R / "gpu.csv"
    if gpu_csv.is_file():
        util = [float(l.split(",")[1]) for l in open(gpu_csv) if l.count(",") >= 2
                and l.split(",")[1].strip().replace(".", "").isdigit()]
        if util:
            lines.append(f"- GPU utilisation while training: mean {statistics.mean(util):.0f} %, "
                         f"max {max(util):.0f} % ({len(util)} samples of 0.5 s)")
    lines.append("\n| phase | wall s | status |\n|---|---|---|")
    for l in open(R / "phases.tsv").read().splitlines()[1:]:
        p = l.split("\t")
        lines.append(f"| {p[0]} | {p[1]} | {p[2]} |")
    lines.append("")
    header = ("point\tN\tlr\tsteps\tepochs\tsteps_per_epoch\tfinal_val_loss\ttrain_wall_s\tstep_ms"
              "\tval_epoch_s\tdata_wait\tparameter\tcnn\tpk\tone_point\tmean\tcnn_over_pk"
              "\tcnn_over_pk_lo\tcnn_over_pk_hi\tcoverage68\tcoverage95")
    tsv.append(header)
    for d in sorted(R.glob("points/*/"), key=lambda p: (not p.name.endswith("_study"), int(p.name.split("_")[0][1:]))):
        info = json.loads((d / "point.json").read_text()) if (d / "point.json").is_file() else {}
        rec = {"info": info}
        run = d / "run"
        summ = run / "train_summary.json"
        step_ms = val_s = dw = math.nan
        if summ.is_file():
            rec["train_summary"] = json.loads(summ.read_text())
            step_s, val_s, rows = epoch_times(run)
            step_ms = 1e3 * step_s
            dw = statistics.median(r.get("data_wait_share", math.nan) for r in rows)
            rec["last_epochs"] = rows[-3:]
        ts = rec.get("train_summary", {})
        mpath = d / "eval/metrics.json"
        title = (f"## {d.name}: N = {info.get('N')}, lr {info.get('lr')}, {ts.get('steps', '?')} steps "
                 f"({info.get('epochs')} epochs x {info.get('steps_per_epoch')}), "
                 f"final val loss {ts.get('final', {}).get('val_loss', math.nan):.4f}, "
                 f"train wall {ts.get('wall_time_s', math.nan):.0f} s, step {step_ms:.1f} ms, "
                 f"validation {val_s:.2f} s/epoch, data wait {100 * dw:.0f} %, device {ts.get('device')}")
        lines.append(title)
        if not mpath.is_file():
            lines.append(f"\nno evaluation ({info.get('status', 'not run')})\n")
            points[d.name] = rec
            continue
        metrics = json.loads(mpath.read_text())
        rec["eval_metrics"] = metrics
        rows = [r for r in level_rows(metrics) if r["level"] == "universe"]
        lines.append("\nper-universe test MAE (unitPar), bootstrap 16-84 % of CNN ÷ P(k); "
                     "[docs/explanation/universes_study.md: CPU, N = 1,000, 750 steps, 1,260 "
                     "universes (60 validation), simulation before ddc3fee]\n")
        lines.append("| parameter | CNN | P(k) fit | one-point fit | mean | CNN ÷ P(k) | cov68 | cov95 |")
        lines.append("|---|---|---|---|---|---|---|---|")
        for r in rows:
            ref = REFERENCE.get(r["parameter"])
            lo, hi = r["cnn_over_pk_lo"], r["cnn_over_pk_hi"]
            rng = f" ({lo:.2f}-{hi:.2f})" if math.isfinite(lo) and math.isfinite(hi) else ""
            refs = (f" [{ref[0]:.3f}]", f" [{ref[1]:.3f}]", f" [{ref[2]:.3f}]", f" [{ref[3]:.3f}]",
                    f" [{ref[4]:.2f}]") if ref else ("",) * 5
            lines.append(
                f"| {r['parameter']} | {r['cnn_mae']:.3f}{refs[0]} | {r['pk_mae']:.3f}{refs[1]} | "
                f"{r['one_point_mae']:.3f}{refs[2]} | {r['mean_mae']:.3f}{refs[3]} | "
                f"{r['cnn_over_pk']:.2f}{rng}{refs[4]} | "
                f"{r.get('coverage68', math.nan):.3f} | {r.get('coverage95', math.nan):.3f} |")
            tsv.append("\t".join(str(x) for x in (
                d.name, info.get("N"), info.get("lr"), ts.get("steps"), info.get("epochs"),
                info.get("steps_per_epoch"), f"{ts.get('final', {}).get('val_loss', math.nan):.5f}",
                f"{ts.get('wall_time_s', math.nan):.1f}", f"{step_ms:.2f}", f"{val_s:.3f}",
                f"{dw:.3f}", r["parameter"], *(f"{r[k]:.4f}" for k in (
                    "cnn_mae", "pk_mae", "one_point_mae", "mean_mae", "cnn_over_pk",
                    "cnn_over_pk_lo", "cnn_over_pk_hi")),
                f"{r.get('coverage68', math.nan):.3f}", f"{r.get('coverage95', math.nan):.3f}")))
        lines.append("")
        points[d.name] = rec
    (R / "summary.tsv").write_text("\n".join(tsv) + "\n")
    (R / "points.json").write_text(json.dumps(points, indent=1, default=str) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    {"base": base_cmd, "point": point_cmd, "auto-steps": auto_steps_cmd,
     "summary": summary_cmd}[sys.argv[1]](*sys.argv[2:])
PYEOF

echo "=== $(date -u +%FT%TZ) $(nproc) cores; $("$PY" --version 2>&1); deadline ${TOTAL_S} s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'
# Preprocessing reads each shard's chunk table through h5py's chunk_iter where HDF5 has it
# (>= 1.12.3) and by coordinate where not (src/cosmocub/data/h5chunks.py).
"$PY" -c 'import h5py; print("h5py", h5py.__version__, "HDF5", h5py.version.hdf5_version, "chunk_iter", hasattr(h5py.h5d.DatasetID, "chunk_iter"))'
NG=$("$PY" "$R/helper.py" base)
CFG=$R/cfg/base.yaml
echo "base config: config/universes.yaml + $(tr '\n' ' ' < "$R/cfg/overrides.yaml")"

# ---------------------------------------------------------------- 1. simulate
t=$(now); T=$(budget 240 200)
echo "=== simulate: $NG simulate-group jobs, $JOBS at a time (timeout $T s)"
st=ok
seq 0 $((NG - 1)) | timeout -k 10 "$T" xargs -P "$JOBS" -I{} env OMP_NUM_THREADS=1 \
  MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 NUMBA_NUM_THREADS=1 \
  sh -c '"$0" -m cosmocub.cli simulate-group --config "$1" --group {} --out "$2/universes" > "$2/logs/simulate_{}.log" 2>&1' \
  "$PY" "$CFG" "$R" || st="failed rc $?"
phase simulate "$(since "$t")" "$st; $(ls "$R/universes" | wc -l) universes"
[[ $st == ok ]] || { tail -3 "$LOGS"/simulate_*.log | tail -20; exit 1; }

# ---------------------------------------------------------------- 2. preprocess
t=$(now); T=$(budget 200 150)
echo "=== preprocess: plan, $NG groups ($JOBS at a time), gather (timeout $T s)"
timeout -k 10 "$T" "$PY" -m cosmocub.cli preprocess-plan --config "$CFG" --universes-dir "$R/universes" \
  --staging "$R/.shards-staging" > "$LOGS/preprocess_plan.log" 2>&1 || { cat "$LOGS/preprocess_plan.log"; exit 1; }
# the Python processes alone (their command line starts with the interpreter): a USR1 would
# kill the `sh -c` around each of them
( for wait_s in ${WATCHDOG_S:-45 45}; do
    sleep "$wait_s"; pkill -USR1 -f '^[^ ]+ -m cosmocub.cli preprocess-(group|gather)'
  done ) &
WATCHDOG=$!
seq 0 $((NG - 1)) | timeout -k 10 "$(budget 200 150)" xargs -P "$JOBS" -I{} env OMP_NUM_THREADS=1 \
  MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  sh -c 'exec > "$2/logs/preprocess_group_{}.log" 2>&1; date +"start %s.%N"; "$0" -m cosmocub.cli preprocess-group --config "$1" --staging "$2/.shards-staging" --group {} --out "$2/.shards-groups/{}.npz" --threads 1; rc=$?; date +"end %s.%N rc $rc"; exit $rc' \
  "$PY" "$CFG" "$R" || { kill "$WATCHDOG" 2>/dev/null; tail -n 40 "$LOGS"/preprocess_group_0.log; exit 1; }
timeout -k 10 "$(budget 200 140)" "$PY" -m cosmocub.cli preprocess-gather --config "$CFG" \
  --staging "$R/.shards-staging" --groups-dir "$R/.shards-groups" --out "$R/shards" \
  > "$LOGS/preprocess_gather.log" 2>&1 || { kill "$WATCHDOG" 2>/dev/null; tail -40 "$LOGS/preprocess_gather.log"; exit 1; }
kill "$WATCHDOG" 2>/dev/null || true
phase preprocess "$(since "$t")" "ok; $(du -sh "$R/shards" | cut -f1) of shards"

# ---------------------------------------------------------------- 3. train + evaluate
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
    -lms 500 > "$R/gpu.csv" 2>/dev/null &
  GPU_MON=$!
fi

# prepare NAME N STEPS: the point's config (study-point-config) in points/NAME/config.yaml
prepare() {
  local name=$1 n=$2 steps=$3 pt e s
  read -r pt e s < <("$PY" "$R/helper.py" point "$name" "$n" "$steps")
  mkdir -p "$R/points/$name"
  cc study-point-config --config "$R/cfg/$name.yaml" --study universes --point "$pt" \
    --out "$R/points/$name/config.yaml" > "$LOGS/config_$name.log" 2>&1 \
    || { cat "$LOGS/config_$name.log"; return 1; }
  printf '{"N": %s, "lr": %s, "epochs": %s, "steps_per_epoch": %s, "study_point": "%s"}\n' \
    "$n" "$LR" "$e" "$s" "$pt" > "$R/points/$name/point.json"
  echo "point $name: study point $pt, $e epochs x $s steps, workers $WORKERS, amp $AMP"
}
# train NAME TIMEOUT: `launch -- train` with one rank, as rule train / study-point run it
train() {
  local name=$1 t0; t0=$(now)
  timeout -k 20 "$2" "$PY" -m cosmocub.cli launch --nodes 1 --ranks-per-node 1 \
    --cpus-per-rank "$CPUS_PER_RANK" --max-restarts 0 -- train \
    --config "$R/points/$name/config.yaml" --shards "$R/shards" --out "$R/points/$name/run" \
    > "$LOGS/train_$name.log" 2>&1 && st=ok || st="failed rc $?"
  phase "train_$name" "$(since "$t0")" "$st"
  [[ $st == ok ]] || { tail -5 "$LOGS/train_$name.log"; return 1; }
}
evaluate() {
  local name=$1 t0; t0=$(now)
  OMP_NUM_THREADS=${EVAL_THREADS:-4} timeout -k 10 "$2" "$PY" -m cosmocub.cli evaluate \
    --config "$R/points/$name/config.yaml" --shards "$R/shards" --run-dir "$R/points/$name/run" \
    --out "$R/points/$name/eval" > "$LOGS/evaluate_$name.log" 2>&1 && st=ok || st="failed rc $?"
  phase "evaluate_$name" "$(since "$t0")" "$st"
  [[ $st == ok ]] || { tail -5 "$LOGS/evaluate_$name.log"; return 1; }
}

REPRO=u${N_MAIN}_s$((EPOCHS * STEPS_PER_EPOCH))_study; MAIN_LONG=none
prepare "$REPRO" "$N_MAIN" $((EPOCHS * STEPS_PER_EPOCH))
train "$REPRO" "$(budget 240 90)"
evaluate "$REPRO" "$(budget 180 30)" > "$LOGS/evaluate_bg.log" 2>&1 &
EVAL_REPRO=$!

# every long point must end its training by the deadline less ~60 s for the evaluations
if out=$("$PY" "$R/helper.py" auto-steps "$R/points/$REPRO/run" "$(( $(left) - 60 ))" \
    "$SLOWDOWN" "$STEPS_LONG" $N_MAIN $EXTRA_N 2> "$LOGS/auto_steps.log"); then
  STEPS_LONG=$(sed -n 1p <<< "$out"); NS=$(sed -n 2p <<< "$out")
else
  [[ $STEPS_LONG == auto ]] && STEPS_LONG=3000
  NS="$N_MAIN"
fi
cat "$LOGS/auto_steps.log"
echo "=== long points at $STEPS_LONG steps: N = $NS, side by side"; MAIN_LONG=u${N_MAIN}_s${STEPS_LONG}
LONG=(); pids=()
for n in $NS; do
  prepare "u${n}_s${STEPS_LONG}" "$n" "$STEPS_LONG" > "$LOGS/prepare_$n.log" 2>&1 &
  pids+=($!)
done
i=0
for n in $NS; do
  wait "${pids[$i]}" && LONG+=("u${n}_s${STEPS_LONG}"); cat "$LOGS/prepare_$n.log"; i=$((i + 1))
done
T=$(budget 600 45); t_long=$(now)
pids=()
for name in "${LONG[@]}"; do
  ( train "$name" "$T" && evaluate "$name" "$(budget 120 5)" ) > "$LOGS/long_$name.log" 2>&1 &
  pids+=($!)
done
wait "$EVAL_REPRO" || true; cat "$LOGS/evaluate_bg.log"
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || echo "long point ${LONG[$i]} did not finish"
  cat "$LOGS/long_${LONG[$i]}.log"
done
phase long_points "$(since "$t_long")" "${#LONG[@]} points at $STEPS_LONG steps, timeout $T s"
# the background jobs' phases were appended by their subshells; the summary is written on exit
