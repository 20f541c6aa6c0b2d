"""repro.heap: freed tensor memory reused instead of faulted in again, counted in page faults (not time),
each case in a fresh process because malloc's settings are the process's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")

# a 128 MB tensor made and freed 6 times after a first one: the page faults of those 6
PROGRAM = """
import resource, sys, torch
from repro import heap, steptime
if "reuse" in sys.argv:
    assert heap.reuse_freed_memory() == heap.applied()
if "measured" in sys.argv:  # a step's memory measured in between (it maps big blocks while it runs)
    with steptime.cpu_memory_accounting():
        pass
x = torch.empty(32 << 20).fill_(1.0)
del x
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    y = torch.empty(32 << 20).fill_(1.0)
    del y
print(heap.applied(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(*args: str, env: dict[str, str] | None = None) -> tuple[bool, int]:
    run_env = {**os.environ, **(env or {})}
    out = subprocess.run([sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, env=run_env,
                         check=True, cwd=os.path.dirname(os.path.dirname(__file__)))  # fmt: skip
    applied, count = out.stdout.split()
    return applied == "True", int(count)


def test_freed_big_tensors_are_reused_without_faulting_their_pages_in_again():
    applied, default = faults()
    assert not applied and default >= 6 * (128 << 20) // (2 << 20)  # at least a fault per 2 MB page
    applied, reused = faults("reuse")
    assert applied and reused < default / 3, (reused, default)  # one block's faults at most, not six
    # a step's memory measurement between switches it off only while it runs
    assert faults("reuse", "measured")[1] < default / 3


def test_repro_malloc_system_leaves_glibcs_defaults():
    applied, count = faults("reuse", env={"REPRO_MALLOC": "system"})
    assert not applied and count > faults("reuse")[1] * 3
