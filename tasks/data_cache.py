"""The embedded-data cache: where the stand-in datasets are made, once, and found again.

Each set is a folder ``<name>-v<version>`` in the cache (the ``cache`` argument, else env
REPRO_DATA_CACHE, else ``~/.cache/int8-repro/data``) holding a MANIFEST.json that says what it is,
how it was made and its statistics. A set is written into a temporary folder and renamed into place
(atomic_files), so a killed run never leaves half a dataset; when two processes make it at once, the
first to finish wins. A folder without a manifest is not ours to trust and is rebuilt.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

from atomic_files import write_folder

CACHE_ENV = "REPRO_DATA_CACHE"
DEFAULT_CACHE = Path("~/.cache/int8-repro/data")
MANIFEST = "MANIFEST.json"


def cache_dir(cache: str | os.PathLike | None = None) -> Path:
    """The embedded-data cache: the argument, else env REPRO_DATA_CACHE, else ~/.cache/int8-repro/data."""
    chosen = cache or os.environ.get(CACHE_ENV) or DEFAULT_CACHE
    return Path(chosen).expanduser()


def read_manifest(folder: str | os.PathLike) -> dict | None:
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def write_set(folder: Path, write: Callable[[Path], dict]) -> dict:
    """Make the set `folder` with write(tmp_folder) -> manifest dict, atomically; returns its manifest."""

    def fill(tmp: Path) -> None:
        t0 = time.perf_counter()
        manifest = write(tmp)
        manifest["made_in_s"] = round(time.perf_counter() - t0, 2)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))

    if not write_folder(folder, fill) and read_manifest(folder) is None:
        raise FileExistsError(f"{folder} appeared while it was being made, without a {MANIFEST}")
    return read_manifest(folder)


def ensure_set(name: str, version: int, write: Callable[[Path], dict], cache=None) -> Path:
    """The folder of set `name` at `version` in the cache, made with `write` on first use."""
    folder = cache_dir(cache) / f"{name}-v{version}"
    if read_manifest(folder) is None:
        if folder.exists():  # a folder without a manifest is not ours to trust; rebuild it
            shutil.rmtree(folder)
        write_set(folder, write)
    return folder
