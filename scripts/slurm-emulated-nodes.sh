#!/usr/bin/env bash
# A multi-node Slurm on this machine, for tests/cluster and by hand: Debian's slurmctld on the
# host, one slurmd per emulated node, each in its own network namespace with its own hostname
# (emu1 … emuN), address (10.78.0.K) and link shaped as cosmocub.netemu shapes its links; the
# host joins the same bridge as 10.78.0.254 (slurmctld, srun's clients, an MLflow server or a Dask
# scheduler listen there). Its own slurm.conf, ports and state, so the one-node Slurm of
# scripts/slurm-single-node.sh keeps working beside it.
#
# Usage: slurm-emulated-nodes.sh start [--nodes N] [--rate-mbit R] | stop | status | env
#                                 | lose NODE [--link-up] | revive NODE
#   R = 0 leaves the links unshaped. `lose emu2` cuts that node's link and kills its slurmd and
#   everything running on it (a node that dies); with --link-up the link stays up, so its peers
#   see their connections closed (a node whose processes all died); `revive emu2` restores the link, starts its
#   slurmd again and returns it to service. Clients need SLURM_CONF=$STATE/etc/slurm.conf (`env`
#   prints it). COSMOCUB_SLURM_EMU_NICE=10 runs the slurmds, and so every job, at that niceness.
# Needs root. `stop` leaves no daemon, namespace, mount or /etc/hosts line behind (the state
# folder keeps the logs). `nsenter --net`, not `ip netns exec`: the latter mounts a fresh /sys,
# hiding the cgroup filesystem slurmd needs; `unshare --uts --mount` gives each slurmd (and its
# jobs) the node's hostname and /etc/slurm. docs/cluster/slurm-emulated-nodes.md has the whole story.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=scripts/slurm-common.sh
source "$HERE/slurm-common.sh"
STATE=${COSMOCUB_SLURM_EMU_STATE:-/var/lib/cosmocub-slurm-emu}
CONF=$STATE/etc/slurm.conf  # bind-mounted over /etc/slurm inside each node (see start)
PREFIX=ccemu-              # network namespaces: ccemu-sw (the switch), ccemu-n1 … ccemu-nN
SUBNET=10.78.0             # netemu's studies use 10.77.0 inside their own switch; no overlap
HOST_ADDR=$SUBNET.254
HOST_IF=${PREFIX}host      # the host's port on the emulated network (in the host's namespace)
NODE_IF=eth0               # each node's NIC, inside its namespace
CTLD_PORT=6827             # the one-node Slurm keeps Slurm's defaults, 6817/6818
SLURMD_PORT=6828
HOSTS_MARK="# cosmocub slurm-emulated-nodes"
# Niceness of the slurmds and so of every job on the nodes (the machine may be shared).
NICE=${COSMOCUB_SLURM_EMU_NICE:-0}
BURST_BYTES=2048           # as cosmocub.netemu.namespaces: one MTU-sized frame, tc's rounding

die() { echo "slurm-emulated-nodes: $*" >&2; exit 1; }
say() { echo "slurm-emulated-nodes: $*"; }
ctl() { SLURM_CONF=$CONF "$@"; }
node_names() { [ -f "$STATE/nodes" ] && cat "$STATE/nodes" || true; }

shape() {  # netns interface mbit: MTU-sized packets through a one-frame bucket (docs/cluster/netemu.md)
  local ns=$1 dev=$2 mbit=$3 limit
  limit=$(awk -v m="$mbit" \
    'BEGIN { b = m * 1e6 / 8; l = 4 * 1024 * 1024; print int(b > l ? b : l) }')
  ip -n "$ns" link set "$dev" gso_max_segs 1
  ip netns exec "$ns" tc qdisc add dev "$dev" root tbf rate "${mbit}mbit" burst $BURST_BYTES \
    limit "$limit"
}

