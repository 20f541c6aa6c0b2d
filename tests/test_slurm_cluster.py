"""The Slurm executor on a real Slurm: a one-node cluster on localhost (.ci/slurm_up.sh, started by
.ci/run, else by the `slurm` fixture where the daemons are installed and this is root).

Cells trained as jobs equal the same cells trained here at one thread; a parent SIGKILLed and run again
submits no cell twice; a failed job's stderr reaches the table; a job signalled with USR1 after its first
checkpoint requeues and resumes from it, ending as the uninterrupted cell. Skipped only where no Slurm
answers and none can be started; under CI a missing Slurm fails instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import submitit

from tables.generate import generate
from tables.slurm_executor import SlurmCells, SlurmQueue
from tables.specs import SPECS

REPO = Path(__file__).resolve().parents[1]
ONE_CPU = {"cpus_per_task": 1, "time": 10}
pytestmark = pytest.mark.slurm


def _answers() -> bool:
    if not shutil.which("sbatch"):
        return False
    ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
    return ping.returncode == 0 and "UP" in ping.stdout


@pytest.fixture(scope="session")
def slurm():
    """A Slurm that answers: the one running, else the local one started here (and stopped after)."""
    started = False
    if not _answers() and shutil.which("slurmctld") and os.geteuid() == 0:
        started = subprocess.run(["bash", str(REPO / ".ci" / "slurm_up.sh")], timeout=120).returncode == 0
    if not _answers():
        if os.environ.get("CI"):
            pytest.fail("no Slurm answers: .ci/run starts one with .ci/slurm_up.sh")
        pytest.skip("no Slurm answers (bash .ci/slurm_up.sh starts one on localhost, as root)")
    yield
    if started:
        subprocess.run(["bash", str(REPO / ".ci" / "slurm_down.sh")], timeout=60)


def _rows(name: str, *pairs: tuple[str, str]):
    spec = SPECS[name]
    return dataclasses.replace(spec, rows=tuple(r for r in spec.rows if (r.model, r.method) in pairs))


def _one_thread_local(spec, results, **kw):
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each job (one CPU): the float sums' order is the thread count's
    try:
        return generate(spec, profile="smoke", results_dir=results, progress=False, **kw)
    finally:
        torch.set_num_threads(threads)


def _same_cells(a, b) -> None:
    assert a.outcomes.keys() == b.outcomes.keys()
    for key, ours in a.outcomes.items():
        theirs = b.outcomes[key]
        assert ours.error is None and theirs.error is None, (ours.error, theirs.error)
        for field in ("top1", "val_correct", "final_loss", "iters", "diverged"):
            assert ours.result[field] == theirs.result[field], (key, field)


@pytest.mark.slow
def test_smoke_cells_as_slurm_jobs_equal_the_local_cells(slurm, tmp_path):
    spec = _rows("table4", ("resnet18", "daiq"), ("resnet18", "ui8"))
    local = _one_thread_local(spec, tmp_path / "local")
    start = time.perf_counter()
    jobs = generate(spec, profile="smoke", results_dir=tmp_path / "slurm", progress=False, executor="slurm",
                    slurm_resources=ONE_CPU)  # fmt: skip
    print(f"{len(jobs.outcomes)} smoke cells as Slurm jobs in {time.perf_counter() - start:.1f} s")
    assert jobs.ran == len(jobs.outcomes) == 3 and jobs.errors == 0
    _same_cells(jobs, local)
    for key in jobs.outcomes:
        entry = json.loads((tmp_path / "slurm" / "cache" / f"{key}.json").read_text())
        assert entry["executor"]["resources"] == ONE_CPU and entry["ran_with"]["threads"] == 1
    assert jobs.frame.drop(columns=["fp32_ms_per_iter", "int8_ms_per_iter"]).equals(
        local.frame.drop(columns=["fp32_ms_per_iter", "int8_ms_per_iter"])
    )
    # the same cells packed into one job (cells_per_job): one Python's start for all three
    start = time.perf_counter()
    packed = generate(spec, profile="smoke", results_dir=tmp_path / "packed", progress=False,
                      executor="slurm", slurm_resources={**ONE_CPU, "cells_per_job": 3})  # fmt: skip
    print(f"the same cells as one Slurm job in {time.perf_counter() - start:.1f} s")
    assert packed.ran == 3 and packed.errors == 0
    _same_cells(packed, local)
    job_ids = {json.loads((tmp_path / "packed" / "cache" / f"{k}.json").read_text())["executor"]["job_id"]
               for k in packed.outcomes}  # fmt: skip
    assert len(job_ids) == 1


# The parent of the kill test: a table of fake cells that each take a few seconds, on Slurm.
PARENT = """
import sys, time
from tables.generate import generate
from tables.specs import SPECS

