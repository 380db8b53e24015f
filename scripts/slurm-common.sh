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

# A munge key, and a munged that answers; "$1/munged.ours" marks one started here, so that the
# caller's stop ends it and no other.
start_munge() {  # state_dir
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
    touch "$1/munged.ours"
  fi
}
