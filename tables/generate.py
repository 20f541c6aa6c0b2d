"""The table generator: plan the cells of a spec, run the ones not cached, render the table.

`generate("table4", profile="embedded")` trains every cell the cache lacks (one FP32 baseline per
model, dataset and seed, shared by all rows of that model; one INT8 cell per row and seed), caches
each as soon as it finishes, and writes results/<name>.md, results/<name>.csv and a sidecar
results/<name>.meta.json. The cell runner defaults to the spec's task (`tasks.get_task(spec.task).run`)
and can be injected (tests use a fake). A cell whose run raises is reported as an error, not cached,
and the rest still runs; KeyboardInterrupt propagates after the finished cells are safely cached.
Each cell trains in its own work dir, results/work/<cell key>, kept until the cell is cached: a cell
whose run was killed resumes from its checkpoints there (tasks.runner). A process runs a cell only
under its claim (tables.cells.CellClaim): two table runs on one results directory share the cells out,
and each waits for the cells the other is running before writing its table (`make table4 JOBS=2` starts
two, one thread each on 2 cores; each cell's cache entry says how many ran at a time and on how many
threads, and the table says how many of its cells ran so).
Each cell's training log (what the task prints to stdout, e.g. mmengine's logger) goes to
results/logs/<cell key>.log rather than the terminal, so the progress bar stays readable; `verbose`
keeps it on the terminal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

import kernels
from repro.quant import NonFiniteError
from tables.cells import Cache, Cell, CellClaim, row_blocker
from tables.shared_training import SharedTraining
from tables.spec import Row, Spec
from tables.specs import get_spec
from tables.time_left import seconds_left
from tasks import PROFILES
from tasks.bad_data import one_line_error
from tasks.datasets import DatasetNotFoundError
from tasks.device_choice import trained_on

DEFAULT_SEEDS = {"smoke": 1, "embedded": 3, "paper": 1}

Runner = Callable[..., Any]


@dataclass
class RowPlan:
    row: Row
    blocker: str | None
    # per seed: (seed, FP32 baseline cell, INT8 cell); empty when blocked
    cells: list[tuple[int, Cell, Cell]] = field(default_factory=list)


@dataclass
class Plan:
    spec: Spec
    profile: str
    seeds: list[int]
    data_root: str | None
    recipe_version: str | None
    rows: list[RowPlan]
    numerics: str | None = None

    @property
    def cells(self) -> list[Cell]:
        """Every distinct cell, seed by seed (a run stopped after seed 0 still fills the table)."""
        seen: dict[str, Cell] = {}
        for seed in self.seeds:
            for rp in self.rows:
                for s, fp32, int8 in rp.cells:
                    if s == seed:
                        seen.setdefault(fp32.key, fp32)
                        seen.setdefault(int8.key, int8)
        return list(seen.values())


@dataclass
class Outcome:
    result: dict[str, Any] | None = None
    error: str | None = None
    cached: bool = False
    elapsed_s: float | None = None  # the cell's own training time, where and whenever it ran
    # its process's CPU time over the same span: unlike elapsed_s, not inflated by other processes on the
    # machine or a pause (SIGSTOP); None for cells cached before it was recorded
    cpu_s: float | None = None
    ran_with: dict[str, Any] | None = None  # ran_with() when it ran; None: not recorded (older cells)
    # the key of the cell whose training this cell's result is, scored for this cell (tables.shared_training);
    # its own elapsed_s and cpu_s are then 0: the training is counted once, in that cell
    shared_from: str | None = None


JOBS_ENV = "REPRO_TABLE_JOBS"  # set by `make <table> JOBS=n`: n table processes share the machine


def table_jobs() -> int:
    """How many table processes share the machine (`make JOBS=n`)."""
    return max(1, int(os.environ.get(JOBS_ENV) or 1))


def ran_with() -> dict[str, Any]:
    """How this process shares the machine: its threads, how many table processes run at once, and the
    device its cells train on (tasks.device_choice), as a finished cell records it."""
    return {"threads": torch.get_num_threads(), "jobs": table_jobs(), "device": trained_on()}


@dataclass
class Generated:
    spec: Spec
    plan: Plan
    outcomes: dict[str, Outcome]
    frame: Any  # pandas.DataFrame, one row per paper row
    markdown: str
    meta: dict[str, Any]
    paths: dict[str, Path]
    ran: int
    cached: int
    errors: int


def default_seeds(profile: str, spec: Spec | None = None) -> int:
    """How many seeds a table trains unless told: its own count at this profile, else the profile's."""
    return (spec.seeds if spec is not None else {}).get(profile, DEFAULT_SEEDS[profile])