no_ipv6() {  # only what the jobs send crosses the links (no neighbour discovery chatter)
  [ -d /proc/sys/net/ipv6 ] || return 0
  ip netns exec "$1" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6;
    echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6'
}

build_network() {
  local nodes=$1 rate=$2 sw=${PREFIX}sw
  ip netns add "$sw"
  no_ipv6 "$sw"
  ip -n "$sw" link add br0 type bridge
  ip -n "$sw" link set br0 up
  # The host's port: its end here, the other on the bridge (deleting the switch deletes both).
  ip link add "$HOST_IF" type veth peer name porth netns "$sw"
  ip -n "$sw" link set porth master br0 up
  ip addr add "$HOST_ADDR/24" dev "$HOST_IF"
  ip link set "$HOST_IF" up
  for k in $(seq "$nodes"); do
    local ns=${PREFIX}n$k
    ip netns add "$ns"
    no_ipv6 "$ns"
    ip -n "$ns" link set lo up
    ip -n "$sw" link add "port$k" type veth peer name "$NODE_IF" netns "$ns"
    ip -n "$sw" link set "port$k" master br0 up
    ip -n "$ns" addr add "$SUBNET.$k/24" dev "$NODE_IF"
    ip -n "$ns" link set "$NODE_IF" up
    if [ "$rate" != 0 ]; then
      shape "$ns" "$NODE_IF" "$rate"
      shape "$sw" "port$k" "$rate"
    fi
  done
}

remove_network() {
  local ns
  for ns in $(ip netns list | awk -v p="$PREFIX" 'index($1, p) == 1 {print $1}'); do
    # What still runs in a node (a slurmstepd, a rank) dies with it, as on a node that is gone.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$HOST_IF" 2>/dev/null || true
}

hosts_add() {  # the ranks meet at the first node's name (SLURM_JOB_NODELIST), so it must resolve
  hosts_remove
  {
    for k in $(seq "$1"); do echo "$SUBNET.$k emu$k $HOSTS_MARK"; done
  } >> /etc/hosts
}

hosts_remove() {
  # Rewritten in place (`cat >`), not replaced: /etc/hosts is often a bind mount.
  if grep -qF "$HOSTS_MARK" /etc/hosts; then
    local kept; kept=$(grep -vF "$HOSTS_MARK" /etc/hosts)
    printf '%s\n' "$kept" > /etc/hosts
  fi
}

write_config() {
  local nodes=$1 cpus mem
  cpus=$(/usr/sbin/slurmd -C 2>/dev/null | sed -n 's/.*CPUs=\([0-9]*\).*/\1/p' | head -n 1 || true)
  [ -n "$cpus" ] || cpus=$(nproc --all)
  # The machine's memory shared out among the nodes, 1 GiB left to the system.
  mem=$(( ($(awk '/MemTotal/ {print int($2/1024)}' /proc/meminfo) - 1024) / nodes ))
  mkdir -p "$STATE"/{ctld,log,etc} /run/cosmocub-slurm-emu
  printf '#!/bin/sh\necho export GLOO_SOCKET_IFNAME=%s\n' "$NODE_IF" > "$STATE/etc/task-prolog.sh"
  chmod 755 "$STATE/etc/task-prolog.sh"
  cat > "$CONF" <<CONF
# written by cosmocub scripts/slurm-emulated-nodes.sh
ClusterName=cosmocub-emu
SlurmctldHost=$(hostname -s)($HOST_ADDR)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d-%n
SlurmctldPidFile=/run/cosmocub-slurm-emu/slurmctld.pid
SlurmdPidFile=/run/cosmocub-slurm-emu/slurmd-%n.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
$(slurm_shared_settings)
# Every task talks over its node's NIC and meters it (cosmocub.train.wire_meter), as a site's
# environment modules set GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME.
TaskProlog=$STATE/etc/task-prolog.sh
# Site settings that decide how fast a lost node ends its job (docs/cluster/slurm-emulated-nodes.md):
# slurmctld declares a node that has not answered for SlurmdTimeout seconds DOWN and ends its
# jobs (Slurm's default is 300 s); the ranks' own collective timeout is train.collective_timeout_s.
SlurmdTimeout=30
# The nodes are emulated on one machine: each says it has the machine's CPUs.
NodeName=DEFAULT CPUs=$cpus RealMemory=$mem State=UNKNOWN
$(for k in $(seq "$nodes"); do echo "NodeName=emu$k NodeAddr=$SUBNET.$k"; done)
PartitionName=emu Nodes=emu[1-$nodes] Default=YES MaxTime=60 State=UP
CONF
}

