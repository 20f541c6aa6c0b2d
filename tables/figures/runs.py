"""The trainings the figures draw from, each trained once with the statistics recorder attached and
cached under <results>/figures/runs/, shared by every figure that needs it.

A run is a table cell's configuration (task, model, method and options, seed, profile, paper dataset:
the same recipe) with a StatsRecorderHook (repro.hooks) added, which changes nothing in the training
(tests/test_recorder.py), so its final top-1 is the cell's; a few are named variants of a cell (a lower
learning rate for UI8 Figure 4b, a smaller batch for WAGEUBN Figure 8). The cached run is a folder
written whole or not at all (atomic_files): result.json (the RunResult and how the run was made),
records.json (the recorder's records and the curves) and samples.npz. The tables' own cache is not
written: the recorder's work falls inside the timed training steps, so the run's ms/iter is not a cell's.
A process trains a run only while it holds the run's claim (tables.cells.Claim, <folder>.lock), so
processes on one results directory (`make figures JOBS=2`) share the runs out, as the tables' cells.
A run trains in results/figures/work/<run> (its checkpoints, and in them what it has recorded) until its
folder is written: a killed run resumes where its last checkpoint left it. With an executor (`repro figure
--executor slurm`: tables.slurm_executor) each pending run is a Slurm job that trains it the same way
(train_claimed, in tables.slurm_job.FigureRunJob), its folder recording the job.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import sys
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

import kernels
from atomic_files import write_folder
from kernels.bench.devices import describe, label
from repro.recorder import load
from tables import provenance
from tables.cells import Claim, normalize_options
from tables.figures.run_order import estimated_work, longest_first
from tables.generate import table_jobs
from tables.render import describe_dataset
from tables.time_left import seconds_left_by_work
from tasks import classification, recipe_version

SCHEMA = 1
SMOKE_TIMES, SMOKE_EVALS = 3, 1


@dataclass(frozen=True)
class RunSpec:
    """One recorded training. `recorder`: StatsRecorderHook arguments (`times` recorded iterations spread
    over the run; layers are module names of the classifier, whose network is its `net`); `evals`:
    validations spread over the run besides the last; `lr_factor` / `batch_factor` scale the recipe's
    learning rate / batch size."""

    name: str
    model: str
    method: str
    paper_dataset: str
    options: Mapping[str, Any] = field(default_factory=dict)
    recorder: Mapping[str, Any] = field(default_factory=lambda: {"times": 0})
    evals: int = 0
    lr_factor: float = 1.0
    batch_factor: float = 1.0
    seed: int = 0

    def recipe(self, profile: str) -> dict[str, Any]:
        return classification.recipe(self.model, profile, self.paper_dataset)

    def cfg_options(self, profile: str) -> dict[str, Any]:
        r = self.recipe(profile)
        out: dict[str, Any] = {}
        if self.lr_factor != 1.0:
            out["optim_wrapper"] = {"optimizer": {"lr": r["lr"] * self.lr_factor}}
        if self.batch_factor != 1.0:
            out["train_dataloader"] = {"batch_size": batch_size(r["batch_size"], self.batch_factor)}
        return out

    def hook(self, profile: str) -> dict[str, Any]:
        """The StatsRecorderHook config; the smoke profile (the tests) records at most SMOKE_TIMES
        iterations and evaluates at most SMOKE_EVALS times besides the run's last validation."""
        hook = {"type": "StatsRecorderHook", "eval_times": self.evals, **self.recorder}
        if profile == "smoke":
            hook["eval_times"] = min(hook["eval_times"], SMOKE_EVALS)
            hook["times"] = min(hook.get("times", 0), SMOKE_TIMES)
        return hook

    def key(self, profile: str, data_root: str | None) -> str:
        """A hash of what the run is (not of its name): two specs that train the same way share a run."""
        config = {
            "schema": SCHEMA,
            "model": self.model,
            "method": self.method,
            "options": normalize_options(self.method, self.options),
            "paper_dataset": self.paper_dataset,
            "seed": self.seed,
            "hook": self.hook(profile),
            "cfg_options": self.cfg_options(profile),
            "profile": profile,
            "data_root": data_root,
            "recipe_version": recipe_version(classification, self.model),  # ResNet-50 has its own
            "numerics": kernels.NUMERICS,
        }
        return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:12]


