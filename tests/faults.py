"""Faults injected into a real `repro` process, for tests/test_resume.py, test_distributed.py and
test_table_claims.py.

    python tests/faults.py train --model resnet18 ...      # `repro` with the faults the env names

REPRO_FAULT_KILL_AT=N         SIGKILL this process as training iteration N (0-based) starts
REPRO_FAULT_STOP_AT=N         SIGSTOP it there instead (a rank that hangs; the test kills it afterwards)
REPRO_FAULT_RANK=R            inject the faults below only on rank R (default: every rank)
REPRO_FAULT_NAN_GRAD_AT=N     a NaN gradient reaches the network's output in iteration N (the last layer
                              is float, so the int8 layer before it meets the NaN in its backward pass)
REPRO_FAULT_NAN_FLAG_AT=N     a GPU-style deferred NaN flag (kernels.errors) set in iteration N
REPRO_FAULT_CELL_LOG=PATH     table cells of the classification task do not train: each appends
                              "<pid> <model> <method> <options> <seed>" to PATH and returns a made-up
                              result after REPRO_FAULT_CELL_S seconds (default 0.3)
REPRO_FAULT_CELL_BARRIER=DIR,N  before its first cell, a process waits until N processes have reached
                              that point (one file each in DIR), so that racing processes really race
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import torch
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from kernels.errors import device_flag  # noqa: E402
from tables.command import main  # noqa: E402
from tasks import classification, top1  # noqa: E402


def _at(name: str) -> int | None:
    value = os.environ.get(name)
    return None if value is None else int(value)


def _this_rank() -> bool:
    wanted = os.environ.get("REPRO_FAULT_RANK")
    return wanted is None or int(os.environ.get("RANK", 0)) == int(wanted)


KILL_AT, STOP_AT, NAN_GRAD_AT, NAN_FLAG_AT = (
    _at(f"REPRO_FAULT_{k}") for k in ("KILL_AT", "STOP_AT", "NAN_GRAD_AT", "NAN_FLAG_AT")
)
_iteration = {"now": -1}


def _fault(loop) -> None:
    _iteration["now"] = loop._iter
    if KILL_AT is not None and loop._iter == KILL_AT and _this_rank():
        os.kill(os.getpid(), signal.SIGKILL)
    if STOP_AT is not None and loop._iter == STOP_AT and _this_rank():
        os.kill(os.getpid(), signal.SIGSTOP)


def _with_faults(run_iter):
    def faulty(self, *args):
        _fault(self)
        return run_iter(self, *args)

    return faulty


EpochBasedTrainLoop.run_iter = _with_faults(EpochBasedTrainLoop.run_iter)
IterBasedTrainLoop.run_iter = _with_faults(IterBasedTrainLoop.run_iter)
_forward = top1.CrossEntropyClassifier.forward


def forward(self, inputs, labels=None, mode="tensor"):
    out = _forward(self, inputs, labels, mode)
    now = _iteration["now"]
    if mode == "loss" and _this_rank() and now in (NAN_GRAD_AT, NAN_FLAG_AT):
        if now == NAN_FLAG_AT:
            device_flag(torch.device("cpu")).fill_(1)
        else:
            out["loss"].register_hook(lambda g: g * float("nan"))
    return out


top1.CrossEntropyClassifier.forward = forward

CELL_LOG = os.environ.get("REPRO_FAULT_CELL_LOG")


def _barrier() -> None:
    spec = os.environ.get("REPRO_FAULT_CELL_BARRIER")
    if not spec or _barrier.passed:
        return
    folder, n = spec.rsplit(",", 1)
    open(os.path.join(folder, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 120
    while len(os.listdir(folder)) < int(n) and time.monotonic() < deadline:
        time.sleep(0.05)
    _barrier.passed = True


_barrier.passed = False


def fake_cell(model, method, profile, seed, method_options=None, **kw) -> dict:
    _barrier()
    time.sleep(float(os.environ.get("REPRO_FAULT_CELL_S", "0.3")))
    options = json.dumps(method_options or {}, sort_keys=True)
    fd = os.open(CELL_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{os.getpid()} {model} {method} {options} {seed}\n".encode())
    finally:
        os.close(fd)
    top1 = 40.0 + len(model) + len(method) + seed
    return dict(task="classification", model=model, method=method, top1=top1, final_loss=0.5, diverged=False)


if CELL_LOG:
    classification.run = fake_cell

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
