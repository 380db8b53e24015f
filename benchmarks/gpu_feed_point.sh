#!/usr/bin/env bash
# Feeding the accelerator (issue 37) on one GPU, in one short run (about 4 min on an H100, at most
# TOTAL_S, then at most 3 min of layer timing): benchmarks/gpu_feed_point.py, which measures
#   - the science point's loader per core (the worker path) against crops cut on the GPU from the
#     resident shard, and its step alone (samples/s);
#   - short runs of config/science.yaml on synthetic 64³ universes (UNIVERSES, EPOCHS x STEPS):
#     the H200 run's setup (3 workers, fp32, NCDHW) and the new path one change at a time (the
#     shard on the GPU in fp32; the defaults: bf16, NDHWC, fused AdamW; without NDHWC; compiled;
#     the shard in pinned memory): samples/s, data wait, device busy; the host syncs per step;
#   - the reference CosmoFlow (128³, batch 8, bf16), eager and compiled: samples/s and achieved
#     TFLOP/s against the GPU's bf16 peak;
# and writes $OUT/feed_point.{md,json,log} and $OUT/gpu.csv (nvidia-smi every 0.5 s); then times
# the MLPerf reference CosmoFlow's layers at batch 1 for the performance model (at most 3 min):
# $OUT/gpu_layers_mlperf.{json,log}.
#
# Runs in the repo root with the package from src/ (not pip-installed) and the missing pure/binary
# dependencies from .whl/ when it is there (as gpu_universes_point.sh). Env (defaults): PYTHON
# (python3), WHEELS (.whl), SITE (/tmp/site), OUT ($OUT or ./gpu-out), TOTAL_S (450), UNIVERSES
# (130), EPOCHS (3), STEPS (100), VARIANTS (all of gpu_feed_point.py's), SMOKE (unset; 1 = the
# CPU check: --device cpu --smoke, a minute on 2 cores).
#
# Not yet run on a GPU (written without one: no GPU was lent to the session that wrote it).
set -euo pipefail
PY=${PYTHON:-python3}; SITE=${SITE:-/tmp/site}; WHEELS=${WHEELS:-.whl}; OUT=${OUT:-$PWD/gpu-out}
TOTAL_S=${TOTAL_S:-450}; UNIVERSES=${UNIVERSES:-130}; EPOCHS=${EPOCHS:-3}; STEPS=${STEPS:-100}
mkdir -p "$OUT" "$SITE"
if compgen -G "$WHEELS/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH=$PWD/src:$SITE${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg HDF5_USE_FILE_LOCKING=FALSE
export PYTHONPYCACHEPREFIX=${PYTHONPYCACHEPREFIX:-/tmp/pycache}
export NUMBA_CACHE_DIR=${NUMBA_CACHE_DIR:-/tmp/numba-cache}

echo "=== $(date -u +%FT%TZ) $(nproc) cores; $("$PY" --version 2>&1); limit ${TOTAL_S} s"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null \
  || echo "no nvidia-smi"
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())'

ARGS=(--out "$OUT" --universes "$UNIVERSES" --epochs "$EPOCHS" --steps "$STEPS")
[[ -n ${VARIANTS:-} ]] && ARGS+=(--variants "$VARIANTS")
[[ -n ${SMOKE:-} ]] && ARGS+=(--device cpu --smoke)

MON=""
if command -v nvidia-smi > /dev/null && [[ -z ${SMOKE:-} ]]; then
  nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv,noheader,nounits \
    -lms 500 > "$OUT/gpu.csv" 2> /dev/null &
  MON=$!
fi
rc=0
timeout -k 10 "$TOTAL_S" "$PY" benchmarks/gpu_feed_point.py "${ARGS[@]}" \
  > "$OUT/feed_point.log" 2>&1 || rc=$?
[[ -n $MON ]] && kill "$MON" 2> /dev/null
tail -n 60 "$OUT/feed_point.log"
if [[ -s $OUT/gpu.csv ]]; then  # utilisation over the whole run (loader rows, runs, reference)
  awk -F', ' '$2 ~ /^[0-9]+$/ {n++; s+=$2; if ($2 > m) m=$2}
    END {if (n) printf "\nGPU utilisation over the run: mean %.0f %%, max %d %% (%d samples of 0.5 s)\n", s/n, m, n}' \
    "$OUT/gpu.csv" | tee -a "$OUT/feed_point.md"
fi
# The performance model's layer calibration of the MLPerf reference CosmoFlow at one sample a
# GPU (issue 36): `python benchmarks/against_mlperf.py LOGDIR --gpu-calibration
# $OUT/gpu_layers_mlperf.json` back on the CPU machine prices that GPU's rows with it (the device
# part of the uncalibrated gap); then the host's costs the software profiles take from public
# measurements (issue 52: an eager launch, a sync's round trip, a graph replay) measured on this
# GPU: $OUT/host_costs.json beside perfmodel/cost_model/software.py's LAUNCH_S, SYNC_S,
# GRAPH_LAUNCH_S (the host part).
if [[ -z ${SMOKE:-} ]]; then
  timeout -k 10 180 "$PY" -m cosmocub.cli perf-model calibrate --device cuda --batch 1 \
    --config config/cosmoflow-mlperf.yaml --out "$OUT/gpu_layers_mlperf.json" \
    > "$OUT/gpu_layers_mlperf.log" 2>&1 || echo "layer calibration failed: $OUT/gpu_layers_mlperf.log"
  tail -n 12 "$OUT/gpu_layers_mlperf.log"
fi
timeout -k 10 60 "$PY" -m cosmocub.perfmodel.measure.host_costs --out "$OUT/host_costs.json" \
  ${SMOKE:+--device cpu --repeats 3} 2>&1 | tee "$OUT/host_costs.log" || echo "host costs failed"
echo "=== exit $rc; $(ls "$OUT" | tr '\n' ' ')"
exit "$rc"