def batch_size(base: int, factor: float) -> int:
    # at least 2: batch norm needs two values per channel where a feature map is 1x1
    return max(2, round(base * factor))


def _layers(*names: str) -> list[str]:
    return [f"net.{n}" for n in names]


def mobilenet_v2_conv(block: int, conv: int) -> str:
    """torchvision's module name of UI8's "layer<block> conv<conv>" of MobileNetV2 (UI8 Table 1, Figure
    3): blocks counted from 0, each conv1 (1x1 expansion), conv2 (3x3 depthwise), conv3 (1x1 projection);
    torchvision's block 0 has no expansion (its conv1 is None)."""
    if block == 0:
        return {2: "features.1.conv.0.0", 3: "features.1.conv.1"}[conv]
    return f"features.{block + 1}.conv." + {1: "0.0", 2: "1.0", 3: "2"}[conv]


MOBILENET_DEPTHS = (0, 4, 8, 12, 16)  # UI8 Figure 3(c): conv3 of these blocks
MOBILENET_BLOCK = 8  # UI8 Table 1's layer8, and Figure 3(a), (b), (d)
MOBILENET_LAYERS = tuple(
    dict.fromkeys(
        [mobilenet_v2_conv(b, 3) for b in MOBILENET_DEPTHS]
        + [mobilenet_v2_conv(MOBILENET_BLOCK, c) for c in (1, 2, 3)]
    )
)
# ResNet-50's conv6, 21, 34 and 46 (DAIQ Figure 1), its Conv2d layers counted from 1 in module order
RESNET50_FIGURE1 = {6: "layer1.1.conv1", 21: "layer2.2.conv3", 34: "layer3.2.conv3", 46: "layer4.0.conv3"}
RESNET18_LAYER = "layer2.0.conv1"  # DAIQ Figure 3's "a convolution layer in ResNet-18"
WAGEUBN_BLOCK = ("layer2.0.conv1", "layer2.0.bn1", "layer2.0.relu")  # WAGEUBN Figure 7
_NO_CLIP = {"clip": False, "lr_scaling": False, "period": 1}  # UI8 Table 3's "No clipping" cell
_SCALING = {"clip": False, "lr_scaling": True, "period": 1}  # UI8 Table 4's alpha=20, beta=0.1 cell
_ALL_G = {"layers": None, "paths": ["G"], "times": 24, "sample_size": 256}
_CURVES = 12  # validations over a run whose curves are drawn


def _mobilenet(name: str, **kw: Any) -> RunSpec:
    """MobileNetV2 on CIFAR-10 (its stand-in), as UI8's ablations (section 4.1) and Figures 2 to 6."""
    return RunSpec(f"ui8-mobilenet-{name}", "mobilenet_v2", kw.pop("method", "ui8"), "cifar10", **kw)


def _imagenet(name: str, model: str, method: str, **kw: Any) -> RunSpec:
    return RunSpec(name, model, method, "imagenet", **kw)


_MOBILENET_FP32 = {
    "layers": _layers(*MOBILENET_LAYERS),
    "paths": ["A", "W", "G"],
    "times": 12,
    "ks": ["G", "W"],
    "clip_curve": True,
}
_RESNET50_SLICES = {
    "layers": _layers(*RESNET50_FIGURE1.values()),
    "paths": ["G"],
    "times": 4,
    "slices": 8,
    "sample_size": 1024,
}
_RESNET18_ERRORS = {"layers": _layers(RESNET18_LAYER), "paths": ["G"], "times": 30, "dn": True}
# WAGEUBN: every quantized conv (e_l3 for Figures 9 and 10) and one block's BN and ReLU (Figure 7)
_WAGEUBN_ALL = {
    "layers": _layers("layer*.conv*", "layer*.downsample.0", *WAGEUBN_BLOCK[1:]),
    "paths": ["A", "W", "G", "GW", "BN", "E1"],
    "times": 4,
    "sample_size": 2048,
    "compare": ["shift8", "flag8"],
}
_WAGEUBN_FIRST = {"layers": _layers("layer1.0.conv1"), "paths": ["G"], "times": 4, "sample_size": 2048}
BATCH_FACTORS = (1.0, 0.5, 0.25, 0.125)  # WAGEUBN Figure 8: batch 128, 64, 32, 16 in the paper