def resolve_seeds(profile: str, seeds: int | None, spec: Spec | None = None) -> list[int]:
    """Seeds 0..n-1: n asked, else default_seeds."""
    if seeds is None:
        n = default_seeds(profile, spec)
    else:
        n = int(seeds)
    if n < 1:
        raise ValueError(f"--seeds must be at least 1, got {n}")
    return list(range(n))


def make_plan(
    spec: Spec,
    profile: str,
    seeds: list[int],
    data_root: str | os.PathLike | None,
    recipe_version: str | None,
    numerics: str | None = None,
    model_versions: Mapping[str, str] | None = None,
) -> Plan:
    rows = []
    for row in spec.rows:
        rp = RowPlan(row, row_blocker(row))
        if rp.blocker is None:
            common = dict(
                task=spec.task,
                model=row.model,
                profile=profile,
                paper_dataset=row.paper_dataset,
                data_root=data_root,
                recipe_version=(model_versions or {}).get(row.model, recipe_version),
                numerics=numerics,
            )
            for seed in seeds:
                fp32 = Cell.make(method="fp32", options={}, seed=seed, **common)
                int8 = Cell.make(method=row.method, options=row.options, seed=seed, **common)
                rp.cells.append((seed, fp32, int8))
        rows.append(rp)
    root = str(Path(data_root).expanduser().resolve()) if data_root else None
    return Plan(spec, profile, seeds, root, recipe_version, rows, numerics)


def load_task_runner(task_name: str) -> tuple[Runner, str | None]:
    """The real task's `run` and its RECIPE_VERSION (None if it exposes none)."""
    try:
        import tasks

        module = tasks.get_task(task_name)
    except Exception as err:  # noqa: BLE001 - any import failure means the task is not available
        raise RuntimeError(f"task {task_name!r} is not available: {type(err).__name__}: {err}") from err
    recipe = getattr(module, "RECIPE_VERSION", None)
    return module.run, (None if recipe is None else str(recipe))


def model_recipe_versions(task_name: str) -> dict[str, str]:
    """The models whose recipe changed alone, with their own version (the task's MODEL_RECIPE_VERSIONS)."""
    import tasks

    module = tasks.get_task(task_name)
    return {m: tasks.recipe_version(module, m) for m in getattr(module, "MODEL_RECIPE_VERSIONS", {})}


def result_dict(result: Any) -> dict[str, Any]:
    if hasattr(result, "to_dict"):
        return dict(result.to_dict())
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return dataclasses.asdict(result)
    if isinstance(result, Mapping):
        return dict(result)
    raise TypeError(f"the runner returned {type(result).__name__}, not a RunResult or a mapping")


def one_line(err: BaseException) -> str:
    msg = f"{type(err).__name__}: {one_line_error(err)}"
    return msg if len(msg) <= 300 else msg[:297] + "..."


def run_cells(
    plan: Plan,
    cache: Cache,
    runner: Runner | None,
    work_root: Path,
    progress: bool = True,
    log_root: Path | None = None,
    runner_options: dict[str, Any] | None = None,
    cached_only: bool = False,
    shared: SharedTraining | None = None,
    executor: Any = None,
) -> dict[str, Outcome]:
    """Run every cell the cache lacks; return the outcome of every cell of the plan. `runner_options` go
    to the runner beside each cell's own arguments (e.g. skip_bad_samples). With `cached_only` nothing
    runs: the cells the cache lacks have no outcome (the table shows them pending). `shared`: the task's
    cells that train one run (tables.shared_training); a cell whose twin is cached is scored from it.
    `executor`: None trains the cells in this process; a tables.slurm_executor.SlurmCells hands each to a
    Slurm job and waits for them (their results land in the same cache)."""
    cells = plan.cells
    outcomes: dict[str, Outcome] = {}
    todo = []
    for cell in cells:
        outcome = known_outcome(cache, cell, shared)
        if outcome is not None:
            outcomes[cell.key] = outcome
        else:
            todo.append(cell)
    if not todo or cached_only:
        return outcomes
    if runner is None:
        raise ValueError(f"{len(todo)} cells of {plan.spec.name} need a runner")
    bar = tqdm(
        total=len(cells),
        initial=len(cells) - len(todo),
        desc=plan.spec.name,
        unit="cell",
        disable=not progress,
        file=sys.stderr,
        dynamic_ncols=True,
        # the time left is the postfix's (tables.time_left), not tqdm's mean time a cell
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",
    )
    if executor is not None:
        try:
            executor.run(
                plan, cache, todo, outcomes, work_root=work_root, log_root=log_root, runner=runner,
                runner_options=dict(runner_options or {}), shared=shared, bar=bar,
                jobs_root=work_root.parent / "slurm",
            )  # fmt: skip
        finally:
            bar.close()
        return outcomes
    session = _Session(plan, cache, runner, work_root, log_root, bar, dict(runner_options or {}), shared)
    try:
        waiting = []
        for cell in todo:  # first the cells no other process is running, then the others as they free up
            if not session.run_claimed(cell, outcomes, wait=False):
                waiting.append(cell)
        if waiting:
            bar.write(f"{plan.spec.name}: waiting for {len(waiting)} cells another process is running")
        for cell in waiting:
            session.run_claimed(cell, outcomes, wait=True)
    finally:
        bar.close()
    return outcomes


