#!/usr/bin/env bash
# Submit a Snakemake job script with `flux batch`; print the job id the status command takes.
set -euo pipefail
mkdir -p .snakemake/flux_logs
exec flux batch --output=.snakemake/flux_logs/{{id}}.log "$@"