# UI8 Figure 4b's learning-rate settings, each also trained at these seeds (final top-1 only: no recorder,
# no curve), so that its claim compares the settings with the seeds' spread, not one run each
ETA_RUNS = ("exponential", "noclip-lr0.1", "noclip-lr0.5", "noclip")
EXTRA_SEEDS = (1, 2)


def seeded(name: str, seed: int) -> str:
    """The name of run `name` trained at another seed."""
    return f"{name}-seed{seed}"


RUNS: dict[str, RunSpec] = {
    spec.name: spec
    for spec in (
        _mobilenet("fp32", method="fp32", evals=_CURVES, recorder=_MOBILENET_FP32),
        _mobilenet("noclip", options=_NO_CLIP, evals=_CURVES, recorder=_ALL_G),
        _mobilenet("ui8", evals=_CURVES, recorder=_ALL_G),
        _mobilenet("exponential", options=_SCALING, evals=_CURVES),
        _mobilenet("linear", options={**_SCALING, "lr_form": "linear"}, evals=_CURVES),
        _mobilenet("quadratic", options={**_SCALING, "lr_form": "quadratic"}, evals=_CURVES),
        _mobilenet("noclip-lr0.1", options=_NO_CLIP, lr_factor=0.1, evals=_CURVES),
        _mobilenet("noclip-lr0.5", options=_NO_CLIP, lr_factor=0.5, evals=_CURVES),
        *(_imagenet(f"{m}-fp32", m, "fp32", evals=_CURVES) for m in ("resnet18", "resnet34", "resnet50")),
        _imagenet("resnet50-ui8", "resnet50", "ui8", evals=_CURVES),
        _imagenet("resnet50-daiq", "resnet50", "daiq", recorder=_RESNET50_SLICES),
        *(
            _imagenet(f"resnet18-{m}", "resnet18", m, recorder=_RESNET18_ERRORS)
            for m in ("gq", "daiq-gvq", "daiq-mcs")
        ),
        _imagenet("resnet18-wageubn", "resnet18", "wageubn", evals=_CURVES, recorder=_WAGEUBN_ALL),
        _imagenet(
            "resnet18-wageubn-shift8",
            "resnet18",
            "wageubn",
            options={"e2": "shift8"},
            evals=_CURVES,
            recorder=_WAGEUBN_FIRST,
        ),
        _imagenet("resnet18-wageubn-e2-16", "resnet18", "wageubn-e2-16", evals=_CURVES),
        *(
            _imagenet(f"{m}-{method}", m, method, evals=_CURVES)
            for m in ("resnet34", "resnet50")
            for method in ("wageubn", "wageubn-e2-16")
        ),
        *(
            _imagenet(f"resnet18-{method}-batch{f:g}", "resnet18", method, batch_factor=f)
            for method in ("fp32", "wageubn")
            for f in BATCH_FACTORS[1:]
        ),
    )
}


RUNS.update(
    (
        seeded(spec.name, seed),
        replace(spec, name=seeded(spec.name, seed), seed=seed, evals=0, recorder={"times": 0}),
    )
    for spec in (RUNS[f"ui8-mobilenet-{eta}"] for eta in ETA_RUNS)
    for seed in EXTRA_SEEDS
)


