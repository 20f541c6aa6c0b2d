"""The Slurm executor's logic without a Slurm (tables/slurm_executor.py): submit, re-attach, report.

An in-process queue stands in for Slurm (a job runs at the next look at the queue), and one test goes
through submitit's local executor (each job a subprocess, the cell pickled there and back). The same on a
real Slurm: tests/test_slurm_cluster.py.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback

import pytest

from tables.cells import Cache
from tables.command import main as repro_main
from tables.generate import cell_executor, generate
from tables.slurm_executor import SlurmCells, job_name, pack_name, results_scope, stderr_tail
from tables.slurm_resources import DEFAULTS, parse_args, slurm_resources


def fake_run(**kw):
    """A stand-in for the task's run: deterministic per cell; fails for the cells of resnet18's daiq."""
    if kw["model"] == "resnet18" and kw["method"] == "daiq":
        raise RuntimeError("boom: fake failure")
    h = int(hashlib.sha256(f"{kw['model']}|{kw['method']}|{kw['seed']}".encode()).hexdigest()[:8], 16)
    return {"top1": 40.0 + (h % 5000) / 100, "diverged": False, "iters": 6, "ms_per_iter": 1.0}


def fine_run(**kw):
    return {"top1": 50.0 + kw["seed"], "diverged": False, "iters": 6, "ms_per_iter": 1.0}


class InlineQueue:
    """Slurm stand-in: each submitted job runs here at the next look at the queue, and has then ended;
    `hold` keeps named jobs listed as running (a job an earlier parent submitted, still going)."""

    name = "inline"
    resources = {"cpus_per_task": 1, "partition": "test"}

    def __init__(self, hold=None):
        self.jobs, self.submitted, self.names, self.hold, self.next_id = {}, [], [], dict(hold or {}), 100

    def submit(self, job, name, folder):
        self.next_id += 1
        job_id = str(self.next_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{job_id}_submitted.pkl").write_bytes(b"")
        self.jobs[name] = (job_id, job, folder)
        self.submitted += [cell.key for cell in job.cells]
        self.names.append(name)
        return job_id

    def live(self):
        for name, (job_id, job, folder) in list(self.jobs.items()):
            del self.jobs[name]
            try:
                job()
            except Exception:  # noqa: BLE001 - as a job's stderr shows it
                (folder / f"{job_id}_0_log.err").write_text(traceback.format_exc() + "srun: error: task 0\n")
        return {name: (job_id, "RUNNING") for name, job_id in self.hold.items()}


def run(tmp_path, executor, runner=fake_run, **kw):
    return generate("table2", profile="smoke", seeds=1, results_dir=tmp_path, runner=runner, progress=False,
                    executor=executor, **kw)  # fmt: skip


def test_cells_on_the_executor_are_the_local_cells_and_record_where_they_ran(tmp_path):
    local = run(tmp_path / "local", "local", fine_run)
    queue = InlineQueue()
    slurm = run(tmp_path / "slurm", SlurmCells(queue, poll_s=0), fine_run)
    assert slurm.outcomes.keys() == local.outcomes.keys()
    assert sorted(queue.submitted) == sorted(local.outcomes)
    for key, outcome in slurm.outcomes.items():
        assert outcome.result == local.outcomes[key].result and not outcome.cached
        entry = json.loads((tmp_path / "slurm" / "cache" / f"{key}.json").read_text())
        assert entry["executor"]["name"] == "slurm" and entry["executor"]["resources"] == queue.resources
        assert entry["cell"] == json.loads((tmp_path / "local" / "cache" / f"{key}.json").read_text())["cell"]
        records = (tmp_path / "slurm" / "slurm" / key / "jobs.jsonl").read_text().splitlines()
        assert len(records) == 1 and json.loads(records[0])["resources"] == queue.resources
    assert slurm.frame.to_csv() == local.frame.to_csv()
    assert not list((tmp_path / "slurm" / "work").glob("*/"))  # work dirs removed once cached

    again = SlurmCells(InlineQueue(), poll_s=0)
    rerun = run(tmp_path / "slurm", again, fine_run)
    assert rerun.ran == 0 and not again.queue.submitted  # all from the cache


def test_a_rerun_waits_for_the_live_jobs_and_submits_only_the_missing_cells(tmp_path):
    first = run(tmp_path / "probe", SlurmCells(InlineQueue(), poll_s=0), fine_run)
    cells = first.plan.cells
    running = cells[0]
    scope = results_scope(tmp_path / "run" / "cache")
    # an earlier parent's job, still running; the same cell's job of another results directory is not it
    queue = InlineQueue(hold={job_name(running, scope): "77", job_name(cells[1], "0ther0ne"): "78"})
    executor = SlurmCells(queue, poll_s=0)
    cache = Cache(tmp_path / "run" / "cache")

    def live_then_done():  # the held job finishes (its cell cached) on the third look
        calls["n"] += 1
        if calls["n"] == 3:
            cache.store(running, fine_run(seed=running.seed, model=running.model), 1.0)
            queue.hold.clear()
        return real_live()

    calls, real_live = {"n": 0}, queue.live
    queue.live = live_then_done
    out = run(tmp_path / "run", executor, fine_run)
    assert running.key not in queue.submitted and len(queue.submitted) == len(cells) - 1
    assert cells[1].key in queue.submitted
    assert out.errors == 0 and out.outcomes[running.key].result["top1"] == 50.0


def test_a_failed_job_names_its_id_and_stderr_and_the_others_finish(tmp_path, capsys):
    out = run(tmp_path, SlurmCells(InlineQueue(), poll_s=0))
    failed = {k: o for k, o in out.outcomes.items() if o.error}
    assert len(failed) == 1 and out.errors == 1 and out.ran == len(out.outcomes)
    (error,) = [o.error for o in failed.values()]
    assert error.startswith("Slurm job 10") and "boom: fake failure" in error and "srun:" not in error
    assert "error: Slurm job 10" in (tmp_path / "table2.md").read_text()
    assert all(o.result for o in out.outcomes.values() if not o.error)


def test_a_submission_that_never_reached_its_job_is_submitted_again(tmp_path):
    class Lossy(InlineQueue):
        def submit(self, job, name, folder):
            job_id = super().submit(job, name, folder)
            if len(self.submitted) == 1:  # as if the parent died between sbatch and submitit's pickle
                (folder / f"{job_id}_submitted.pkl").unlink()
                del self.jobs[name]
            return job_id

    queue = Lossy()
    out = run(tmp_path, SlurmCells(queue, poll_s=0), fine_run)
    assert out.errors == 0 and len(queue.submitted) == len(out.outcomes) + 1
    assert queue.submitted[0] == queue.submitted[-1]


def test_cells_per_job_packs_the_cells_into_fewer_jobs_with_the_same_results(tmp_path):
    local = run(tmp_path / "local", "local", fine_run)
    queue = InlineQueue()
    packed = run(tmp_path / "packed", SlurmCells(queue, poll_s=0, cells_per_job=3), fine_run)
    n = len(local.outcomes)
    assert n > 3 and sorted(queue.submitted) == sorted(local.outcomes)
    assert len(queue.names) == -(-n // 3) and all(name.count("+") <= 2 for name in queue.names)
    assert packed.frame.to_csv() == local.frame.to_csv()
    for key in local.outcomes:
        entry = json.loads((tmp_path / "packed" / "cache" / f"{key}.json").read_text())
        (record,) = [
            json.loads(r)
            for r in (tmp_path / "packed" / "slurm" / key / "jobs.jsonl").read_text().splitlines()
        ]
        assert entry["executor"]["cells_in_job"] == record["cells_in_job"] in (1, 2, 3)
        assert (
            tmp_path / "packed" / "slurm" / record["folder"] / f"{record['job_id']}_submitted.pkl"
        ).exists()


def test_a_failed_cell_in_a_pack_leaves_the_packs_other_cells_trained(tmp_path):
    out = run(tmp_path, SlurmCells(InlineQueue(), poll_s=0, cells_per_job=len(run_cells(tmp_path))))
    failed = {k: o for k, o in out.outcomes.items() if o.error}
    assert len(failed) == 1 and out.errors == 1
    (error,) = [o.error for o in failed.values()]
    assert error.startswith("Slurm job 101") and "boom: fake failure" in error
    assert all(o.result for o in out.outcomes.values() if not o.error)


def test_a_rerun_waits_for_a_live_pack_and_submits_none_of_its_cells(tmp_path):
    cells = run_cells(tmp_path)
    # an earlier parent's pack, still running
    queue = InlineQueue(hold={pack_name(cells[:2], results_scope(tmp_path / "run" / "cache")): "77"})
    cache = Cache(tmp_path / "run" / "cache")
    calls, real_live = {"n": 0}, queue.live

    def live_then_done():  # the pack trains its first cell, then its second, then ends
        calls["n"] += 1
        if calls["n"] in (2, 3):
            cell = cells[calls["n"] - 2]
            cache.store(cell, fine_run(seed=cell.seed, model=cell.model), 1.0)
        if calls["n"] == 3:
            queue.hold.clear()
        return real_live()

    queue.live = live_then_done
    out = run(tmp_path / "run", SlurmCells(queue, poll_s=0, cells_per_job=4), fine_run)
    assert not {c.key for c in cells[:2]} & set(queue.submitted) and out.errors == 0


def run_cells(tmp_path):
    """The plan's cells (from a run on a scratch results directory)."""
    return run(tmp_path / "probe", SlurmCells(InlineQueue(), poll_s=0), fine_run).plan.cells


