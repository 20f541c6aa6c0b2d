"""Atomic writes: a file or a folder appears whole under its name, or not at all.

Each is written under a temporary name in its destination's folder, then renamed into place, so a
killed run leaves neither half a file nor half a dataset behind. Here, on the ground floor, so that
every floor shares one: the compiled-kernel cache, the embedded-data cache (tasks), and the table
cells and outputs (tables).

Both keep the mode a plain `open` or `mkdir` would give under the user's umask (mkstemp and mkdtemp make
them private, 0600 and 0700), so the rest of a group can read results on a shared filesystem.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it (/proc), else set and reset."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def write_file(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text or bytes) to `path` via a temporary file and os.replace; its folder must exist."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())
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
        tmp.chmod(0o777 & ~umask())
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