@dataclass
class RecordedRun:
    """A finished run: its spec, profile, RunResult (as a dict), the recorder's records and samples, the
    curves, and how it was made (device, data, elapsed time)."""

    spec: RunSpec
    profile: str
    result: dict[str, Any]
    meta: dict[str, Any]
    records: list[dict[str, Any]]
    samples: dict[str, np.ndarray]
    curves: dict[str, Any]
    config: dict[str, Any]

    def find(self, path: str, layer: str | None = None, iteration: int | None = None, call: int = 0):
        """The records of `path` (and `layer`, bare or with "net.", and `iteration`) in order."""
        full = None if layer is None else layer if layer.startswith("net.") else f"net.{layer}"
        return [
            r
            for r in self.records
            if r["path"] == path
            and (full is None or r["layer"] == full)
            and (iteration is None or r["iteration"] == iteration)
            and r.get("call", 0) == call
        ]

    def sample(self, record: dict[str, Any], side: str = "float") -> np.ndarray:
        return self.samples[f"{record['sample']['key']}|{side}"]

    @property
    def iterations(self) -> list[int]:
        return sorted({r["iteration"] for r in self.records})

    @property
    def data(self) -> str:
        return describe_dataset(self.result["dataset"], self.spec.paper_dataset, self.profile)

    @property
    def diverged(self) -> bool:
        return bool(self.result.get("diverged"))

    def describe(self) -> str:
        """One line: model, method (and options that differ from the defaults), data, profile."""
        opts = ", ".join(f"{k}={v}" for k, v in self.spec.options.items())
        extra = [f"lr x{self.spec.lr_factor:g}"] if self.spec.lr_factor != 1 else []
        if self.spec.batch_factor != 1:
            extra.append(f"batch {self.meta['batch_size']}")
        what = ", ".join(x for x in (opts, *extra) if x)
        return f"{self.spec.model} {self.spec.method}{f' ({what})' if what else ''}"


def run_folder(root: Path, spec: RunSpec, profile: str, data_root: str | None) -> Path:
    return root / f"{spec.model}-{spec.method}-{profile}-{spec.key(profile, data_root)}"


def ensure(
    names: Iterable[str],
    profile: str,
    results_dir: str | Path,
    data_root: str | None = None,
    progress: bool = True,
    verbose: bool = False,
    executor: Any = None,
) -> dict[str, RecordedRun]:
    """The runs `names` at `profile`, training (one after another, the longest first) those not cached yet;
    `executor` (tables.slurm_executor.SlurmCells) trains each as a Slurm job instead, all at once."""
    root = Path(results_dir) / "figures" / "runs"
    names = list(dict.fromkeys(names))
    unknown = [n for n in names if n not in RUNS]
    if unknown:
        raise ValueError(f"unknown figure run {unknown[0]!r}; known: {', '.join(RUNS)}")
    folders = {n: run_folder(root, RUNS[n], profile, data_root) for n in names}
    todo: dict[Path, str] = {}  # one training per folder: two names may train the same way
    for n in names:
        if not (folders[n] / "result.json").exists():
            todo.setdefault(folders[n], n)
    todo = longest_first(todo.values(), RUNS, profile)  # a long run taken last leaves one process alone
    bar = tqdm(
        total=len(names),
        initial=len(names) - len(todo),
        desc="figure runs",
        unit="run",
        disable=not progress or not todo,
        file=sys.stderr,
        dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]",  # the time left is the postfix's
    )
    trains = {f: n for n, f in reversed(folders.items())}  # one name a folder

    def postfix(name: str) -> str:
        # reads every recorded run's result: only for a bar that shows it
        return name if bar.disable else name + time_left(trains, profile)

    try:
        if executor is not None:
            _on_executor(executor, [FigureRun(n, folders[n]) for n in todo], profile, data_root, results_dir,
                         verbose, bar)  # fmt: skip
            todo = []
        # first the runs no other process is training, then (waiting for each claim) those it was
        deferred = [n for n in todo if not _train_claimed(n, folders[n], profile, data_root, results_dir,
                                                          verbose, bar, postfix, wait=False)]  # fmt: skip
        for name in deferred:
            _train_claimed(
                name, folders[name], profile, data_root, results_dir, verbose, bar, postfix, wait=True
            )
    finally:
        bar.close()
    return {n: read(root, RUNS[n], profile, data_root) for n in names}


