#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for CI and for trying `kvbench slurm` locally:
# Debian's slurmctld, slurmd, slurm-client and munge packages, no systemd needed. Run as root.
#
#   scripts/slurm-local.sh start   install (if needed), start munged, slurmctld and slurmd; prints
#                                  the `export SLURM_CONF=…` line to use
#   scripts/slurm-local.sh stop    stop exactly the daemons `start` started, by PID
#
# State (config, spool, logs, PIDs) lives in $SLURM_LOCAL_DIR (default /tmp/kvbench-slurm).
# Config: one node at 127.0.0.1 with this machine's CPUs, proctrack/linuxproc and task/none
# (no cgroups), select/cons_tres with CR_Core, SlurmUser=root, MinJobAge=4 so `sbatch --wait`
# returns within ~2 s of a job ending.
set -euo pipefail
DIR=${SLURM_LOCAL_DIR:-/tmp/kvbench-slurm}
CONF=$DIR/slurm.conf
PIDS=$DIR/pids

install() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null \
        && command -v sbatch >/dev/null && command -v munged >/dev/null && return
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

start() {
    if [ -s "$PIDS" ]; then
        echo "slurm-local: already started (PIDs $(cat "$PIDS")); run stop first" >&2
        exit 1
    fi
    install
    rm -rf "$DIR/state"
    mkdir -p "$DIR/state/ctld" "$DIR/state/d" "$DIR/log"
    : > "$PIDS"
    # munge: the package's postinst made /etc/munge/munge.key; start munged unless one answers.
    [ -s /etc/munge/munge.key ] || {
        mungekey --create --keyfile=/etc/munge/munge.key
        chown munge:munge /etc/munge/munge.key
        chmod 600 /etc/munge/munge.key
    }
    if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        mkdir -p /run/munge && chown munge:munge /run/munge
        runuser -u munge -- /usr/sbin/munged   # daemonizes; its PID is in /run/munge/munged.pid
        for _ in $(seq 50); do [ -S /run/munge/munge.socket.2 ] && break; sleep 0.1; done
        echo "$(cat /run/munge/munged.pid)" >> "$PIDS"
    fi
    munge -n | unmunge >/dev/null
    local host cpus mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 * 85 / 100 ))  # MiB
    cat > "$CONF" <<CONF
ClusterName=kvbench
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$DIR/state/ctld
SlurmdSpoolDir=$DIR/state/d
SlurmctldPidFile=$DIR/state/slurmctld.pid
SlurmdPidFile=$DIR/state/slurmd.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerParameters=sched_interval=1
MinJobAge=4
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF=$CONF
    slurmctld -D -i >"$DIR/log/slurmctld.stdout" 2>&1 &
    echo $! >> "$PIDS"
    slurmd -D >"$DIR/log/slurmd.stdout" 2>&1 &
    echo $! >> "$PIDS"
    for _ in $(seq 150); do
        sinfo -h -o '%T' 2>/dev/null | grep -qx idle && break
        sleep 0.2
    done
    sinfo -h -o '%T' | grep -qx idle || {
        echo "slurm-local: the node did not come up; logs in $DIR/log" >&2
        tail -5 "$DIR"/log/*.log >&2 || true
        stop
        exit 1
    }
    echo "export SLURM_CONF=$CONF"
}

stop() {
    [ -s "$PIDS" ] || return 0
    # Let the last job's slurmstepd finish (its socket in the spool dir goes away) first.
    for _ in $(seq 25); do compgen -G "$DIR/state/d/*_*.*" >/dev/null || break; sleep 0.2; done
    local p
    for p in $(tac "$PIDS"); do kill "$p" 2>/dev/null || true; done
    for p in $(cat "$PIDS"); do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.2; done
    done
    rm -f "$PIDS"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
