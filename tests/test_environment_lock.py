"""The environment is the lock's: `make setup` installs every package through constraints.txt, so the
environment the tests run in holds exactly the lock's versions, and every table names the lock's hash."""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig

import pytest

from tables import provenance

PROJECT = "int8-repro"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins() -> dict[str, str]:
    pins = {}
    for line in provenance.LOCK.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep and version and " " not in line, f"constraints.txt: {line!r} is not name==version"
        pins[canonical(name)] = version
    return pins


def test_every_installed_package_is_pinned_at_its_version():
    pins = lock_pins()
    assert canonical(PROJECT) not in pins, "the project itself is installed editable, not from the lock"
    for name in ("torch", "torchvision", "mmengine", "mmcv", "mmdet", "numpy", "pandas", "scipy"):
        assert canonical(name) in pins, f"{name} is not in the lock"
    # the environment's own site-packages (imports such as pkg_resources put setuptools' vendored copies
    # on sys.path too; those are not installed packages)
    where = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    dists = importlib.metadata.distributions(path=where)
    installed = {canonical(d.metadata["Name"]): d.version for d in dists}
    installed.pop(canonical(PROJECT), None)
    unpinned = sorted(set(installed) - set(pins))
    assert not unpinned, f"installed but not in constraints.txt (run make lock): {unpinned}"
    differ = {n: (v, pins[n]) for n, v in installed.items() if v != pins[n]}
    assert not differ, f"installed version != locked version: {differ} (make setup installs through the lock)"


def test_provenance_names_commit_and_lock():
    info = provenance.as_dict()
    if info["commit"].startswith("unknown"):
        pytest.skip("not a git checkout: the tables say so instead of a commit")
    assert re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", info["commit"]), info["commit"]
    assert re.fullmatch(r"[0-9a-f]{12}", info["environment_lock"]), info["environment_lock"]
    assert info["commit"] in provenance.line() and info["environment_lock"] in provenance.line()