def test_a_cell_of_several_ranks_is_another_cell_than_the_single_process_one(tmp_path):
    class TwoRanks(InlineQueue):
        resources = {"cpus_per_task": 1, "nodes": 1, "ntasks_per_node": 2}

    single = run(tmp_path / "one", SlurmCells(InlineQueue(), poll_s=0), fine_run)
    two = run(tmp_path / "two", SlurmCells(TwoRanks(), poll_s=0), fine_run)
    assert len(two.outcomes) == len(single.outcomes) and not set(two.outcomes) & set(single.outcomes)
    assert all(c.numerics.endswith("+ranks:2") for c in two.plan.cells)
    assert all(c.numerics is None for c in single.plan.cells)  # an injected runner's, as before


def test_cells_per_job_is_the_executors_and_never_an_sbatch_option(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    got = slurm_resources(args="cells_per_job=8 time=30")
    assert got == {**DEFAULTS, "time": 30, "cells_per_job": 8}
    executor = cell_executor("slurm", got)
    assert executor.cells_per_job == 8 and "cells_per_job" not in executor.queue.resources
    for bad in ("0", "17", "2.5", "many"):
        with pytest.raises(ValueError, match="cells_per_job"):
            slurm_resources(args=f"cells_per_job={bad}")


@pytest.mark.slow
def test_cells_go_through_submitits_local_executor_and_back(tmp_path):
    """Each job a subprocess (submitit's LocalExecutor): the cell, its runner and the outcome pickled."""
    import cloudpickle
    import submitit

    class LocalQueue:
        name, resources = "local", {}

        def __init__(self):
            self.jobs = {}

        def submit(self, job, name, folder):
            executor = submitit.LocalExecutor(folder=folder)
            executor.update_parameters(timeout_min=5)
            self.jobs[name] = executor.submit(job)
            return str(self.jobs[name].job_id)

        def live(self):
            return {n: (j.job_id, "RUNNING") for n, j in self.jobs.items() if not j.done()}

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job's process cannot import tests/
    try:
        spec = _two_rows()
        out = generate(spec, profile="smoke", seeds=1, results_dir=tmp_path, runner=fake_run, progress=False,
                       executor=SlurmCells(LocalQueue(), poll_s=0.2))  # fmt: skip
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    assert out.errors == 1 and out.ran == len(out.outcomes) == 3
    (error,) = [o.error for o in out.outcomes.values() if o.error]
    assert "boom: fake failure" in error


def _two_rows():
    import dataclasses

    from tables.specs import SPECS

    spec = SPECS["table2"]
    return dataclasses.replace(spec, rows=tuple(r for r in spec.rows if r.method in ("gq", "daiq")))


def test_the_stderr_tail_leaves_out_submitits_and_sruns_own_lines(tmp_path):
    (tmp_path / "5_0_log.err").write_text(
        "submitit INFO (x) - Starting\nTraceback (most recent call last):\n  File a.py\n"
        "ValueError: bad\nsubmitit ERROR (x) - Submitted job triggered an exception\nsrun: error: task 0\n"
    )
    assert stderr_tail(tmp_path, "5") == "File a.py | ValueError: bad"


def test_resources_come_from_the_config_file_then_slurm_args_and_never_from_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert slurm_resources() == DEFAULTS
    (tmp_path / "slurm.toml").write_text('[slurm]\npartition = "gpu"\ntime = 120\nreservation = "r1"\n')
    got = slurm_resources(args="time=30 gpus_per_cell=4,nodes_per_cell=2 cpus-per-task=8")
    assert got == {"partition": "gpu", "time": 30, "cpus_per_task": 8, "gpus_per_node": 4, "nodes": 2,
                   "additional_parameters": {"reservation": "r1"}}  # fmt: skip
    assert parse_args("") == {} and parse_args("mem=4G") == {"mem": "4G"}
    with pytest.raises(ValueError, match="not key=value"):
        parse_args("partition")
    with pytest.raises(ValueError, match="no such file"):
        slurm_resources(config=tmp_path / "missing.toml")


def test_the_command_takes_the_executor_and_refuses_slurm_args_without_it(tmp_path, capsys):
    assert repro_main(["table", "table2", "--profile", "smoke", "--slurm-args", "time=5"]) == 2
    assert "apply with --executor slurm" in capsys.readouterr().err
    assert repro_main(["table", "table2", "--executor", "slurm", "--slurm-args", "time"]) == 2
    assert "not key=value" in capsys.readouterr().err


def test_the_signal_slurm_sends_before_the_time_limit_is_the_one_the_job_waits_for(tmp_path):
    """submitit reads SUBMITIT_PREEMPT_SIGNAL at its import, which comes before tables.slurm_executor's
    default; the sbatch line must still name the signal the job's handler (the same variable) waits for."""
    import os

    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="true", folder=tmp_path, job_name="j", signal_delay_s=60)
    assert f"#SBATCH --signal={os.environ['SUBMITIT_PREEMPT_SIGNAL']}@60" in script.splitlines()
