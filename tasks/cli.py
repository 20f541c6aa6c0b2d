"""The `repro train` subcommand: one training run of a task, printed as one line (or JSON).

    repro train --task classification --model resnet18 --method daiq --profile embedded [--seed N]
                [--data-root PATH] [--paper-dataset imagenet|cifar10] [--cfg-options k=v ...]
                [--method-options k=v ...] [--work-dir D] [--skip-bad-samples] [--launcher none|pytorch]
                [--device cuda|cpu] [--json]
    repro train --task detection --config PATH --method daiq [--cfg-options k=v ...]   (any mmdet config)
    repro train --task video --model r3d_18|r3d_50 --method daiq [--paper-dataset ucf101|kinetics400]

Wired into the `repro` command (tables/command.py) with `add_train_parser(subparsers)`. Unknown task /
model / method / profile names, and method options of the wrong type, are one-line errors (exit 2, like
argparse's own errors); so are missing or bad data (a layout not found, an unreadable image, a malformed
annotation list, data smaller than one batch), each naming the file and what to do. A run that fails
(out of memory, another rank failed) is one line and exit 1. A diverged run is a result ("diverged"),
exit 0. With --work-dir the run keeps its checkpoints there, and the same command run again resumes it.
Under torchrun (`--launcher pytorch`) only rank 0 prints the result.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from mmengine.config import DictAction

from tasks import TASKS, get_task


class KeyValueAction(DictAction):
    """mmengine's DictAction (k=v pairs, values as lists or tuples), a malformed pair one line and exit 2
    instead of a traceback: a pair without '=' or a key, a value with unbalanced brackets."""

    def __call__(self, parser, namespace, values, option_string=None):
        for pair in values:
            key, sep, _ = pair.partition("=")
            if not sep or not key.strip():
                parser.exit(2, f"{parser.prog}: error: {option_string}: {pair!r} is not key=value\n")
        try:
            super().__call__(parser, namespace, values, option_string)
        except (ValueError, AssertionError) as err:
            parser.exit(
                2, f"{parser.prog}: error: {option_string}: cannot parse {' '.join(values)!r}: {err}\n"
            )


def add_train_arguments(parser: argparse.ArgumentParser, task_choice: bool = True) -> None:
    if task_choice:
        parser.add_argument("--task", default="classification", help=f"one of: {', '.join(TASKS)}")
    parser.add_argument("--model", default=None, help="e.g. resnet18 (an unknown name lists them all)")
    parser.add_argument(
        "--config",
        default=None,
        help="detection: an MMDetection config file (shipped or yours) to run instead of the task's own",
    )
    parser.add_argument("--method", required=True, help="e.g. fp32, ui8, daiq (see `repro methods`)")
    parser.add_argument("--profile", default="embedded", help="smoke, embedded (default) or paper")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--paper-dataset",
        default=None,
        help="the paper's dataset: imagenet (default) or cifar10 for classification, ucf101 (default) or "
        "kinetics400 for video, coco (default) or voc for detection (embedded/smoke: a stand-in)",
    )
    parser.add_argument(
        "--data-root", default=None, help="paper: the dataset root; embedded/smoke: the data cache"
    )
    parser.add_argument(
        "--work-dir",
        default=None,
        help="keep logs and checkpoints here; run again to resume (default: a temp dir, removed)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        type=float,
        default=None,
        metavar="SECONDS",
        help="least seconds between checkpoints in --work-dir (default: 60 at smoke and embedded, so a "
        "smoke run saves none; 0 at paper); 0 saves at every chance, e.g. to try resuming a smoke run",
    )
    parser.add_argument(
        "--skip-bad-samples",
        action="store_true",
        help="skip unreadable images and frames instead of stopping (listed in the log and the result)",
    )
    parser.add_argument(
        "--method-options", nargs="+", action=KeyValueAction, default=None, help="method options, k=v ..."
    )
    parser.add_argument(
        "--cfg-options",
        nargs="+",
        action=KeyValueAction,
        default=None,
        help="override Runner config keys, k=v with dotted keys, as mmengine's --cfg-options",
    )
    parser.add_argument(
        "--launcher",
        choices=["none", "pytorch"],
        default="none",
        help="pytorch: run under torchrun (MMEngine launcher='pytorch')",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="train under torch.compile (MMEngine's compile=True: the whole train_step; kernels.traceable)",
    )
    parser.add_argument(
        "--device",
        default=None,
        help="cuda or cpu (default: cuda when present); cuda where no GPU is visible is an error",
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """Add the `train` subcommand to the `repro` command's subparsers."""
    parser = subparsers.add_parser("train", help="train one model with one method (one table cell)")
    add_train_arguments(parser)
    parser.set_defaults(func=cmd_train)
    return parser