def time_left(trains: dict[Path, str], profile: str) -> str:
    """', about H:MM:SS left' for the runs not yet recorded (the one starting included), from the recorded
    runs' times (tables.time_left); '' before any is recorded."""
    pending, timed = [], []
    for folder, name in trains.items():
        work = estimated_work(RUNS[name], profile)
        result = folder / "result.json"
        if not result.exists():
            pending.append(work)
        elif seconds := json.loads(result.read_text()).get("meta", {}).get("elapsed_s"):
            timed.append((work, seconds))
    left = seconds_left_by_work(pending, timed, table_jobs())
    return "" if left is None else f", about {tqdm.format_interval(left)} left"


def _train_claimed(
    name: str,
    folder: Path,
    profile: str,
    data_root: str | None,
    results_dir,
    verbose: bool,
    bar,
    postfix,
    wait: bool,
) -> bool:
    """Train run `name` under its claim unless another process has it done; False (without waiting)
    when another process holds the claim and `wait` is False."""
    log = None if verbose else run_log(results_dir, name, profile)

    def starting() -> None:
        bar.set_postfix_str(postfix(name), refresh=True)

    if train_claimed(name, folder, profile, data_root, log, wait=wait, starting=starting) is None:
        return False
    bar.update(1)
    return True


@dataclass(frozen=True)
class FigureRun:
    """A run to train as a Slurm job: its job is named after its folder (tables.slurm_executor.job_name)."""

    name: str
    folder: Path

    @property
    def key(self) -> str:
        return self.folder.name

    def describe(self) -> str:
        return f"figure run {self.name}"


def _on_executor(executor, todo: list[FigureRun], profile: str, data_root, results_dir, verbose: bool, bar):
    """Each run of `todo` as one job of `executor` (tables.slurm_executor: re-attached to a live job of an
    earlier parent, never submitted twice); once all have ended, a RuntimeError names each run whose job
    ended without it (the job's id and the tail of its stderr)."""
    from tables.slurm_executor import claimed_elsewhere, results_scope
    from tables.slurm_job import FigureRunJob

    failures: dict[str, str] = {}
    resources = dict(getattr(executor.queue, "resources", {}))

    def job(runs: list[FigureRun]) -> FigureRunJob:
        (run,) = runs  # one run a job
        log = None if verbose else str(run_log(results_dir, run.name, profile).resolve())
        return FigureRunJob(run.name, profile, str(run.folder.resolve()), data_root, log, resources=resources,
                            device=executor.device)  # fmt: skip

    def failed(run: FigureRun, error: str) -> None:
        failures[run.name] = error
        bar.write(f"{run.describe()} failed: {error}", file=sys.stderr)

    root = Path(results_dir) / "figures"
    executor.run_jobs(
        todo, job=job, done=lambda run, ran: (run.folder / "result.json").exists(), failed=failed,
        held=lambda run, fresh: claimed_elsewhere(Claim(run.folder.parent / f"{run.folder.name}.lock")),
        bar=bar, jobs_root=root / "slurm", scope=results_scope(root / "runs"),
    )  # fmt: skip
    if failures:
        raise RuntimeError("; ".join(f"figure run {name}: {error}" for name, error in failures.items()))


def run_log(results_dir, name: str, profile: str) -> Path:
    """Where run `name`'s training log goes (its stdout and warnings)."""
    return Path(results_dir) / "figures" / "logs" / f"{name}-{profile}.log"


