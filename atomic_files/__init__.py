"""Atomic writes: a file or a folder appears whole under its name, or not at all.

Each is written under a temporary name in its destination's folder, then renamed into place, so a
killed run leaves neither half a file nor half a dataset behind. Here, on the ground floor, so that
every floor shares one: the compiled-kernel cache, the embedded-data cache (tasks), and the table
cells and outputs (tables).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text or bytes) to `path` via a temporary file and os.replace; its folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_folder(path: str | os.PathLike, fill: Callable[[Path], object]) -> bool:
    """Run fill(folder) on a fresh temporary folder beside `path`, then rename it to `path`.

    False when another writer's folder took the name first (renaming onto a non-empty folder fails):
    this one is then discarded and theirs kept. A fill that raises leaves nothing behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        fill(tmp)
        try:
            os.rename(tmp, path)
        except OSError:
            if not path.is_dir():
                raise
            return False
        return True
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
