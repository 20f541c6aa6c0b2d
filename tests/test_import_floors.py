"""The floors: tables above tasks, tasks above repro, repro above kernels, kernels above atomic_files
(the one file writer); no import runs back up, and in kernels/cuda and kernels/cpu the runtime imports
no sibling."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS = {"atomic_files": 0, "kernels": 1, "repro": 2, "tasks": 3, "tables": 4}
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


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_backends_runtime_imports_no_sibling(device):
    """The runtime (compile, cache, load, launch) is each backend package's ground: nothing in it
    imports the package's other modules or the package itself, so no import circle can form."""
    path = ROOT / "kernels" / device / "runtime.py"
    tree = ast.parse(path.read_text(), str(path))
    relative = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level > 0]
    absolute = {
        name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom | ast.Import)
        for name in ([n.module] if isinstance(n, ast.ImportFrom) and n.module else [a.name for a in n.names])
        if name and name.startswith("kernels")
    }
    assert not relative and not absolute


def test_no_module_is_named_like_a_folder_beside_it():
    """A module beside a folder of its name (kernels/cuda.py beside kernels/cuda/ was one) is one name for two
    things."""
    clashes = [
        str(path.relative_to(ROOT))
        for package in FLOORS
        for path in (ROOT / package).rglob("*.py")
        if path.with_suffix("").is_dir()
    ]
    assert clashes == []