def train_claimed(
    name: str,
    folder: Path,
    profile: str,
    data_root: str | None,
    log: Path | None,
    record: Mapping[str, Any] | None = None,
    trainer=None,
    wait: bool = True,
    starting=None,
) -> bool | None:
    """Train run `name` into `folder` under its claim, here or in a Slurm job (tables.slurm_job), unless it
    is written by then: True trained, False found written, None another process holds the claim and `wait`
    is False. `record`: where it trained (a Slurm job's), kept in its result; `trainer` stands in for
    train (tests); `starting()` is called before it trains."""
    claim = Claim(folder.parent / f"{folder.name}.lock")
    if not claim.acquire(wait=wait):
        return None
    try:
        if (folder / "result.json").exists():  # another process may have trained it meanwhile
            return False
        if starting is not None:
            starting()
        where = {"record": record} if record else {}  # a local run's train call as before
        (trainer or train)(RUNS[name], profile, folder, data_root, log, **where)
        return True
    finally:
        claim.release(remove=(folder / "result.json").exists())


def work_dir(folder: Path) -> Path:
    """Where a run trains: results/figures/work/<run>, kept until its folder is written, so that a killed
    run resumes from its checkpoints there (its recorded statistics and curves in them too)."""
    return folder.parent.parent / "work" / folder.name


def train(
    spec: RunSpec,
    profile: str,
    folder: Path,
    data_root: str | None,
    log: Path | None,
    record: Mapping[str, Any] | None = None,
) -> None:
    """Train `spec` with the recorder attached and write its folder (atomically). `elapsed_s` is this
    process's part of the run: a resumed run's counts from its resumption. `record`: where it trained (a
    Slurm job: its id, node, resources), kept in its meta as "executor"."""
    start = time.perf_counter()
    work = work_dir(folder)
    out = work / "stats"
    hook = {**spec.hook(profile), "out": str(out)}
    cfg_options = {**spec.cfg_options(profile), "default_hooks": {"stats": hook}}
    with _logged(log, append=(work / "run").exists()):  # a resumed run's log goes on
        result = classification.run(
            spec.model,
            spec.method,
            profile=profile,
            seed=spec.seed,
            method_options=dict(spec.options),
            paper_dataset=spec.paper_dataset,
            data_root=data_root,
            work_dir=str(work / "run"),
            cfg_options=cfg_options,
        )
    recipe = spec.recipe(profile)
    meta = {
        "spec": asdict(spec),
        "profile": profile,
        "device": label(describe(torch.device("cpu"))),
        "batch_size": batch_size(recipe["batch_size"], spec.batch_factor),
        "lr": recipe["lr"] * spec.lr_factor,
        "elapsed_s": round(time.perf_counter() - start, 1),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "trained_at": provenance.as_dict(),
        **({"executor": dict(record)} if record else {}),
    }
    body = {"result": result.to_dict(), "meta": meta}

    def fill(tmp: Path) -> None:
        for name in ("records.json", "samples.npz"):
            shutil.copy(out / name, tmp / name)
        (tmp / "result.json").write_text(json.dumps(body, indent=1, default=str))

    if folder.exists() and not (folder / "result.json").exists():
        shutil.rmtree(folder)  # a folder without its result is not ours to trust
    write_folder(folder, fill)
    shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def _logged(log: Path | None, append: bool = False):
    """A run's stdout and warnings go to `log` (the progress bar stays readable); None: the terminal."""
    if log is None:
        yield
        return
    log.parent.mkdir(parents=True, exist_ok=True)
    with (
        open(log, "a" if append else "w", buffering=1) as stream,
        contextlib.redirect_stdout(stream),
        warnings.catch_warnings(),
    ):
        warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: stream.write(
            warnings.formatwarning(message, category, filename, lineno, line)
        )
        yield


def read(root: Path, spec: RunSpec, profile: str, data_root: str | None) -> RecordedRun:
    folder = run_folder(root, spec, profile, data_root)
    body = json.loads((folder / "result.json").read_text())
    records, samples = load(folder)
    return RecordedRun(
        spec=spec,
        profile=profile,
        result=body["result"],
        meta=body["meta"],
        records=records["records"],
        samples=samples,
        curves=records["curves"],
        config=records["config"],
    )