def _rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", 0))  # a rank that closed its process group early (tasks.distributed)


def cmd_train(args) -> int:
    from tasks.distributed import close_process_group

    try:
        return _train(args)
    finally:
        close_process_group()


def run_arguments(args) -> dict[str, Any] | int:
    """The task's run(**arguments) the command's arguments ask for, or an exit status where they are wrong
    (its one-line error printed); the same wherever the run trains (here, or a Slurm job)."""
    config = getattr(args, "config", None)
    if not args.model and config is None:  # --model '' names no model either
        print("error: --model is required (or --config for --task detection)", file=sys.stderr)
        return 2
    cfg_options = dict(args.cfg_options or {})
    if args.checkpoint_interval is not None:
        if not args.checkpoint_interval >= 0:
            print(
                f"error: --checkpoint-interval takes seconds >= 0, got {args.checkpoint_interval}",
                file=sys.stderr,
            )
            return 2
        cfg_options["default_hooks.checkpoint.min_interval_s"] = args.checkpoint_interval
    if args.launcher != "none":
        cfg_options["launcher"] = args.launcher
    if args.compile:
        cfg_options["compile"] = True
    return dict(
        model=args.model or Path(config).stem,
        method=args.method,
        profile=args.profile,
        seed=args.seed,
        method_options=dict(args.method_options or {}),
        data_root=args.data_root,
        work_dir=args.work_dir,
        cfg_options=cfg_options or None,
        skip_bad_samples=bool(getattr(args, "skip_bad_samples", False)),
        # each task has its own default paper dataset
        **({} if args.paper_dataset is None else {"paper_dataset": args.paper_dataset}),
        **({} if config is None else {"config": config}),
    )


def _train(args) -> int:
    from tasks.bad_data import BadDataError, one_line_error
    from tasks.datasets import DatasetNotFoundError
    from tasks.device_choice import trained_on, use_device
    from tasks.out_of_memory import RunFailed
    from tasks.runner import summary

    task = get_task(args.task)
    arguments = run_arguments(args)
    if isinstance(arguments, int):
        return arguments
    if args.profile == "paper" and args.work_dir is None and _rank() == 0:
        print(
            "repro: no --work-dir: this run keeps no checkpoints and cannot resume if stopped",
            file=sys.stderr,
        )
    use_device(args.device)  # a ValueError (one line, exit 2) where the device is not here
    try:
        result = task.run(**arguments)
    except (DatasetNotFoundError, BadDataError) as err:
        print(f"error: {one_line_error(err)}", file=sys.stderr)
        return 2
    except RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if _rank() == 0:
        record = {**result.to_dict(), "device": trained_on()}
        print(json.dumps(record) if args.json else summary(result), flush=True)
    return 0


def task_main(task: str, description: str, argv=None) -> int:
    """`python -m tasks.<task> ...`: the `repro train` arguments for one task (e.g. under torchrun)."""
    from repro.third_party_warnings import filter_known

    filter_known()
    parser = argparse.ArgumentParser(prog=f"python -m tasks.{task}", description=description)
    add_train_arguments(parser, task_choice=False)
    args = parser.parse_args(argv)
    args.task = task
    try:
        return cmd_train(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