start_slurmd() {  # k
  local k=$1
  mkdir -p "$STATE/d-emu$k" /etc/slurm
  # slurmd daemonizes inside the node's network, UTS and mount namespaces; its jobs inherit
  # them. In the node, /etc/slurm is this cluster's: a job's own srun finds its slurm.conf
  # there, as on a real node (the Slurm executor's jobstep drops SLURM_CONF, with every other
  # SLURM_* variable, from the srun it wraps a job in). The mount is private to the node and
  # goes with its last process.
  nsenter --net="/run/netns/${PREFIX}n$k" unshare --uts --mount --propagation private \
    sh -c "hostname emu$k && mount --bind $STATE/etc /etc/slurm &&
      exec env SLURM_CONF=$CONF nice -n $NICE /usr/sbin/slurmd -N emu$k"
}

start() {
  local nodes=2 rate=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) nodes=${2:?}; shift 2 ;;
      --rate-mbit) rate=${2:?}; shift 2 ;;
      *) die "start: unknown argument '$1' (--nodes N --rate-mbit R)" ;;
    esac
  done
  [[ "$nodes" =~ ^[0-9]+$ ]] && [ "$nodes" -ge 1 ] && [ "$nodes" -le 200 ] \
    || die "--nodes must be 1..200, got '$nodes'"
  [[ "$rate" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--rate-mbit must be a number >= 0, got '$rate'"
  [ "$(id -u)" = 0 ] || die "needs root (network namespaces, daemons, /etc/hosts)"
  for tool in ip tc nsenter unshare; do
    command -v $tool >/dev/null || die "$tool not found (packages iproute2, util-linux)"
  done
  if [ -n "$(node_names)" ] || ip netns list | grep -q "^${PREFIX}"; then
    die "already running (or left over): run '$0 stop' first"
  fi
  bash "$HERE/slurm-single-node.sh" install
  mkdir -p "$STATE"
  # From here on, a failure (in a function too: set -E) says where, in one line, and undoes
  # everything that start made.
  set -E
  trap 'echo "slurm-emulated-nodes: start failed: $BASH_COMMAND (line $LINENO)" >&2;
    stop >/dev/null 2>&1 || true' ERR
  build_network "$nodes" "$rate"
  for k in $(seq "$nodes"); do echo "emu$k"; done > "$STATE/nodes"
  echo "$rate" > "$STATE/rate_mbit"
  hosts_add "$nodes"
  write_config "$nodes"
  start_munge
  rm -rf "$STATE"/ctld/* "$STATE"/d-*  # a fresh cluster: no jobs or node state of a past one
  ctl /usr/sbin/slurmctld -i
  for k in $(seq "$nodes"); do start_slurmd "$k"; done
  trap - ERR
  set +E
  for _ in $(seq 60); do
    if [ "$(ctl sinfo -h -o '%T %D' 2>/dev/null | awk '$1 == "idle" {print $2}')" = "$nodes" ]; then
      say "up: $nodes nodes at ${rate} Mbit/s ($(ctl sinfo -h -o '%N %c CPUs %m MB each'));" \
        "host $HOST_ADDR"
      say "export SLURM_CONF=$CONF"
      return 0
    fi
    sleep 1
  done
  ctl sinfo >&2 || true
  stop >/dev/null 2>&1 || true
  die "the nodes did not become idle in 60 s; see $STATE/log/"
}

stop_pid() {  # pidfile: TERM, wait up to 10 s, then KILL
  local pidfile=$1 pid
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$pidfile"
}

stop() {
  if [ -f "$CONF" ]; then
    ctl scancel --user=root >/dev/null 2>&1 || true
  fi
  for name in $(node_names); do stop_pid "/run/cosmocub-slurm-emu/slurmd-$name.pid"; done
  stop_pid /run/cosmocub-slurm-emu/slurmctld.pid
  remove_network
  hosts_remove
  stop_munge
  rm -f "$STATE/nodes" "$STATE/rate_mbit"
  rm -rf /run/cosmocub-slurm-emu
  say "stopped"
}

status() {
  [ -n "$(node_names)" ] || { say "not running"; return 3; }
  ctl sinfo
  say "host $HOST_IF $HOST_ADDR; links $(cat "$STATE/rate_mbit") Mbit/s; SLURM_CONF=$CONF"
  local k=0
  for name in $(node_names); do
    k=$((k + 1))
    local pidfile=/run/cosmocub-slurm-emu/slurmd-$name.pid alive=no
    [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && alive=yes
    # Counters read inside the node's namespace (netlink answers for the namespace asked).
    local bytes
    bytes=$(ip -n "${PREFIX}n$k" -s -j link show "$NODE_IF" 2>/dev/null \
      | sed -n 's/.*"rx":{"bytes":\([0-9]*\).*"tx":{"bytes":\([0-9]*\).*/rx \1 B, tx \2 B/p')
    say "$name netns ${PREFIX}n$k $SUBNET.$k slurmd ${alive}; $NODE_IF ${bytes:-absent}"
  done
}

node_index() {  # emuK -> K, for a node of the running cluster
  grep -qx "$1" <(node_names) || die "no node '$1' (running: $(node_names | xargs))"
  echo "${1#emu}"
}

lose() {  # a node that dies: its link cut, then its slurmd, slurmstepds and tasks killed
  local k pids; k=$(node_index "$1")
  # The link first, as when a node loses power: its kernel cannot reset the connections of the
  # processes it kills, so its peers hear nothing (no RST, no FIN), as from a dead machine.
  # --link-up keeps it: the kernel closes their connections, and the peers hear of it at once.
  [ "${2:-}" = --link-up ] || ip -n "${PREFIX}n$k" link set "$NODE_IF" down
  pids=$(ip netns pids "${PREFIX}n$k")
  # shellcheck disable=SC2086
  [ -z "$pids" ] || kill -9 $pids
  rm -f "/run/cosmocub-slurm-emu/slurmd-$1.pid"
  say "lost $1: killed $(echo $pids | wc -w) processes (slurmd and what ran there)"
}

revive() {  # the node back: its slurmd started again, the node returned to service
  local k; k=$(node_index "$1")
  ip -n "${PREFIX}n$k" link set "$NODE_IF" up
  start_slurmd "$k"
  for _ in $(seq 60); do
    ctl scontrol update nodename="$1" state=resume >/dev/null 2>&1 || true
    if ctl sinfo -h -n "$1" -o '%T' | grep -qE '^(idle|mixed|allocated)'; then
      say "$1 back: $(ctl sinfo -h -n "$1" -o '%T')"
      return 0
    fi
    sleep 1
  done
  die "$1 did not come back in 60 s; see $STATE/log/slurmd-$1.log"
}

case "${1:-}" in
  start) shift; start "$@" ;;
  stop) stop ;;
  status) status ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  lose) lose "${2:?lose NODE (emu2) [--link-up]}" "${3:-}" ;;
  revive) revive "${2:?revive NODE (emu2)}" ;;
  *) die "usage: $0 start [--nodes N] [--rate-mbit R] | stop | status | env" \
    "| lose NODE [--link-up] | revive NODE" ;;
esac
