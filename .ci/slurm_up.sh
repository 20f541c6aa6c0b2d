#!/usr/bin/env bash
# A one-node Slurm on localhost, for the Slurm executor's tests and for trying `EXECUTOR=slurm` on one
# machine (docs/cluster.md). Idempotent: installs Debian's slurm-wlm and munge where they are missing and
# apt is usable (root); writes /etc/slurm/slurm.conf, unless one is there that this script did not write (a
# real cluster's node: then it only checks that Slurm answers); starts munged, slurmctld and slurmd where
# they are not running (restarts the two when the conf changed); waits until `srun -n1 true` answers.
# Exit 0: Slurm answers; 1: it cannot be had. `--install-only` (make setup) installs the packages and stops.
# .ci/slurm_down.sh stops what this started.
set -euo pipefail
install_only=false
[[ ${1:-} == --install-only ]] && install_only=true

conf=/etc/slurm/slurm.conf
mark="# written by .ci/slurm_up.sh"

answers() { timeout 5 scontrol ping >/dev/null 2>&1 && timeout 10 srun -n1 -t1 true >/dev/null 2>&1; }
# running, not a zombie (PID 1 of a container may not reap the daemons' exited processes)
running() { ps -C "$1" -o stat= | grep -qv '^Z'; }
ours() { [[ ! -f $conf ]] || grep -qF "$mark" "$conf"; }

conf_text() {
    local host cpus mem_mib real_mem
    host=$(hostname -s)
    cpus=$(nproc)
    mem_mib=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
    real_mem=$((mem_mib > 2048 ? mem_mib - 1024 : mem_mib / 2)) # a GiB under the machine's, for the OS
    cat <<EOF
$mark, for one node on localhost ($host)
ClusterName=repro
SlurmctldHost=$host
AuthType=auth/munge
CredType=cred/munge
# a requeued job waits cred_expire seconds before it starts again (default 120): the requeue tests wait less
AuthInfo=cred_expire=20
SlurmUser=slurm
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
# the tests wait on jobs: the scheduler looks at once rather than every few seconds
SchedulerParameters=sched_min_interval=0
# a job that asks nothing of memory gets its CPUs' share, so that one-CPU jobs run side by side
DefMemPerCPU=$((real_mem / cpus))
StateSaveLocation=/var/lib/slurm/slurmctld
SlurmdSpoolDir=/var/lib/slurm/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ReturnToService=2
NodeName=$host CPUs=$cpus RealMemory=$real_mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
}

if ! $install_only && command -v srun >/dev/null && command -v scontrol >/dev/null && answers; then
    if ! ours || [[ $(conf_text) == "$(cat "$conf")" ]]; then
        echo "slurm_up: Slurm already answers ($(scontrol ping | head -n1))"
        exit 0
    fi
fi
installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; }
if ! installed; then
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "slurm_up: slurm-wlm and munge are not installed, and installing them needs root and apt-get" >&2
        exit 1
    fi
    echo "slurm_up: installing slurm-wlm and munge (Debian packages)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
fi
if $install_only; then
    echo "slurm_up: slurm-wlm and munge are installed ($(slurmd -V))"
    exit 0
fi
if ! ours; then
    echo "slurm_up: $conf was not written by this script and Slurm does not answer; not touching it" >&2
    exit 1
fi
if [[ $(id -u) != 0 ]]; then
    echo "slurm_up: a local Slurm needs root to start (run as root, or point at a cluster)" >&2
    exit 1
fi

# munge: the key the daemons and the clients sign with (the package makes one; make it if missing)
if [[ ! -s /etc/munge/munge.key ]]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge
chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! running munged; then
    runuser -u munge -- munged --force
fi

mkdir -p /etc/slurm /var/lib/slurm/slurmctld /var/lib/slurm/slurmd /var/log/slurm
chown slurm:slurm /var/lib/slurm/slurmctld /var/log/slurm
if [[ ! -f $conf || $(conf_text) != "$(cat "$conf")" ]]; then
    conf_text >"$conf.tmp"
    mv "$conf.tmp" "$conf"
    for pidfile in /run/slurmd.pid /run/slurmctld.pid; do # restarted below with the new conf
        [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null || true
    done
    for _ in $(seq 20); do
        running slurmctld || running slurmd || break
        sleep 0.5
    done
fi
if ! running slurmctld; then
    slurmctld
fi
if ! running slurmd; then
    slurmd
fi
deadline=$((SECONDS + 30))
while ((SECONDS < deadline)); do
    if answers; then
        echo "slurm_up: Slurm answers on $(hostname -s) ($(nproc) CPUs)"
        exit 0
    fi
    sleep 1
done
echo "slurm_up: Slurm did not answer within 30 s; see /var/log/slurm/slurmctld.log and slurmd.log" >&2
tail -n 5 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log >&2 || true
exit 1
