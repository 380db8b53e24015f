#!/usr/bin/env bash
# Snakemake's status protocol: print running, success or failed for the Flux job id $1.
set -euo pipefail
state=$(flux jobs --no-header --format='{status}' "$1" 2>/dev/null || echo UNKNOWN)
case "$state" in
  COMPLETED) echo success ;;
  FAILED|CANCELED|TIMEOUT) echo failed ;;
  UNKNOWN) echo failed ;;
  *) echo running ;;
esac
