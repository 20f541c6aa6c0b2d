"""No block of six or more lines of the project's code stands twice (imports and docstrings aside): a
repeated block is a helper waiting to be written, and two copies drift apart."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("atomic_files", "kernels", "repro", "tasks", "tables")
BLOCK = 6
MIN_CHARS = 120  # six closing brackets or `else:` lines are not code worth sharing


def code_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, stripped text) of the lines that are code: no blank, comment, import, docstring or
    function signature (a public API's parameter list is a declaration, and two tasks' `run` share one)."""
    text = path.read_text()
    skip: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import | ast.ImportFrom):
            skip.update(range(node.lineno, node.end_lineno + 1))
        elif isinstance(node, ast.FunctionDef) and node.body:
            skip.update(range(node.lineno, node.body[0].lineno))
        elif isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str):
            skip.update(range(node.lineno, node.end_lineno + 1))
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#") and number not in skip:
            lines.append((number, stripped))
    return lines


def repeated_blocks(paths, root: Path = ROOT) -> dict[tuple[str, ...], list[str]]:
    where: dict[tuple[str, ...], list[str]] = defaultdict(list)
    for path in paths:
        lines = code_lines(path)
        for i in range(len(lines) - BLOCK + 1):
            block = tuple(text for _, text in lines[i : i + BLOCK])
            if sum(map(len, block)) >= MIN_CHARS:
                where[block].append(f"{path.relative_to(root)}:{lines[i][0]}")
    return {block: places for block, places in where.items() if len(places) > 1}


def test_no_block_of_code_stands_twice():
    paths = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    found = repeated_blocks(paths)
    assert not found, "repeated: " + "; ".join(" and ".join(places) for places in list(found.values())[:5])


def test_the_check_sees_a_repeated_block(tmp_path):
    body = "\n".join(f"    total_{i} = compute_something(argument_{i}, other_{i})" for i in range(BLOCK))
    for name in ("a.py", "b.py"):
        (tmp_path / name).write_text(f'"""doc"""\nimport os\n\n\ndef f():\n{body}\n')
    assert len(repeated_blocks([tmp_path / "a.py", tmp_path / "b.py"], tmp_path)) == 1