@dataclass
class _Session:
    """What running the cells of one plan needs."""

    plan: Plan
    cache: Cache
    runner: Runner
    work_root: Path
    log_root: Path | None
    bar: Any
    runner_options: dict[str, Any]
    shared: SharedTraining | None = None

    def twins_running(self, cell: Cell, wait: bool) -> bool:
        """Whether another process is training one of the cell's twins; with `wait`, wait until none is
        (holding no claim meanwhile, so two processes never wait on each other)."""
        for twin in self.shared.twins(cell) if self.shared else []:
            claim = CellClaim(self.work_root, twin)
            if not claim.path.exists():  # never claimed: checking must not leave a lock file behind
                continue
            if not claim.acquire(wait=wait):
                return True
            claim.release(remove=self.cache.load(twin) is not None)
        return False

    def run_claimed(self, cell: Cell, outcomes: dict[str, Outcome], wait: bool) -> bool:
        """Run one cell under its claim (False: another process holds it, or trains a twin of it, and
        wait is False). A cell another process finished meanwhile, or whose twin it finished, is taken
        from the cache."""
        if self.twins_running(cell, wait):
            return False
        claim = CellClaim(self.work_root, cell)
        if not claim.acquire(wait=wait):
            return False
        cached = stopped = False
        try:
            known = known_outcome(self.cache, cell, self.shared)
            if known is not None:
                outcomes[cell.key] = known
            else:
                left = "" if self.bar.disable else self.time_left(outcomes)  # reads the cache: only for a bar
                self.bar.set_postfix_str(cell.describe() + left, refresh=True)
                outcomes[cell.key] = self.run(cell)
            cached = outcomes[cell.key].error is None
            self.bar.update(1)
        except DatasetNotFoundError:
            stopped = True  # nothing ran: neither the claim's lock nor the work dir stays behind
            shutil.rmtree(self.work_root / cell.key, ignore_errors=True)
            raise
        finally:
            claim.release(remove=cached or stopped)
        return True

    def time_left(self, outcomes: dict[str, Outcome]) -> str:
        """', about H:MM:SS left' at the start of a cell (its own included), from the cells timed so far
        (this process's and, read from the cache, the other processes'); '' before any is timed."""
        timed, pending, counted = {}, [], set()
        for cell in self.plan.cells:
            outcome = outcomes.get(cell.key) or known_outcome(self.cache, cell, self.shared)
            if outcome is None:
                twins = {twin.key for twin in self.shared.twins(cell)} if self.shared else set()
                if not twins & counted:  # one training serves the cell and its twins (tables.shared_training)
                    pending.append(cell)
                counted.add(cell.key)
            elif outcome.elapsed_s and not outcome.shared_from:
                # CPU time where smaller: a pause (SIGSTOP) inflates the wall time, not it
                timed[cell] = min(outcome.elapsed_s, outcome.cpu_s or outcome.elapsed_s)
        left = seconds_left(pending, timed, table_jobs())
        return "" if left is None else f", about {tqdm.format_interval(left)} left"

    def run(self, cell: Cell) -> Outcome:
        return train_cell(
            cell, self.plan.spec.metric, self.cache, self.runner, self.work_root, self.log_root,
            self.runner_options, self.bar.write, self.plan.spec.name,
        )  # fmt: skip


