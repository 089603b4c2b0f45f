#!/usr/bin/env bash
# A single-node Slurm cluster in a directory of its own (tests, demos): munged, slurmctld and
# slurmd from the distribution's packages (scripts/setup.sh --tests installs them), configured for
# this machine and nothing else. Nothing is written outside DIR; the system's own Slurm and
# munge configuration (if any) are untouched.
#
#   scripts/slurm/cluster.sh start DIR   # writes DIR/slurm.conf, starts the daemons, waits for the node
#   scripts/slurm/cluster.sh stop DIR    # stops them (by their pid files), leaves DIR
#   export SLURM_CONF=DIR/slurm.conf     # what sbatch/squeue/scancel need to find the cluster
#
# Choices: ProctrackType=proctrack/linuxproc and TaskPlugin=task/none (no cgroups: they are
# unavailable in containers); SlurmUser=root when run as root; state, spool, logs and the
# munge socket and key under DIR; free ports picked at start (two clusters can coexist);
# MinJobAge=3600 so finished jobs stay visible to `scontrol show job` (there is no
# accounting daemon, so no sacct); one partition `debug` with every core of this machine.
# Environment: SLURM_PORT_BASE (default: picked free), SLURM_START_TIMEOUT (seconds, 60).
set -euo pipefail

die() { echo "slurm/cluster.sh: $*" >&2; exit 1; }
[ $# -eq 2 ] || die "usage: $0 start|stop DIR"
cmd=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

stop_pid() { # pidfile name
  local f=$1
  [ -f "$f" ] || return 0
  local pid; pid=$(cat "$f" 2>/dev/null || true)
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

if [ "$cmd" = stop ]; then
  stop_pid "$dir/slurmd.pid"
  stop_pid "$dir/slurmctld.pid"
  stop_pid "$dir/munge/munged.pid"
  echo "slurm/cluster.sh: stopped the cluster in $dir"
  exit 0
fi
[ "$cmd" = start ] || die "unknown command '$cmd' (start or stop)"

for b in munged mungekey slurmctld slurmd sbatch squeue scontrol; do
  command -v "$b" >/dev/null 2>&1 || [ -x "/usr/sbin/$b" ] || die "$b not found: run scripts/setup.sh --tests (Debian packages slurm-wlm and munge)"
done
PATH=$PATH:/usr/sbin

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
host=$(hostname -s)
cpus=$(nproc)
mem=$(awk '/MemTotal/ {print int($2/1024*0.9)}' /proc/meminfo)
user=$(id -un)
mkdir -p "$dir/munge" "$dir/ctld" "$dir/spool" "$dir/log"
chmod 0700 "$dir/munge"

# munge: its own key and socket.
[ -f "$dir/munge/munge.key" ] || mungekey --create --keyfile="$dir/munge/munge.key" --bits=1024 >/dev/null
chmod 0600 "$dir/munge/munge.key"
stop_pid "$dir/munge/munged.pid"
munged --force --socket="$dir/munge/munge.socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munged.seed" \
  || die "munged did not start (see $dir/log/munged.log)"

ctld_port=${SLURM_PORT_BASE:-$(free_port)}
d_port=$(( ${SLURM_PORT_BASE:-0} > 0 ? SLURM_PORT_BASE + 1 : $(free_port) ))
cat > "$dir/slurm.conf" <<CONF
# Written by scripts/slurm/cluster.sh: a single-node cluster for tests.
ClusterName=ringrec
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=$user
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=3600
KillWait=10
InactiveLimit=0
SchedulerParameters=sched_interval=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF=$dir/slurm.conf
stop_pid "$dir/slurmd.pid"
stop_pid "$dir/slurmctld.pid"
# -i: ignore a state file of an earlier cluster in DIR (its jobs are gone).
slurmctld -i -f "$SLURM_CONF" || die "slurmctld did not start (see $dir/log/slurmctld.log)"
slurmd -f "$SLURM_CONF" -N "$host" || die "slurmd did not start (see $dir/log/slurmd.log)"

deadline=$(( $(date +%s) + ${SLURM_START_TIMEOUT:-60} ))
while :; do
  state=$(sinfo -h -N -o '%T' 2>/dev/null | head -1 || true)
  case $state in idle|mixed|allocated) break ;; esac
  if [ "$(date +%s)" -ge "$deadline" ]; then
    tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 || true
    die "the node did not become idle within ${SLURM_START_TIMEOUT:-60} s (state '${state:-none}')"
  fi
  sleep 0.2
done
echo "slurm/cluster.sh: cluster up in $dir (node $host, $cpus CPUs, ports $ctld_port/$d_port); export SLURM_CONF=$dir/slurm.conf"
