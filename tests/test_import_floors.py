"""The floors: tables above tasks, tasks above repro, repro above kernels; no import runs back up."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"kernels": 0, "repro": 1, "tasks": 2, "tables": 3}
# Imports of a higher floor that are allowed (none: kernels has its own NonFiniteError and quantizer)
KNOWN: set[tuple[str, str]] = set()


def imported_packages(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def upward_imports(package: str) -> set[tuple[str, str]]:
    floor = FLOORS[package]
    return {
        (str(path.relative_to(ROOT)), name)
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in imported_packages(path)
        if FLOORS.get(name, -1) > floor
    }


@pytest.mark.parametrize("package", list(FLOORS))
def test_no_import_runs_back_up(package):
    assert upward_imports(package) - KNOWN == set()


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from tables.command import main\n")
    assert imported_packages(module) == {"tables"}
