#!/usr/bin/env bash
# Snakemake's status protocol: print running, success or failed for the LSF job id $1.
set -euo pipefail
state=$(bjobs -noheader -o stat "$1" 2>/dev/null | head -1 || true)
case "$state" in
  DONE) echo success ;;
  EXIT|"") echo failed ;;
  *) echo running ;;
esac
