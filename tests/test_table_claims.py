"""Two table runs on one results directory share its cells out: each cell is run by one process (under
its flock claim, tables.cells.CellClaim), the cache stays whole, and both write the whole table. A claim
whose process was killed frees itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from tables.cells import Cell, CellClaim

FAULTS = Path(__file__).resolve().parent / "faults.py"


def test_two_table_processes_never_run_a_cell_twice(tmp_path):
    """Real `repro table table4 --profile smoke` processes racing on one results directory; their cells
    do not train (tests/faults.py REPRO_FAULT_CELL_LOG: 0.3 s each, logged), so the race takes seconds."""
    log, results, barrier = tmp_path / "cells.log", tmp_path / "results", tmp_path / "barrier"
    barrier.mkdir()
    # both processes start their cells together (one imports slower than the other cannot run them all)
    env = dict(
        os.environ,
        REPRO_FAULT_CELL_LOG=str(log),
        REPRO_FAULT_CELL_BARRIER=f"{barrier},2",
        OMP_NUM_THREADS="1",
    )
    cmd = [sys.executable, str(FAULTS), "table", "table4", "--profile", "smoke"]
    cmd += ["--results-dir", str(results), "--no-progress"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=240) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]

    runs = [line.split(" ", 1) for line in log.read_text().splitlines()]
    cells = Counter(cell for _, cell in runs)
    assert len(cells) == 31 and max(cells.values()) == 1, cells.most_common(3)  # 7 FP32 + 24 INT8, once
    assert len({pid for pid, _ in runs}) == 2  # both processes ran cells
    cached = list((results / "cache").glob("*.json"))
    assert len(cached) == 31 and all(json.loads(p.read_text())["result"]["top1"] for p in cached)
    assert not list((results / "cache").glob(".*.tmp"))
    assert not list((results / "work").glob("*"))  # no work dir and no claim left once cached
    table = (results / "table4.csv").read_text()
    assert "error" not in table and table.count("\n") > 20


def test_a_killed_processs_claim_does_not_block_the_cell(tmp_path):
    cell = Cell("classification", "resnet18", "daiq", "{}", 1, "smoke", "imagenet", None, None)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=Path.cwd()
    )
    assert holder.stdout.readline().strip() == "held"
    assert not CellClaim(tmp_path, cell).acquire(wait=False)  # another process is running the cell
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    claim = CellClaim(tmp_path, cell)
    assert claim.acquire(wait=False)  # the kernel released the dead process's lock
    claim.release()


HOLD = """
import sys, time
from tables.cells import Cell, CellClaim
cell = Cell("classification", "resnet18", "daiq", "{}", 1, "smoke", "imagenet", None, None)
assert CellClaim(sys.argv[1], cell).acquire(wait=False)
print("held", flush=True)
time.sleep(600)
"""
