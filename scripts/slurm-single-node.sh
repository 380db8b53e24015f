#!/usr/bin/env bash
# A one-node Slurm on this machine, for tests/cluster: Debian's slurmctld, slurmd and munge, no
# accounting database. Usage: slurm-single-node.sh install|start|stop|status
# Needs root. The config carries a marker line; a slurm.conf without it is never overwritten.
set -euo pipefail

CONF=/etc/slurm/slurm.conf
STATE=${COSMOCUB_SLURM_STATE:-/var/lib/cosmocub-slurm}
MARKER="# written by cosmocub scripts/slurm-single-node.sh"
PACKAGES=(slurmctld slurmd slurm-client munge)
# shellcheck source=scripts/slurm-common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/slurm-common.sh"

die() { echo "slurm-single-node: $*" >&2; exit 1; }

install() {
  [ "$(id -u)" = 0 ] || die "needs root (apt-get install ${PACKAGES[*]})"
  local missing=()
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  [ ${#missing[@]} = 0 ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q "${missing[@]}" >/dev/null; } \
    || die "cannot install ${missing[*]}"
}

write_config() {
  local host cpus mem
  host=$(hostname -s)
  # The CPUs slurmd itself finds (what it registers, whatever this shell's affinity or
  # OMP_NUM_THREADS, both of which `nproc` obeys); the hardware count where it says nothing.
  cpus=$(/usr/sbin/slurmd -C 2>/dev/null | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n 1 || true)
  [ -n "$cpus" ] || cpus=$(nproc --all)
  # Leave 1 GiB to the system; Slurm refuses a node that has less than it says.
  mem=$(( $(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) - 1024 ))
  if [ -f "$CONF" ] && ! grep -qF "$MARKER" "$CONF"; then
    die "$CONF exists and was not written by this script; not touching it"
  fi
  mkdir -p /etc/slurm "$STATE"/{ctld,d} /var/log/slurm
  cat > "$CONF" <<CONF
$MARKER
ClusterName=cosmocub
SlurmctldHost=$host(127.0.0.1)
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
$(slurm_shared_settings)
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=60 State=UP
CONF
}

start() {
  install
  write_config
  start_munge
  [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null \
    || /usr/sbin/slurmctld
  [ -f "$STATE/slurmd.pid" ] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null \
    || /usr/sbin/slurmd
  for _ in $(seq 60); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed|allocated)'; then
      echo "slurm-single-node: up ($(sinfo -h -o '%N %c CPUs %m MB %T'))"
      return 0
    fi
    scontrol update nodename="$(hostname -s)" state=resume >/dev/null 2>&1 || true
    sleep 1
  done
  die "the node did not become idle in 60 s; see /var/log/slurm/"
}

stop() {
  scancel --user=root >/dev/null 2>&1 || true
  for d in slurmd slurmctld; do
    local pidfile="$STATE/$d.pid"
    if [ -f "$pidfile" ]; then
      local pid; pid=$(cat "$pidfile")
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      rm -f "$pidfile"
    fi
  done
  stop_munge
  # A slurm.conf naming a controller that no longer runs costs every Slurm client 9 s of
  # retries (10 connects, 1 s apart), and snakemake-executor-plugin-slurm runs `scontrol show
  # config` when it is imported, i.e. at every `snakemake` start, whatever the executor.
  # Without a slurm.conf scontrol fails at once. start writes it again.
  if [ -f "$CONF" ] && grep -qF "$MARKER" "$CONF"; then rm -f "$CONF"; fi
  echo "slurm-single-node: stopped"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  status) sinfo ;;
  *) die "usage: $0 install|start|stop|status" ;;
esac
