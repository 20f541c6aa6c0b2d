"""What one cell's Slurm job asks for, read from the one place a user edits (docs/cluster.md).

    resources = slurm_resources(config="slurm.toml", args="partition=gpu gpus_per_node=4 time=720")

Lowest first: DEFAULTS; the config file (TOML, its [slurm] table; `--slurm-config`, else $REPRO_SLURM_CONFIG,
else ./slurm.toml when there is one); `SLURM_ARGS=` / `--slurm-args` (space- or comma-separated key=value).
Keys are submitit's SlurmExecutor parameters (partition, time in minutes, nodes, ntasks_per_node,
cpus_per_task, gpus_per_node, mem, account, qos, constraint, ...); any other key is an sbatch option of its
own name (`reservation=x` becomes `#SBATCH --reservation=x`). gpus_per_cell and nodes_per_cell, the
issue's names, are gpus_per_node and nodes (one task a GPU takes ntasks_per_node as well). A cell's ranks
are nodes x ntasks_per_node, part of its key (tables.generate): `ntasks` is refused, and both are whole
numbers. One key is the executor's own, not sbatch's: cells_per_job (default 1), how many pending cells one
job trains one after another (tables.slurm_executor). The other resources go into each cell's cache entry
(where it ran and on what), never into its key: a cell is the same cell wherever it trains.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

# A job one CPU a cell (the same arithmetic as `make JOBS=nproc` locally); an hour, past submitit's 5 minutes.
DEFAULTS: dict[str, Any] = {"cpus_per_task": 1, "time": 60}
ALIASES = {"gpus_per_cell": "gpus_per_node", "nodes_per_cell": "nodes"}
# The executor's own keys: kept out of sbatch's options. A pack's job name lists its cells' keys (33
# characters each), so a pack stays well under a kilobyte.
EXECUTOR_KEYS = ("cells_per_job",)
MOST_CELLS_PER_JOB = 16
CONFIG_ENV = "REPRO_SLURM_CONFIG"
DEFAULT_CONFIG = "slurm.toml"


def executor_parameters() -> set[str]:
    """The names submitit's SlurmExecutor takes (sbatch's own, with underscores)."""
    from submitit import SlurmExecutor

    return set(SlurmExecutor._valid_parameters())


def parse_args(text: str | None) -> dict[str, Any]:
    """`key=value` pairs, separated by spaces or commas; values that read as numbers become numbers."""
    out: dict[str, Any] = {}
    for item in re.split(r"[\s,]+", (text or "").strip()):
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"SLURM_ARGS: {item!r} is not key=value")
        out[key.strip().lstrip("-").replace("-", "_").lower()] = _number(value)
    return out


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def config_path(config: str | os.PathLike | None) -> Path | None:
    """The config file in force: the one named, else $REPRO_SLURM_CONFIG, else ./slurm.toml if present."""
    if config:
        return Path(config)
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV])
    return Path(DEFAULT_CONFIG) if Path(DEFAULT_CONFIG).is_file() else None


def slurm_resources(config: str | os.PathLike | None = None, args: str | None = None) -> dict[str, Any]:
    """The submitit SlurmExecutor parameters every cell's job gets (a ValueError names a bad file or key)."""
    merged = dict(DEFAULTS)
    path = config_path(config)
    if path is not None:
        if not path.is_file():
            raise ValueError(f"Slurm config {path}: no such file")
        import tomllib  # Python 3.11 and later

        try:
            table = tomllib.loads(path.read_text()).get("slurm", {})
        except tomllib.TOMLDecodeError as err:
            raise ValueError(f"Slurm config {path}: {err}") from err
        merged.update({str(k).replace("-", "_").lower(): v for k, v in table.items()})
    merged.update(parse_args(args))
    valid = executor_parameters()
    extra = dict(merged.pop("additional_parameters", None) or {})
    out: dict[str, Any] = {}
    for key, value in merged.items():
        key = ALIASES.get(key, key)
        if key in EXECUTOR_KEYS:
            out[key] = _cells_per_job(value)
        elif key in valid:
            out[key] = value
        else:  # an sbatch option submitit has no parameter for
            extra[key] = value
    if "ntasks" in extra:
        raise ValueError(
            "ntasks: give ntasks_per_node (and nodes); a cell's ranks are nodes x ntasks_per_node"
        )
    for key in ("nodes", "ntasks_per_node"):
        if key in out and (not isinstance(out[key], int) or isinstance(out[key], bool) or out[key] < 1):
            raise ValueError(
                f"{key}={out[key]!r}: a whole number, at least 1 (a cell's ranks are counted from it)"
            )
    if extra:
        out["additional_parameters"] = extra
    return out


def add_executor_arguments(parser, what: str) -> None:
    """--executor, --slurm-args and --slurm-config on a command whose `what` ("the cells train") may train
    as Slurm jobs (`repro table`, `repro figure`, `repro train`)."""
    cluster = parser.add_argument_group("executor (docs/cluster.md)")
    cluster.add_argument(
        "--executor",
        choices=("local", "slurm"),
        default="local",
        help=f"where {what}: in this process (default), or on Slurm, a job each, through submitit",
    )
    cluster.add_argument(
        "--slurm-args",
        default=None,
        help="a job's resources, key=value each (partition=gpu time=120 cpus_per_task=8 gpus_per_node=1 "
        "...), over the config file's",
    )
    cluster.add_argument(
        "--slurm-config",
        default=None,
        help=f"TOML file with a [slurm] table of the same keys (default: ${CONFIG_ENV}, else "
        f"./{DEFAULT_CONFIG})",
    )


def executor_resources(args) -> dict[str, Any] | None:
    """The jobs' resources for `--executor slurm`, None for local; a ValueError (one line, exit 2) for a bad
    file or key, or for --slurm-args / --slurm-config without --executor slurm."""
    if args.executor == "slurm":
        return slurm_resources(args.slurm_config, args.slurm_args)
    if args.slurm_args or args.slurm_config:
        raise ValueError("--slurm-args and --slurm-config apply with --executor slurm")
    return None


def _cells_per_job(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MOST_CELLS_PER_JOB:
        raise ValueError(f"cells_per_job={value!r}: a whole number from 1 to {MOST_CELLS_PER_JOB}")
    return value