def slow_run(**kw):
    time.sleep(3)
    return {"top1": 50.0 + kw["seed"], "diverged": False, "iters": 6, "ms_per_iter": 1.0}

out = generate(SPECS["table2"], profile="smoke", seeds=2, results_dir=sys.argv[1], runner=slow_run,
               progress=False, executor="slurm", slurm_resources={"cpus_per_task": 1, "time": 5})
sys.exit(1 if out.errors else 0)
"""


@pytest.mark.slow
def test_a_parent_sigkilled_and_run_again_submits_no_cell_twice(slurm, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    results = tmp_path / "results"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))

    def parent():
        return subprocess.Popen([sys.executable, str(script), str(results)], env=env)

    def submitted():
        return list((results / "slurm").glob("*/*_submitted.pkl"))

    def cached():
        return list((results / "cache").glob("*.json"))

    for until in (lambda: submitted(), lambda: cached()):  # killed once jobs run, then once some are done
        proc = parent()
        deadline = time.time() + 120
        while not until() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert len(cached()) < 10  # 10 cells: table2's 4 rows and their FP32 baseline, 2 seeds
    assert parent().wait(timeout=300) == 0
    folders = [p for p in (results / "slurm").iterdir() if p.is_dir()]
    assert len(folders) == len(cached()) == 10
    for folder in folders:
        (pickle,) = folder.glob("*_submitted.pkl")  # one job a cell, whatever the kills
        job_id = pickle.name.split("_")[0]
        entry = json.loads((results / "cache" / f"{folder.name}.json").read_text())
        assert entry["executor"]["job_id"] == job_id
        starts = (folder / f"{job_id}_0_log.out").read_text().count("Starting with JobEnvironment")
        assert starts == 1  # and started once: trained once


def failing_run(**kw):
    raise RuntimeError("boom: this cell cannot train")


@pytest.mark.slow
def test_a_failed_job_reports_its_stderr_and_the_other_cells_finish(slurm, tmp_path):
    import cloudpickle

    spec = _rows("table4", ("resnet18", "daiq"))
    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job cannot import tests/
    try:

        def run(**kw):
            if kw["method"] == "daiq":
                return failing_run(**kw)
            return {"top1": 50.0, "diverged": False, "iters": 6, "ms_per_iter": 1.0}

        out = generate(spec, profile="smoke", results_dir=tmp_path, progress=False, runner=run,
                       executor="slurm", slurm_resources=ONE_CPU)  # fmt: skip
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert out.errors == 1 and out.ran == 2
    (error,) = [o.error for o in out.outcomes.values() if o.error]
    assert error.startswith("Slurm job ") and "boom: this cell cannot train" in error
    assert "error: Slurm job " in (tmp_path / "table4.md").read_text()


def run_stopping_after_epoch_1(**kw):
    """The task's cell, checkpointed every epoch; a DAIQ cell's job, on its first start, waits after epoch 1
    (for the test to signal it). Changes nothing in what it trains."""
    from tasks import classification, top1

    first_start = os.environ.get("SLURM_JOB_ID") and not int(os.environ.get("SLURM_RESTART_COUNT") or 0)
    if first_start and kw["method"] == "daiq":
        real, calls = top1.CrossEntropyClassifier.forward, {"n": 0}

        def forward(self, inputs, labels=None, mode="tensor"):
            calls["n"] += mode == "loss"
            if mode == "loss" and calls["n"] == 4:  # epoch 2's first step (3 a smoke epoch)
                time.sleep(120)  # the USR1 handler ends this
            return real(self, inputs, labels, mode)

        top1.CrossEntropyClassifier.forward = forward
    kw["cfg_options"] = {"default_hooks": {"checkpoint": {"min_interval_s": 0}}}
    return classification.run(**kw)


@pytest.mark.slow
def test_a_job_signalled_after_its_first_checkpoint_requeues_and_resumes_as_the_whole_run(slurm, tmp_path):
    import cloudpickle

    spec = _rows("table2", ("resnet18", "daiq"))
    cell = next(c for c in _plan_cells(spec) if c.method == "daiq")
    whole = _one_thread_local(spec, tmp_path / "local", runner=run_stopping_after_epoch_1)
    results, out = tmp_path / "slurm", {}
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        parent = threading.Thread(
            target=lambda: out.setdefault("table", generate(
                spec, profile="smoke", results_dir=results, progress=False, runner=run_stopping_after_epoch_1,
                executor=SlurmCells(SlurmQueue(ONE_CPU), poll_s=0.5))),
        )  # fmt: skip
        parent.start()
        checkpoint = results / "work" / cell.key / "epoch_1.pth"
        deadline = time.time() + 180
        while not checkpoint.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert checkpoint.exists(), "the cell's job wrote no checkpoint"
        (record,) = (results / "slurm" / cell.key / "jobs.jsonl").read_text().splitlines()
        job_id = json.loads(record)["job_id"]
        # the signal the job's handler waits for (USR1 unless SUBMITIT_PREEMPT_SIGNAL says otherwise)
        subprocess.run(["scancel", f"--signal={submitit.JobEnvironment.USR_SIG}", job_id], check=True)
        parent.join(timeout=300)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    table = out["table"]
    assert table.errors == 0
    entry = json.loads((results / "cache" / f"{cell.key}.json").read_text())
    assert entry["executor"]["job_id"] == job_id and entry["executor"]["restarts"] >= 1  # requeued, same job
    assert entry["result"]["resumed_from"].endswith("epoch_1.pth")
    _same_cells(table, whole)


@pytest.mark.slow
def test_a_job_at_its_time_limit_requeues_and_ends_as_the_whole_run(slurm, tmp_path):
    """Slurm's own signal before the time limit (not scancel's): a 2-minute job signalled 60 s before it,
    while its cell waits after epoch 1, is requeued under the same id and finishes the cell as the
    uninterrupted run does. (Before the signal names were tied together, Slurm sent USR2 to a job waiting
    for USR1, and the job died.)"""
    import cloudpickle

    spec = _rows("table2", ("resnet18", "daiq"))
    cell = next(c for c in _plan_cells(spec) if c.method == "daiq")
    whole = _one_thread_local(spec, tmp_path / "local", runner=run_stopping_after_epoch_1)
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        limited = {**ONE_CPU, "time": 2, "signal_delay_s": 60}
        table = generate(spec, profile="smoke", results_dir=tmp_path / "slurm", progress=False,
                         runner=run_stopping_after_epoch_1,
                         executor=SlurmCells(SlurmQueue(limited), poll_s=0.5))  # fmt: skip
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert table.errors == 0
    entry = json.loads((tmp_path / "slurm" / "cache" / f"{cell.key}.json").read_text())
    assert entry["executor"]["restarts"] >= 1
    _same_cells(table, whole)


def _plan_cells(spec):
    from tables.generate import make_plan

    return make_plan(spec, "smoke", [0], None, None).cells


@pytest.mark.slow
def test_a_cell_on_two_tasks_of_one_job_is_the_torchrun_run_of_it(slurm, tmp_path):
    """torch.distributed set up from Slurm's environment (two gloo CPU ranks in one job) trains the cell
    as torchrun's two processes do."""
    from tables.cells import Cache, Cell
    from tables.slurm_job import CellJob
    from tasks import datasets as D

    D.ensure_digits()  # made here, not raced by the ranks
    cell = Cell.make(task="classification", model="resnet18", method="daiq", options={}, seed=0,
                     profile="smoke", paper_dataset="imagenet", data_root=None,
                     recipe_version=None)  # fmt: skip
    two_tasks = {"ntasks_per_node": 2, "cpus_per_task": 1, "time": 10}
    job = CellJob(cell, "test", "top1", str(tmp_path / "cache"), str(tmp_path / "work"), None,
                  resources=two_tasks)  # fmt: skip
    queue = SlurmQueue(two_tasks)
    job_id = queue.submit(job, f"repro-{cell.key}", tmp_path / "slurm")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    cmd += ["-m", "tasks.classification", "--launcher", "pytorch", "--json", "--model", "resnet18"]
    cmd += ["--method", "daiq", "--profile", "smoke", "--paper-dataset", "imagenet"]
    torchrun = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True,
                              timeout=300)  # fmt: skip
    assert torchrun.returncode == 0, torchrun.stderr[-3000:]
    theirs = json.loads(next(line for line in torchrun.stdout.splitlines() if line.startswith("{")))
    deadline = time.time() + 300
    while f"repro-{cell.key}" in queue.live() and time.time() < deadline:
        time.sleep(1)
    entry = Cache(tmp_path / "cache").load(cell)
    assert entry is not None, (tmp_path / "slurm" / f"{job_id}_0_log.err").read_text()[-3000:]
    assert entry["executor"]["tasks"] == 2 and entry["executor"]["job_id"] == job_id
    ours = entry["result"]
    for field in ("iters", "top1", "val_correct", "final_loss", "diverged"):
        assert ours[field] == theirs[field], field


