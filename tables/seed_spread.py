"""How the seeds' spread of INT8 - FP32 shrinks with the training run's size: one network, several
(training images x epochs) sizes, FP32 and INT8 at each seed, and per size the spread of the per-seed
differences, the 95% interval (tables.delta_interval), the seeds a half-width of 0.5 points would take
and their training iterations (what the interval costs at that size).

    python -m tables.seed_spread --model resnet18 --methods daiq --sizes 6400x2 6400x8 25600x2 \
        --seeds 0-5 --jobs 2 --out results/seed-spread

Classification at the embedded profile (the stand-in data of its config) with the recipe's train_limit and
epochs replaced, everything else the recipe's (the multistep milestones stay fractions of the run). Each
run is one subprocess writing one JSON file into --out, so a killed study resumes where it stopped; the
summary goes to <out>/seed-spread.md (--summarize: from the runs there, training nothing). A study tool
for choosing the profile's size (docs/data.md), not a table: its runs are not table cells and do not
enter the tables' cache.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from tqdm.auto import tqdm

from atomic_files import write_file
from kernels.bench import devices
from tables import provenance
from tables.delta_interval import delta_interval, seeds_to_settle
from tasks.top1 import unpack_flags

TARGET = 0.5  # the half-width DAIQ Table 4's rows are asked for (points)


def parse_size(text: str) -> tuple[int, int]:
    """'6400x2' -> (6400 training images, 2 epochs)."""
    try:
        images, epochs = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"size {text!r}: write training images x epochs, e.g. 6400x2"
        ) from None
    if images < 10 or epochs < 1:
        raise argparse.ArgumentTypeError(f"size {text!r}: at least 10 images and 1 epoch")
    return images, epochs


def parse_seeds(text: str) -> list[int]:
    """'0-5' or '0,3,7' -> the seeds."""
    try:
        if "-" in text:
            first, last = (int(v) for v in text.split("-"))
            return list(range(first, last + 1))
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds {text!r}: write e.g. 0-5 or 0,1,2") from None


def run_path(out: Path, model: str, method: str, seed: int, images: int, epochs: int) -> Path:
    return out / f"{model}_{method}_s{seed}_n{images}_e{epochs}.json"


def train_one(model: str, method: str, seed: int, images: int, epochs: int, path: Path) -> None:
    """One run, in this process: the embedded recipe with train_limit and epochs replaced."""
    import tasks.classification as classification

    recipe = classification.recipe

    def resized(*args):
        r = recipe(*args)
        r.update(train_limit=images, epochs=epochs, val_interval=epochs)
        return r

    # The study's size is not a RunSpec field, so that table cells' keys stay as they are: replace the
    # task's recipe function for this one run instead.
    classification.recipe = resized
    try:
        result = classification.run(model, method, profile="embedded", seed=seed).to_dict()
    finally:
        classification.recipe = recipe
    result.update(
        train_images=images, train_epochs=epochs, threads=torch.get_num_threads(), commit=provenance.commit()
    )
    write_file(path, json.dumps(result))


def summarize(records: list[dict]) -> list[dict]:
    """Per (model, size, INT8 method): the seeds both FP32 and INT8 finished, paired seed by seed."""
    runs: dict[tuple, dict[int, dict]] = defaultdict(dict)
    for r in records:
        runs[(r["model"], r["train_images"], r["train_epochs"], r["method"])][r["seed"]] = r
    rows = []
    for (model, images, epochs, method), int8 in sorted(runs.items()):
        if method == "fp32":
            continue
        fp32 = runs.get((model, images, epochs, "fp32"), {})
        seeds = sorted(s for s in set(int8) & set(fp32) if not (int8[s]["diverged"] or fp32[s]["diverged"]))
        if len(seeds) < 2:
            continue
        f, q = [fp32[s]["top1"] for s in seeds], [int8[s]["top1"] for s in seeds]
        diffs = [b - a for a, b in zip(f, q, strict=True)]
        pairs = [
            (unpack_flags(int8[s].get("val_correct")), unpack_flags(fp32[s].get("val_correct")))
            for s in seeds
        ]
        interval = delta_interval(diffs, pairs)
        spread = statistics.stdev(diffs)
        rows.append(
            dict(
                model=model,
                method=method,
                images=images,
                epochs=epochs,
                iters=fp32[seeds[0]]["iters"],
                seeds=len(seeds),
                fp32=statistics.mean(f),
                fp32_sd=statistics.stdev(f),
                int8=statistics.mean(q),
                int8_sd=statistics.stdev(q),
                delta=statistics.mean(diffs),
                delta_sd=spread,
                half_width=interval.half_width,
                test_se=interval.test_se,
                seeds_for_target=seeds_to_settle(spread, interval.test_se, len(seeds), TARGET),
                ms_fp32=statistics.median(fp32[s]["ms_per_iter"] for s in seeds),
                ms_int8=statistics.median(int8[s]["ms_per_iter"] for s in seeds),
            )
        )
    return rows


def markdown(rows: list[dict], header: str) -> str:
    lines = [
        header,
        "",
        "| model | method | images x epochs | iters | seeds | FP32 | INT8 | sd FP32 | sd INT8 | Δ | sd of Δ "
        f"| 95% CI | half-width | test se | seeds for ±{TARGET} | their iterations | ms/iter FP32 / INT8 |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lo, hi = r["delta"] - r["half_width"], r["delta"] + r["half_width"]
        test_se = "" if r["test_se"] is None else f"{r['test_se']:.2f}"
        need = r["seeds_for_target"]
        lines.append(
            f"| {r['model']} | {r['method']} | {r['images']} x {r['epochs']} | {r['iters']} | {r['seeds']} "
            f"| {r['fp32']:.2f} | {r['int8']:.2f} | {r['fp32_sd']:.2f} | {r['int8_sd']:.2f} "
            f"| {r['delta']:+.2f} "
            f"| {r['delta_sd']:.2f} | [{lo:+.2f}, {hi:+.2f}] | {r['half_width']:.2f} | {test_se} "
            f"| {need or 'more than 100'} | {'' if need is None else need * r['iters']} "
            f"| {r['ms_fp32']:.0f} / {r['ms_int8']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def _child(args: list[str]) -> str | None:
    """Run one study run in a subprocess on one thread; None, or its error's last line."""
    cmd = [sys.executable, "-m", "tables.seed_spread", *args]
    done = subprocess.run(cmd, env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tables.seed_spread", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet18")
    p.add_argument("--methods", nargs="+", default=["daiq"], help="INT8 methods, each paired with fp32")
    p.add_argument("--sizes", nargs="+", type=parse_size, default=[(6400, 2)], help="images x epochs")
    p.add_argument("--seeds", type=parse_seeds, default=[0, 1, 2])
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, one thread each")
    p.add_argument("--out", type=Path, default=Path("results/seed-spread"))
    p.add_argument("--summarize", action="store_true", help="train nothing: summarize the runs in --out")
    p.add_argument(
        "--one", nargs=5, metavar=("MODEL", "METHOD", "SEED", "IMAGES", "EPOCHS"), help=argparse.SUPPRESS
    )
    a = p.parse_args(argv)
    if a.jobs < 1:
        p.error(f"--jobs takes a whole number of runs at a time, at least 1, got {a.jobs}")
    if a.one:
        model, method, seed, images, epochs = a.one
        seed, images, epochs = int(seed), int(images), int(epochs)
        train_one(model, method, seed, images, epochs, run_path(a.out, model, method, seed, images, epochs))
        return 0
    a.out.mkdir(parents=True, exist_ok=True)
    todo = [
        (method, seed, images, epochs)
        for seed in a.seeds
        for images, epochs in a.sizes
        for method in ["fp32", *a.methods]
        if not (a.summarize or run_path(a.out, a.model, method, seed, images, epochs).exists())
    ]
    failed = []
    with (
        tqdm(total=len(todo), desc="seed-spread runs", unit="run") as bar,
        ThreadPoolExecutor(a.jobs) as pool,
    ):

        def one(job):
            method, seed, images, epochs = job
            error = _child(
                ["--out", str(a.out), "--one", a.model, method, str(seed), str(images), str(epochs)]
            )
            if error:
                failed.append(f"{method} seed {seed} {images}x{epochs}: {error}")
            bar.update()

        list(pool.map(one, todo))
    records = [json.loads(f.read_text()) for f in sorted(a.out.glob(f"{a.model}_*_s*_n*_e*.json"))]
    device = devices.describe(torch.device("cpu"))["name"]
    header = (
        f"# Seed spread of INT8 - FP32 by training size ({a.model}, embedded profile's stand-in data)\n\n"
        f"Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by `python -m tables.seed_spread`, "
        f"at {provenance.line()}, on {device}, each run on 1 thread (ms/iter of a machine shared with the "
        f"other runs). {len(records)} runs in {a.out}, trained at commit "
        f"{', '.join(sorted({str(r.get('commit', 'unknown')) for r in records}))}."
    )
    text = markdown(summarize(records), header)
    write_file(a.out / "seed-spread.md", text)
    print(text)
    if failed:
        print(f"{len(failed)} runs failed (run again to retry them):", *failed, sep="\n  ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
