#!/usr/bin/env bash
# Submit a Snakemake job script with bsub; print only the job id ("Job <123> is submitted …").
set -euo pipefail
mkdir -p .snakemake/lsf_logs
out=$(bsub -o .snakemake/lsf_logs/%J.log "$@")
id=$(sed -n 's/^Job <\([0-9]*\)>.*/\1/p' <<<"$out")
[ -n "$id" ] || { echo "bsub said: $out" >&2; exit 1; }
echo "$id"
