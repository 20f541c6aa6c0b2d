#!/usr/bin/env bash
# Stop the one-node Slurm that .ci/slurm_up.sh started: its daemons and munged, by their pid files. A Slurm
# whose slurm.conf this script did not write is left alone.
set -uo pipefail

conf=/etc/slurm/slurm.conf
if [[ -f $conf ]] && ! grep -qF "# written by .ci/slurm_up.sh" "$conf"; then
    echo "slurm_down: $conf is not this project's local Slurm; leaving it running" >&2
    exit 0
fi
for pidfile in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
    if [[ -s $pidfile ]] && kill "$(cat "$pidfile")" 2>/dev/null; then
        echo "slurm_down: stopped $(basename "$pidfile" .pid)"
    fi
done
# wait for them to go (their exited processes may stay as zombies: only live ones count)
for _ in $(seq 20); do
    ps -C slurmd,slurmctld,slurmstepd,munged -o stat= | grep -qv '^Z' || exit 0
    sleep 0.5
done
echo "slurm_down: some daemons are still running after 10 s" >&2
exit 0
