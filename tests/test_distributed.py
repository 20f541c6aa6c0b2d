"""The smoke profile as two gloo processes on the CPU under torchrun (MMEngine launcher="pytorch").

Deselect with `-m "not slow"`; `make test` runs it.
"""

import json
import os
import subprocess
import sys

import pytest

from tasks import datasets as D

pytestmark = pytest.mark.slow


def test_smoke_run_on_two_gloo_ranks(tmp_path_factory):
    cache = tmp_path_factory.getbasetemp() / "repro-data-cache"
    D.ensure_shapes10(cache)  # made once here, not raced by the two ranks
    env = dict(os.environ, REPRO_DATA_CACHE=str(cache), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "tasks.classification", "--launcher", "pytorch", "--json"]
    cmd += ["--model", "resnet20", "--method", "daiq", "--profile", "smoke", "--paper-dataset", "cifar10"]
    # 60 training images: 30 per rank, 3 iterations of 8 per epoch on each rank (7 on one process)
    cmd += ["--cfg-options", "train_dataloader.dataset.limit=60", "env_cfg.dist_cfg.backend=gloo"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]  # torchrun exits 0 only if both ranks did
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1, proc.stdout  # rank 0 reports, rank 1 does not
    result = json.loads(lines[0])
    assert result["method"] == "daiq" and result["dataset"] == "shapes10" and not result["diverged"]
    assert result["iters"] == 6  # 2 epochs x 3: the data was split between the two ranks
    assert 0 <= result["top1"] <= 100 and result["ms_per_iter"] > 0
