# Sourced by slurm-single-node.sh and slurm-emulated-nodes.sh: what their two clusters share.

# slurm.conf settings of both clusters (each adds its names, ports, paths and nodes).
slurm_shared_settings() {
  cat <<'CONF'
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# Finished jobs stay visible to squeue (the executor's status command) for 10 minutes.
MinJobAge=600
# sbatch refuses at once what the partition cannot give (time, CPUs, memory).
EnforcePartLimits=ALL
ReturnToService=2
SchedulerType=sched/backfill
KillWait=5
CONF
}

# One munged serves both clusters (the one-node Slurm and the emulated nodes) when both run, so
# its mark is the machine's, not a cluster's: /run/cosmocub-munged.ours says one of these scripts
# started it, and the last of them to stop ends it (stop_munge). A mark per cluster let the
# first cluster to stop end the munged the other still used: its daemons then failed every
# request with "Protocol authentication error".
MUNGED_OURS=/run/cosmocub-munged.ours

# A munge key, and a munged that answers.
start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
  # Whether a munged answers, not whether one is listed: one that exited can linger as a
  # zombie where nothing reaps orphans (pid 1 of some containers), and pgrep lists it.
  if ! munge -n >/dev/null 2>&1; then
    su -s /bin/sh munge -c "/usr/sbin/munged --force" 2>/dev/null || /usr/sbin/munged --force
    touch "$MUNGED_OURS"
  fi
}

# After the caller's slurmctld has ended: the munged one of these scripts started, once no
# slurmctld runs (a zombie one, listed but gone, does not count).
stop_munge() {
  [ -f "$MUNGED_OURS" ] || return 0
  if pgrep -x -r R,S,D slurmctld >/dev/null 2>&1; then return 0; fi
  [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null || true
  rm -f "$MUNGED_OURS"
}
