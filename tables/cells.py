"""Cells: the unit of work and of caching.

A cell is one training run: (task, model, method, method options, seed, profile, paper dataset, data
root), plus the task's recipe version when it exposes one. FP32 baselines are cells too, shared by
every row of the same model and dataset. Each finished cell is one JSON file named by a hash of its
full configuration, written atomically (atomic_files), so a killed run loses nothing
and a rerun recomputes nothing. A process runs a cell only while it holds the cell's claim (CellClaim),
so that two table runs on one results directory never run the same cell at once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from atomic_files import write_file
from repro.methods import METHODS
from repro.methods.options import typed_options
from tables.spec import Row
from tasks.run_spec import RunSpec

SCHEMA = 1


def normalize_options(method: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options a run will use: the method's defaults overlaid with the row's, sorted by name.

    Each known option is typed as the method types it (repro.methods.options: k=1 and k=1.0 are the
    same cell; a value of the wrong type is a ValueError naming it). For a method not in the registry,
    and for options it does not know (row_blocker reports those), the values are kept as given.
    """
    cls = METHODS.get(method)
    if cls is None:
        return {k: options[k] for k in sorted(options)}
    known = {k: v for k, v in options.items() if k in cls.defaults}
    merged = {**cls.defaults, **options, **typed_options(method, cls.defaults, known)}
    return {k: merged[k] for k in sorted(merged)}


def row_blocker(row: Row) -> str | None:
    """Why this row cannot run today (the `not implemented` reason), or None if it can."""
    if row.not_implemented:
        return row.not_implemented
    cls = METHODS.get(row.method)
    if cls is None:
        return f"method {row.method!r} is not in the registry yet"
    unknown = sorted(set(row.options) - set(cls.defaults))
    if unknown:
        return f"method {row.method!r} has no option {', '.join(unknown)}"
    return None


