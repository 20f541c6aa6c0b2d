"""The Slurm executor's logic without a Slurm (tables/slurm_executor.py): submit, re-attach, report; for a
table's cells, a figure's runs (tables/figures/runs.py) and `repro train` (tables/slurm_train.py).

An in-process queue stands in for Slurm (a job runs at the next look at the queue), and two tests go
through submitit's local executor (each job a subprocess, the cell or run pickled there and back). The same
on a real Slurm: tests/test_slurm_cluster.py.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import traceback

import numpy as np
import pandas as pd
import pytest

from atomic_files import write_folder
from tables.cells import Cache
from tables.command import main as repro_main
from tables.figures.runs import RUNS, ensure, run_folder
from tables.generate import cell_executor, generate
from tables.slurm_executor import JOB_PREFIX, SlurmCells, job_name, pack_name, results_scope, stderr_tail
from tables.slurm_resources import DEFAULTS, parse_args, slurm_resources
from tasks.runner import RunResult


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
        self.submitted += (
            name.removeprefix(JOB_PREFIX).split("-", 1)[1].split("+")
        )  # its cells' or run's keys
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


class LocalQueue:
    """submitit's LocalExecutor as the queue: each job a subprocess. A figure run's job gets `trainer`."""

    name, resources = "local", {}

    def __init__(self, trainer=None):
        self.jobs, self.trainer = {}, trainer

    def submit(self, job, name, folder):
        import submitit

        if self.trainer is not None and hasattr(job, "trainer"):
            job = dataclasses.replace(job, trainer=self.trainer)
        executor = submitit.LocalExecutor(folder=folder)
        executor.update_parameters(timeout_min=5)
        self.jobs[name] = executor.submit(job)
        return str(self.jobs[name].job_id)

    def live(self):
        return {n: (j.job_id, "RUNNING") for n, j in self.jobs.items() if not j.done()}


@pytest.mark.slow
def test_cells_go_through_submitits_local_executor_and_back(tmp_path):
    """Each job a subprocess (submitit's LocalExecutor): the cell, its runner and the outcome pickled."""
    import cloudpickle

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
        "submitit INFO (x) - Starting\nTraceback (most recent call last):\n  File a.py\n    ^^^^~~\n"
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


def fake_train(spec, profile, folder, data_root, log, record=None):
    """A stand-in for a figure run's training (tables.figures.runs.train): writes its folder as train does;
    fails for UI8's MobileNet without clipping."""
    if spec.name == "ui8-mobilenet-noclip":
        raise RuntimeError("boom: this run cannot train")

    def fill(tmp):
        meta = {"spec": spec.name, **({"executor": record} if record else {})}
        (tmp / "result.json").write_text(json.dumps({"result": {"top1": 50.0 + spec.seed}, "meta": meta}))
        (tmp / "records.json").write_text(json.dumps({"records": [], "curves": {}, "config": {}}))
        np.savez(tmp / "samples.npz")

    write_folder(folder, fill)


FIGURE_RUNS = ["ui8-mobilenet-fp32", "ui8-mobilenet-ui8"]


def test_figure_runs_are_jobs_a_live_one_waited_for_and_none_submitted_twice(tmp_path, monkeypatch):
    monkeypatch.setattr("tables.figures.runs.train", fake_train)
    root = tmp_path / "figures" / "runs"
    live, pending = (run_folder(root, RUNS[n], "smoke", None) for n in FIGURE_RUNS)
    # an earlier parent's job, still running
    queue = InlineQueue(hold={f"{JOB_PREFIX}{results_scope(root)}-{live.name}": "77"})
    calls, real_live = {"n": 0}, queue.live

    def live_then_done():  # the held job finishes (its run written) on the third look
        calls["n"] += 1
        if calls["n"] == 3:
            fake_train(RUNS[FIGURE_RUNS[0]], "smoke", live, None, None)
            queue.hold.clear()
        return real_live()

    queue.live = live_then_done
    runs = ensure(FIGURE_RUNS, "smoke", tmp_path, progress=False, executor=SlurmCells(queue, poll_s=0))
    assert queue.submitted == [pending.name] and set(runs) == set(FIGURE_RUNS)
    assert runs[FIGURE_RUNS[1]].meta["executor"]["name"] == "slurm"
    assert runs[FIGURE_RUNS[1]].meta["executor"]["resources"] == queue.resources
    (record,) = (tmp_path / "figures" / "slurm" / pending.name / "jobs.jsonl").read_text().splitlines()
    assert json.loads(record)["cell"] == f"figure run {FIGURE_RUNS[1]}"  # what the job runs
    again = InlineQueue()
    ensure(FIGURE_RUNS, "smoke", tmp_path, progress=False, executor=SlurmCells(again, poll_s=0))
    assert again.submitted == []  # all written


def test_a_failed_figure_run_is_its_job_and_stderr_and_is_submitted_once_for_all_figures(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr("tables.figures.runs.train", fake_train)
    queue = InlineQueue()
    monkeypatch.setattr("tables.slurm_executor.SlurmQueue", lambda resources, python=None: queue)
    # both figures draw UI8's MobileNet without clipping, whose job fails; UI8 Figure 2 also draws FP32's
    argv = ["figure", "ui8-figure2", "ui8-supplement-figure1", "--profile", "smoke", "--no-progress"]
    assert repro_main([*argv, "--results-dir", str(tmp_path), "--executor", "slurm"]) == 1
    err = capsys.readouterr().err
    assert sorted(queue.submitted) == sorted(
        run_folder(tmp_path / "figures" / "runs", RUNS[n], "smoke", None).name
        for n in ("ui8-mobilenet-fp32", "ui8-mobilenet-noclip")
    )  # each once, though two figures need the failed one
    for figure in ("ui8-figure2", "ui8-supplement-figure1"):
        assert f"error: {figure}: RuntimeError: figure run ui8-mobilenet-noclip: Slurm job 10" in err
    assert "RuntimeError: boom: this run cannot train" in err


def fake_task_run(model, method, **kw):
    """A stand-in for the classification task's run: a RunResult; fails for DAIQ."""
    if method == "daiq":
        raise RuntimeError("boom: fake failure")
    return RunResult(task="classification", model=model, method=method, profile=kw["profile"],
                     paper_dataset="imagenet", dataset="digits", seed=kw["seed"], epochs=1, iters=6,
                     final_loss=0.5, diverged=False, ms_per_iter=1.0,
                     scores={"top1": 50.0 + kw["seed"]})  # fmt: skip


def test_repro_train_on_slurm_prints_what_a_local_run_prints_and_keeps_it(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tasks.classification.run", fake_task_run)
    queue = InlineQueue()
    monkeypatch.setattr("tables.slurm_executor.SlurmQueue", lambda resources, python=None: queue)
    argv = ["train", "--model", "resnet18", "--method", "ui8", "--profile", "smoke", "--seed", "1"]
    slurm = ["--executor", "slurm", "--results-dir", str(tmp_path), "--slurm-args", "time=5"]
    for json_flag in (["--json"], []):
        assert repro_main([*argv, *json_flag]) == 0
        local = capsys.readouterr().out
        assert repro_main([*argv, *json_flag, *slurm]) == 0
        out = capsys.readouterr()
        assert out.out == local and len(queue.submitted) == 1  # the second time, the kept result
    assert "the result kept in" in out.err and "trained by Slurm job" in out.err
    (folder,) = (tmp_path / "train").iterdir()
    body = json.loads((folder / "result.json").read_text())
    assert body["executor"]["resources"] == queue.resources and not (folder / "work").exists()

    assert repro_main([*argv[:4], "daiq", *argv[5:], *slurm]) == 1  # its job fails
    err = capsys.readouterr().err
    assert "error: classification resnet18 daiq (smoke, seed 1): Slurm job 102 ended without a result" in err
    assert "RuntimeError: boom: fake failure" in err
    assert repro_main([*argv, *slurm, "--launcher", "pytorch"]) == 2
    assert "sets it up itself" in capsys.readouterr().err
    assert repro_main([*argv[:4], "nosuch", *argv[5:], *slurm]) == 2  # refused here: no job
    assert "error: unknown method 'nosuch'" in capsys.readouterr().err and len(queue.submitted) == 2
    assert repro_main([*argv, "--slurm-args", "time=5"]) == 2
    assert "apply with --executor slurm" in capsys.readouterr().err


@pytest.mark.slow
def test_figure_runs_and_a_training_go_through_submitits_local_executor_and_back(tmp_path, capsys):
    """Each job a subprocess: a figure run (one written, one failed) and `repro train`'s run."""
    import argparse

    import cloudpickle

    from tables.slurm_train import train_on_slurm

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the job's process cannot import tests/
    try:
        executor = SlurmCells(LocalQueue(trainer=fake_train), poll_s=0.2)
        with pytest.raises(RuntimeError, match="figure run ui8-mobilenet-noclip: Slurm job .*boom"):
            ensure(["ui8-mobilenet-noclip", "ui8-mobilenet-fp32"], "smoke", tmp_path, progress=False,
                   executor=executor)  # fmt: skip
        (run,) = ensure(["ui8-mobilenet-fp32"], "smoke", tmp_path, progress=False, executor=executor).values()
        assert run.meta["executor"]["name"] == "slurm" and run.result["top1"] == 50.0

        args = argparse.Namespace(
            task="classification", model="resnet18", method="ui8", profile="smoke", seed=2, config=None,
            paper_dataset=None, data_root=None, work_dir=None, checkpoint_interval=None,
            skip_bad_samples=False, method_options=None, cfg_options=None, launcher="none", compile=False,
            device="cpu", json=True, results_dir=str(tmp_path),  # the job chooses it
        )  # fmt: skip
        assert train_on_slurm(args, SlurmCells(LocalQueue(), poll_s=0.2), runner=fake_task_run) == 0
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    record = json.loads(capsys.readouterr().out)
    assert record["top1"] == 52.0 and record["method"] == "ui8" and record["device"].startswith("cpu")


def test_a_failed_cell_is_named_in_its_table_and_in_the_claims_that_read_it(tmp_path, capsys):
    from tables import claims

    out = run(tmp_path, SlurmCells(InlineQueue(), poll_s=0))  # the job of resnet18's DAIQ cell fails
    (failed,) = out.meta["failed_cells"]
    assert failed["error"].startswith("Slurm job 10") and "boom: fake failure" in failed["error"]
    assert f"- {failed['cell']}: Slurm job 10" in (tmp_path / "table2.md").read_text()

    report = tmp_path / "report"  # the claims report on the table as written (its sidecar lists the cell)
    assert claims.main(["--profile", "smoke", "--kept", str(tmp_path), "--results-dir", str(report)]) == 1
    assert "1 claims read tables with failed cells" in capsys.readouterr().err
    row = pd.read_csv(report / "claims.csv", keep_default_na=False).set_index("key").loc["daiq-ablation"]
    assert row["verdict"] == claims.INCONCLUSIVE
    assert row["reason"].startswith("1 failed cell in the tables it reads (listed in its details); on the "
                                    "cells that finished, inconclusive: one seed")  # fmt: skip
    assert row["failed_cells"] == f"table2: {failed['cell']}: {failed['error']}"
    details = (report / "claims.md").read_text().split("### daiq-ablation", 1)[1].split("###")[0]
    assert f"- table2: {failed['cell']}: Slurm job 10" in details and "boom: fake failure" in details

    meta = json.loads((tmp_path / "table2.meta.json").read_text())  # a table kept before sidecars listed them
    del meta["failed_cells"]
    (tmp_path / "table2.meta.json").write_text(json.dumps(meta))
    ctx = claims.Context(profile="smoke", results_dir=report, kept=tmp_path)
    frame = claims.evaluate(ctx, [c for c in claims.CLAIMS if c.key == "daiq-ablation"])
    assert (
        frame["failed_cells"][0].startswith("table2: row resnet18 ")
        and "Slurm job 10" in frame["failed_cells"][0]
    )


def test_a_training_of_several_ranks_is_another_run_than_the_one_process_one():
    from tables.slurm_train import run_key

    arguments = {"model": "resnet18", "method": "daiq", "profile": "smoke", "seed": 0, "config": None}
    one, two = (run_key("classification", arguments, "cpu", ranks) for ranks in (1, 2))
    assert one != two and one == run_key("classification", dict(arguments), "cpu")


def test_a_cells_ranks_come_only_from_nodes_and_ntasks_per_node(tmp_path, monkeypatch):
    """A job's ranks go into the cell's key: ntasks would run several ranks under a one-rank key."""
    monkeypatch.chdir(tmp_path)
    for bad, says in (
        ("ntasks=2", "ntasks_per_node"),
        ("nodes=1-2", "whole number"),
        ("ntasks_per_node=0", "at least 1"),
    ):
        with pytest.raises(ValueError, match=says):
            slurm_resources(args=bad)
    assert cell_executor("slurm", slurm_resources(args="nodes=2 ntasks_per_node=3")).ranks_per_cell == 6


def test_the_command_to_resume_names_the_slurm_resources_it_ran_with(tmp_path):
    """Rerun without them, a table of several ranks a cell plans other cells (their keys name the ranks)."""
    args = ["table", "table2", "--profile", "smoke", "--executor", "slurm", "--cached-only", "--no-progress",
            "--slurm-args", "ntasks_per_node=2 time=5", "--results-dir", str(tmp_path)]  # fmt: skip
    assert repro_main(args) == 0
    command = json.loads((tmp_path / "table2.meta.json").read_text())["command"]
    assert command.endswith("--executor slurm --slurm-args 'ntasks_per_node=2 time=5'")


def test_a_failed_squeue_is_asked_again_and_the_last_failure_raises(monkeypatch):
    import subprocess
    from types import SimpleNamespace

    from tables import slurm_executor

    answers = iter([subprocess.CalledProcessError(1, "squeue"), subprocess.TimeoutExpired("squeue", 120),
                    SimpleNamespace(stdout="7|repro-ab-cd|RUNNING\n8|other|PENDING\n")])  # fmt: skip

    def run(*args, **kw):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(slurm_executor.subprocess, "run", run)
    monkeypatch.setattr(slurm_executor, "SQUEUE_RETRY_S", 0.0)
    queue = slurm_executor.SlurmQueue({})
    assert queue.live() == {"repro-ab-cd": ("7", "RUNNING")}
    answers = iter([subprocess.CalledProcessError(1, "squeue")] * slurm_executor.SQUEUE_TRIES)
    with pytest.raises(subprocess.CalledProcessError):
        queue.live()