def train_cell(
    cell: Cell,
    metric: str,
    cache: Cache,
    runner: Runner,
    work_root: Path,
    log_root: Path | None,
    runner_options: Mapping[str, Any],
    say: Callable[[str], Any],
    table: str,
    record: Mapping[str, Any] | None = None,
) -> Outcome:
    """Train one cell in its work dir and cache it; the same wherever it runs (this process, a Slurm job:
    tables.slurm_job). The caller holds the cell's claim. `say` prints a line beside the progress bar;
    `record`: where it ran (the executor and its resources), kept in the cache entry, not its key."""
    work_dir = work_root / cell.key
    start, cpu_start = time.perf_counter(), time.process_time()
    log = _cell_log(log_root, cell)
    try:
        with log as stream, contextlib.redirect_stdout(stream or sys.stdout), _warnings_to(stream):
            raw = runner(**cell.spec.run_arguments(), work_dir=str(work_dir), **runner_options)
        result = result_dict(raw)
        if not result.get("diverged") and result.get(metric) is None:
            raise ValueError(f"the run finished without a {metric!r} and did not diverge")
    except DatasetNotFoundError:
        raise  # the same for every cell of the table: it stops before writing (one line, exit 2)
    except NonFiniteError as err:
        # A divergence that escaped the task: a result like any other, cached.
        result = {"diverged": True, metric: None, "note": f"runner raised {one_line(err)}"}
    except Exception as err:  # noqa: BLE001 - reported per cell; the table goes on
        work_dir.mkdir(parents=True, exist_ok=True)
        (work_dir / "error.txt").write_text(traceback.format_exc())
        where = work_dir if log_root is None else f"{work_dir} and {log_root / cell.key}.log"
        say(f"{table}: {cell.describe()} failed: {one_line(err)} (see {where})")
        return Outcome(error=one_line(err))
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    how = ran_with()
    path = cache.store(cell, result, elapsed, how, cpu, record)
    shutil.rmtree(work_dir, ignore_errors=True)
    if result.get("skipped_samples"):  # --skip-bad-samples: never silent
        n = len(result["skipped_samples"])
        say(f"{table}: {cell.describe()} skipped {n} bad samples (listed in {path})")
    return Outcome(result=result, elapsed_s=elapsed, ran_with=how, cpu_s=cpu)


def cell_executor(executor: str | Any, resources: Mapping[str, Any] | None, device: str | None = None) -> Any:
    """None for local processes, the Slurm executor for "slurm" (DESIGN seam 6), an object as given. A
    Slurm job trains on `device` (tasks.device_choice), chosen where it runs."""
    if executor in (None, "local"):
        return None
    if executor == "slurm":
        from tables.slurm_executor import SlurmCells, SlurmQueue
        from tables.slurm_resources import slurm_resources

        resources = dict(resources) if resources is not None else slurm_resources()
        cells_per_job = int(resources.pop("cells_per_job", 1))  # the executor's, not sbatch's
        return SlurmCells(SlurmQueue(resources), cells_per_job=cells_per_job, device=device)
    if isinstance(executor, str):
        raise ValueError(f"unknown executor {executor!r}; choose from local, slurm")
    return executor


def cached_outcome(entry: Mapping[str, Any]) -> Outcome:
    return Outcome(
        result=entry["result"],
        cached=True,
        elapsed_s=entry.get("elapsed_s"),
        ran_with=entry.get("ran_with"),
        cpu_s=entry.get("cpu_s"),
    )


def known_outcome(cache: Cache, cell: Cell, shared: SharedTraining | None) -> Outcome | None:
    """The cell's cached outcome, else its twin's scored as the cell's (no time of its own), else None."""
    entry = cache.load(cell)
    if entry is not None:
        return cached_outcome(entry)
    found = shared.from_cache(cache, cell) if shared else None
    if found is None:
        return None
    twin, entry = found
    return Outcome(
        result=entry["result"], cached=True, elapsed_s=0.0, ran_with=entry.get("ran_with"), cpu_s=0.0,
        shared_from=twin.key,
    )  # fmt: skip


def _cell_log(log_root: Path | None, cell: Cell) -> contextlib.AbstractContextManager:
    """The file a cell's stdout goes to (a fresh one per attempt), or a no-op when logging to the terminal."""
    if log_root is None:
        return contextlib.nullcontext(None)
    log_root.mkdir(parents=True, exist_ok=True)
    return open(log_root / f"{cell.key}.log", "w", buffering=1)


