"""Which checkpoint a run resumes from: the newest one of the same run in its work dir.

    identity = run_identity(task="classification", model="resnet18", method="daiq", ...)
    path = checkpoint_to_resume(work_dir, identity)     # None: the run starts afresh

A run's identity is what its result depends on: task, model, method and its typed options, profile,
paper dataset, seed, data root, the cfg_options given, the task's RECIPE_VERSION, kernels.NUMERICS,
the content of a config file given by the user, and the number of ranks. tasks.checkpoints writes it
into every checkpoint. A checkpoint of another identity (or without one, or unreadable) is never
loaded: one line says so, and it is moved into ``<work dir>/other-runs/<time>/`` so that this run
neither loads nor overwrites it. What a run may change and still resume: anything outside its identity,
such as the skip policy for bad samples.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

import repro  # noqa: F401  (registers what mmengine checkpoints pickle with torch's weights_only loader)
from tasks.checkpoints import RUN_KEY

CHECKPOINT_NAME = re.compile(r"^(epoch|iter)_(\d+)\.pth$")
PARTIAL_NAME = re.compile(r"^\.(epoch|iter)_\d+\.pth\.tmp$")  # a kill during tasks.checkpoints' write
OTHER_RUNS = "other-runs"


def run_identity(**fields: Any) -> dict[str, Any]:
    """The identity as plain JSON values (cfg_options' values as their JSON or their str)."""
    return json.loads(json.dumps(fields, sort_keys=True, default=str))


def differences(saved: dict[str, Any] | None, identity: dict[str, Any]) -> list[str]:
    """What differs, as "method ui8 (this run: daiq)"; ["it holds no run identity"] when there is none."""
    if not isinstance(saved, dict):
        return ["it holds no run identity (another program or an older version wrote it)"]
    out = []
    for key in sorted(set(saved) | set(identity)):
        if saved.get(key) != identity.get(key):
            out.append(f"{key} {json.dumps(saved.get(key))} (this run: {json.dumps(identity.get(key))})")
    return out


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """The meta dict of a checkpoint, without reading its tensors into memory."""
    checkpoint = torch.load(path, map_location="cpu", mmap=True)
    return checkpoint.get("meta", {}) if isinstance(checkpoint, dict) else {}


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def checkpoint_to_resume(
    work_dir: str | os.PathLike, identity: dict[str, Any], main_process: bool = True
) -> str | None:
    """The newest checkpoint (by iteration) of this run in work_dir, or None; one line says which. Other
    runs' checkpoints and unreadable ones are moved aside by the main process, one line each; every rank
    decides alike."""
    work = Path(work_dir)
    if not work.is_dir():
        return None
    mine: list[tuple[int, int, str]] = []
    aside: list[tuple[Path, str]] = []
    for path in sorted(work.iterdir()):
        if PARTIAL_NAME.match(path.name) and main_process:
            path.unlink(missing_ok=True)
        if not CHECKPOINT_NAME.match(path.name):
            continue
        try:
            meta = read_meta(path)
        except Exception as err:  # noqa: BLE001 - any failure to read it means it cannot be resumed
            aside.append((path, f"is unreadable ({type(err).__name__}: {str(err).strip()[:120]})"))
            continue
        diff = differences(meta.get(RUN_KEY), identity)
        if diff:
            aside.append((path, f"is a checkpoint of another run: {'; '.join(diff)}"))
        else:
            mine.append((int(meta.get("iter", 0)), int(meta.get("epoch", 0)), str(path)))
    if aside and main_process:
        target = work / OTHER_RUNS / time.strftime("%Y%m%d-%H%M%S")
        target.mkdir(parents=True, exist_ok=True)
        for path, why in aside:
            if path.exists():
                os.replace(path, target / path.name)
            _say(f"repro: {path} {why}: not resumed; moved to {target}/")
        last = work / "last_checkpoint"
        if last.is_file() and Path(last.read_text().strip()).name in {p.name for p, _ in aside}:
            last.unlink()
    if not mine:
        return None
    iteration, epoch, path = max(mine)
    if main_process:
        _say(f"repro: resuming from {path} (after {iteration} iterations, {epoch} epochs done)")
    return path
