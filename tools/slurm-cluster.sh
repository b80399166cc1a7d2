#!/usr/bin/env bash
# A single-node Slurm cluster for tests, in a directory of its own: no systemd, no files
# outside DIR. Debian's slurm-wlm and munge are installed first when missing (root only).
#
#   tools/slurm-cluster.sh start DIR   # prints the SLURM_CONF to export; idle within seconds
#   tools/slurm-cluster.sh stop DIR    # stops the daemons it started, by their pid files
set -euo pipefail
action=${1:?start or stop}
dir=$(realpath -m "${2:?a directory for the state of the cluster}")

stop() {
    for daemon in slurmd slurmctld munged; do
        if [[ -f "$dir/$daemon.pid" ]]; then
            kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true
        fi
    done
    for daemon in slurmd slurmctld munged; do
        for _ in $(seq 50); do
            [[ -f "$dir/$daemon.pid" ]] && kill -0 "$(cat "$dir/$daemon.pid")" 2>/dev/null || break
            sleep 0.1
        done
        rm -f "$dir/$daemon.pid"
    done
}

if [[ $action == stop ]]; then
    stop
    exit 0
fi

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "cannot install slurm-wlm and munge here (needs root and apt-get)" >&2
        exit 3
    fi
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

mkdir -p "$dir/state" "$dir/spool" "$dir/log"
dd if=/dev/urandom of="$dir/munge.key" bs=1024 count=1 status=none
chmod 400 "$dir/munge.key"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge.seed"

host=$(hostname -s)
cpus=$(nproc)
kib=$(awk '/MemTotal/ {print $2}' /proc/meminfo)
memory=$((kib / 1024 * 9 / 10))
cat > "$dir/slurm.conf" <<CONF
ClusterName=shardify-test
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldTimeout=30
SlurmdTimeout=30
MinJobAge=600
NodeName=$host CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF"
for _ in $(seq 100); do
    if sinfo -h -o %T 2>/dev/null | grep -q idle; then
        echo "$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "the cluster did not come up; logs in $dir/log" >&2
tail -n 20 "$dir"/log/*.log >&2 || true
stop
exit 1
