"""The README's examples run as pasted: its Python blocks, and its quick-tour commands (smoke profile)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def tour_commands() -> list[str]:
    tour = README.split("## A quick tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"\n\n((?:    .*\n)+)", tour).group(1)
    lines = [line.strip().split("  #", 1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("source ")]


def test_the_readme_has_a_python_example_and_a_tour():
    assert python_blocks() and len(tour_commands()) >= 3
    assert len(README.splitlines()) <= 160  # the rest lives in docs/


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_blocks_run_as_pasted(index, capsys):
    exec(compile(python_blocks()[index], f"README.md python block {index}", "exec"), {})
    assert "one INT8 training step, loss" in capsys.readouterr().out


def _run(command: str, tmp_path: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    args = shlex.split(command)
    if args[0] == "make":  # the same target, its outputs in a scratch results directory
        args += [f"RESULTS={tmp_path / 'results'}", f"VENV={Path(sys.executable).parent.parent}"]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)


@pytest.mark.parametrize("command", [c for c in tour_commands() if "PROFILE=smoke" not in c])
def test_quick_tour_commands_run(command, tmp_path):
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in tour_commands() if "PROFILE=smoke" in c])
def test_quick_tour_smoke_tables_run(command, tmp_path):
    done = _run(command, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "results" / "table4.md").exists()