@contextlib.contextmanager
def _warnings_to(stream):
    """Warnings raised during a cell go to its log with its stdout (libraries warn on every run, which
    cluttered the progress bar); stream None leaves them on the terminal."""
    with warnings.catch_warnings():
        if stream is not None:
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: (
                stream.write(warnings.formatwarning(message, category, filename, lineno, line))
            )
        yield


def generate(
    spec: Spec | str,
    *,
    profile: str = "embedded",
    seeds: int | None = None,
    data_root: str | os.PathLike | None = None,
    results_dir: str | os.PathLike = "results",
    cache_dir: str | os.PathLike | None = None,
    runner: Runner | None = None,
    recipe_version: str | None = None,
    progress: bool = True,
    command: str | None = None,
    verbose: bool = False,
    skip_bad_samples: bool = False,
    cached_only: bool = False,
    compiled: bool = False,
    shared: SharedTraining | None = None,
    executor: str | Any = "local",
    slurm_resources: Mapping[str, Any] | None = None,
) -> Generated:
    """Run the missing cells of one table and write results/<name>.md, .csv and .meta.json.

    With `runner=None` the spec's task runs the cells and its RECIPE_VERSION and kernels.NUMERICS join the
    cache key; an injected runner uses `recipe_version` as given. `skip_bad_samples` lets the cells skip
    unreadable samples (each cell's result lists them; the cell keys do not change). `cached_only`
    writes the table from the cache alone (e.g. while another process is still running its cells).
    `compiled`: every cell trains under torch.compile (MMEngine's compile=True); its arithmetic differs
    from eager in the stochastic-rounding stream, so the cells' numerics (and keys) name it. `shared`:
    which cells train one run (tables.shared_training); by default the task's, none for an injected runner.
    `executor`: "local" trains the cells in this process; "slurm" hands each to a Slurm job with
    `slurm_resources` (tables.slurm_resources) and waits for them (tables.slurm_executor); or an executor
    object (tests). Where a cell trained changes neither its key nor its cache entry's result.
    """
    from tables import render

    if isinstance(spec, str):
        spec = get_spec(spec)
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose from {', '.join(PROFILES)}")
    seed_list = resolve_seeds(profile, seeds, spec)
    results_dir = Path(results_dir)
    cache = Cache(Path(cache_dir) if cache_dir else results_dir / "cache")

    runnable = any(row_blocker(r) is None for r in spec.rows)
    numerics = None
    model_versions: dict[str, str] = {}
    if runner is None and runnable:
        runner, recipe_version = load_task_runner(spec.task)
        model_versions = model_recipe_versions(spec.task)
        numerics = kernels.NUMERICS
        shared = shared or SharedTraining.of_task(spec.task)
    if compiled:
        from kernels.traceable import NOISE_STREAM

        numerics = f"{numerics or kernels.NUMERICS}+compiled:{NOISE_STREAM}"
    cells_executor = cell_executor(executor, slurm_resources)
    ranks = getattr(cells_executor, "ranks_per_cell", 1)
    if ranks > 1:  # one data-parallel run of several ranks, each its share of the batch: other arithmetic
        numerics = f"{numerics or kernels.NUMERICS}+ranks:{ranks}"
    plan = make_plan(spec, profile, seed_list, data_root, recipe_version, numerics, model_versions)
    log_root = None if verbose else results_dir / "logs"
    options = {"skip_bad_samples": True} if skip_bad_samples else {}
    if compiled:
        options["cfg_options"] = {"compile": True}
    start = time.perf_counter()
    outcomes = run_cells(
        plan, cache, runner, results_dir / "work", progress, log_root, options, cached_only, shared,
        cells_executor,
    )  # fmt: skip
    wall = time.perf_counter() - start

    frame, meta = render.summarize(plan, outcomes)
    meta["wall_seconds"] = round(wall, 1)
    meta["command"] = command or f"repro table {spec.name} --profile {profile} --seeds {len(seed_list)}"
    markdown = render.markdown(frame, meta)
    paths = render.write(results_dir, spec.name, frame, markdown, meta)
    ran = sum(1 for o in outcomes.values() if not o.cached)
    return Generated(
        spec=spec,
        plan=plan,
        outcomes=outcomes,
        frame=frame,
        markdown=markdown,
        meta=meta,
        paths=paths,
        ran=ran,
        cached=sum(1 for o in outcomes.values() if o.cached),
        errors=sum(1 for o in outcomes.values() if o.error),
    )
