"""Seeds fixed before the run: from a pilot (the kept tables), the seeds each table needs for every claim
that reads it to reach a verdict, written once to tables/seed_plan.json, where `--seeds plan`
(`make table4 SEEDS=plan`) reads them.

    python -m tables.seed_plan --kept results/reference/embedded     (make seed-plan)

Each inconclusive claim's comparisons project the seeds that would settle them at the pilot's measured
differences and spreads (tables.delta_interval.seeds_to_settle, capped at MOST_SEEDS); a table gets the
most that any claim reading it asks for, never fewer than it has now. Choosing the count from a pilot
and then training it once keeps the report's 95% intervals honest; adding seeds after looking at a
result until the interval clears a line is optional stopping, which inflates the false-positive rate
(docs/tables.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from atomic_files import write_file
from tables import provenance
from tables.claims import verdict
from tables.claims.context import Context, NotKept
from tables.claims.registry import CLAIMS
from tables.generate import default_seeds
from tables.specs import SPECS

PLAN = Path(__file__).with_name("seed_plan.json")


def claim_needs(ctx: Context) -> dict[str, dict[str, int | None]]:
    """{claim: {comparison: seeds that would settle it (None: more than MOST_SEEDS)}} for the claims whose
    verdict waits on seeds, read off the seeds notes their checks write."""
    found: dict[str, dict[str, int | None]] = {}
    for claim in CLAIMS:
        with verdict.recording_needs() as needs:
            try:
                claim.check(ctx)
            except NotKept:
                continue
        if needs:
            found[claim.key] = needs
    return found


def plan(ctx: Context) -> dict:
    """The plan as written to seed_plan.json: per table its seeds and the claims that ask for them."""
    needs = claim_needs(ctx)
    tables: dict[str, dict] = {}
    for claim in CLAIMS:
        names = [n for n in claim.needs if n in SPECS]  # speed tables and figures: not a count of seeds
        for name in names:
            # a comparison named after its table ("table4 resnet18 daiq") asks that table alone
            counts = [n for c, n in needs.get(claim.key, {}).items() if _reads(c, name, names)]
            if not counts:
                continue
            beyond = any(n is None for n in counts)
            want = verdict.MOST_SEEDS if beyond else max(counts)
            now = default_seeds(ctx.profile, SPECS[name])
            entry = tables.setdefault(name, {"seeds": now, "now": now, "claims": [], "beyond_limit": False})
            entry["seeds"] = max(entry["seeds"], want)
            entry["claims"].append(claim.key)
            entry["beyond_limit"] |= beyond
    commits = sorted({m.get("commit") for m in ctx.metas.values() if m.get("commit")})
    return {
        "profile": ctx.profile,
        # the kept tables' commits, and the commit of the code that read them
        "pilot": {"kept": str(ctx.kept), "commits": commits, "read_at": provenance.commit()},
        "level": verdict.LEVEL,
        "most_seeds": verdict.MOST_SEEDS,
        "written_at": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "tables": dict(sorted(tables.items())),
        "claims": needs,
    }


def _reads(comparison: str, name: str, names: list[str]) -> bool:
    own = [n for n in names if comparison.startswith(f"{n} ")]
    return name in own if own else True


def planned_seeds(name: str, profile: str, path: Path = PLAN) -> int:
    """The seeds the plan fixes for table `name` at `profile`; a ValueError (one line) where it has none."""
    try:
        written = json.loads(path.read_text())
    except (OSError, ValueError):
        raise ValueError(f"no seed plan at {path}: `make seed-plan` writes it from the kept tables") from None
    if written.get("profile") != profile:
        raise ValueError(f"the seed plan {path} is for profile {written.get('profile')!r}, not {profile!r}")
    entry = written["tables"].get(name)
    if entry is None:  # no claim waits on this table's seeds: it keeps its own count
        return default_seeds(profile, SPECS.get(name))
    return int(entry["seeds"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tables.seed_plan", description=__doc__.split("\n\n")[0])
    ap.add_argument("--kept", type=Path, required=True, help="the pilot: a kept results directory")
    ap.add_argument("--profile", default="embedded")
    ap.add_argument("--out", type=Path, default=PLAN)
    args = ap.parse_args(argv)
    if not args.kept.is_dir():
        print(f"error: --kept {args.kept}: no such directory", file=sys.stderr)
        return 2
    written = plan(Context(args.profile, progress=False, kept=args.kept))
    write_file(args.out, json.dumps(written, indent=1) + "\n")
    for name, entry in written["tables"].items():
        beyond = f" (a claim needs more than {verdict.MOST_SEEDS})" if entry["beyond_limit"] else ""
        print(f"{name}: {entry['now']} -> {entry['seeds']} seeds{beyond}, for {', '.join(entry['claims'])}")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
