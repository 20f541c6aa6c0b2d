"""What produced a result: the commit and the locked environment, named in every table's header and metadata
(the device is named by the table itself: kernels.bench.devices)."""

from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "constraints.txt"  # every package's exact version; `make setup` installs through it


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    if done.returncode:
        raise OSError(done.stderr.strip())
    return done.stdout.strip()


@functools.cache
def commit() -> str:
    """The checkout's commit (12 hex digits), with '+dirty' when tracked files differ from it."""
    try:
        sha = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"
    return sha + ("+dirty" if dirty else "")


@functools.cache
def lock_hash() -> str:
    """The first 12 hex digits of the lock file's sha256: equal hashes, equal environments."""
    try:
        return hashlib.sha256(LOCK.read_bytes()).hexdigest()[:12]
    except OSError:
        return "none (no constraints.txt)"


def as_dict() -> dict[str, str]:
    return {"commit": commit(), "environment_lock": lock_hash()}


def line() -> str:
    """E.g. "commit 0123456789ab, environment lock 89abcdef0123 (constraints.txt)"."""
    return f"commit {commit()}, environment lock {lock_hash()} ({LOCK.name})"
