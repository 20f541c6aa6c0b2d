#!/usr/bin/env bash
# The manual kill loop of docs/cluster.md: the parent of `repro table table4 --profile smoke --executor
# slurm` SIGKILLed 3-22 s after each start and started again until it finishes; then every cell is checked:
# one submission (one submitit pickle in its folder), its job started once, its cache entry naming that job.
#   bash .ci/slurm_kill_loop.sh [RESULTS_DIR]      (PY= the Python to run, default .venv/bin/python)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-.venv/bin/python}
R=${1:-/tmp/table4-kill-loop}
rm -rf "$R"
kills=0
while true; do
    "$PY" -m tables.command table table4 --profile smoke --results-dir "$R" --executor slurm \
        --slurm-args "cpus_per_task=1 time=10" --no-progress >"$R.last.log" 2>&1 &
    pid=$!
    wait_s=$((RANDOM % 20 + 3))
    for _ in $(seq $wait_s); do
        sleep 1
        kill -0 $pid 2>/dev/null || break
    done
    if kill -0 $pid 2>/dev/null; then
        kill -KILL $pid
        wait $pid 2>/dev/null
        kills=$((kills + 1))
        echo "kill $kills after ${wait_s} s: $(ls "$R/cache" 2>/dev/null | wc -l) cells cached"
    else
        wait $pid
        echo "finished (exit $?) after $kills kills"
        break
    fi
done
"$PY" - "$R" <<'EOF'
import json, pathlib, sys
results = pathlib.Path(sys.argv[1])
folders = [p for p in (results / "slurm").iterdir() if p.is_dir()]
irregular = []
for folder in folders:
    pickles = list(folder.glob("*_submitted.pkl"))
    entry = json.loads((results / "cache" / f"{folder.name}.json").read_text())
    job_id = entry["executor"]["job_id"]
    starts = (folder / f"{job_id}_0_log.out").read_text().count("Starting with JobEnvironment")
    if len(pickles) != 1 or pickles[0].name.split("_")[0] != job_id or starts != 1:
        irregular.append((folder.name, [p.name for p in pickles], job_id, starts))
cached = len(list((results / "cache").glob("*.json")))
print(f"{len(folders)} cells submitted, {cached} cached; submitted or started more than once: {irregular or 'none'}")
sys.exit(1 if irregular else 0)
EOF
