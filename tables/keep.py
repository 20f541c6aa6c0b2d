"""`make keep FROM=DIR`: copy the finished tables and figures of a results directory into the kept set.

    make keep FROM=../run/results                     # into results/reference/embedded
    python -m tables.keep --from DIR --to results/reference/embedded --profile embedded

A kept table is rendered again from DIR's cache by this checkout's code (so it carries this version's
columns, such as the rows' intervals), and only when every one of its cells is finished: a table still
running elsewhere is listed and left out. Its footer then names this commit; the cells' own training
times stay in it (`training_seconds`). The speed tables and figures are copied as DIR has them. Nothing
trains.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from tables.specs import SPECS, SPEED_SPECS


def kept_seeds(dest: Path, name: str) -> int | None:
    """How many seeds the table kept in dest has (None: not kept, or no sidecar)."""
    try:
        return int(json.loads((dest / f"{name}.meta.json").read_text())["seeds"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def keep_tables(
    source: Path, dest: Path, profile: str, seeds: int | None = None
) -> tuple[list[str], list[str]]:
    """(kept, unfinished): the training tables whose every cell is in source/cache, rendered into dest.
    A table kept with more seeds than asked is rendered with as many again when the cache holds them
    all, so keeping the rest does not replace it with fewer."""
    from tables.generate import generate, resolve_seeds

    kept, unfinished = [], []
    for name, spec in SPECS.items():
        asked = len(resolve_seeds(profile, seeds, spec))
        more = kept_seeds(dest, name)
        tries = ([more] if more is not None and more > asked else []) + [asked]
        for n in tries:
            with tempfile.TemporaryDirectory() as scratch:
                out = generate(
                    name, profile=profile, seeds=n, results_dir=scratch, cache_dir=source / "cache",
                    progress=False, cached_only=True,
                    command=f"make {name} PROFILE={profile} (cells), kept by make keep",
                )  # fmt: skip
                if out.cached == 0 or out.cached < len(out.plan.cells):
                    continue
                dest.mkdir(parents=True, exist_ok=True)
                for path in out.paths.values():
                    shutil.copy2(path, dest / path.name)
                kept.append(name)
                break
        else:
            if out.cached:
                unfinished.append(f"{name} ({out.cached} of {len(out.plan.cells)} cells)")
    return kept, unfinished


def copy_made(source: Path, dest: Path) -> list[str]:
    """The speed tables and figures source holds, copied as they are."""
    copied = []
    for name in SPEED_SPECS:
        files = [source / f"{name}{ext}" for ext in (".md", ".csv", ".meta.json")]
        if all(f.exists() for f in files):
            dest.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, dest / f.name)
            copied.append(name)
    figures = sorted((source / "figures").glob("*.png")) if (source / "figures").is_dir() else []
    for png in figures:
        (dest / "figures").mkdir(parents=True, exist_ok=True)
        for f in (png, *(png.with_suffix(ext) for ext in (".csv", ".md", ".meta.json"))):
            if f.exists():
                shutil.copy2(f, dest / "figures" / f.name)
        copied.append(f"figures/{png.stem}")
    return copied


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tables.keep", description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="source", required=True, help="a results directory (its cache/)")
    parser.add_argument("--to", dest="dest", default="results/reference/embedded")
    parser.add_argument("--profile", default="embedded")
    parser.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="the first N seeds only (default: each table's own, else the profile's)",
    )
    args = parser.parse_args(argv)
    source, dest = Path(args.source), Path(args.dest)
    if not (source / "cache").is_dir():
        print(f"error: {source} holds no cache/ (the results directory of a table run)", file=sys.stderr)
        return 2
    kept, unfinished = keep_tables(source, dest, args.profile, args.seeds)
    copied = copy_made(source, dest)
    print(f"kept in {dest}: {', '.join(kept + copied) or 'nothing'}")
    if unfinished:
        print(f"not finished, left out: {', '.join(unfinished)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