@dataclass(frozen=True)
class Cell:
    task: str
    model: str
    method: str
    options_json: str  # the normalized options, canonical JSON (keeps the dataclass hashable)
    seed: int
    profile: str
    paper_dataset: str
    data_root: str | None
    recipe_version: str | None
    # the backends' arithmetic (kernels.NUMERICS): a new stochastic-rounding stream makes new cells; None
    # (cells made before it existed, tests' injected runners) leaves it out of the key
    numerics: str | None = None

    @classmethod
    def make(
        cls,
        *,
        task: str,
        model: str,
        method: str,
        options: Mapping[str, Any],
        seed: int,
        profile: str,
        paper_dataset: str,
        data_root: str | os.PathLike | None,
        recipe_version: str | None,
        numerics: str | None = None,
    ) -> Cell:
        root = str(Path(data_root).expanduser().resolve()) if data_root else None
        opts = json.dumps(normalize_options(method, options), sort_keys=True)
        recipe = None if recipe_version is None else str(recipe_version)
        num = None if numerics is None else str(numerics)
        return cls(task, model, method, opts, int(seed), profile, paper_dataset, root, recipe, num)

    @property
    def options(self) -> dict[str, Any]:
        return json.loads(self.options_json)

    @property
    def spec(self) -> RunSpec:
        """The run this cell trains."""
        return RunSpec(
            self.task, self.model, self.method, self.profile, self.paper_dataset, self.seed, self.options,
            self.data_root,
        )  # fmt: skip

    def config(self) -> dict[str, Any]:
        """The full configuration, as stored in the cache file and hashed into its name."""
        cfg = asdict(self)
        cfg["method_options"] = json.loads(cfg.pop("options_json"))
        if cfg["numerics"] is None:
            del cfg["numerics"]
        return cfg

    @property
    def key(self) -> str:
        canonical = json.dumps(self.config(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:32]

    def describe(self) -> str:
        """Short, for the progress bar: only the options that differ from the method's defaults."""
        defaults = METHODS[self.method].defaults if self.method in METHODS else {}
        opts = ",".join(f"{k}={v}" for k, v in self.options.items() if defaults.get(k, object()) != v)
        return f"{self.model}/{self.method}" + (f"[{opts}]" if opts else "") + f" seed {self.seed}"


class Cache:
    """One JSON file per finished cell under `root`."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, cell: Cell) -> Path:
        return self.root / f"{cell.key}.json"

    def load(self, cell: Cell) -> dict[str, Any] | None:
        """The cached entry ({"cell", "result", ...}) or None. A file that cannot be read as this cell's
        entry is named in one warning line and moved aside (kept for a person to look at), and the cell
        counts as missing, so it is trained again."""
        path = self.path(cell)
        try:
            entry = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            return self._set_aside(path, f"unreadable ({type(err).__name__}: {str(err)[:80]})")
        if not isinstance(entry, dict) or not isinstance(entry.get("result"), dict):
            return self._set_aside(path, "not a cell entry (no result)")
        if entry.get("schema") != SCHEMA:
            return self._set_aside(path, f"of schema {entry.get('schema')!r}, this code reads {SCHEMA}")
        if entry.get("cell") != cell.config():
            return self._set_aside(path, "of another configuration than its name says")
        return entry

    @staticmethod
    def _set_aside(path: Path, why: str) -> None:
        aside = path.with_name(f"{path.name}.bad-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.rename(path, aside)
        except FileNotFoundError:
            return None  # another process sharing this cache moved it aside first, and said so
        tqdm.write(
            f"warning: cache entry {path} is {why}: moved to {aside.name}; its cell will be trained again",
            file=sys.stderr,
        )
        return None

    def store(
        self,
        cell: Cell,
        result: Mapping[str, Any],
        elapsed_s: float,
        ran_with: Mapping[str, int] | None = None,
        cpu_s: float | None = None,
        executor: Mapping[str, Any] | None = None,
    ) -> Path:
        """ran_with: how the machine was shared while the cell ran (tables.generate.ran_with); cpu_s:
        the process's CPU time over the cell; executor: where it ran (a Slurm job: its id, node and
        resources), a record beside the result that is no part of the cell's key."""
        entry = {
            "schema": SCHEMA,
            "key": cell.key,
            "cell": cell.config(),
            "result": dict(result),
            "elapsed_s": round(float(elapsed_s), 3),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if ran_with is not None:
            entry["ran_with"] = dict(ran_with)
        if cpu_s is not None:
            entry["cpu_s"] = round(float(cpu_s), 3)
        if executor is not None:
            entry["executor"] = dict(executor)
        text = json.dumps(_finite(entry), indent=1, sort_keys=True, default=_jsonable, allow_nan=False)
        self.root.mkdir(parents=True, exist_ok=True)
        return write_file(self.path(cell), text)


def _finite(value: Any) -> Any:
    """Strict JSON: NaN and infinities (a diverged run's loss) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _jsonable(value: Any) -> Any:
    """Fallback for values json cannot write (numpy/torch scalars, paths)."""
    if hasattr(value, "item"):
        return _finite(value.item())
    return str(value)


class Claim:
    """This process's claim on one piece of work (a cell, a figure run): an exclusive lock (flock) on a
    lock file. The kernel drops it when the process ends, however it ends, so a killed run never keeps
    the work from others."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._fd: int | None = None

    def acquire(self, wait: bool = False) -> bool:
        """Take the claim: False at once if another process holds it (wait=False), else when it is free."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for a person looking
        self._fd = fd
        return True

    def release(self, remove: bool = False) -> None:
        """Drop the claim; `remove` (only once the work is done and kept) deletes the lock file too. Safe:
        a process that still locks the removed file, or a new one, finds the work done."""
        if self._fd is not None:
            if remove:
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


class CellClaim(Claim):
    """A cell's claim: <root>/<key>.lock."""

    def __init__(self, root: str | os.PathLike, cell: Cell):
        super().__init__(Path(root) / f"{cell.key}.lock")