def _repro_env() -> dict[str, str]:
    """This checkout's code for the parent and, through sbatch's --export=ALL, its jobs; one thread."""
    path = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    return dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")


def _repro(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tables.command", *argv], env=_repro_env(), cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _json_line(text: str) -> dict:
    return json.loads(next(line for line in text.splitlines() if line.startswith("{")))


TRAIN = ["train", "--model", "resnet18", "--method", "daiq", "--profile", "smoke", "--json"]
SMOKE_JOB = ["--executor", "slurm", "--slurm-args", "cpus_per_task=1 time=10"]


@pytest.mark.slow
def test_repro_train_on_slurm_reattaches_after_a_kill_and_prints_the_local_runs_result(slurm, tmp_path):
    local = _repro(*TRAIN)
    assert local.returncode == 0, local.stderr[-3000:]
    argv = [sys.executable, "-m", "tables.command", *TRAIN, *SMOKE_JOB, "--results-dir", str(tmp_path)]
    start = time.perf_counter()
    parent = subprocess.Popen(argv, env=_repro_env(), cwd=REPO, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.time() + 120
    while not list(tmp_path.glob("train/*/*_submitted.pkl")) and time.time() < deadline:
        time.sleep(0.05)
    parent.send_signal(signal.SIGKILL)  # its job submitted, maybe started: it goes on
    parent.wait()
    again = _repro(*argv[3:])
    print(f"repro train --executor slurm, killed once and run again: {time.perf_counter() - start:.1f} s")
    assert again.returncode == 0, again.stderr[-3000:]
    (pickle,) = tmp_path.glob("train/*/*_submitted.pkl")  # one job: the second parent waited for it
    ours, theirs = _json_line(again.stdout), _json_line(local.stdout)
    for field in ("iters", "top1", "val_correct", "final_loss", "diverged", "device"):
        assert ours[field] == theirs[field], field
    body = json.loads((pickle.parent / "result.json").read_text())
    assert body["executor"]["job_id"] == pickle.name.split("_")[0] and body["executor"]["restarts"] == 0
    assert not (pickle.parent / "work").exists()


@pytest.mark.slow
def test_a_figures_run_as_a_slurm_job_equals_the_local_run(slurm, tmp_path):
    figure = ["figure", "ui8-supplement-figure1", "--profile", "smoke", "--no-progress"]
    local = _repro(*figure, "--results-dir", str(tmp_path / "local"))
    assert local.returncode == 0, local.stderr[-3000:]
    start = time.perf_counter()
    jobs = _repro(*figure, "--results-dir", str(tmp_path / "slurm"), *SMOKE_JOB)
    print(f"one smoke figure run as a Slurm job, drawn: {time.perf_counter() - start:.1f} s")
    assert jobs.returncode == 0, jobs.stderr[-3000:]
    (folder,) = (tmp_path / "slurm" / "figures" / "runs").iterdir()
    ours = json.loads((folder / "result.json").read_text())
    theirs = json.loads((tmp_path / "local" / "figures" / "runs" / folder.name / "result.json").read_text())
    for field in ("iters", "top1", "val_correct", "final_loss", "diverged"):
        assert ours["result"][field] == theirs["result"][field], field
    (pickle,) = (tmp_path / "slurm" / "figures" / "slurm" / folder.name).glob("*_submitted.pkl")
    assert ours["meta"]["executor"]["job_id"] == pickle.name.split("_")[0]
    assert ours["meta"]["executor"]["resources"] == ONE_CPU
    csv = "figures/ui8-supplement-figure1.csv"
    assert (tmp_path / "slurm" / csv).read_text() == (tmp_path / "local" / csv).read_text()
